"""Search tasks: a compute declaration, concrete arguments and a target, with a stable key.

A task is what the tuner optimises and what records are filed under. Its ``workload_key`` is
a hash of the compute DAG's *structure* (op kinds, shapes, dtypes, printed bodies), the
arguments and the target string, so it is the same in every process and on every run: a log
written yesterday, or by a measurement worker, applies to the task built today. Two workloads
that declare the same computation share records, which is what we want.

>>> @register_workload
... def add(n):
...     A = te.placeholder((n,), "float32", name="A")
...     return [A, te.compute((n,), lambda i: A[i] + 1, name="B")]
>>> task = SearchTask(add, args=(64,))            # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tecomp import te
from tecomp.ir.expr import BinaryOp, Call, CmpOp, Expr, IntImm, Reduce
from tecomp.ir.functor import ExprVisitor
from tecomp.te.schedule import Schedule
from tecomp.te.tensor import ComputeOp, Operation, PlaceholderOp, Tensor

if TYPE_CHECKING:
    from .space import SearchSpace
    from .steps import Step
    from .template import ConfigSpace


class TuningError(Exception):
    """A tuning request that cannot be honoured (bad workload, no records, ...)."""


# Workloads are looked up by "module:qualname" so that a record (which stores that name) can
# be turned back into a task in another process. It maps names to the user's own functions;
# no tuning behaviour is dispatched through it.
_WORKLOADS: dict[str, Callable[..., Sequence[Tensor]]] = {}


def workload_name(func: Callable[..., Any]) -> str:
    return f"{func.__module__}:{func.__qualname__}"


# Set on the functions decorated with `tuning.template` (their signature is func(cfg, *args)).
# An attribute rather than a registry, so a worker process that imports the function by name
# sees the mark without any other bookkeeping.
TEMPLATE_MARK = "__tuning_template__"


def is_template(func: Callable[..., Any]) -> bool:
    """Whether ``func`` was decorated with `tuning.template`."""
    return bool(getattr(func, TEMPLATE_MARK, False))


def require_module_level(func: Callable[..., Any], who: str) -> None:
    """Raise unless ``func`` is a function that worker processes can import by name."""
    if not callable(func):
        raise TuningError(f"{who} expects a function, got {func!r}")
    if "<locals>" in func.__qualname__ or "<lambda>" in func.__qualname__:
        raise TuningError(
            f"{who}: {func.__qualname__} is not defined at module level; candidates "
            "are measured in worker processes that import the workload by name, so define it "
            "at the top level of a module"
        )
    main = sys.modules.get("__main__")
    if getattr(func, "__module__", None) == "__main__" and not getattr(main, "__file__", None):
        # a notebook cell or a REPL: no file the workers could import it from, and every
        # candidate would fail to build with only the log telling why
        raise TuningError(
            f"{who}: {func.__qualname__} is defined in an interactive session (notebook or REPL); "
            "candidates are measured in worker processes that import the workload by name, so "
            "put it in a .py file (in a notebook: %%writefile my_ops.py) and import it from there"
        )


def register_workload(func: Callable[..., Sequence[Tensor]]) -> Callable[..., Sequence[Tensor]]:
    """Declare ``func(*args) -> [tensors]`` as something the tuner may build tasks from.

    The function must live at module level: candidates are built and measured in worker
    processes, which import it by name. It is returned unchanged.
    """
    require_module_level(func, "register_workload")
    _WORKLOADS[workload_name(func)] = func
    return func


def lookup_workload(name: str) -> Callable[..., Sequence[Tensor]]:
    """The registered function called ``name`` ("module:qualname"), importing its module."""
    func = _WORKLOADS.get(name)
    if func is None:
        import importlib

        module = name.split(":", 1)[0]
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise TuningError(f"workload {name}: cannot import module {module!r} ({e})") from None
        func = _WORKLOADS.get(name)
    if func is None:
        raise TuningError(f"workload {name} is not registered; decorate it with "
                          "@tuning.register_workload (or @tuning.template)")
    return func


class _FlopCounter(ExprVisitor):
    """Floating-point operations in one evaluation of an expression (index math excluded)."""

    def __init__(self) -> None:
        self.n = 0

    def visit_BinaryOp(self, e: BinaryOp) -> None:
        if e.dtype.startswith(("float", "bfloat")):
            self.n += 1
        super().visit_BinaryOp(e)

    def visit_CmpOp(self, e: CmpOp) -> None:  # type: ignore[override]
        if e.a.dtype.startswith(("float", "bfloat")):
            self.n += 1
        self.visit(e.a)
        self.visit(e.b)

    def visit_Call(self, e: Call) -> None:
        if e.dtype.startswith(("float", "bfloat")):
            self.n += 1
        super().visit_Call(e)


def _count(e: Expr) -> int:
    c = _FlopCounter()
    c.visit(e)
    return c.n


def _const_extent(e: Expr, what: str) -> int:
    if not isinstance(e, IntImm):
        raise TuningError(f"{what} has the symbolic extent {e}; a search task needs concrete "
                          "shapes (pass them in args)")
    return e.value


class SearchTask:
    """One kernel to tune: ``func(*args)`` declared for ``target``.

    ``workload_key`` identifies the task in records; ``flop_ct`` is the number of floating
    point operations of one call (for GFLOP/s). `apply_best` turns the best record of a log
    into a schedule.

    ``func`` is either a workload (`register_workload`: the tuner derives the schedules) or a
    template (`tuning.template`: ``func(cfg, *args) -> (schedule, tensors)`` with knobs, the
    tuner picks their values; ``config_space`` then describes them, None otherwise).
    """

    def __init__(self, func: Callable[..., Sequence[Tensor]], args: Sequence[Any] = (),
                 target: str = "llvm", name: str | None = None) -> None:
        if workload_name(func) not in _WORKLOADS:
            raise TuningError(f"{func.__qualname__} is not a registered workload; decorate it "
                              "with @tuning.register_workload (or @tuning.template)")
        from tecomp.codegen.target import Target

        self.func = func
        self.args = tuple(args)
        self.target = str(Target.parse(target))
        self.workload = workload_name(func)
        self.name = name or f"{func.__name__}{self.args!r}".replace(",)", ")")
        self._init_dag()

    def _init_dag(self) -> None:
        self.is_template = is_template(self.func)
        self.config_space: ConfigSpace | None = None
        if self.is_template:
            from .template import discover

            # the DAG is what the template returns for its default config; the same call
            # records the knobs it defines
            self.config_space, tensors = discover(self.func, self.args, self.workload)
        else:
            tensors = list(self.func(*self.args))
        if not tensors or not all(isinstance(t, Tensor) for t in tensors):
            raise TuningError(f"workload {self.workload} must return a non-empty list of "
                              "te.Tensor (inputs and outputs, in kernel argument order)")
        self.tensors: list[Tensor] = tensors
        self.outputs: list[Operation] = [t.op for t in tensors if isinstance(t.op, ComputeOp)]
        if not self.outputs:
            raise TuningError(f"workload {self.workload} returns no computed tensor")
        self.ops = _topo_ops(self.outputs)
        names = [op.name for op in self.ops]
        dup = sorted({n for n in names if names.count(n) > 1})
        # a template's candidates are knob values, not steps that name stages: any names do
        if dup and not self.is_template:
            raise TuningError(
                f"workload {self.workload}: operation names must be unique for tuning (steps "
                f"refer to stages by name), repeated: {dup}; pass name= to te.compute/placeholder")
        text = _dag_text(self.ops)
        if self.config_space is not None:
            # records of a template must not be filed under the plain workload of the same DAG
            # (their steps mean nothing there), nor survive a change of the template's knobs
            text = f"template {self.workload}\n{self.config_space.describe()}\n{text}"
        h = hashlib.sha256(f"{text}\nargs={self.args!r}\ntarget={self.target}".encode())
        self.workload_key = h.hexdigest()[:24]
        self.flop_ct = float(_flops(self.ops))

    # pickling: worker processes rebuild the DAG from the function (tensors do not travel)
    def __getstate__(self) -> dict[str, Any]:
        return {"func": self.func, "args": self.args, "target": self.target, "name": self.name}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.func, self.args = state["func"], state["args"]
        self.target, self.name = state["target"], state["name"]
        self.workload = workload_name(self.func)
        _WORKLOADS.setdefault(self.workload, self.func)
        self._init_dag()

    def __repr__(self) -> str:
        return f"SearchTask({self.name}, target={self.target!r}, key={self.workload_key})"

    def to_json(self) -> dict[str, Any]:
        return {"workload": self.workload, "args": list(self.args), "target": self.target,
                "key": self.workload_key}

    @staticmethod
    def from_json(d: dict[str, Any]) -> SearchTask:
        """The task a record was written for (its workload must be importable)."""
        func = lookup_workload(d["workload"])
        args = tuple(tuple(a) if isinstance(a, list) else a for a in d["args"])
        return SearchTask(func, args, d["target"])

    # schedules ------------------------------------------------------------------------------
    def create_schedule(self) -> Schedule:
        """The default schedule (every stage at root, loops in declaration order).

        For a template too: it is the reference that measurements are checked against.
        """
        return te.create_schedule(self.outputs)

    def make_space(self) -> SearchSpace:
        """The space the tuner searches: sketches derived from the DAG (`SearchSpace`), or
        the knobs of a template (`tuning.template.TemplateSpace`)."""
        if self.is_template:
            from .template import TemplateSpace

            return TemplateSpace(self)
        from .space import SearchSpace  # not at the top: tuning.space imports this module

        return SearchSpace(self)

    def apply_steps(self, steps: Sequence[Step]) -> tuple[Schedule, list[Tensor]]:
        """Replay ``steps`` onto a fresh default schedule; returns ``(schedule, args)``.

        For a template, ``steps`` is one `TemplateConfigStep` (none: the default config) and
        the template is called with that config.
        """
        if self.is_template:
            from .template import apply_template_steps

            return apply_template_steps(self, steps)
        from .steps import State

        st = State(self)
        for s in steps:
            st.apply(s)
        return st.sch, list(self.tensors)

    def apply_best(self, log: str) -> tuple[Schedule, list[Tensor]]:
        """The schedule of the fastest valid record of this task in ``log``, ready for tc.build.

        Raises `tuning.records.NoValidRecordError` when the log has none for this task.
        """
        from .records import best_record

        rec = best_record(log, self)
        return self.apply_steps(rec.steps)


def _topo_ops(outputs: Sequence[Operation]) -> list[Operation]:
    order: list[Operation] = []
    seen: set[int] = set()

    def visit(op: Operation) -> None:
        if id(op) in seen:
            return
        seen.add(id(op))
        for t in op.input_tensors:
            visit(t.op)
        order.append(op)

    for op in outputs:
        visit(op)
    return order


def _dag_text(ops: Sequence[Operation]) -> str:
    """A canonical text of the DAG; printed bodies are deterministic across processes."""
    lines = []
    for op in ops:
        if isinstance(op, PlaceholderOp):
            lines.append(f"placeholder {op.name} {[str(d) for d in op.shape]} {op.dtype}")
        elif isinstance(op, ComputeOp):
            axes = [f"{a.var.name}:{a.dom.extent}" for a in op.axis]  # type: ignore[union-attr]
            red = [f"{r.var.name}:{r.dom.extent}" for r in op.reduce_axis]  # type: ignore[union-attr]
            bodies = []
            for b in op.body:
                if isinstance(b, Reduce):
                    comb = b.combiner
                    bodies.append(f"reduce[{comb.name}: {[str(x) for x in comb.result]} "
                                  f"id {[str(x) for x in comb.identity]}]"
                                  f"({[str(s) for s in b.source]} if {b.condition}) #{b.value_index}")
                else:
                    bodies.append(str(b))
            lines.append(f"compute {op.name} {axes} {red} {bodies} {op.output(0).dtype}")
        else:
            lines.append(f"{type(op).__name__} {op.name}")
    return "\n".join(lines)


def _flops(ops: Sequence[Operation]) -> int:
    total = 0
    for op in ops:
        if not isinstance(op, ComputeOp):
            continue
        extents = [_const_extent(a.dom.extent, f"axis {a.var.name} of {op.name}")  # type: ignore[union-attr]
                   for a in op.axis]
        points = math.prod(extents)
        b = op.body[0]
        if isinstance(b, Reduce):
            rext = [_const_extent(r.dom.extent, f"reduce axis {r.var.name} of {op.name}")
                    for r in b.axis]
            rpoints = math.prod(rext)
            per = sum(_count(s) for s in b.source) + sum(_count(r) for r in b.combiner.result)
            total += points * rpoints * per
        else:
            total += points * sum(_count(x) for x in op.body)
    return total

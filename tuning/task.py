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
import inspect
import math
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


def require_callable(func: Callable[..., Any], who: str) -> None:
    """Raise unless ``func`` is something `register_workload` / `template` can take."""
    if not callable(func):
        raise TuningError(f"{who} expects a function, got {func!r}")


def register_workload(func: Callable[..., Sequence[Tensor]]) -> Callable[..., Sequence[Tensor]]:
    """Declare ``func(*args) -> [tensors]`` as something the tuner may build tasks from.

    The function may live anywhere: in a package, a script (with or without an
    ``if __name__ == "__main__":`` guard), a notebook cell, a REPL or ``python -c``.
    Measurement workers never call it: a `SearchTask` calls it once, here, and ships the
    resulting compute DAG to them as data (`tecomp.te.serialize`); tuning logs carry the same
    data, so a log can be applied and exported later by a process that cannot import it.
    It is returned unchanged.
    """
    require_callable(func, "register_workload")
    _WORKLOADS[workload_name(func)] = func
    return func


def check_arguments(func: Callable[..., Any], args: Sequence[Any]) -> None:
    """Raise `TuningError` naming the workload's parameters when ``args`` do not fit them
    (instead of the workload's own TypeError, deep in a traceback)."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):
        return
    params = list(sig.parameters.values())
    if is_template(func) and params:
        params = params[1:]  # cfg is passed by the tuner
        sig = sig.replace(parameters=params)
    try:
        sig.bind(*args)
    except TypeError as e:
        shown = ", ".join(p.name if p.default is p.empty else f"[{p.name}]"
                         for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
        got = ", ".join(map(repr, args)) or "none"
        raise TuningError(f"workload {func.__name__} takes the arguments ({shown}); got "
                          f"{len(args)}: ({got}): {e}") from None


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

    ``prepack``: the inputs a candidate copies into another layout (a convolution's or dense
    layer's weight, `tuning.steps.LayoutCacheReadStep`) are constants the user packs once
    (`tuning.prepack`): each candidate is timed with them packed outside the kernel, the
    packing done once before the timing and left out of it, so the tuner ranks what a
    prepacked kernel costs. It is another objective, so another task (its own
    ``workload_key``; the name says "prepacked"); `tuning.prepacked_best` and ``tecomp
    export`` give its best as a kernel plus its pre-transform. CPU targets only.
    """

    def __init__(self, func: Callable[..., Sequence[Tensor]], args: Sequence[Any] = (),
                 target: str = "llvm", name: str | None = None, prepack: bool = False) -> None:
        if workload_name(func) not in _WORKLOADS:
            raise TuningError(f"{func.__qualname__} is not a registered workload; decorate it "
                              "with @tuning.register_workload (or @tuning.template)")
        check_arguments(func, args)
        self._setup(func, workload_name(func), args, target, name or f"{func.__name__}{tuple(args)!r}", prepack)
        self._init_dag(None)

    @classmethod
    def from_dag(cls, dag: dict[str, Any], workload: str, args: Sequence[Any] = (),
                 target: str = "llvm", name: str | None = None, prepack: bool = False) -> SearchTask:
        """The task of a serialized compute DAG (`tecomp.te.serialize.dag_to_json` of the
        workload's tensors), without the function that declared it: how measurement workers
        and readers of a log rebuild a workload they cannot import. ``workload`` is the name
        the records are filed under ("module:qualname")."""
        task = cls.__new__(cls)
        short = workload.split(":")[-1].split(".")[-1]
        task._setup(None, workload, args, target, name or f"{short}{tuple(args)!r}", prepack)
        task._init_dag(dag)
        return task

    def _setup(self, func: Callable[..., Any] | None, workload: str, args: Sequence[Any],
               target: str, name: str, prepack: bool = False) -> None:
        from tecomp.codegen.target import Target

        self.func = func
        self.args = tuple(args)
        tgt = Target.parse(target)
        if prepack and tgt.is_gpu:
            raise TuningError(f"prepack=True is for CPU targets; {tgt} kernels read their weights "
                              "in the layout they are given")
        self.target = str(tgt)
        self.workload = workload
        self.prepack = bool(prepack)
        name = name.replace(",)", ")")
        self.name = f"{name} prepacked" if prepack and not name.endswith(" prepacked") else name

    def _init_dag(self, dag: dict[str, Any] | None) -> None:
        self.is_template = self.func is not None and is_template(self.func)
        self.config_space: ConfigSpace | None = None
        if dag is not None:
            from tecomp.errors import TecompError
            from tecomp.te.serialize import dag_from_json

            try:
                tensors = dag_from_json(dag)
            except TecompError as e:
                raise TuningError(f"workload {self.workload}: {e}") from None
            self._dag = dag
        elif self.is_template:
            from .template import discover

            assert self.func is not None
            # the DAG is what the template returns for its default config; the same call
            # records the knobs it defines
            self.config_space, tensors = discover(self.func, self.args, self.workload)
        else:
            assert self.func is not None
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
        if self.prepack:  # another objective: records of the two must never meet
            text = f"prepacked weights\n{text}"
        h = hashlib.sha256(f"{text}\nargs={self.args!r}\ntarget={self.target}".encode())
        self.workload_key = h.hexdigest()[:24]
        self.flop_ct = float(_flops(self.ops))

    def dag_json(self) -> dict[str, Any]:
        """The task's compute DAG as JSON data (`tecomp.te.serialize`); `from_dag` rebuilds
        the same task from it."""
        from tecomp.errors import TecompError
        from tecomp.te.serialize import dag_to_json

        if self._dag is None:
            try:
                self._dag = dag_to_json(self.tensors)
            except TecompError as e:
                raise TuningError(f"workload {self.workload} cannot be shipped to measurement "
                                  f"workers: {e}") from None
        return self._dag

    _dag: dict[str, Any] | None = None

    # Pickling (to measurement workers): a workload travels as its DAG, never as the function,
    # so no worker imports the user's module (a script would run again; a notebook cell cannot
    # be imported). A template's schedule *is* code: its function travels by value
    # (cloudpickle), which defines it in the worker without importing the user's __main__.
    def __getstate__(self) -> dict[str, Any]:
        state: dict[str, Any] = {"workload": self.workload, "args": self.args,
                                 "target": self.target, "name": self.name, "prepack": self.prepack}
        if self.is_template:
            import cloudpickle

            state["template"] = cloudpickle.dumps(self.func)
        else:
            state["dag"] = self.dag_json()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        func = None
        if "template" in state:
            import pickle

            func = pickle.loads(state["template"])  # noqa: S301 - our own parent process's bytes
            _WORKLOADS.setdefault(state["workload"], func)
        self._setup(func, state["workload"], state["args"], state["target"], state["name"],
                    state.get("prepack", False))
        self._init_dag(state.get("dag"))

    def __repr__(self) -> str:
        return f"SearchTask({self.name}, target={self.target!r}, key={self.workload_key})"

    def to_json(self) -> dict[str, Any]:
        return {"workload": self.workload, "args": list(self.args), "target": self.target,
                "key": self.workload_key, **({"prepack": True} if self.prepack else {})}

    @staticmethod
    def from_json(d: dict[str, Any], dag: dict[str, Any] | None = None) -> SearchTask:
        """The task a record was written for: from ``dag`` (the log's copy of the computation)
        when given and the task is not a template, else by importing its workload by name."""
        args = tuple(tuple(a) if isinstance(a, list) else a for a in d["args"])
        prepack = d.get("prepack", False) is True
        if dag is not None:
            return SearchTask.from_dag(dag, d["workload"], args, d["target"], d.get("name"), prepack)
        func = lookup_workload(d["workload"])
        return SearchTask(func, args, d["target"], prepack=prepack)

    # schedules ------------------------------------------------------------------------------
    def create_schedule(self) -> Schedule:
        """The default schedule (every stage at root, loops in declaration order).

        For a template too: it is the reference that measurements are checked against.
        """
        return te.create_schedule(self.outputs)

    def make_space(self) -> SearchSpace:
        """The space the tuner searches: sketches derived from the DAG (`SearchSpace`, or the
        space registered for the target's kind: `tuning.gpu_space` for cuda), or the knobs of
        a template (`tuning.template.TemplateSpace`)."""
        if self.is_template:
            from .template import TemplateSpace

            return TemplateSpace(self)
        from .space import space_for  # not at the top: tuning.space imports this module

        return space_for(self)

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

        Its arguments are the task's own. For a prepack task (ranked with its weights packed
        outside the kernel) that kernel packs them itself, once per call at root
        (`tuning.prepack.packed_once_steps`); `tuning.prepacked_best` gives the ranked kernel
        on packed weights and the pre-transform that packs them, to run once.

        Raises `tuning.records.NoValidRecordError` when the log has none for this task.
        """
        from .records import best_record

        rec = best_record(log, self)
        if self.prepack:
            from .prepack import packed_once_steps

            return packed_once_steps(self, rec.steps)
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

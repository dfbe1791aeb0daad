"""Schedule steps: the tuner's search state as plain data.

A candidate schedule is a tuple of steps. Each step is a frozen dataclass that names its stage
by operation name (``"C"``, ``"C.local"`` after a cache_write, ``"C.rf"`` after an rfactor)
and its loops by position in that stage's current leaf list, so the same tuple replays onto a
fresh ``te.create_schedule`` of the task's DAG in any process (Ansor's "serializable history
for replay"). Steps are hashable (dedupe of measured candidates) and round-trip through JSON
(records).

>>> steps = (SplitStep("C", 0, (4, 8)), AnnotationStep("C", 2, "vectorize"))
>>> steps_from_json(steps_to_json(steps)) == steps
True
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from tecomp.errors import ScheduleError
from tecomp.te.schedule import Schedule, Stage
from tecomp.te.tensor import ComputeOp, IterVar

if TYPE_CHECKING:
    from .task import SearchTask


class State:
    """A schedule under construction and the steps applied to it so far.

    The search builds candidates through a State, so every choice it makes is checked by the
    real schedule primitives at once, and the recorded steps are exactly what replays.
    """

    def __init__(self, task: SearchTask) -> None:
        self.task = task
        self.sch: Schedule = task.create_schedule()
        self.steps: list[Step] = []

    def stage(self, name: str) -> Stage:
        for st in self.sch.stages:
            if st.op.name == name:
                return st
        raise ScheduleError(f"no stage named {name!r} (stages: "
                            f"{', '.join(s.op.name for s in self.sch.stages)})")

    def has_stage(self, name: str) -> bool:
        return any(st.op.name == name for st in self.sch.stages)

    def leaves(self, name: str) -> list[IterVar]:
        return list(self.stage(name).leaf_iter_vars)

    def index(self, name: str, iv: IterVar) -> int:
        for k, x in enumerate(self.stage(name).leaf_iter_vars):
            if x is iv:
                return k
        raise ScheduleError(f"stage {name}: axis {iv.name} is not a leaf")

    def apply(self, step: Step) -> Any:
        out = step.apply(self)
        self.steps.append(step)
        return out


def _leaf(state: State, stage: str, axis: int) -> IterVar:
    leaves = state.stage(stage).leaf_iter_vars
    if not 0 <= axis < len(leaves):
        raise ScheduleError(f"stage {stage}: no leaf axis #{axis} (it has {len(leaves)})")
    return leaves[axis]


@dataclass(frozen=True)
class Step(abc.ABC):
    """One schedule primitive applied to a stage named ``stage``."""

    KIND: ClassVar[str] = ""
    stage: str

    @abc.abstractmethod
    def apply(self, state: State) -> Any:
        """Apply the primitive to ``state.sch`` (raises ScheduleError when it does not fit)."""

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.KIND}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            d[f.name] = list(v) if isinstance(v, tuple) else v
        return d


@dataclass(frozen=True)
class SplitStep(Step):
    """Split leaf ``axis`` into ``len(factors) + 1`` loops; ``factors`` are the extents of the
    inner loops, outermost first (the outermost loop covers the rest, rounded up)."""

    KIND: ClassVar[str] = "split"
    axis: int
    factors: tuple[int, ...]

    def apply(self, state: State) -> list[IterVar]:
        st = state.stage(self.stage)
        iv = _leaf(state, self.stage, self.axis)
        out: list[IterVar] = []
        for k in range(len(self.factors)):
            # split by the product of the remaining inner extents: inner splits then divide
            # exactly and only the outermost split may need a tail guard
            rest = 1
            for f in self.factors[k:]:
                rest *= int(f)
            outer, iv = st.split(iv, factor=rest)
            out.append(outer)
        out.append(iv)
        return out


@dataclass(frozen=True)
class ReorderStep(Step):
    """New leaf order: ``order[k]`` is the old position of the loop that becomes k-th."""

    KIND: ClassVar[str] = "reorder"
    order: tuple[int, ...]

    def apply(self, state: State) -> None:
        st = state.stage(self.stage)
        leaves = st.leaf_iter_vars
        if sorted(self.order) != list(range(len(leaves))):
            raise ScheduleError(f"stage {self.stage}: reorder {self.order} is not a permutation "
                                f"of its {len(leaves)} leaves")
        st.reorder(*[leaves[k] for k in self.order])


@dataclass(frozen=True)
class FuseStep(Step):
    """Fuse consecutive leaves ``axes`` (outermost first) into one loop."""

    KIND: ClassVar[str] = "fuse"
    axes: tuple[int, ...]

    def apply(self, state: State) -> IterVar:
        st = state.stage(self.stage)
        return st.fuse(*[_leaf(state, self.stage, a) for a in self.axes])


@dataclass(frozen=True)
class AnnotationStep(Step):
    """Mark leaf ``axis`` as ``"vectorize"``, ``"parallel"`` or ``"unroll"``."""

    KIND: ClassVar[str] = "annotate"
    axis: int
    annotation: str

    def apply(self, state: State) -> None:
        st = state.stage(self.stage)
        iv = _leaf(state, self.stage, self.axis)
        if self.annotation == "vectorize":
            st.vectorize(iv)
        elif self.annotation == "parallel":
            st.parallel(iv)
        elif self.annotation == "unroll":
            st.unroll(iv)
        else:
            raise ScheduleError(f"unknown annotation {self.annotation!r}")


@dataclass(frozen=True)
class PragmaStep(Step):
    """A pragma on leaf ``axis``, e.g. ``("auto_unroll_max_step", 64)``."""

    KIND: ClassVar[str] = "pragma"
    axis: int
    key: str
    value: int

    def apply(self, state: State) -> None:
        state.stage(self.stage).pragma(_leaf(state, self.stage, self.axis), self.key, self.value)


@dataclass(frozen=True)
class ComputeAtStep(Step):
    """Compute ``stage`` inside leaf ``target_axis`` of stage ``target``."""

    KIND: ClassVar[str] = "compute_at"
    target: str
    target_axis: int

    def apply(self, state: State) -> None:
        tgt = state.stage(self.target)
        state.stage(self.stage).compute_at(tgt, _leaf(state, self.target, self.target_axis))


@dataclass(frozen=True)
class ComputeInlineStep(Step):
    KIND: ClassVar[str] = "compute_inline"

    def apply(self, state: State) -> None:
        state.stage(self.stage).compute_inline()


@dataclass(frozen=True)
class ComputeRootStep(Step):
    KIND: ClassVar[str] = "compute_root"

    def apply(self, state: State) -> None:
        state.stage(self.stage).compute_root()


@dataclass(frozen=True)
class CacheWriteStep(Step):
    """Compute ``stage`` into a new stage ``"<stage>.<scope>"``; ``stage`` becomes a copy."""

    KIND: ClassVar[str] = "cache_write"
    scope: str = "local"

    def apply(self, state: State) -> None:
        st = state.stage(self.stage)
        state.sch.cache_write(st.op.output(0), self.scope)


@dataclass(frozen=True)
class CacheReadStep(Step):
    """Copy ``stage``'s output into ``"<stage>.<scope>"``, read by the stages ``readers``."""

    KIND: ClassVar[str] = "cache_read"
    scope: str
    readers: tuple[str, ...]

    def apply(self, state: State) -> None:
        st = state.stage(self.stage)
        state.sch.cache_read(st.op.output(0), self.scope, [state.stage(r).op for r in self.readers])


@dataclass(frozen=True)
class LayoutCacheReadStep(Step):
    """Copy ``stage``'s output into ``"<stage>.<scope>"`` with its dimensions stored in the
    order ``order`` (dimension k of the copy is dimension ``order[k]`` of ``stage``), read by
    the stages ``readers`` (`tecomp.te.layout.cache_read_layout`): a weight repacked so the
    loop that gets vectorized walks it contiguously."""

    KIND: ClassVar[str] = "cache_read_layout"
    scope: str
    readers: tuple[str, ...]
    order: tuple[int, ...]

    def apply(self, state: State) -> None:
        from tecomp.te.layout import cache_read_layout

        st = state.stage(self.stage)
        cache_read_layout(state.sch, st.op.output(0), self.scope,
                          [state.stage(r).op for r in self.readers], self.order)


@dataclass(frozen=True)
class LayoutCacheWriteStep(Step):
    """Compute ``stage`` into ``"<stage>.<scope>"`` whose axis k is axis ``order[k]`` of
    ``stage`` (`tecomp.te.layout.cache_write_layout`); ``stage`` becomes the copy back."""

    KIND: ClassVar[str] = "cache_write_layout"
    scope: str
    order: tuple[int, ...]

    def apply(self, state: State) -> None:
        from tecomp.te.layout import cache_write_layout

        st = state.stage(self.stage)
        cache_write_layout(state.sch, st.op.output(0), self.scope, self.order)


@dataclass(frozen=True)
class RfactorStep(Step):
    """rfactor the reduction leaf ``axis`` into a new stage ``"<stage>.rf"``; the spatial
    axis it becomes sits at position ``factor_axis`` of the new stage."""

    KIND: ClassVar[str] = "rfactor"
    axis: int
    factor_axis: int

    def apply(self, state: State) -> None:
        st = state.stage(self.stage)
        if not isinstance(st.op, ComputeOp):
            raise ScheduleError(f"rfactor: {self.stage} is not a compute stage")
        state.sch.rfactor(st.op.output(0), _leaf(state, self.stage, self.axis), self.factor_axis)


@dataclass(frozen=True)
class BindStep(Step):
    """Bind leaf ``axis`` to the GPU thread index ``tag`` ("blockIdx.x", "threadIdx.x",
    "vthread"). Each bind makes its own ``te.thread_axis``: loops of one tag then may differ
    in extent (the launch takes the largest, the narrower loops are masked), which one shared
    thread_axis object would refuse."""

    KIND: ClassVar[str] = "bind"
    axis: int
    tag: str

    def apply(self, state: State) -> None:
        from tecomp import te

        st = state.stage(self.stage)
        st.bind(_leaf(state, self.stage, self.axis), te.thread_axis(self.tag))


@dataclass(frozen=True)
class StorePredicateStep(Step):
    """Store the stage's results only on thread 0 of its loop bound to ``tag`` (TVM's
    ``set_store_predicate(tx.var.equal(0))``): after a cross-thread reduction every thread
    holds the result, one writes it."""

    KIND: ClassVar[str] = "store_predicate"
    tag: str

    def apply(self, state: State) -> None:
        st = state.stage(self.stage)
        for leaf in st.leaf_iter_vars:
            a = st.iter_var_attrs.get(leaf)
            if a is not None and a.bind_thread is not None and a.bind_thread.thread_tag == self.tag:
                st.set_store_predicate(a.bind_thread.var.equal(0))
                return
        raise ScheduleError(f"stage {self.stage}: no loop is bound to {self.tag}")


def _tuplify(v: Any) -> Any:
    return tuple(_tuplify(x) for x in v) if isinstance(v, (list, tuple)) else v


def _listify(v: Any) -> Any:
    return [_listify(x) for x in v] if isinstance(v, (list, tuple)) else v


@dataclass(frozen=True)
class TemplateConfigStep(Step):
    """The knob values of a user-written template (`tuning.template`): a whole candidate.

    A template task replays it by calling the template with this config rather than by
    applying primitives to a `State`; ``stage`` is unused. ``config`` holds ``(knob, value)``
    pairs, sorted by knob, with lists turned into tuples so that the step stays hashable and
    equal to itself after a JSON round trip.

    >>> TemplateConfigStep((("unroll", 1), ("tile_i", [4, 2, 8]))).config
    (('tile_i', (4, 2, 8)), ('unroll', 1))
    """

    KIND: ClassVar[str] = "template_config"
    config: tuple[tuple[str, Any], ...]
    # keyword-only with a default, so the config is the one positional argument
    stage: str = field(default="", kw_only=True)

    def __post_init__(self) -> None:
        items = self.config.items() if isinstance(self.config, Mapping) else self.config
        pairs = [(str(k), _tuplify(v)) for k, v in items]
        names = [k for k, _ in pairs]
        if len(set(names)) != len(names):
            raise ValueError(f"template config names a knob twice: {names}")
        object.__setattr__(self, "config", tuple(sorted(pairs, key=lambda kv: kv[0])))

    def apply(self, state: State) -> None:
        from .task import TuningError

        raise TuningError(f"task {state.task.name} is not a template: a TemplateConfigStep (knob "
                          "values) only replays onto a task built from a @tuning.template function")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.KIND, "stage": self.stage,
                "config": [[k, _listify(v)] for k, v in self.config]}


# serialisation ------------------------------------------------------------------------------


def _step_classes() -> dict[str, type[Step]]:
    """Step kinds by name, found by walking subclasses (tests may define their own steps)."""
    out: dict[str, type[Step]] = {}
    todo: list[type[Any]] = [Step]
    while todo:
        cls = todo.pop()
        sub: type[Step]
        for sub in cls.__subclasses__():
            if sub.KIND:
                out[sub.KIND] = sub
            todo.append(sub)
    return out


def step_from_json(d: dict[str, Any]) -> Step:
    classes = _step_classes()
    kind = d.get("kind")
    cls = classes.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown step kind {kind!r}")
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in d:
            raise ValueError(f"step {kind}: missing field {f.name!r}")
        v = d[f.name]
        kwargs[f.name] = tuple(v) if isinstance(v, list) else v
    return cls(**kwargs)


def steps_to_json(steps: Sequence[Step]) -> list[dict[str, Any]]:
    return [s.to_json() for s in steps]


def steps_from_json(items: Sequence[dict[str, Any]]) -> tuple[Step, ...]:
    return tuple(step_from_json(d) for d in items)


def steps_key(steps: Sequence[Step]) -> str:
    """A digest of a step list, stable across processes (dedupe of measured candidates)."""
    text = json.dumps(steps_to_json(steps), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


__all__ = [
    "AnnotationStep", "BindStep", "CacheReadStep", "CacheWriteStep", "ComputeAtStep", "ComputeInlineStep",
    "ComputeRootStep", "FuseStep", "LayoutCacheReadStep", "LayoutCacheWriteStep", "PragmaStep", "ReorderStep",
    "RfactorStep", "SplitStep",
    "State", "Step", "StorePredicateStep", "TemplateConfigStep", "step_from_json", "steps_from_json",
    "steps_key", "steps_to_json",
]

"""The one-pass sketch of row normalisations (issue 18): layer norm, RMSNorm, group norm, and
any DAG of the same shape -- reductions over a row (a group, a channel) that feed one
elementwise output over the same row.

Such an operator is memory bound: what it costs is how often each row comes from DRAM. The
generic "producers at outer loops" sketch of `tuning.space` computes the producers at the
output's outermost loop: a row for layer norm, but the whole tensor for group norm (``n``,
of extent 1: three passes over it, and nothing to run in parallel), and it leaves the
vector lanes of the partial sums to a dozen knobs drawn at random. This rule builds the
structure directly and leaves only the knobs that matter to the tuner:

* the output's leading axes that the statistics are indexed by (``i`` of ``total[i]``) are
  the *row loop*; an axis read through ``c // q`` (group norm's ``[n, c // (C / G)]``) is
  split by ``q`` first, so that the row loop walks whole groups;
* every other stage of the DAG (the reductions, an elementwise stage such as softmax's ``e``)
  is computed at the row loop, so a row is read from DRAM once and re-read from cache;
* each reduction splits its innermost reduce axis into ``lanes`` (a knob: 8 to 64, i.e. one to
  eight AVX2 registers of independent accumulators) and is rfactored over them: the partial
  sums are a vectorised loop over the lanes, and only ``lanes`` scalars are added per row;
* the row loops (after the split) are fused into one parallel loop, or only the outer ones
  (a knob), and the output's innermost axis is vectorised (a knob).

The sketch is appended after the generic ones (records name sketches by index) and is one
alternative among them: the tuner keeps whichever measures fastest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tecomp.errors import TecompError
from tecomp.ir.expr import Expr, FloorDiv, IntImm, Var
from tecomp.lowering.inline import effective_bodies
from tecomp.te.tensor import ComputeOp, IterVar

from .space_rules import _extent, _scan
from .steps import (
    AnnotationStep,
    ComputeAtStep,
    ComputeInlineStep,
    FuseStep,
    PragmaStep,
    ReorderStep,
    RfactorStep,
    SplitStep,
    State,
)

if TYPE_CHECKING:
    from .space import Sketch, StagePlan, _Builder
    from .task import SearchTask

# accumulator lanes of a row reduction: 8 is one AVX2 register, 64 eight of them (independent
# add chains hide the add latency); AVX-512 machines take the same values as 4 or fewer zmm.
# Only those that divide the reduce axis are offered : a tail makes the lanes' loop
# guarded, and group norm's W = 56 then still has 8 and 56 (7 registers, the whole row)
LANE_CHOICES = tuple(range(8, 65, 8))
OUT_VECTOR_CHOICES = (8, 16, 32, 64)
ROW_UNROLL_CHOICES = (0, 16, 64)
# plan kinds of the sketch (`StagePlan.kind`): "row_reduce" (rfactored over lanes, at the row
# loop), "row_stage" (an elementwise producer at the row loop), "row_loop" (the output)
ROW_KINDS = frozenset({"row_reduce", "row_stage", "row_loop"})


@dataclass(frozen=True)
class RowChain:
    """What the rule found: the output, the stages computed at its row loop, how many of its
    leading axes make the row loop, and the factor the last of them is split by (1: none)."""

    output: str
    reductions: tuple[str, ...]
    elementwise: tuple[str, ...]
    depth: int
    group: int


def _index_use(idx: Expr, axes: Sequence[Var]) -> tuple[int, int] | None:
    """``(position of the axis, divisor)`` when ``idx`` is an axis or ``axis // q``; None for
    anything else (a shifted or mixed index: the rule does not apply)."""
    # IR expressions compare structurally into new expressions: match the axes by identity
    pos = [k for k, a in enumerate(axes) if a is idx]
    if pos:
        return pos[0], 1
    if isinstance(idx, FloorDiv) and isinstance(idx.b, IntImm):
        pos = [k for k, a in enumerate(axes) if a is idx.a]
        if pos:
            return pos[0], int(idx.b.value)
    return None


def find_row_chain(task: SearchTask, state: State) -> RowChain | None:
    """The row structure of ``task`` (with its injective stages already inlined in ``state``),
    or None when the DAG is not "reductions over a row feeding one elementwise output"."""
    sch = state.sch
    outputs = [op.name for op in task.outputs]
    if len(outputs) != 1:
        return None
    live = [st for st in sch.stages if isinstance(st.op, ComputeOp) and st.attach_type != "inline"]
    by_name = {st.op.name: st for st in live}
    out = by_name.get(outputs[0])
    if out is None:
        return None
    oop = out.op
    assert isinstance(oop, ComputeOp)
    if oop.reduce_axis or oop.num_outputs != 1 or len(oop.axis) < 2:
        return None
    bodies = effective_bodies(sch)
    out_axes = [a.var for a in oop.axis]
    out_ext = [_extent(a) for a in oop.axis]
    reductions: list[str] = []
    elementwise: list[str] = []
    for st in live:
        op = st.op
        assert isinstance(op, ComputeOp)
        if st is out:
            continue
        if op.num_outputs != 1:
            return None
        if op.reduce_axis:
            reductions.append(op.name)
        elif [_extent(a) for a in op.axis] == out_ext:
            elementwise.append(op.name)  # softmax's e: a row buffer, read at the output's axes
        else:
            return None
    if not reductions:
        return None
    # the bodies that index the statistics in terms of the output's axes: the output's own, and
    # those of the elementwise stages, which it must read at its own axes (their axes then stand
    # for the output's, position by position)
    readers: list[tuple[list[Expr], list[Var]]] = [(bodies[out], out_axes)]
    for name in elementwise:
        loads = [ld for ld in _scan(bodies[out]).loads if ld.producer.op.name == name]
        if not loads or any(len(ld.indices) != len(out_axes)
                            or any(i is not a for i, a in zip(ld.indices, out_axes)) for ld in loads):
            return None
        eop = by_name[name].op
        assert isinstance(eop, ComputeOp)
        readers.append((bodies[by_name[name]], [a.var for a in eop.axis]))
    uses: dict[int, int] = {}
    for body, axes in readers:
        for ld in _scan(body).loads:
            if ld.producer.op.name not in reductions:
                continue
            for idx in ld.indices:
                use = _index_use(idx, axes)
                if use is None:
                    return None
                pos, q = use
                if uses.setdefault(pos, q) != q:
                    return None
    # the reductions must be read by the chain only (another output or stage reading them
    # would see partial rows), and read each with the same axes in every body
    for name in reductions:
        for st in live:
            if st.op.name not in (*reductions, *elementwise, out.op.name) and any(
                    t.op.name == name for t in st.op.input_tensors):
                return None
    if not uses:
        return None
    depth = max(uses) + 1
    if sorted(uses) != list(range(depth)) or depth >= len(out_axes):
        return None  # a statistic per element, or an axis skipped: not a row
    if any(q != 1 for p, q in uses.items() if p != depth - 1):
        return None
    group = uses[depth - 1]
    if out_ext[depth - 1] % group:
        return None
    return RowChain(out.op.name, tuple(reductions), tuple(elementwise), depth, group)


def row_sketches(task: SearchTask, base: Sequence[Sketch], with_elementwise: bool = False) -> list[Sketch]:
    """``base`` with the one-pass row sketch appended when ``task`` has the row structure.

    A chain with an elementwise stage of its own (softmax: ``e = exp(x - max)``, kept as a row
    buffer because two stages read it) gets the sketch only with ``with_elementwise``: the
    generic "producers at outer loops" sketch already computes such a chain a row at a time
    (its stages have no group axis to split), on softmax 1536x128 the row sketch's best in a
    64-trial tune was no faster than that sketch's (0.219 vs 0.221 ms, a loaded machine), and
    one more sketch would dilute the sampling of the ones that win there."""
    from .space import Sketch, StagePlan, inline_injective  # here: space.py imports this module

    state = State(task)
    outputs = {op.name for op in task.outputs}
    inline = inline_injective(state, outputs)  # as `generate_sketches` does
    chain = find_row_chain(task, state)
    if chain is None or (chain.elementwise and not with_elementwise):
        return list(base)
    plans = ([StagePlan(n, "inline") for n in inline] + [StagePlan(n, "row_reduce") for n in chain.reductions]
             + [StagePlan(n, "row_stage") for n in chain.elementwise] + [StagePlan(chain.output, "row_loop")])
    return [*base, Sketch(tuple(plans))]


def is_row_sketch(sketch: Sketch) -> bool:
    """Whether ``sketch`` is this rule's (`build_row_sketch` applies it, not `_Builder.build`)."""
    return any(p.kind in ROW_KINDS for p in sketch.plans)


def _knob(b: _Builder, key: str, options: Sequence[int]) -> int:
    """``b.choice`` for a knob with several legal values; a single one is no knob (mutating
    it could only hand back the parent, a wasted measurement)."""
    options = tuple(dict.fromkeys(options))
    return options[0] if len(options) == 1 else b.choice(key, options)


def build_row_sketch(b: _Builder, plans: Sequence[StagePlan]) -> None:
    """Apply a row sketch to ``b``'s state, with ``b``'s knobs (given, mutated or drawn)."""
    st: State = b.state
    reductions = [p.stage for p in plans if p.kind == "row_reduce"]
    elementwise = [p.stage for p in plans if p.kind == "row_stage"]
    out = next(p.stage for p in plans if p.kind == "row_loop")
    for p in plans:
        if p.kind == "inline":
            b.apply(ComputeInlineStep(p.stage))
    chain = find_row_chain(st.task, st)
    if chain is None or chain.output != out:
        raise TecompError("row sketch: the DAG no longer has its row structure")
    # reductions: lanes of independent accumulators, then rfactor over them
    for name in reductions:
        op = st.stage(name).op
        assert isinstance(op, ComputeOp)
        ext = _extent(op.reduce_axis[-1])
        lanes = [v for v in LANE_CHOICES if ext % v == 0] or [min(ext, LANE_CHOICES[0])]
        v = _knob(b, f"{name}/lanes", lanes)
        pos = st.index(name, op.reduce_axis[-1])
        b.apply(SplitStep(name, pos, (v,)))
        b.apply(RfactorStep(name, pos + 1, len(op.axis)))
    # the output: split the group axis, vectorise the innermost, fuse and parallelise the rows
    oop = st.stage(out).op
    assert isinstance(oop, ComputeOp)
    axes = list(oop.axis)
    depth = chain.depth
    row: list[IterVar] = axes[:depth]
    if chain.group > 1:
        outer, _ = b.apply(SplitStep(out, st.index(out, axes[depth - 1]), (chain.group,)))
        row = axes[:depth - 1] + [outer]
    last = axes[-1]
    ext = _extent(last)
    vopts = [v for v in OUT_VECTOR_CHOICES if ext % v == 0] + ([ext] if ext <= OUT_VECTOR_CHOICES[-1] else [])
    vf = _knob(b, f"{out}/vec", vopts or [1])
    if 1 < vf < ext:
        _, last = b.apply(SplitStep(out, st.index(out, last), (vf,)))
    if vf > 1:
        b.apply(AnnotationStep(out, st.index(out, last), "vectorize"))
    # fuse the last ``par`` row loops (group norm: n and the group) into one parallel loop; the
    # outer ones stay serial around it, and the statistics attach inside the fused loop
    par = _knob(b, f"{out}/par", range(1, len(row) + 1))
    first = st.index(out, row[len(row) - par])
    if par > 1:
        b.apply(FuseStep(out, tuple(range(first, first + par))))
    b.apply(AnnotationStep(out, first, "parallel"))
    u = b.choice(f"{out}/unroll", ROW_UNROLL_CHOICES)
    if u:
        b.apply(PragmaStep(out, first, "auto_unroll_max_step", u))
    # producers at the row loop, consumers' producers last (compute_at order does not matter,
    # lowering orders them by dependence)
    for name in elementwise:
        b.apply(ComputeAtStep(name, out, first))
        eop = st.stage(name).op
        assert isinstance(eop, ComputeOp)
        e_last = eop.axis[-1]
        if 1 < vf < _extent(e_last):
            _, e_last = b.apply(SplitStep(name, st.index(name, e_last), (vf,)))
        if vf > 1:
            b.apply(AnnotationStep(name, st.index(name, e_last), "vectorize"))
    for name in reductions:
        b.apply(ComputeAtStep(name, out, first))
        rf = f"{name}.rf"
        b.apply(ComputeAtStep(rf, out, first))
        rop = st.stage(rf).op
        assert isinstance(rop, ComputeOp)
        lane = rop.axis[-1]
        # lanes innermost: each step of the reduce loops adds one vector per accumulator
        order = list(rop.axis[:-1]) + list(rop.reduce_axis) + [lane]
        perm = [st.index(rf, iv) for iv in order]
        if perm != list(range(len(perm))):
            b.apply(ReorderStep(rf, tuple(perm)))
        b.apply(AnnotationStep(rf, st.index(rf, lane), "vectorize"))


__all__ = ["LANE_CHOICES", "RowChain", "build_row_sketch", "find_row_chain", "is_row_sketch", "row_sketches"]

"""Bound inference: the loop extents of every stage and the region each stage must produce.

Stages are visited consumers-first. A stage at root produces its whole domain. A stage computed
at loop ``iv`` of a consumer produces the union of the regions its readers touch while the loops
outside ``iv`` are fixed and the loops inside are relaxed to their ranges (interval analysis);
that region's extent, bounded by a constant where possible, sizes its buffer. The region never
exceeds the stage's own domain (reads outside it are in branches never taken, see `_window`).

On a GPU a loop bound to a thread index is not fixed for a buffer that several threads share
(TVM's InferBound): a "shared" buffer computed inside a ``threadIdx`` loop holds what the
whole block reads, so the enclosing ``threadIdx``/``vthread`` loops are relaxed too; a
"global" one also relaxes ``blockIdx``; a "local" one belongs to one thread and relaxes
nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..arith.interval import Interval, can_prove, const_bounds, eval_interval
from ..arith.simplify import simplify
from ..errors import LoweringError, ScheduleError
from ..ir.expr import (
    LE,
    LT,
    Expr,
    FloorDiv,
    FloorMod,
    IntImm,
    Max,
    Min,
    ProducerLoad,
    Var,
    const,
)
from ..ir.functor import ExprVisitor, free_vars, substitute
from ..te.schedule import Schedule, SingletonRel, SplitRel, Stage
from ..te.tensor import AxisVar, ComputeOp, IterVar, IterVarKind


@dataclass
class StageBounds:
    """Everything the loop-nest builder needs to know about one stage's iteration space."""

    root_min: dict[IterVar, Expr] = field(default_factory=dict)
    ext: dict[IterVar, Expr] = field(default_factory=dict)  # every iter var (root, derived)
    value: dict[IterVar, Expr] = field(default_factory=dict)  # offset from root min, in leaves
    conds: list[Expr] = field(default_factory=list)  # guards for non-divisible splits
    buf_min: list[Expr] = field(default_factory=list)  # realized region, per output dimension
    buf_ext: list[Expr] = field(default_factory=list)
    _root_values: dict[IterVar, Expr] = field(default_factory=dict, repr=False)

    def root_value(self, iv: IterVar) -> Expr:
        """The root axis ``iv`` in terms of the leaf loop vars (asked for several times per
        axis while lowering; simplifying it once saves ~a fifth of a tuning candidate's
        lowering). ``root_min`` and ``value`` are final once `derive` returns."""
        rv = self._root_values.get(iv)
        if rv is None:
            rv = self._root_values[iv] = simplify(self.root_min[iv] + self.value[iv])
        return rv


def _ceildiv(a: Expr, b: Expr) -> Expr:
    return simplify(FloorDiv(a + b - 1, b))


def _is_zero(e: Expr) -> bool:
    return isinstance(e, IntImm) and e.value == 0


def derive(st: Stage, root_min: dict[IterVar, Expr], root_ext: dict[IterVar, Expr]) -> StageBounds:
    """Pass extents down the split/fuse relations and values back up to the root axes."""
    b = StageBounds(root_min=dict(root_min))
    b.ext.update(root_ext)
    for rel in st.relations:
        if isinstance(rel, SplitRel):
            pe = b.ext[rel.parent]
            if rel.factor is not None:
                b.ext[rel.outer] = _ceildiv(pe, rel.factor)
                b.ext[rel.inner] = rel.factor
            else:
                assert rel.nparts is not None
                b.ext[rel.outer] = rel.nparts
                b.ext[rel.inner] = _ceildiv(pe, rel.nparts)
        elif isinstance(rel, SingletonRel):  # fuse() of no axes: one iteration, no root axis
            b.ext[rel.iv] = const(1)
        else:
            b.ext[rel.fused] = simplify(b.ext[rel.outer] * b.ext[rel.inner])
    for leaf in st.leaf_iter_vars:
        b.value[leaf] = leaf.var
    for rel in reversed(st.relations):
        if isinstance(rel, SplitRel):
            ie = b.ext[rel.inner]
            b.value[rel.parent] = simplify(b.value[rel.outer] * ie + b.value[rel.inner])
            rem = simplify(FloorMod(b.ext[rel.parent], ie)) if rel.factor is not None else None
            exact = rel.factor is not None and rem is not None and _is_zero(rem)
            if rel.nparts is not None:
                exact = _is_zero(simplify(FloorMod(b.ext[rel.parent], rel.nparts))) and _is_zero(
                    simplify(FloorMod(b.ext[rel.parent], ie)))
            if not exact:
                b.conds.append(LT(b.value[rel.parent], b.ext[rel.parent]))
        elif isinstance(rel, SingletonRel):
            continue
        else:
            ie = b.ext[rel.inner]
            b.value[rel.outer] = simplify(FloorDiv(b.value[rel.fused], ie))
            b.value[rel.inner] = simplify(FloorMod(b.value[rel.fused], ie))
    return b


class _Loads(ExprVisitor):
    """Reads of a stage's tensors (by its current op or the op it replaced)."""

    def __init__(self, st: Stage | object) -> None:
        self.ops = {id(st.op), id(st.origin_op)} if isinstance(st, Stage) else {id(st)}
        self.found: list[ProducerLoad] = []

    def visit_ProducerLoad(self, e: ProducerLoad) -> None:
        if id(e.producer.op) in self.ops:
            self.found.append(e)
        super().visit_ProducerLoad(e)


# thread tags whose loops a buffer of each scope is shared across (see the module docstring)
_RELAXED_TAGS = {
    "global": ("blockIdx.", "threadIdx.", "vthread"),
    "shared": ("threadIdx.", "vthread"),
    "local": (),
}


def infer_bounds(
    sch: Schedule,
    bodies: dict[Stage, list[Expr]],
    stages: list[Stage],
    scopes: dict[Stage, str] | None = None,
    fixed: dict[Stage, dict[int, tuple[Expr, Expr]]] | None = None,
) -> dict[Stage, StageBounds]:
    """Bounds of every non-inline compute stage in ``stages`` (topological order).

    ``scopes`` (GPU lowering only) gives each stage's storage scope, which decides which
    enclosing thread-bound loops its region is relaxed over. ``fixed`` narrows axes of root
    stages to ``(min, extent)`` (the stages of a scan body compute one time step: axis 0 is
    ``(t, 1)``).
    """
    out: dict[Stage, StageBounds] = {}
    readers: dict[Stage, list[Stage]] = {st: [] for st in stages}
    for st in stages:
        for other in stages:
            if other is not st and other in bodies:
                v = _Loads(st)
                for e in bodies[other]:
                    v.visit(e)
                if v.found:
                    readers[st].append(other)
    thread_ext: dict[IterVar, tuple[Expr, Stage, IterVar]] = {}  # thread axis -> first bound loop
    for st in reversed(stages):
        op = st.op
        assert isinstance(op, ComputeOp)
        root_min: dict[IterVar, Expr] = {}
        root_ext: dict[IterVar, Expr] = {}
        for r in op.reduce_axis:
            assert r.dom is not None
            root_min[r], root_ext[r] = r.dom.min, r.dom.extent
        if st.attach_type == "scope":
            relax = _RELAXED_TAGS.get(scopes.get(st, "local"), ()) if scopes is not None else ()
            mins, exts = _region(st, readers[st], bodies, out, relax)
        else:
            mins = [iv.dom.min for iv in op.axis]  # type: ignore[union-attr]
            exts = [iv.dom.extent for iv in op.axis]  # type: ignore[union-attr]
            for d, (mn, ex) in (fixed or {}).get(st, {}).items():
                mins[d], exts[d] = mn, ex
        for iv, mn, ex in zip(op.axis, mins, exts):
            root_min[iv], root_ext[iv] = mn, ex
        b = derive(st, root_min, root_ext)
        b.buf_min, b.buf_ext = list(mins), list(exts)
        if st.attach_type == "scope":
            # The region may poke outside the stage's domain (tails of a consumer's split);
            # never compute points that do not exist.
            for iv in op.axis:
                assert iv.dom is not None
                rv = b.root_value(iv)
                b.conds.append(LT(rv, iv.dom.min + iv.dom.extent))
                b.conds.append(LT(iv.dom.min - 1, rv))
        out[st] = b
        if scopes is not None:
            _check_thread_extents(st, b, thread_ext)
    return out


def _check_thread_extents(st: Stage, b: StageBounds,
                          seen: dict[IterVar, tuple[Expr, Stage, IterVar]]) -> None:
    """One ``te.thread_axis`` object is one hardware index with one extent (TVM's InferBound
    refuses it too): loops of different extents must be bound to different objects, whose
    launch extent is then the largest, the narrower loops masked (gpu_check)."""
    for leaf in st.leaf_iter_vars:
        a = st.iter_var_attrs.get(leaf)
        th = a.bind_thread if a is not None else None
        if th is None:
            continue
        ext = simplify(b.ext[leaf])
        prev = seen.setdefault(th, (ext, st, leaf))
        pext, pst, pleaf = prev
        same = (pext.value == ext.value if isinstance(pext, IntImm) and isinstance(ext, IntImm)
                else str(pext) == str(ext))
        if not same:
            raise ScheduleError(
                f"one te.thread_axis('{th.thread_tag}') is bound to loops of different extents: "
                f"'{pleaf.name}' of {pst.name} ({pext}) and '{leaf.name}' of {st.name} ({ext}); bind "
                f"them to separate te.thread_axis('{th.thread_tag}') objects (the launch takes the "
                "largest extent, and a narrower loop runs only on the threads below its extent)")


def _region(
    st: Stage,
    readers: list[Stage],
    bodies: dict[Stage, list[Expr]],
    done: dict[Stage, StageBounds],
    relax_tags: tuple[str, ...] = (),
) -> tuple[list[Expr], list[Expr]]:
    op = st.op
    assert isinstance(op, ComputeOp)
    parent, ivar = st.attach_stage, st.attach_ivar
    assert parent is not None and ivar is not None
    pos = parent.leaf_iter_vars.index(ivar)
    ndim = len(op.axis)
    lo: list[Expr | None] = [None] * ndim
    hi: list[Expr | None] = [None] * ndim
    unbounded = [False] * ndim
    fixed_ranges: dict[Var, tuple[Expr, Expr]] = {}
    p: Stage | None = parent
    while p is not None and p in done:
        for leaf in p.leaf_iter_vars:
            fixed_ranges[leaf.var] = (const(0), done[p].ext[leaf])
        p = p.attach_stage
    if not readers:
        raise LoweringError(f"stage {st.name} is computed at {parent.name} but nothing reads it")
    for c in readers:
        if c not in done:
            raise LoweringError(f"stage {st.name} is read by {c.name}, which is not lowered")
        relaxed: list[IterVar] = []
        chain = c
        while chain is not parent:
            relaxed_here = list(chain.leaf_iter_vars)
            nxt = chain.attach_stage
            if nxt is None:
                raise ScheduleError(
                    f"stage {st.name} is computed at {parent.name} (axis '{ivar.name}') but is "
                    f"also read by {c.name}, which is not inside that loop"
                )
            relaxed.extend(relaxed_here)
            if nxt is parent:
                at = parent.leaf_iter_vars.index(chain.attach_ivar)  # type: ignore[arg-type]
                if at < pos:
                    raise ScheduleError(
                        f"stage {st.name} is computed at {parent.name}.{ivar.name} but reader "
                        f"{c.name} sits outside that loop"
                    )
            chain = nxt
        dom: dict[Var, Interval] = {}
        cb = done[c]
        for leaf in relaxed:
            owner = _owner(leaf, c, parent, done)
            dom[leaf.var] = Interval.from_range(const(0), done[owner].ext[leaf])
        for leaf in parent.leaf_iter_vars[pos + 1:]:
            dom[leaf.var] = Interval.from_range(const(0), done[parent].ext[leaf])
        if relax_tags:
            # thread-bound loops at and outside the attach point: every thread of them reads
            # this buffer, so it must hold all their reads
            anc: Stage | None = parent
            upto = pos
            while anc is not None and anc in done:
                for leaf in anc.leaf_iter_vars[: upto + 1]:
                    a = anc.iter_var_attrs.get(leaf)
                    tag = a.bind_thread.thread_tag if a is not None and a.bind_thread is not None else ""
                    if tag.startswith(relax_tags):
                        dom[leaf.var] = Interval.from_range(const(0), done[anc].ext[leaf])
                nxt = anc.attach_stage
                if nxt is not None and anc.attach_ivar is not None:
                    upto = nxt.leaf_iter_vars.index(anc.attach_ivar)
                anc = nxt
        cop = c.op
        assert isinstance(cop, ComputeOp)
        vmap: dict[Var, Expr] = {iv.var: cb.root_value(iv) for iv in cop.axis + cop.reduce_axis}
        v = _Loads(st)
        for e in bodies[c]:
            v.visit(e)
        for ld in v.found:
            for d, idx in enumerate(ld.indices):
                iv_ = eval_interval(simplify(substitute(idx, vmap)), dom)
                if iv_.lo is None or iv_.hi is None:
                    unbounded[d] = True
                    continue
                lo[d] = iv_.lo if lo[d] is None else simplify(Min(lo[d], iv_.lo))  # type: ignore[arg-type]
                hi[d] = iv_.hi if hi[d] is None else simplify(Max(hi[d], iv_.hi))  # type: ignore[arg-type]
    mins: list[Expr] = []
    exts: list[Expr] = []
    for d, iv in enumerate(op.axis):
        assert iv.dom is not None
        if unbounded[d] or lo[d] is None or hi[d] is None:
            mins.append(iv.dom.min)
            exts.append(iv.dom.extent)
            continue
        mn, ex = _window(lo[d], hi[d], iv.dom.min, iv.dom.extent, fixed_ranges)  # type: ignore[arg-type]
        mins.append(mn)
        exts.append(ex)
    return mins, exts


def _window(lo: Expr, hi: Expr, dmin: Expr, dext: Expr,
            ranges: dict[Var, tuple[Expr, Expr]]) -> tuple[Expr, Expr]:
    """The buffer window ``(min, extent)`` of one dimension read at ``[lo, hi]`` (which may
    depend on the fixed loops around the attach point, ``ranges``) of a stage whose domain is
    ``[dmin, dmin + dext)``: the extent a constant where one bounds it.

    Reads outside the domain happen only in branches never taken (``if_then_else(i < n,
    X[i + k], 0)``, a reduction's ``where``), since the stage has no such points (TVM assumes
    the same when it intersects a read region with the tensor's shape); so the window only has
    to hold the reads clipped to the domain.
    """
    ex = simplify(hi - lo + 1)
    ub_raw = ex.value if isinstance(ex, IntImm) else const_bounds(ex, ranges)[1]
    ub_dom = const_bounds(dext, ranges)[1]
    if ub_raw is not None and (ub_dom is None or ub_raw <= ub_dom):
        # no larger than the domain: the reads' own window (clipping could only trim its ends,
        # at the price of a max() in every index of the buffer)
        return lo, ex if isinstance(ex, IntImm) else const(max(ub_raw, 1))
    cmn = _clip(lo, dmin, ranges, upper=False)
    cmx = _clip(hi, simplify(dmin + dext - 1), ranges, upper=True)
    known = [b for b in (ub_raw, ub_dom, const_bounds(simplify(cmx - cmn + 1), ranges)[1]) if b is not None]
    if known:
        return cmn, const(max(min(known), 1))
    if any(isinstance(v, AxisVar) for v in free_vars(ex)):
        # no constant bounds it (a symbolic size), and an allocation cannot depend on the loops
        # around it: the whole domain, from where the clipped reads start
        return cmn, dext
    return lo, ex


def _clip(e: Expr, bound: Expr, ranges: dict[Var, tuple[Expr, Expr]], upper: bool) -> Expr:
    """``min(e, bound)`` (``upper``) or ``max(e, bound)``, without the min/max where the loop
    ranges decide it, simplified under those ranges (the buffer's min is only used inside them;
    a region's ``min(i * 8 + j, 0)`` is 0 there, and loop_partition copes better with 0)."""
    inside, outside = (LE(e, bound), LE(bound, e)) if upper else (LE(bound, e), LE(e, bound))
    if can_prove(inside, ranges):
        return simplify(e, ranges)
    if can_prove(outside, ranges):
        return bound
    return simplify(Min(e, bound) if upper else Max(e, bound), ranges)


def _owner(leaf: IterVar, c: Stage, parent: Stage, done: dict[Stage, StageBounds]) -> Stage:
    s: Stage | None = c
    while s is not None:
        if leaf in done[s].ext:
            return s
        s = s.attach_stage
    return parent


def is_reduce_leaf(iv: IterVar) -> bool:
    return iv.kind == IterVarKind.REDUCE

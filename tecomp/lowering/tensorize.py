"""Tensorize: match a stage's inner loop nest against a tensor intrinsic and replace it.

The loops from the tensorized axis inward must cover, for each root axis, either nothing or one
whole inner loop whose extent equals the intrinsic's axis extent. The stage body, with its root
axes rewritten as ``fixed part + intrinsic axis``, must then equal the intrinsic's body up to
renaming its placeholders to the stage's tensors; each placeholder's tile origin is read off the
index expressions (what is left when the intrinsic axes are zero).
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

from ..arith.interval import can_prove
from ..arith.simplify import simplify
from ..errors import ScheduleError
from ..ir.expr import Expr, FloatImm, IntImm, ProducerLoad, Reduce, Var, const
from ..ir.functor import free_vars, substitute
from ..ir.stmt import Stmt
from ..te.schedule import Stage
from ..te.tensor import ComputeOp, IterVar, IterVarKind, Tensor
from ..te.tensor_intrin import TensorIntrin, TensorRegion

if TYPE_CHECKING:
    from .schedule_ops import Lowering


class _Mismatch(Exception):
    pass


class _Matcher:
    def __init__(self, ivars: dict[Var, Expr]) -> None:
        self.ivars = set(ivars)
        self.ranges = {v: (const(0), ext) for v, ext in ivars.items()}
        self.tmap: dict[Tensor, Tensor] = {}  # intrinsic placeholder -> stage tensor
        self.origin: dict[Tensor, list[Expr]] = {}  # tile origin, one entry per stage dim
        # (stage dim, intrinsic dim) pairs the tile spans, in order
        self.dims: dict[Tensor, list[tuple[int, int]]] = {}

    def match(self, a: Any, b: Any) -> None:
        if isinstance(a, ProducerLoad) and isinstance(b, ProducerLoad):
            self._load(a, b)
            return
        if isinstance(a, Var) or isinstance(b, Var):
            if a is not b:
                raise _Mismatch(f"{a} vs {b}")
            return
        if isinstance(a, (IntImm, FloatImm)):
            if type(a) is not type(b) or a.value != b.value or a.dtype != b.dtype:
                raise _Mismatch(f"{a} vs {b}")
            return
        if isinstance(a, Reduce):
            if not isinstance(b, Reduce):
                raise _Mismatch("reduction vs non-reduction")
            if a.combiner is not b.combiner and a.combiner.name != b.combiner.name:
                raise _Mismatch(f"reducer {a.combiner.name} vs {b.combiner.name}")
            for x, y in zip(a.source, b.source):
                self.match(x, y)
            return
        if isinstance(a, Expr):
            if type(a) is not type(b) or a.dtype != b.dtype:
                raise _Mismatch(f"{a} vs {b}")
            for f in fields(a):  # type: ignore[arg-type]
                self.match(getattr(a, f.name), getattr(b, f.name))
            return
        if isinstance(a, tuple):
            if not isinstance(b, tuple) or len(a) != len(b):
                raise _Mismatch("arity")
            for x, y in zip(a, b):
                self.match(x, y)
            return
        if a != b:
            raise _Mismatch(f"{a!r} vs {b!r}")

    def _load(self, a: ProducerLoad, b: ProducerLoad) -> None:
        t_stage, t_in = a.producer, b.producer
        prev = self.tmap.get(t_in)
        if prev is None:
            self.tmap[t_in] = t_stage
        elif prev is not t_stage:
            raise _Mismatch(f"{t_in.name} maps to both {prev.name} and {t_stage.name}")
        sa = [simplify(i, self.ranges) for i in a.indices]
        sb = [simplify(i, self.ranges) for i in b.indices]
        # dimensions the tile spans: those whose index moves with the intrinsic's axes
        da = [d for d, i in enumerate(sa) if free_vars(i) & self.ivars]
        db = [d for d, i in enumerate(sb) if free_vars(i) & self.ivars]
        if len(da) != len(db):
            raise _Mismatch(f"{t_stage.name} spans {len(da)} dimensions, {t_in.name} {len(db)}")
        for d_a, d_b in zip(da, db):
            diff = simplify(sa[d_a] - sb[d_b], self.ranges)
            if free_vars(diff) & self.ivars:
                raise _Mismatch(f"index {sa[d_a]} of {t_stage.name} does not follow {sb[d_b]}")
        zero = {v: const(0, v.dtype) for v in self.ivars}
        org = [simplify(substitute(i, zero)) for i in sa]
        old = self.origin.get(t_in)
        if old is None:
            self.origin[t_in] = org
            self.dims[t_in] = list(zip(da, db))
        elif any(not _is_zero(simplify(x - y)) for x, y in zip(old, org)):
            raise _Mismatch(f"{t_in.name} is read at two different tiles")


def _is_zero(e: Expr) -> bool:
    return isinstance(e, IntImm) and e.value == 0


def tensorize_stmt(lw: Lowering, st: Stage, pos: int, intrin: TensorIntrin) -> Stmt:
    return tensorize_parts(lw, st, pos, intrin)[0]


def tensorize_parts(lw: Lowering, st: Stage, pos: int, intrin: TensorIntrin) -> tuple[Stmt, Stmt | None]:
    """The tensorized body and the intrinsic's reset (None: initialise element-wise)."""
    op = st.op
    assert isinstance(op, ComputeOp)
    b = lw.bounds[st]
    leaves = st.leaf_iter_vars
    inner = leaves[pos:]
    inner_vars = {iv.var for iv in inner}
    axis_name = leaves[pos].name

    def err(msg: str) -> ScheduleError:
        return ScheduleError(f"stage {st.name}: cannot tensorize at axis '{axis_name}' with "
                             f"{intrin.name}: {msg}")

    zero_inner = {v: const(0, v.dtype) for v in inner_vars}
    parts: dict[IterVar, tuple[Expr, IterVar | None]] = {}
    for r in op.axis + op.reduce_axis:
        val = b.value[r]
        fixed = simplify(substitute(val, zero_inner))
        rest = simplify(val - fixed)
        if free_vars(rest) - inner_vars:
            raise err(f"axis '{r.name}' mixes outer and inner loops")
        leaf = None
        if not (isinstance(rest, IntImm) and rest.value == 0):
            leaf = next((iv for iv in inner if iv.var is rest), None)
            if leaf is None:
                raise err(f"axis '{r.name}' is not covered by a single inner loop ({rest})")
        parts[r] = (fixed, leaf)
    # A stage computed at a consumer's loop carries "inside the domain" conditions over the
    # consumer's loops too: prove them with the extents of every loop of the schedule.
    loop_ranges = {iv.var: (const(0), sb.ext[iv]) for s2, sb in lw.bounds.items()
                   for iv in s2.leaf_iter_vars if iv in sb.ext}
    for c in b.conds:
        if free_vars(c) & inner_vars and not can_prove(c, loop_ranges):
            raise err("the tensorized region has a partial tile (extent not divisible)")

    iop = intrin.op
    spatial = [r for r in op.axis if parts[r][1] is not None]
    reduce_ = [r for r in op.reduce_axis if parts[r][1] is not None]
    ispatial = [a for a in iop.axis if not _is_one(a)]
    ireduce = [a for a in iop.reduce_axis if not _is_one(a)]
    if len(spatial) != len(ispatial) or len(reduce_) != len(ireduce):
        raise err(f"the region has {len(spatial)} spatial and {len(reduce_)} reduction loops, "
                  f"the intrinsic {len(ispatial)} and {len(ireduce)}")
    vmap: dict[Var, Expr] = {}
    ivars: dict[Var, Expr] = {}
    for group, igroup in ((spatial, ispatial), (reduce_, ireduce)):
        for r, ia in zip(group, igroup):
            leaf = parts[r][1]
            assert leaf is not None and ia.dom is not None
            e1, e2 = simplify(b.ext[leaf]), simplify(ia.dom.extent)
            if not (isinstance(e1, IntImm) and isinstance(e2, IntImm) and e1.value == e2.value):
                raise err(f"loop '{leaf.name}' has extent {e1}, the intrinsic axis '{ia.name}' {e2}")
            vmap[r.var] = simplify(b.root_min[r] + parts[r][0]) + ia.var
            ivars[ia.var] = e2
    for r in op.axis + op.reduce_axis:
        if r.var not in vmap:
            vmap[r.var] = simplify(b.root_min[r] + parts[r][0])
    for ia in iop.axis + iop.reduce_axis:
        if _is_one(ia):
            vmap.setdefault(ia.var, const(0))
    m = _Matcher(ivars)
    body_s = lw.bodies[st]
    if len(body_s) != len(iop.body):
        raise err("different number of outputs")
    try:
        for x, y in zip(body_s, iop.body):
            ys = substitute(y, {ia.var: const(0) for ia in iop.axis + iop.reduce_axis if _is_one(ia)})
            m.match(substitute(x, vmap) if not isinstance(x, Reduce) else _subst_reduce(x, vmap), ys)
    except _Mismatch as e:
        raise err(f"body does not match ({e})") from None
    ins: list[TensorRegion] = []
    for t in intrin.inputs:
        ts = m.tmap.get(t)
        if ts is None:
            raise err(f"intrinsic input {t.name} is not read")
        buf, mins = lw.buffer_of(ts)
        org = [simplify(o - mn) for o, mn in zip(m.origin[t], mins)]
        ins.append(_region(buf, org, m.dims[t], tuple(t.shape)))
    outs = []
    span = [d for d, r in enumerate(op.axis) if parts[r][1] is not None]
    idims = [d for d, a in enumerate(iop.axis) if not _is_one(a)]
    for k in range(op.num_outputs):
        buf = lw.buffers[(st, k)]
        org = [simplify(parts[r][0]) for r in op.axis]
        outs.append(_region(buf, org, list(zip(span, idims)), tuple(iop.output(k).shape)))
    return intrin.implement_parts(ins, outs)


def _region(buf: Any, origin: list[Expr], dims: list[tuple[int, int]], shape: tuple[Expr, ...]) -> TensorRegion:
    """The tile at ``origin``; intrinsic dim ``j`` walks buffer dim ``i`` for (i, j) in dims."""
    strides = _strides(buf)
    off: Expr = const(0)
    for o, s in zip(origin, strides):
        off = off + o * s
    tile = [const(0)] * len(shape)  # unit dimensions of the intrinsic never move
    for i, j in dims:
        tile[j] = strides[i]
    return TensorRegion(buf, simplify(off), shape, tuple(tile))


def _subst_reduce(x: Reduce, vmap: dict[Var, Expr]) -> Reduce:
    return Reduce(x.combiner, tuple(substitute(s, vmap) for s in x.source), x.axis,
                  substitute(x.condition, vmap), x.value_index, x.init)


def _is_one(iv: IterVar) -> bool:
    return iv.dom is not None and isinstance(iv.dom.extent, IntImm) and iv.dom.extent.value == 1


def _strides(buf: Any) -> tuple[Expr, ...]:
    from ..passes.flatten import _strides as flat_strides

    return tuple(simplify(s) for s in flat_strides(buf))


__all__ = ["tensorize_parts", "tensorize_stmt", "IterVarKind"]

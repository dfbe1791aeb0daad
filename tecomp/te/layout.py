"""cache_read / cache_write with a permuted layout: the copy stores its dimensions in another order.

``cache_read_layout(s, W, "pack", [C], (1, 2, 3, 0))`` makes ``W.pack[ci, kh, kw, co] =
W[co, ci, kh, kw]`` and has ``C`` read ``W.pack`` with its indices permuted the same way, so a
loop over ``co`` walks the copy contiguously (a vector load instead of a gather).
``cache_write_layout(s, C, "local", (0, 2, 3, 1))`` computes ``C`` into ``C.local[n, h, w, c]``
(its axes in that order) and turns ``C`` into the copy ``C[n, c, h, w] = C.local[n, h, w, c]``:
the accumulator of a tile is then contiguous along ``c``. These are the layout rewrites of a
blocked convolution (the vector over output channels) expressed as schedule primitives, so the
user's arrays keep their layout and the transform is a stage of the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import ScheduleError
from ..ir.expr import Expr, ProducerLoad, Var, const
from .tensor import AxisVar, ComputeOp, IterVar, IterVarKind, Operation, Range, Tensor

if TYPE_CHECKING:
    from .schedule import Schedule


def _check_order(order: Sequence[int], ndim: int, what: str) -> tuple[int, ...]:
    out = tuple(int(k) for k in order)
    if sorted(out) != list(range(ndim)):
        raise ScheduleError(f"{what}: order {tuple(order)} is not a permutation of the "
                            f"{ndim} dimensions")
    return out


def cache_read_layout(sch: Schedule, tensor: Tensor, scope: str,
                      readers: Sequence[Tensor | Operation], order: Sequence[int]) -> Tensor:
    """Copy ``tensor`` into a new stage ``"<name>.<scope>"`` whose dimension ``k`` is the
    tensor's dimension ``order[k]``; ``readers`` read the copy (indices permuted alike)."""
    from .schedule import Stage, _ReplaceLoads

    src = sch[tensor]
    cur = src.op.output(tensor.value_index) if src.op is not tensor.op else tensor
    perm = _check_order(order, len(cur.shape), f"cache_read_layout of {tensor.name}")
    axis = [IterVar(Range(const(0, cur.shape[d].dtype), cur.shape[d]), AxisVar(f"ax{k}", "int32"),
                    IterVarKind.DATA_PAR) for k, d in enumerate(perm)]
    idx: list[Expr] = [const(0)] * len(perm)
    for k, d in enumerate(perm):
        idx[d] = axis[k].var
    cache_op = ComputeOp(f"{cur.op.name}.{scope}", axis, [cur[tuple(idx)]])
    cache_t = cache_op.output(0)
    reader_stages = [sch[r] for r in readers]
    if not reader_stages:
        raise ScheduleError(f"cache_read_layout of {tensor.name}: give at least one reader")
    src_ops = [o for o, s2 in sch._by_op.items() if s2 is src]
    for rs in reader_stages:
        if not any(sch._by_op.get(x.op) is src and x.value_index == cur.value_index
                   for x in rs.op.input_tensors):
            raise ScheduleError(f"cache_read_layout: stage {rs.name} does not read {tensor.name}")
    first = min(reader_stages, key=sch.stages.index)
    st = Stage(cache_op, sch)
    st.scope = scope
    sch._insert_stage(st, first)
    keys = {(id(o), cur.value_index) for o in src_ops}

    class _Permute(_ReplaceLoads):
        def visit_ProducerLoad(self, e: ProducerLoad) -> Expr:
            if (id(e.producer.op), e.producer.value_index) not in keys:
                return super().visit_ProducerLoad(e)
            old = [self.visit(i) for i in e.indices]
            return ProducerLoad(cache_t, tuple(old[d] for d in perm))

    for rs in reader_stages:
        op = rs.op
        assert isinstance(op, ComputeOp)
        m = _Permute({})
        new_op = ComputeOp(op.name, op.axis, [m.visit(b) for b in op.body], op.tag, op.attrs)
        new_op.reduce_axis = op.reduce_axis
        sch._replace_op(rs, new_op, keep_axes=True)
    return cache_t


def cache_write_layout(sch: Schedule, tensor: Tensor, scope: str, order: Sequence[int]) -> Tensor:
    """Compute ``tensor`` into a new stage ``"<name>.<scope>"`` whose axis ``k`` is the
    tensor's axis ``order[k]``; ``tensor``'s stage becomes a copy out of it."""
    from .schedule import Stage, _ReplaceLoads

    st = sch[tensor]
    op = st.op
    if not isinstance(op, ComputeOp):
        raise ScheduleError(f"cache_write_layout: {tensor.name} is a placeholder")
    if op.num_outputs != 1:
        raise ScheduleError(f"cache_write_layout: {op.name} has several outputs (unsupported)")
    if st.relations or any(a.kind for a in st.iter_var_attrs.values()):
        raise ScheduleError(f"cache_write_layout on stage {op.name} must come before other primitives")
    perm = _check_order(order, len(op.axis), f"cache_write_layout of {op.name}")
    var_map: dict[Var, Expr] = {}
    axis = []
    for d in perm:
        a = op.axis[d]
        na = IterVar(a.dom, AxisVar(a.var.name + ".c", a.var.dtype), a.kind)
        axis.append(na)
        var_map[a.var] = na.var
    m = _ReplaceLoads({}, var_map)
    cache_op = ComputeOp(f"{op.name}.{scope}", axis, [m.visit(b) for b in op.body])
    cache_t = cache_op.output(0)
    copy_op = ComputeOp(op.name, list(op.axis), [cache_t[tuple(op.axis[d].var for d in perm)]],
                        op.tag, op.attrs)
    cst = Stage(cache_op, sch)
    cst.scope = scope
    sch._insert_stage(cst, st)
    sch._replace_op(st, copy_op, keep_axes=False)
    return cache_t


__all__ = ["cache_read_layout", "cache_write_layout"]

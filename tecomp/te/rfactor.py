"""rfactor: factor a reduction into partial results along one reduction loop.

``rf = s.rfactor(C, ki)`` creates a stage computing ``rf[ki, i...] = reduce over the other
reduction loops`` and turns ``C`` into ``C[i...] = reduce over ki of rf[ki, i...]``. The partial
stage has ``ki`` as a spatial axis, so it can be vectorized or parallelized.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ScheduleError
from ..ir.expr import And, Expr, Reduce, Var, const
from ..ir.functor import substitute
from .tensor import AxisVar, ComputeOp, IterVar, IterVarKind, Range, Tensor

if TYPE_CHECKING:
    from .schedule import Schedule


def rfactor(sch: Schedule, tensor: Tensor, axis: IterVar,
            factor_axis: int = 0) -> Tensor | list[Tensor]:
    """Factor the reduction of ``tensor``'s stage along leaf ``axis``; see the module doc.

    A reduction with several values (a tuple reducer such as argmax) gives one partial
    tensor per value: the list is returned, as TVM's ``s.rfactor`` does. An ``init=`` stays
    on the final stage (the partial results start from the reducer's identity), so it is
    combined exactly once.
    """
    from ..arith.simplify import simplify
    from ..lowering.bound import derive
    from .schedule import Stage

    st = sch[tensor]
    op = st.op
    if not isinstance(op, ComputeOp) or not op.reduce_axis:
        raise ScheduleError(f"rfactor: stage {st.name} is not a reduction")
    st._leaf_index(axis, "rfactor")
    if axis.kind != IterVarKind.REDUCE:
        raise ScheduleError(f"stage {st.name}: rfactor axis '{axis.name}' is not a reduction axis")
    if not isinstance(factor_axis, int) or not 0 <= factor_axis <= len(op.axis):
        raise ScheduleError(
            f"stage {st.name}: rfactor factor_axis {factor_axis!r} out of range [0, {len(op.axis)}]")
    reds = op.body
    assert all(isinstance(r, Reduce) for r in reds)
    red = reds[0]
    assert isinstance(red, Reduce)
    nval = len(reds)
    root_min = {iv: iv.dom.min for iv in op.axis + op.reduce_axis}  # type: ignore[union-attr]
    root_ext = {iv: iv.dom.extent for iv in op.axis + op.reduce_axis}  # type: ignore[union-attr]
    b = derive(st, root_min, root_ext)
    red_leaves = [iv for iv in st.leaf_iter_vars if iv.kind == IterVarKind.REDUCE]

    # the partial-reduction stage
    sp_axes = [IterVar(a.dom, AxisVar(a.var.name, a.var.dtype), IterVarKind.DATA_PAR) for a in op.axis]
    rf_axis = IterVar(Range(const(0), b.ext[axis]), AxisVar(axis.var.name, "int32"), IterVarKind.DATA_PAR)
    rf_axes = list(sp_axes)
    rf_axes.insert(factor_axis, rf_axis)
    leaf_map: dict[Var, Expr] = {axis.var: rf_axis.var}
    new_red: list[IterVar] = []
    for lf in red_leaves:
        if lf is axis:
            continue
        nr = IterVar(Range(const(0), b.ext[lf]), AxisVar(lf.var.name, "int32"), IterVarKind.REDUCE)
        new_red.append(nr)
        leaf_map[lf.var] = nr.var
    vmap: dict[Var, Expr] = {a.var: n.var for a, n in zip(op.axis, sp_axes)}
    for r in op.reduce_axis:
        vmap[r.var] = simplify(substitute(b.root_value(r), leaf_map))
    red_var_set = {lf.var for lf in red_leaves}
    from ..ir.functor import free_vars

    cond: Expr = substitute(red.condition, vmap)
    for c in b.conds:
        if free_vars(c) & red_var_set:
            cond = And(cond, substitute(c, leaf_map))
    cond = simplify(cond)
    src = tuple(substitute(s, vmap) for s in red.source)
    # every value of a tuple reducer is one Reduce node over the same sources (value_index k)
    rf_op = ComputeOp(f"{op.name}.rf", rf_axes,
                      [Reduce(red.combiner, src, tuple(new_red), cond, k) for k in range(nval)])
    rf_ts = [rf_op.output(k) for k in range(nval)]

    # the final reduction over the factored axis
    out_axes = [IterVar(a.dom, AxisVar(a.var.name, a.var.dtype), IterVarKind.DATA_PAR) for a in op.axis]
    k_rf = IterVar(Range(const(0), b.ext[axis]), AxisVar(axis.var.name + ".v", "int32"), IterVarKind.REDUCE)
    idx: list[Expr] = [a.var for a in out_axes]
    idx.insert(factor_axis, k_rf.var)
    # an init may read the output's own axes (``init=I[i, j]``): re-point them at the new ones
    init_map: dict[Var, Expr] = {a.var: n.var for a, n in zip(op.axis, out_axes)}
    init = tuple(substitute(v, init_map) for v in red.init)
    loads = tuple(t[tuple(idx)] for t in rf_ts)
    final = [Reduce(red.combiner, loads, (k_rf,), const(True), k, init) for k in range(nval)]
    new_op = ComputeOp(op.name, out_axes, list(final), op.tag, op.attrs)

    rf_stage = Stage(rf_op, sch)
    sch._insert_stage(rf_stage, st)
    # also re-points stages that read the op being replaced (a cache_read copy of this stage)
    sch._replace_op(st, new_op, keep_axes=False)
    return rf_ts[0] if nval == 1 else rf_ts

"""Prefetch: at each iteration of a loop, touch the cache lines a later iteration will read.

``s[C].prefetch(A, ko, 1)`` emits, at the top of loop ``ko``, one ``llvm.prefetch`` per cache
line of the region of ``A`` that iteration ``ko + 1`` reads (inner loops relaxed). Prefetching
past the end of a buffer is harmless (prefetch never faults), but we clamp to the buffer anyway
so debug builds stay quiet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..arith.interval import Interval, eval_interval
from ..arith.simplify import simplify
from ..errors import ScheduleError
from ..ir.expr import BufferLoad, Call, Expr, IntImm, Min, Var, const
from ..ir.functor import substitute
from ..ir.stmt import Evaluate, For, ForKind, Stmt, seq
from ..te.schedule import Stage
from ..te.tensor import ComputeOp, IterVar, Tensor

if TYPE_CHECKING:
    from .schedule_ops import Lowering

CACHE_LINE = 64


def prefetch_stmts(lw: Lowering, st: Stage, iv: IterVar, items: list[tuple[Tensor, Expr]]) -> list[Stmt]:
    from .bound import _Loads

    op = st.op
    assert isinstance(op, ComputeOp)
    b = lw.bounds[st]
    pos = st.leaf_iter_vars.index(iv)
    inner = st.leaf_iter_vars[pos + 1:]
    dom = {x.var: Interval.from_range(const(0), b.ext[x]) for x in inner}
    out: list[Stmt] = []
    for tensor, offset in items:
        finder = _Loads(lw.sch[tensor])
        for e in lw.bodies[st]:
            finder.visit(e)
        if not finder.found:
            raise ScheduleError(f"stage {st.name}: prefetch of {tensor.name}, which it does not read")
        buf, mins = lw.buffer_of(tensor)
        vmap = {r.var: b.root_value(r) for r in op.axis + op.reduce_axis}
        ahead = {iv.var: iv.var + offset}
        for ld in finder.found:
            lo: list[Expr] = []
            ext: list[int] = []
            for idx, mn in zip(ld.indices, mins):
                e = simplify(substitute(substitute(idx, vmap), ahead) - mn)
                r = eval_interval(e, dom)
                if r.lo is None or r.hi is None:
                    break
                n = simplify(r.hi - r.lo + 1)
                if not isinstance(n, IntImm):
                    break
                lo.append(r.lo)
                ext.append(n.value)
            else:
                out.append(_emit(buf, lo, ext))
    return out


def _emit(buf: object, lo: list[Expr], ext: list[int]) -> Stmt:
    from ..ir.buffer import Buffer
    from ..passes.flatten import _strides, flat_size

    assert isinstance(buf, Buffer)
    strides = _strides(buf)
    step = max(1, CACHE_LINE // buf.itemsize)
    loop_vars = [Var(f"pf{k}") for k in range(len(lo))]
    flat: Expr = const(0)
    for k, (l0, s) in enumerate(zip(lo, strides)):
        coord = l0 + (loop_vars[k] * step if k == len(lo) - 1 else loop_vars[k])
        flat = flat + coord * s
    last = simplify(flat_size(buf) - 1)
    addr = Call("handle", "address_of", (BufferLoad(buf, (simplify(Min(flat, last)),)),))
    body: Stmt = Evaluate(Call("int32", "prefetch", (addr,)))
    for k in range(len(lo) - 1, -1, -1):
        n = ext[k] if k < len(lo) - 1 else -(-ext[k] // step)
        body = For(loop_vars[k], const(0), const(n), ForKind.SERIAL, body)
    return seq(body)

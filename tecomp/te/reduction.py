"""Commutative reducers: te.sum / te.max / te.min and user-defined te.comm_reducer."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import TecompError
from ..ir import dtype as dt
from ..ir.expr import Expr, Max, Min, Reduce, Var, const, to_expr
from .tensor import IterVar, IterVarKind


@dataclass(frozen=True, eq=False)
class CommReducer:
    """``result = combine(lhs, rhs)`` with ``identity``; one instance per set of value dtypes.

    ``lhs`` stands for the running accumulator and ``rhs`` for the new element, so lowering emits
    ``acc = result[lhs := acc, rhs := source]``.
    """

    name: str
    lhs: tuple[Var, ...]
    rhs: tuple[Var, ...]
    result: tuple[Expr, ...]
    identity: tuple[Expr, ...]


class comm_reducer:  # noqa: N801 - classic TVM name, used as te.comm_reducer(...)
    """Create a reducer from ``fcombine(x, y)`` and ``fidentity(dtype)``.

    Example (argmax over a tuple)::

        argmax = te.comm_reducer(
            lambda x, y: (te.if_then_else(x[1] >= y[1], x[0], y[0]),
                          te.if_then_else(x[1] >= y[1], x[1], y[1])),
            lambda t0, t1: (tc.const(-1, t0), te.min_value(t1)), name="argmax")
        idx, val = te.compute((n,), lambda i: argmax((k, A[i, k]), axis=k))
    """

    def __init__(
        self,
        fcombine: Callable[..., Any],
        fidentity: Callable[..., Any],
        name: str = "reduce",
    ) -> None:
        self.fcombine = fcombine
        self.fidentity = fidentity
        self.name = name
        self._cache: dict[tuple[str, ...], CommReducer] = {}

    def instantiate(self, dtypes: tuple[str, ...]) -> CommReducer:
        inst = self._cache.get(dtypes)
        if inst is not None:
            return inst
        multi = len(dtypes) > 1
        lhs = tuple(Var(f"x{k}" if multi else "x", d) for k, d in enumerate(dtypes))
        rhs = tuple(Var(f"y{k}" if multi else "y", d) for k, d in enumerate(dtypes))
        if multi:
            res = self.fcombine(lhs, rhs)
            nparams = len(inspect.signature(self.fidentity).parameters)
            ident = self.fidentity(*dtypes) if nparams == len(dtypes) else self.fidentity(dtypes)
        else:
            res = self.fcombine(lhs[0], rhs[0])
            ident = self.fidentity(dtypes[0])
        res_t = tuple(res) if isinstance(res, (tuple, list)) else (res,)
        id_t = tuple(ident) if isinstance(ident, (tuple, list)) else (ident,)
        if len(res_t) != len(dtypes) or len(id_t) != len(dtypes):
            raise TecompError(
                f"reducer {self.name}: combine/identity must return {len(dtypes)} values"
            )
        res_e = tuple(to_expr(r, d).astype(d) for r, d in zip(res_t, dtypes))
        id_e = tuple(to_expr(r, d).astype(d) for r, d in zip(id_t, dtypes))
        inst = CommReducer(self.name, lhs, rhs, res_e, id_e)
        self._cache[dtypes] = inst
        return inst

    def __call__(
        self,
        expr: Any,
        axis: IterVar | Sequence[IterVar] | Any = None,
        where: Any = None,
        init: Any = None,
    ) -> Any:
        if axis is None or not (isinstance(axis, IterVar) or (
                isinstance(axis, (tuple, list)) and all(isinstance(a, IterVar) for a in axis))):
            if axis is None:
                raise TecompError(f"{self.name}: give axis= (a te.reduce_axis or a list of them)")
            # te.max(a, b): the element-wise combination of two values, as in TVM
            a, b = to_expr(expr), to_expr(axis, to_expr(expr).dtype)
            inst = self.instantiate((a.dtype,))
            from ..ir.expr import promote
            from ..ir.functor import substitute

            a, b = promote(a, b)
            inst = self.instantiate((a.dtype,))
            return substitute(inst.result[0], {inst.lhs[0]: a, inst.rhs[0]: b})
        axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
        for a in axes:
            if not isinstance(a, IterVar) or a.kind != IterVarKind.REDUCE:
                raise TecompError(
                    f"{self.name}: axis {a!r} is not a reduce axis; create it with te.reduce_axis"
                )
        if len({id(a) for a in axes}) != len(axes):
            raise TecompError(f"{self.name}: the same reduce axis is listed twice")
        multi = isinstance(expr, (tuple, list))
        srcs = tuple(to_expr(e) for e in (expr if multi else (expr,)))
        inst = self.instantiate(tuple(s.dtype for s in srcs))
        cond = to_expr(where) if where is not None else const(True)
        if not dt.is_bool(cond.dtype):
            raise TecompError(f"{self.name}: where= must be a boolean condition, got {cond.dtype}")
        inits: tuple[Expr, ...] = ()
        if init is not None:
            iv = init if isinstance(init, (tuple, list)) else (init,)
            inits = tuple(to_expr(v, s.dtype).astype(s.dtype) for v, s in zip(iv, srcs))
        outs = [Reduce(inst, srcs, axes, cond, k, inits) for k in range(len(srcs))]
        return tuple(outs) if multi else outs[0]


def _ident_value(kind: str, d: str) -> Expr:
    from .intrin import max_value, min_value

    if kind == "sum":
        return const(0, d)
    if kind == "prod":
        return const(1, d)
    return min_value(d) if kind == "max" else max_value(d)


sum = comm_reducer(lambda x, y: x + y, lambda d: _ident_value("sum", d), name="sum")  # noqa: A001
prod = comm_reducer(lambda x, y: x * y, lambda d: _ident_value("prod", d), name="prod")
max = comm_reducer(lambda x, y: Max(*_same(x, y)), lambda d: _ident_value("max", d), name="max")  # noqa: A001
min = comm_reducer(lambda x, y: Min(*_same(x, y)), lambda d: _ident_value("min", d), name="min")  # noqa: A001


def _same(x: Expr, y: Expr) -> tuple[Expr, Expr]:
    from ..ir.expr import promote

    return promote(x, y)

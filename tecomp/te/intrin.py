"""Math intrinsics, conditionals and dtype limits for declarations."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import TecompError
from ..ir import dtype as dt
from ..ir.expr import (
    And,
    Call,
    Expr,
    ExprLike,
    Max,
    Min,
    Not,
    Or,
    Select,
    as_bool,
    const,
    promote,
    to_expr,
)

FLOAT_UNARY = (
    "exp", "exp2", "log", "log2", "log10", "sqrt", "rsqrt", "tanh", "sigmoid", "erf",
    "floor", "ceil", "round", "trunc", "sin", "cos",
)


def _float_arg(name: str, x: ExprLike) -> Expr:
    e = to_expr(x)
    if not dt.is_float(e.dtype):
        e = e.astype("float32")
    return e


def _unary(name: str) -> Any:
    def f(x: ExprLike) -> Expr:
        e = _float_arg(name, x)
        return Call(e.dtype, name, (e,))

    f.__name__ = name
    f.__doc__ = f"Element-wise ``{name}`` (float arguments; ints are converted to float32)."
    return f


exp = _unary("exp")
exp2 = _unary("exp2")
log = _unary("log")
log2 = _unary("log2")
log10 = _unary("log10")
sqrt = _unary("sqrt")
rsqrt = _unary("rsqrt")
tanh = _unary("tanh")
sigmoid = _unary("sigmoid")
erf = _unary("erf")
floor = _unary("floor")
ceil = _unary("ceil")
round = _unary("round")  # noqa: A001
trunc = _unary("trunc")
sin = _unary("sin")
cos = _unary("cos")


def abs(x: ExprLike) -> Expr:  # noqa: A001
    """Absolute value for ints and floats."""
    e = to_expr(x)
    if dt.is_float(e.dtype):
        return Call(e.dtype, "fabs", (e,))
    if dt.is_uint(e.dtype) or dt.is_bool(e.dtype):
        return e
    return Select(e < 0, -e, e)


def power(x: ExprLike, y: ExprLike) -> Expr:
    a, b = promote(_float_arg("power", x), to_expr(y, to_expr(x).dtype))
    if not dt.is_float(b.dtype):
        b = b.astype(a.dtype)
    return Call(a.dtype, "pow", (a, b))


pow = power  # noqa: A001


def max(a: ExprLike, b: ExprLike) -> Expr:  # noqa: A001
    ea = to_expr(a, b.dtype if isinstance(b, Expr) else None)
    return Max(*promote(ea, to_expr(b, ea.dtype)))


def min(a: ExprLike, b: ExprLike) -> Expr:  # noqa: A001
    ea = to_expr(a, b.dtype if isinstance(b, Expr) else None)
    return Min(*promote(ea, to_expr(b, ea.dtype)))


def if_then_else(cond: ExprLike, t: ExprLike, f: ExprLike) -> Expr:
    """``t`` where ``cond`` holds, else ``f``; only the chosen side is evaluated.

    That makes padding safe: ``if_then_else(i >= 1, A[i - 1], 0.0)`` never reads ``A[-1]``.
    """
    c = as_bool(to_expr(cond))
    et = to_expr(t, f.dtype if isinstance(f, Expr) else None)
    ef = to_expr(f, et.dtype)
    et, ef = promote(et, ef)
    return Select(c, et, ef)


def all(*conds: ExprLike) -> Expr:  # noqa: A001
    """Logical and of every condition (``te.all(i > 0, j < n)``)."""
    if len(conds) == 1 and isinstance(conds[0], (tuple, list)):
        conds = tuple(conds[0])
    if not conds:
        raise TecompError("te.all needs at least one condition")
    out = as_bool(to_expr(conds[0]))
    for c in conds[1:]:
        out = And(out, as_bool(to_expr(c)))
    return out


def any(*conds: ExprLike) -> Expr:  # noqa: A001
    """Logical or of every condition."""
    if len(conds) == 1 and isinstance(conds[0], (tuple, list)):
        conds = tuple(conds[0])
    if not conds:
        raise TecompError("te.any needs at least one condition")
    out = as_bool(to_expr(conds[0]))
    for c in conds[1:]:
        out = Or(out, as_bool(to_expr(c)))
    return out


def logical_not(c: ExprLike) -> Expr:
    return Not(as_bool(to_expr(c)))


def min_value(dtype: str) -> Expr:
    """The smallest value of ``dtype`` (-inf for floats, the way reductions want it)."""
    d = dt.canonical(dtype)
    if dt.is_float(d):
        return const(-np.inf, d)
    if dt.is_bool(d):
        return const(False, d)
    return const(int(np.iinfo(dt.to_numpy(d)).min), d)


def max_value(dtype: str) -> Expr:
    """The largest value of ``dtype`` (+inf for floats)."""
    d = dt.canonical(dtype)
    if dt.is_float(d):
        return const(np.inf, d)
    if dt.is_bool(d):
        return const(True, d)
    return const(int(np.iinfo(dt.to_numpy(d)).max), d)


def call_extern(dtype: str, name: str, *args: ExprLike) -> Expr:
    """Call the C function ``name`` (resolved when the kernel is JIT-compiled or linked)."""
    return Call(dt.canonical(dtype) if dtype != "void" else "int32", name,
                tuple(to_expr(a) for a in args), extern=True)

"""Reference semantics of scalar (and small vector) expressions, evaluated in Python.

The simplifier folds constants with these same operator functions, and the tests use
`evaluate` as the oracle every rewrite rule is checked against, so there is exactly one place
that says what ``FloorMod`` of a negative number or an ``int8`` overflow means:

* integers wrap to their dtype (two's complement, like the generated machine code);
* ``FloorDiv``/``FloorMod`` follow Python's ``//``/``%``; ``Div`` on integers truncates toward
  zero (C); division by zero raises ZeroDivisionError;
* floats are computed with numpy scalars of the expression's dtype, so float32 rounds like
  float32 and ``1/0`` is ``inf``;
* float -> int casts truncate toward zero and saturate: out of range gives the dtype's
  min/max, NaN gives 0 (``llvm.fptosi.sat``; `float_to_int`).

>>> from tecomp import te
>>> from tecomp.ir import Var
>>> x = Var("x")
>>> evaluate((x - 7) // 2, {x: 0}), evaluate(te.truncdiv(x - 7, 2), {x: 0})
(-4, -3)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ..errors import TecompError
from ..ir import dtype as dt
from ..ir.expr import (
    EQ,
    GE,
    GT,
    LE,
    LT,
    NE,
    Add,
    And,
    BinaryOp,
    Broadcast,
    Cast,
    CmpOp,
    Div,
    Expr,
    FloatImm,
    FloorDiv,
    FloorMod,
    IntImm,
    Let,
    Max,
    Min,
    Mul,
    Not,
    Or,
    Ramp,
    Select,
    Sub,
    Var,
)

Scalar = int | float | bool
Value = Scalar | tuple[Scalar, ...]


def wrap_int(v: int, dtype: str) -> int:
    """``v`` reduced to the two's-complement range of the integer ``dtype``."""
    e = dt.element(dtype)
    if e == "bool":
        return int(v != 0)
    b = dt.bits(e)
    if dt.is_uint(e):
        return v % (1 << b)
    half = 1 << (b - 1)
    return (v + half) % (1 << b) - half


def trunc_div(a: int, b: int) -> int:
    """C integer division (rounds toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _int_op(op: type[BinaryOp], a: int, b: int) -> int:
    if op is Add:
        return a + b
    if op is Sub:
        return a - b
    if op is Mul:
        return a * b
    if op is FloorDiv:
        return a // b
    if op is FloorMod:
        return a % b
    if op is Div:
        if b == 0:
            raise ZeroDivisionError("integer division by zero")
        return trunc_div(a, b)
    if op is Min:
        return min(a, b)
    if op is Max:
        return max(a, b)
    raise TecompError(f"no integer semantics for {op.__name__}")


_FLOAT_OPS: dict[type[BinaryOp], Callable[[np.floating, np.floating], np.floating]] = {
    Add: lambda a, b: a + b,
    Sub: lambda a, b: a - b,
    Mul: lambda a, b: a * b,
    Div: lambda a, b: a / b,
    FloorDiv: lambda a, b: np.floor_divide(a, b),
    FloorMod: lambda a, b: np.mod(a, b),
    Min: lambda a, b: np.minimum(a, b),
    Max: lambda a, b: np.maximum(a, b),
}


class InexactHalfFold(OverflowError):
    """A float16/bfloat16 operation whose float32 result is not a 16-bit value.

    16-bit floats are computed in float32 and rounded only when stored or cast
    (tecomp/ir/dtype.py), but an immediate of a 16-bit dtype holds a 16-bit value: such a
    result has no immediate that keeps it, so the simplifier (which skips folds that raise
    OverflowError) leaves the operation to run time.
    """


def binary(op: type[BinaryOp], a: Scalar, b: Scalar, dtype: str) -> Scalar:
    """``a op b`` in ``dtype`` (scalar operands); 16-bit floats compute in float32 and raise
    `InexactHalfFold` when the result is not exact in 16 bits."""
    if dt.is_half(dtype):
        with np.errstate(all="ignore"):
            r = float(_FLOAT_OPS[op](np.float32(a), np.float32(b)))  # type: ignore[arg-type]
        if r == r and float(dt.round_to(np.float32(r), dtype)) != r:
            raise InexactHalfFold(f"{a} {op.__name__} {b} in {dtype}")
        return r
    if dt.is_float(dtype):
        t = dt.to_numpy(dtype).type
        with np.errstate(all="ignore"):
            return float(_FLOAT_OPS[op](t(a), t(b)))  # type: ignore[arg-type]
    r = _int_op(op, int(a), int(b))
    return bool(r) if dt.is_bool(dtype) else wrap_int(r, dtype)


def compare(op: type[CmpOp], a: Scalar, b: Scalar) -> bool:
    if op is LT:
        return a < b
    if op is LE:
        return a <= b
    if op is GT:
        return a > b
    if op is GE:
        return a >= b
    if op is EQ:
        return a == b
    if op is NE:
        return a != b
    raise TecompError(f"unknown comparison {op.__name__}")


def float_to_int(f: float, dtype: str) -> int:
    """Float ``f`` converted to the integer ``dtype`` the way compiled code does it: truncate
    toward zero, saturate out-of-range values (and +-inf) to the dtype's min/max, NaN -> 0
    (LLVM's ``fptosi.sat``/``fptoui.sat``; negative values to an unsigned dtype give 0)."""
    b = dt.bits(dtype)
    lo, hi = (0, (1 << b) - 1) if dt.is_uint(dtype) else (-(1 << (b - 1)), (1 << (b - 1)) - 1)
    if lo - 1 < f < hi + 1:  # Python compares floats with ints exactly
        return int(f)  # truncates toward zero
    if f != f:
        return 0
    return lo if f < 0 else hi


def cast(v: Scalar, dtype: str) -> Scalar:
    """Convert a scalar to ``dtype``; float -> int truncates and saturates (`float_to_int`),
    int -> int wraps, anything -> bool is ``!= 0``."""
    if dt.is_bool(dtype):
        return bool(v != 0)
    if dt.is_half(dtype):  # one correct rounding (ints and floats alike are exact as float64)
        return float(dt.round_to(np.float64(v), dtype))
    if dt.is_float(dtype):
        return float(dt.to_numpy(dtype).type(v))
    if isinstance(v, float):
        return float_to_int(v, dtype)
    return wrap_int(int(v), dtype)


def _lanes(v: Value, n: int) -> tuple[Scalar, ...]:
    return v if isinstance(v, tuple) else (v,) * n


def _map2(fn: Callable[[Scalar, Scalar], Scalar], a: Value, b: Value) -> Value:
    if isinstance(a, tuple) or isinstance(b, tuple):
        n = len(a) if isinstance(a, tuple) else len(b)  # type: ignore[arg-type]
        return tuple(fn(x, y) for x, y in zip(_lanes(a, n), _lanes(b, n), strict=True))
    return fn(a, b)


def evaluate(e: Expr, env: Mapping[Var, Scalar]) -> Value:
    """The value of ``e`` with the variables bound by ``env`` (vectors come back as tuples)."""
    if isinstance(e, IntImm):
        return bool(e.value) if dt.is_bool(e.dtype) else e.value
    if isinstance(e, FloatImm):
        with np.errstate(over="ignore"):  # 1e10 as float16 is inf
            if dt.is_half(e.dtype):
                return float(dt.round_to(np.float64(e.value), e.dtype))
            return float(dt.to_numpy(e.dtype).type(e.value))
    if isinstance(e, Var):
        if e not in env:
            raise TecompError(f"evaluate: no value for variable {e.name}")
        return env[e]
    if isinstance(e, BinaryOp):
        el = dt.element(e.dtype)
        op = type(e)
        return _map2(lambda x, y: binary(op, x, y, el), evaluate(e.a, env), evaluate(e.b, env))
    if isinstance(e, CmpOp):
        cop = type(e)
        return _map2(lambda x, y: compare(cop, x, y), evaluate(e.a, env), evaluate(e.b, env))
    if isinstance(e, And):
        return _map2(lambda x, y: bool(x) and bool(y), evaluate(e.a, env), evaluate(e.b, env))
    if isinstance(e, Or):
        return _map2(lambda x, y: bool(x) or bool(y), evaluate(e.a, env), evaluate(e.b, env))
    if isinstance(e, Not):
        v = evaluate(e.a, env)
        return tuple(not x for x in v) if isinstance(v, tuple) else not v
    if isinstance(e, Select):
        c = evaluate(e.cond, env)
        if isinstance(c, tuple):
            t, f = _lanes(evaluate(e.t, env), len(c)), _lanes(evaluate(e.f, env), len(c))
            return tuple(x if ci else y for ci, x, y in zip(c, t, f, strict=True))
        return evaluate(e.t, env) if c else evaluate(e.f, env)  # only the chosen side runs
    if isinstance(e, Cast):
        v = evaluate(e.value, env)
        el = dt.element(e.dtype)
        return tuple(cast(x, el) for x in v) if isinstance(v, tuple) else cast(v, el)
    if isinstance(e, Let):
        return evaluate(e.body, {**env, e.var: evaluate(e.value, env)})  # type: ignore[dict-item]
    if isinstance(e, Ramp):
        base, stride = evaluate(e.base, env), evaluate(e.stride, env)
        el = dt.element(e.dtype)
        return tuple(binary(Add, base, binary(Mul, stride, k, el), el) for k in range(e.lanes))  # type: ignore[arg-type]
    if isinstance(e, Broadcast):
        v = evaluate(e.value, env)
        return (v,) * e.lanes  # type: ignore[return-value]
    raise TecompError(f"evaluate: cannot evaluate {type(e).__name__} ({e})")


__all__ = ["InexactHalfFold", "binary", "cast", "compare", "evaluate", "float_to_int", "trunc_div", "wrap_int"]

"""The numeric semantics of the loop-nest interpreter (`interp`): integer wrapping and ranges,
the saturating float->int cast, the float intrinsics and the operator tables.

Kept apart from the closure compiler so that the contract the code generators must honour
(see `interp`'s module docstring) reads in one place.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from ..arith import intrin_eval
from ..ir import dtype as dt
from ..ir import expr as E  # noqa: N812


def int_range(dtype: str) -> tuple[int, int]:
    """[lo, hi) of an int dtype; bool counts as 0/1."""
    if dt.is_bool(dtype):
        return 0, 2
    info = np.iinfo(dt.to_numpy(dtype))
    return int(info.min), int(info.max) + 1


def saturating_float_to_int(x: Any, dtype: Any) -> np.ndarray:
    """Floats ``x`` (array-like) converted to the numpy integer ``dtype`` with the IR's cast
    semantics: truncate toward zero, saturate to the dtype's range, NaN -> 0."""
    npd = np.dtype(dtype)
    info = np.iinfo(npd)
    t = np.trunc(np.asarray(x, np.float64))  # exact for float16/32/64 inputs
    lo, hi = float(info.min), float(info.max) + 1.0  # 0 or -2**(b-1), 2**b or 2**(b-1): exact
    with np.errstate(invalid="ignore"):
        ok = (t >= lo) & (t < hi)  # False for NaN
        out = np.where(ok, t, 0.0).astype(npd)  # in range: exact
        out[t >= hi] = info.max
        out[t < lo] = info.min
    return out


def wrapper(dtype: str) -> Callable[[int], int]:
    lo, hi = int_range(dtype)
    m = hi - lo
    return lambda x: x if lo <= x < hi else (x - lo) % m + lo


def erf(x: Any) -> Any:
    a = np.asarray(x)
    r = np.array([math.erf(v) for v in a.reshape(-1).tolist()], dtype=a.dtype)
    return r.reshape(a.shape)[()]


def float_fns(npd: np.dtype) -> dict[str, Callable[..., Any]]:
    one = npd.type(1)
    return {
        "exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "log10": np.log10,
        "log1p": np.log1p, "expm1": np.expm1, "sqrt": np.sqrt,
        "rsqrt": lambda x: one / np.sqrt(x), "tanh": np.tanh,
        "sigmoid": lambda x: one / (one + np.exp(-x)), "erf": erf,
        "abs": np.abs, "fabs": np.abs, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc,
        "round": np.rint, "nearbyint": np.rint, "rint": np.rint,
        "pow": np.power, "power": np.power, "sin": np.sin, "cos": np.cos, "tan": np.tan,
        "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "atan2": np.arctan2,
        "sinh": np.sinh, "cosh": np.cosh, "fmin": np.fmin, "fmax": np.fmax, "fmod": np.fmod,
        "copysign": np.copysign,
        "fma": lambda a, b, c: (np.float64(a) * np.float64(b) + np.float64(c)).astype(npd),
        **intrin_eval.float_fns(npd),
    }


PREDICATES = {"isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite}
POISON = {"f": np.nan, "b": True, "i": 0x5A, "u": 0x5A}


# operator tables ----------------------------------------------------------------------------


def trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def vec_trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    q = np.floor_divide(a, b)
    fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
    return q + fix.astype(q.dtype)


# Min/Max are ``a < b ? a : b`` / ``a > b ? a : b``: Python's min(b, a) keeps b unless a < b.
MIN, MAX = (lambda a, b: min(b, a)), (lambda a, b: max(b, a))
INT_SCALAR: dict[type, Callable[[Any, Any], Any]] = {
    E.Add: operator.add, E.Sub: operator.sub, E.Mul: operator.mul, E.Div: trunc_div,
    E.FloorDiv: operator.floordiv, E.FloorMod: operator.mod, E.Min: MIN, E.Max: MAX,
}
FLOAT_SCALAR: dict[type, Callable[[Any, Any], Any]] = {
    E.Add: operator.add, E.Sub: operator.sub, E.Mul: operator.mul, E.Div: operator.truediv,
    E.FloorDiv: lambda a, b: np.floor(a / b), E.FloorMod: lambda a, b: a - np.floor(a / b) * b,
    E.Min: MIN, E.Max: MAX,
}
INT_VECTOR: dict[type, Callable[[Any, Any], Any]] = {
    E.Add: np.add, E.Sub: np.subtract, E.Mul: np.multiply, E.Div: vec_trunc_div,
    E.FloorDiv: np.floor_divide, E.FloorMod: np.remainder, E.Min: np.minimum, E.Max: np.maximum,
}
FLOAT_VECTOR: dict[type, Callable[[Any, Any], Any]] = {
    **FLOAT_SCALAR,
    E.Min: lambda a, b: np.where(a < b, a, b), E.Max: lambda a, b: np.where(a > b, a, b),
}
CMP: dict[type, Callable[[Any, Any], Any]] = {
    E.EQ: operator.eq, E.NE: operator.ne, E.LT: operator.lt, E.LE: operator.le,
    E.GT: operator.gt, E.GE: operator.ge,
}

REDUCE_OPS = {"add": E.Add, "mul": E.Mul, "min": E.Min, "max": E.Max}
LOGIC: dict[type, tuple[Callable[[Any, Any], Any], Callable[[Any, Any], Any]]] = {
    E.And: (lambda a, b: bool(a) and bool(b), np.logical_and),
    E.Or: (lambda a, b: bool(a) or bool(b), np.logical_or),
}

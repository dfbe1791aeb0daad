"""TVM's ``tvm.tir`` spellings of the expression helpers, so classic TE code that writes
``tvm.tir.if_then_else(...)`` or ``tvm.tir.const(...)`` runs with only the import changed
(``import tecomp as tvm``). Everything here is the same function as in `tecomp.te`."""

from __future__ import annotations

from typing import Any

from .errors import TecompError
from .ir.buffer import Buffer
from .ir.expr import Expr, FloatImm, IntImm, StringImm, Var
from .ir.expr import const as _const
from .te.extern import decl_buffer
from .te.intrin import (
    abs,
    acos,
    acosh,
    all,
    any,
    asin,
    asinh,
    atan,
    atan2,
    atanh,
    bitwise_and,
    bitwise_not,
    bitwise_or,
    bitwise_xor,
    call_extern,
    call_intrin,
    call_llvm_intrin,
    call_llvm_pure_intrin,
    call_pure_extern,
    ceil,
    ceildiv,
    clz,
    copysign,
    cos,
    cosh,
    div,
    erf,
    exp,
    exp2,
    exp10,
    floor,
    floordiv,
    floormod,
    fmod,
    hypot,
    if_then_else,
    indexdiv,
    indexmod,
    infinity,
    isfinite,
    isinf,
    isnan,
    ldexp,
    likely,
    log,
    log1p,
    log2,
    log10,
    logical_not,
    max_value,
    min_value,
    nearbyint,
    nextafter,
    popcount,
    power,
    reinterpret,
    round,
    rsqrt,
    shift_left,
    shift_right,
    sigmoid,
    sin,
    sinh,
    sqrt,
    tan,
    tanh,
    trunc,
    truncdiv,
    truncmod,
)
from .te.intrin import pow as pow  # noqa: A004


def const(value: Any, dtype: str | None = None) -> Expr:
    """An immediate value (``tvm.tir.const(1.0, "float32")``)."""
    return _const(value, dtype)


def call_packed(*args: Any, **kwargs: Any) -> Expr:
    """TVM's call into a registered PackedFunc: not supported (there is no PackedFunc
    registry); say what to use instead."""
    raise TecompError(
        "tir.call_packed is not supported: tecomp has no PackedFunc registry. Call a C function "
        "with te.call_extern(dtype, 'symbol', buf.data, ...) (load its library with "
        "tc.load_extern_library), or give the symbol a Python implementation for the "
        "interpreter with te.register_extern")


def Select(cond: Any, true_value: Any, false_value: Any) -> Expr:  # noqa: N802 (TVM's name)
    """``cond ? true_value : false_value``. TVM's Select evaluates both sides; here only the
    chosen side runs (it is `if_then_else`), so a guarded read in the other side is safe."""
    return if_then_else(cond, true_value, false_value)


__all__ = [
    "Buffer", "Expr", "FloatImm", "IntImm", "Select", "StringImm", "Var", "abs", "acos", "acosh",
    "all", "call_packed", "decl_buffer",
    "any", "asin", "asinh", "atan", "atan2", "atanh", "bitwise_and", "bitwise_not", "bitwise_or",
    "bitwise_xor", "call_extern", "call_intrin", "call_llvm_intrin",
    "call_llvm_pure_intrin", "call_pure_extern", "ceil", "ceildiv", "clz", "const", "copysign", "cos", "cosh",
    "div", "erf", "exp", "exp10", "exp2", "floor", "floordiv", "floormod", "fmod", "hypot",
    "if_then_else", "indexdiv", "indexmod", "infinity", "isfinite", "isinf", "isnan", "ldexp",
    "likely", "log", "log10", "log1p", "log2", "logical_not", "max_value", "min_value",
    "nearbyint", "nextafter", "popcount", "pow", "power", "reinterpret", "round", "rsqrt",
    "shift_left", "shift_right", "sigmoid", "sin", "sinh", "sqrt", "tan", "tanh", "trunc",
    "truncdiv", "truncmod",
]

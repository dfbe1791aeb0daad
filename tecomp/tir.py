"""TVM's ``tvm.tir`` spellings of the expression helpers, so classic TE code that writes
``tvm.tir.if_then_else(...)`` or ``tvm.tir.const(...)`` runs with only the import changed
(``import tecomp as tvm``). Everything here is the same function as in `tecomp.te`."""

from __future__ import annotations

from typing import Any

from .ir.expr import Expr, FloatImm, IntImm, StringImm, Var
from .ir.expr import const as _const
from .ir.expr import to_expr as _to_expr
from .te.intrin import (
    abs,
    all,
    any,
    call_extern,
    ceil,
    cos,
    erf,
    exp,
    exp2,
    floor,
    if_then_else,
    log,
    log2,
    log10,
    max_value,
    min_value,
    power,
    round,
    rsqrt,
    sigmoid,
    sin,
    sqrt,
    tanh,
    trunc,
)
from .te.intrin import pow as pow  # noqa: A004


def const(value: Any, dtype: str | None = None) -> Expr:
    """An immediate value (``tvm.tir.const(1.0, "float32")``)."""
    return _const(value, dtype)


def Select(cond: Any, true_value: Any, false_value: Any) -> Expr:  # noqa: N802 (TVM's name)
    """``cond ? true_value : false_value``; unlike TVM's Select both sides are not evaluated
    eagerly here either: it is `if_then_else` (a guarded read in the untaken side is safe)."""
    return if_then_else(cond, true_value, false_value)


def floordiv(a: Any, b: Any) -> Expr:
    """Floor division (Python's ``//``)."""
    return _to_expr(a) // b


def floormod(a: Any, b: Any) -> Expr:
    """Floor modulo (Python's ``%``)."""
    return _to_expr(a) % b


indexdiv = floordiv
indexmod = floormod

__all__ = [
    "Expr", "FloatImm", "IntImm", "Select", "StringImm", "Var", "abs", "all", "any", "call_extern",
    "ceil", "const", "cos", "erf", "exp", "exp2", "floor", "floordiv", "floormod", "if_then_else",
    "indexdiv", "indexmod", "log", "log2", "log10", "max_value", "min_value", "pow", "power",
    "round", "rsqrt", "sigmoid", "sin", "sqrt", "tanh", "trunc",
]

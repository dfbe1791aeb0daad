"""Structural equality and hashing of expressions (Vars compare by identity)."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

from .expr import Expr, Var

_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _children(e: Expr) -> list[Any]:
    # field names per node type, looked up once: `fields()` on every call was a tenth of
    # the lowering time of a tuning candidate (the simplifier compares trees constantly)
    names = _FIELD_NAMES.get(type(e))
    if names is None:
        names = _FIELD_NAMES[type(e)] = tuple(f.name for f in fields(e))  # type: ignore[arg-type]
    return [getattr(e, n) for n in names]


def structural_equal(a: Any, b: Any) -> bool:
    """True when ``a`` and ``b`` are the same tree (same node types, values and Var objects)."""
    if a is b:
        return True
    if isinstance(a, Var) or isinstance(b, Var):
        return False
    if isinstance(a, Expr) and isinstance(b, Expr):
        if type(a) is not type(b):
            return False
        return all(structural_equal(x, y) for x, y in zip(_children(a), _children(b)))
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(structural_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        # by bits: 0.0 and -0.0 differ (copysign, 1/x tell them apart) and NaN equals NaN, so
        # the simplifier never merges the two zeros nor fails to share a NaN constant
        return type(b) is float and (a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
                                     or (a != a and b != b))
    if isinstance(a, (int, str, bool)) or a is None:
        return type(a) is type(b) and a == b
    return False


def structural_hash(e: Any) -> int:
    """Hash consistent with `structural_equal`."""
    if isinstance(e, Var):
        return id(e)
    if isinstance(e, Expr):
        return hash((type(e).__name__, *(structural_hash(c) for c in _children(e))))
    if isinstance(e, tuple):
        return hash(tuple(structural_hash(c) for c in e))
    if isinstance(e, float) and e != e:
        return hash("nan")  # hash(nan) is per object since Python 3.10
    if isinstance(e, (int, float, str, bool)) or e is None:
        return hash(e)
    return id(e)

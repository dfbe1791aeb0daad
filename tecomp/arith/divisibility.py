"""Powers of two that provably divide an integer expression, for every value of its variables.

`pow2_divisor(e)` is the largest ``2**k`` (at most ``cap``) dividing every value ``e`` can take,
with each variable an arbitrary integer (a loop counter, a thread index, a size: nothing is
assumed about them unless ``known`` says so). Codegen uses it to claim the alignment of a vector
access: ``A[ramp(ty*32 + tx*4, 1, 4)]`` of float32 is 16-byte aligned when ``A`` is.

The expression is read through the simplifier's linear form (``sum c_i * t_i + k``, so
``x*2 + x*2`` counts as ``4*x``), and each term by its shape::

    2**a * 2**b   divides  x * y        (a product of non-constants)
    min(2**a, c)  divides  x mod c      (x - c*floor(x/c): both parts are multiples)
    2**(a-j)      divides  x // 2**j    (exact when 2**j divides x, i.e. j <= a)
    min(...)      divides  min/max/select/let bodies (the value is one of the operands)
    2**a          divides  an int->int cast of x (wrapping to n bits keeps the low bits)

Anything else counts as 1. The answer holds in fixed-width arithmetic too: wrapping modulo
``2**n`` keeps divisibility by every ``2**k`` with ``k <= n``.

>>> from tecomp.ir.expr import Var, const
>>> tx, ty = Var("tx", "int32"), Var("ty", "int32")
>>> pow2_divisor(ty * 32 + tx * 4 + 8)
4
"""

from __future__ import annotations

from collections.abc import Mapping

from ..ir import dtype as dt
from ..ir.expr import (
    Cast,
    Expr,
    FloorDiv,
    FloorMod,
    IntImm,
    Let,
    Max,
    Min,
    Mul,
    Select,
    Var,
)
from .simplify import Simplifier

DEFAULT_CAP = 1 << 16  # far more than any access alignment (16 bytes for a float4)


def _lowbit(c: int, cap: int) -> int:
    """The largest power of two dividing the constant ``c`` (``cap`` for 0)."""
    return cap if c == 0 else min(cap, abs(c) & -abs(c))


def pow2_divisor(e: Expr, known: Mapping[Var, int] | None = None, cap: int = DEFAULT_CAP) -> int:
    """The largest power of two, at most ``cap`` (a power of two), that divides every value of
    the scalar integer expression ``e``. ``known`` maps variables to a power of two they are
    known to be a multiple of; other variables are arbitrary integers (1)."""
    if cap < 1 or cap & (cap - 1):
        raise ValueError(f"cap must be a power of two, got {cap}")
    return _Pow2(known or {}, cap).of(e)


class _Pow2:
    def __init__(self, known: Mapping[Var, int], cap: int) -> None:
        self.known = known
        self.cap = cap
        self.simp = Simplifier()

    def of(self, e: Expr) -> int:
        if dt.lanes(e.dtype) != 1 or not dt.is_int(e.dtype):
            return 1
        terms, k = self.simp.linear(e)
        r = _lowbit(k, self.cap)
        for t, c in terms.values():
            if r == 1:
                break
            r = min(r, _lowbit(c, self.cap) * self.term(t), self.cap)
        return r

    def term(self, t: Expr) -> int:
        """A power of two dividing every value of one term of a linear form."""
        cap = self.cap
        if isinstance(t, IntImm):
            return _lowbit(t.value, cap)
        if isinstance(t, Var):
            p = self.known.get(t, 1)
            return p if p >= 1 and not p & (p - 1) else 1
        if isinstance(t, Mul):
            return min(cap, self.of(t.a) * self.of(t.b))
        if isinstance(t, FloorMod) and isinstance(t.b, IntImm) and t.b.value != 0:
            return min(self.of(t.a), _lowbit(t.b.value, cap))
        if isinstance(t, FloorDiv) and isinstance(t.b, IntImm) and t.b.value > 0:
            d = t.b.value
            if d & (d - 1):
                return 1  # not a power of two: the quotient need not inherit anything
            a = self.of(t.a)
            return a // d if a >= d else 1  # exact division when d divides every value
        if isinstance(t, (Min, Max)):
            return min(self.of(t.a), self.of(t.b))
        if isinstance(t, Select):
            return min(self.of(t.t), self.of(t.f))
        if isinstance(t, Let):
            inner = dict(self.known)
            inner[t.var] = self.of(t.value)
            return _Pow2(inner, cap).of(t.body)
        if isinstance(t, Cast) and dt.is_int(t.value.dtype):
            return self.of(t.value)
        return 1


__all__ = ["DEFAULT_CAP", "pow2_divisor"]

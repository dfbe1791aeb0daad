"""Bound analysis of integer expressions: constant bounds and symbolic intervals.

Two flavours, because they answer different questions:

* `ConstBounds` / `const_bounds` give the best *constant* ``[lo, hi]`` of an expression, which is
  what the simplifier needs to decide ``x // 32 -> 0`` or ``i < 100 -> True``. It is cheap (one
  memoised walk, plain Python ints) and never builds IR.
* `eval_interval` gives an `Interval` whose endpoints are *expressions* in the variables that
  stay free. Bound inference needs that: the rows of ``A`` touched by ``io*32 + ii`` for
  ``ii in [0, 32)`` are ``[io*32, io*32 + 31]``, a region of extent 31 + 1 whatever ``io`` is.

Loop ranges are given as ``var -> (min, extent)``, meaning ``min <= var < min + extent``; the min
and extent may themselves be symbolic. Signed variables of 32 bits or more without a range are
unbounded (overflow is assumed not to happen, as in the rest of the compiler) unless
``var_bounds`` gives them constant bounds (shape dimensions are ``(0, None)``).

>>> from tecomp.ir import Var
>>> io, ii = Var("io"), Var("ii")
>>> iv = eval_interval(io * 32 + ii, {ii: Interval.from_range(0, 32)})
>>> print(iv.lo, "..", iv.hi)
io * 32 .. io * 32 + 31
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..ir import dtype as dt
from ..ir.expr import (
    Add,
    And,
    BinaryOp,
    Broadcast,
    Cast,
    CmpOp,
    Div,
    Expr,
    ExprLike,
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
    binop,
    const,
    to_expr,
)
from ..ir.functor import free_vars
from ..ir.structural import structural_equal
from .evaluate import trunc_div

if TYPE_CHECKING:
    from .simplify import Simplifier

INF = math.inf
Ext = int | float  # an int, or -inf / +inf for "unknown"
Bound = tuple[Ext, Ext]
Ranges = Mapping[Var, tuple[ExprLike, ExprLike]]
VarBounds = Mapping[Var, tuple[int | None, int | None]]
Terms = dict[int, tuple[Expr, int]]  # a linear form's terms: id(interned term) -> (term, coefficient)
Lin = tuple[Terms, int]  # sum of coefficient * term, plus a constant
UNBOUNDED: Bound = (-INF, INF)


def dtype_bounds(dtype: str) -> Bound:
    """Values an expression of ``dtype`` can take; wide signed ints count as unbounded."""
    e = dt.element(dtype)
    if e == "bool":
        return (0, 1)
    if dt.is_uint(e):
        return (0, (1 << dt.bits(e)) - 1)
    if dt.is_int(e) and dt.bits(e) <= 16:
        half = 1 << (dt.bits(e) - 1)
        return (-half, half - 1)
    return UNBOUNDED


def _mul1(x: Ext, y: Ext) -> Ext:
    # the values bounded are finite, so 0 * unbounded is 0, not nan
    return 0 if x == 0 or y == 0 else x * y


def mul_bounds(a: Bound, b: Bound) -> Bound:
    ps = [_mul1(x, y) for x in a for y in b]
    return (min(ps), max(ps))


def _fdiv1(x: Ext, c: int) -> Ext:
    return x if math.isinf(x) else x // c  # type: ignore[operator]


def _floordiv_bounds(a: Bound, d: Bound) -> Bound:
    (alo, ahi), (dlo, dhi) = a, d
    if dhi < 0:  # floor(x / d) == floor(-x / -d)
        return _floordiv_bounds((-ahi, -alo), (-dhi, -dlo))
    if dlo <= 0:
        return UNBOUNDED
    # x // d grows toward -1 in d for x < 0 and shrinks toward 0 for x >= 0
    if math.isinf(alo):
        lo: Ext = -INF
    elif alo < 0:
        lo = alo // dlo  # type: ignore[operator]
    else:
        lo = 0 if math.isinf(dhi) else alo // dhi  # type: ignore[operator]
    if math.isinf(ahi):
        hi: Ext = INF
    elif ahi >= 0:
        hi = ahi // dlo  # type: ignore[operator]
    else:
        hi = -1 if math.isinf(dhi) else ahi // dhi  # type: ignore[operator]
    return (lo, hi)


def _floormod_bounds(a: Bound, d: Bound) -> Bound:
    (alo, ahi), (dlo, dhi) = a, d
    if dlo == dhi and dlo > 0 and not math.isinf(alo) and not math.isinf(ahi):
        k = alo // dlo  # type: ignore[operator]
        if ahi // dlo == k:  # type: ignore[operator]
            return (alo - k * dlo, ahi - k * dlo)  # within one period: exact
    if dlo > 0:
        hi = dhi - 1
        if alo >= 0:
            hi = min(hi, ahi)
        return (0, hi)
    if dhi < 0:
        return (dlo + 1, 0)
    return UNBOUNDED


def _truncdiv_bounds(a: Bound, d: Bound) -> Bound:
    (alo, ahi), (dlo, dhi) = a, d
    if dlo == dhi and not math.isinf(dlo) and dlo != 0:
        c = int(dlo)

        def t(x: Ext) -> Ext:
            return x * (1 if c > 0 else -1) if math.isinf(x) else trunc_div(int(x), c)

        return (t(alo), t(ahi)) if c > 0 else (t(ahi), t(alo))
    if dlo > 0 and alo >= 0:
        return _floordiv_bounds(a, d)
    if dlo > 0 or dhi < 0:
        m = max(abs(alo), abs(ahi))
        q = m if math.isinf(m) else m // min(abs(dlo), abs(dhi))  # type: ignore[operator]
        return (-q, q)
    return UNBOUNDED


def _intersect(a: Bound, b: Bound) -> Bound:
    return (max(a[0], b[0]), min(a[1], b[1]))


class ConstBounds:
    """Memoised constant-bound oracle for one ``ranges`` context.

    Results are cached by node identity (the node is kept alive with its entry, so an id is
    never reused while the cache lives).
    """

    def __init__(self, ranges: Ranges | None = None, var_bounds: VarBounds | None = None) -> None:
        self.ranges: dict[Var, tuple[Expr, Expr]] = norm_ranges(ranges)
        self._memo: dict[int, tuple[Expr, Bound]] = {}
        self._active: set[Var] = set()
        self._lets: dict[Var, Bound] = {}
        self._given: dict[Var, Bound] = {
            v: (-INF if lo is None else lo, INF if hi is None else hi)
            for v, (lo, hi) in (var_bounds or {}).items()
        }

    def get(self, e: Expr) -> Bound:
        """``(lo, hi)`` with -inf/+inf where no constant bound is known."""
        m = self._memo.get(id(e))
        if m is not None and m[0] is e:
            return m[1]
        b = self._compute(e)
        if not isinstance(e, Var):  # a var's bound depends on the cycle guard; it is cheap anyway
            self._memo[id(e)] = (e, b)
        return b

    def _var(self, v: Var) -> Bound:
        if v in self._lets:
            return self._lets[v]
        base = dtype_bounds(v.dtype)
        if v in self._given:
            base = _intersect(base, self._given[v])
        r = self.ranges.get(v)
        if r is None or v in self._active:
            return base
        self._active.add(v)
        try:
            mn, ext = self.get(r[0]), self.get(r[1])
        finally:
            self._active.discard(v)
        return _intersect(base, (mn[0], mn[1] + ext[1] - 1))

    def _compute(self, e: Expr) -> Bound:  # noqa: C901 - one branch per node kind
        if isinstance(e, IntImm):
            return (e.value, e.value)
        if isinstance(e, Var):
            return self._var(e)
        if isinstance(e, FloatImm) or dt.is_float(e.dtype):
            return UNBOUNDED
        if isinstance(e, BinaryOp):
            a, b = self.get(e.a), self.get(e.b)
            if isinstance(e, Add):
                return (a[0] + b[0], a[1] + b[1])
            if isinstance(e, Sub):
                return (a[0] - b[1], a[1] - b[0])
            if isinstance(e, Mul):
                return mul_bounds(a, b)
            if isinstance(e, FloorDiv):
                return _floordiv_bounds(a, b)
            if isinstance(e, FloorMod):
                return _floormod_bounds(a, b)
            if isinstance(e, Div):
                return _truncdiv_bounds(a, b)
            if isinstance(e, Min):
                return (min(a[0], b[0]), min(a[1], b[1]))
            if isinstance(e, Max):
                return (max(a[0], b[0]), max(a[1], b[1]))
        if isinstance(e, (CmpOp, And, Or, Not)):
            return (0, 1)
        if isinstance(e, Select):
            t, f = self.get(e.t), self.get(e.f)
            return (min(t[0], f[0]), max(t[1], f[1]))
        if isinstance(e, Cast):
            target = dtype_bounds(e.dtype)
            if dt.is_float(e.value.dtype):
                return target
            v = self.get(e.value)
            return v if target[0] <= v[0] and v[1] <= target[1] else target
        if isinstance(e, Broadcast):
            return self.get(e.value)
        if isinstance(e, Ramp):
            b, s = self.get(e.base), self.get(e.stride)
            step = mul_bounds(s, (0, e.lanes - 1))
            return (b[0] + step[0], b[1] + step[1])
        if isinstance(e, Let):
            self._lets[e.var] = self.get(e.value)
            try:
                return self.get(e.body)
            finally:
                del self._lets[e.var]
        return dtype_bounds(e.dtype)


# bounds of linear forms (the simplifier's canonical integer sums) ---------------------------------


def _scaled(c: int, b: Bound) -> Bound:
    lo, hi = (_mul1(c, b[0]), _mul1(c, b[1]))
    return (lo, hi) if c > 0 else (hi, lo)


def _sum_bounds(cb: ConstBounds, items: Iterable[tuple[Expr, int]], k: int) -> Bound:
    lo: Ext = k
    hi: Ext = k
    for t, c in items:
        tl, th = _scaled(c, cb.get(t))
        lo, hi = lo + tl, hi + th
    return lo, hi


def linear_bounds(s: Simplifier, terms: Terms, k: int, dtype: str) -> Bound:
    """Constant bounds of ``sum c*t + k``, term by term, then tightened two ways where unbounded.

    * ``x//c - y//c`` lies in ``[floor(lo/c), ceil(hi/c)]`` for ``x - y in [lo, hi]``, which
      bounds ``(n + 31)//32 - n//32`` by ``[0, 1]`` whatever ``n`` is;
    * loop vars with symbolic ranges are replaced by their intervals (`eval_interval`), so
      ``i - n <= -1`` for ``i in [0, n)``.
    """
    lo, hi = _sum_bounds(s.cb, terms.values(), k)
    if lo == -INF or hi == INF:
        lo, hi = _paired_div_bounds(s, terms, k, dtype, lo, hi)
    if (lo == -INF or hi == INF) and s.symbolic and s.fallback_depth < 3:
        s.fallback_depth += 1  # ranges may refer to each other; do not chase them forever
        try:
            lo, hi = _symbolic_bounds(s, terms, k, dtype, lo, hi)
        finally:
            s.fallback_depth -= 1
    return lo, hi


def _paired_div_bounds(s: Simplifier, terms: Terms, k: int, dtype: str, lo: Ext, hi: Ext) -> Bound:
    divs = [(key, t, c) for key, (t, c) in terms.items()
            if isinstance(t, FloorDiv) and isinstance(t.b, IntImm) and t.b.value > 0]
    used: set[int] = set()
    plo: Ext = 0
    phi: Ext = 0
    for key, t, m in divs:
        for key2, t2, m2 in divs:
            if m > 0 and m2 == -m and key not in used and key2 not in used \
                    and t2.b.value == t.b.value:  # type: ignore[attr-defined]
                dlo, dhi = linear_bounds(s, *lin_add(s.linear(t.a), s.linear(t2.a), -1), dtype)
                c = t.b.value  # type: ignore[attr-defined]
                plo += m * _fdiv1(dlo, c)
                phi -= m * _fdiv1(-dhi, c)  # ceil(dhi / c)
                used |= {key, key2}
    if not used:
        return lo, hi
    rlo, rhi = _sum_bounds(s.cb, (tc for q, tc in terms.items() if q not in used), k)
    return max(lo, rlo + plo), min(hi, rhi + phi)


def lin_add(a: Lin, b: Lin, sign: int) -> Lin:
    """``a + sign*b`` of linear forms, dropping terms whose coefficient becomes 0."""
    terms = dict(a[0])
    for key, (t, c) in b[0].items():
        n = terms.get(key, (t, 0))[1] + sign * c
        if n:
            terms[key] = (t, n)
        else:
            terms.pop(key, None)
    return terms, a[1] + sign * b[1]


def lin_scale(a: Lin, c: int) -> Lin:
    if c == 0:
        return {}, 0
    return {q: (t, v * c) for q, (t, v) in a[0].items()}, a[1] * c


def _symbolic_bounds(s: Simplifier, terms: Terms, k: int, dtype: str, lo: Ext, hi: Ext) -> Bound:
    vs: set[Var] = set()
    for t, _ in terms.values():
        vs |= {t} if isinstance(t, Var) else free_vars(t)
    if not vs & s.symbolic:
        return lo, hi
    p = s.plain()
    dom = {}
    for v in vs:
        if v in s.ranges:
            mn, ext = s.ranges[v]
            dom[v] = Interval(mn, p.visit(mn + ext - 1))
    iv = _IntervalEval(dom, p).eval(s.rebuild(terms.values(), k, dtype))
    if iv.lo is not None and dt.is_int(iv.lo.dtype):
        lo = max(lo, linear_bounds(s, *s.linear(iv.lo), dtype)[0])
    if iv.hi is not None and dt.is_int(iv.hi.dtype):
        hi = min(hi, linear_bounds(s, *s.linear(iv.hi), dtype)[1])
    return lo, hi


def norm_ranges(ranges: Ranges | None) -> dict[Var, tuple[Expr, Expr]]:
    if not ranges:
        return {}
    return {v: (to_expr(mn, v.dtype), to_expr(ext, v.dtype)) for v, (mn, ext) in ranges.items()}


def _to_opt(x: Ext) -> int | None:
    return None if math.isinf(x) else int(x)


def const_bounds(
    e: Expr, ranges: Ranges | None = None, *, var_bounds: VarBounds | None = None
) -> tuple[int | None, int | None]:
    """Best constant ``(lo, hi)`` of the integer expression ``e``; None where unbounded.

    ``e`` is simplified first, so correlated terms cancel (``(i*32 + j) - i*32`` is bounded by
    ``j``'s range), and symbolic loop ranges are used (``i - n`` is at most -1 for ``i in [0, n)``).
    Free vars are unbounded unless ``var_bounds`` says otherwise (``{n: (1, None)}``).
    """
    from .simplify import Simplifier

    lo, hi = Simplifier(ranges, var_bounds).bounds_of(e)
    return _to_opt(lo), _to_opt(hi)


def can_prove(cond: Expr, ranges: Ranges | None = None, *, var_bounds: VarBounds | None = None) -> bool:
    """True when ``cond`` holds for every value of the variables within ``ranges``.

    False means "not proven", not "false". Comparisons of integers are decided by the bounds of
    the simplified difference of their sides; And/Or/Not by their operands.
    """
    from .simplify import Simplifier

    return Simplifier(ranges, var_bounds).prove(cond)


# symbolic intervals ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Interval:
    """Inclusive ``[lo, hi]`` with expression endpoints; None is unbounded on that side.

    ``eq=False`` because ``==`` on expressions builds IR; compare endpoints with
    `structural_equal` (see `same_as`).
    """

    lo: Expr | None
    hi: Expr | None

    @staticmethod
    def point(e: ExprLike) -> Interval:
        x = to_expr(e)
        return Interval(x, x)

    @staticmethod
    def everything() -> Interval:
        return Interval(None, None)

    @staticmethod
    def from_range(min: ExprLike, extent: ExprLike) -> Interval:  # noqa: A002 - For's field name
        """The values of a loop ``for v in [min, min + extent)``."""
        from .simplify import simplify

        mn, ext = to_expr(min), to_expr(extent)
        return Interval(mn, simplify(binop(Sub, binop(Add, mn, ext), 1)))

    @property
    def is_point(self) -> bool:
        return self.lo is not None and self.hi is not None and structural_equal(self.lo, self.hi)

    @property
    def is_everything(self) -> bool:
        return self.lo is None and self.hi is None

    @property
    def is_bounded(self) -> bool:
        return self.lo is not None and self.hi is not None

    def extent(self) -> Expr | None:
        """``hi - lo + 1`` simplified (the number of integers covered), or None if unbounded."""
        from .simplify import simplify

        if self.lo is None or self.hi is None:
            return None
        return simplify(binop(Add, binop(Sub, self.hi, self.lo), 1))

    def union(self, other: Interval) -> Interval:
        from .simplify import simplify

        lo = None if self.lo is None or other.lo is None else simplify(binop(Min, self.lo, other.lo))
        hi = None if self.hi is None or other.hi is None else simplify(binop(Max, self.hi, other.hi))
        return Interval(lo, hi)

    def same_as(self, other: Interval) -> bool:
        return _same(self.lo, other.lo) and _same(self.hi, other.hi)

    def __repr__(self) -> str:
        return f"Interval[{self.lo if self.lo is not None else '-inf'}, " \
            f"{self.hi if self.hi is not None else '+inf'}]"


def _same(a: Expr | None, b: Expr | None) -> bool:
    return a is b if a is None or b is None else structural_equal(a, b)


def eval_interval(
    e: Expr, dom: Mapping[Var, Interval], ranges: Ranges | None = None
) -> Interval:
    """The interval of ``e`` when each var in ``dom`` ranges over its interval.

    Vars not in ``dom`` stay symbolic (a point). ``ranges`` (var -> (min, extent)) only helps
    simplify the endpoints. Endpoints are simplified, so ``hi - lo`` of ``io*32 + ii`` with
    ``ii in [0, 31]`` simplifies to 31.
    """
    from .simplify import Simplifier

    return _IntervalEval(dom, Simplifier(ranges)).eval(e)


def _both(x: Expr | None, y: Expr | None) -> bool:
    return x is not None and y is not None


def _either(x: Expr | None, y: Expr | None) -> Expr | None:
    # min(x, unbounded) keeps x's upper end; max(x, unbounded) keeps x's lower end
    return x if x is not None else y


class _IntervalEval:
    """One eval_interval walk; all endpoint simplification shares one Simplifier (and its cache)."""

    def __init__(self, dom: Mapping[Var, Interval], simp: Simplifier) -> None:
        self.dom = dict(dom)
        self.s = simp

    def _op(self, cls: type[BinaryOp], x: Expr | None, y: Expr | None) -> Expr | None:
        if x is None or y is None:
            return None
        return self.s.visit(binop(cls, x, y))

    def _const(self, x: Expr | None) -> int | None:
        return x.value if isinstance(x, IntImm) else None

    def _sign(self, iv: Interval) -> int:
        """1 if provably >= 0, -1 if provably <= 0, else 0."""
        if iv.lo is not None and self.s.bounds_of(iv.lo)[0] >= 0:
            return 1
        if iv.hi is not None and self.s.bounds_of(iv.hi)[1] <= 0:
            return -1
        return 0

    def _dtype(self, e: Expr) -> Interval:
        lo, hi = dtype_bounds(e.dtype)
        el = dt.element(e.dtype)
        return Interval(
            None if math.isinf(lo) else const(int(lo), el),
            None if math.isinf(hi) else const(int(hi), el),
        )

    def add(self, a: Interval, b: Interval) -> Interval:
        return Interval(self._op(Add, a.lo, b.lo), self._op(Add, a.hi, b.hi))

    def mul(self, a: Interval, b: Interval) -> Interval:
        for x, y in ((a, b), (b, a)):
            c = self._const(y.lo) if y.is_point else None
            if c is not None:
                k = const(c, y.lo.dtype)  # type: ignore[union-attr]
                lo, hi = self._op(Mul, x.lo, k), self._op(Mul, x.hi, k)
                return Interval(lo, hi) if c >= 0 else Interval(hi, lo)
        if a.is_point and b.is_point:
            return Interval.point(self._op(Mul, a.lo, b.lo))  # type: ignore[arg-type]
        ends = [self._const(v) for v in (a.lo, a.hi, b.lo, b.hi)]
        if all(v is not None for v in ends):
            ps = [x * y for x in ends[:2] for y in ends[2:]]  # type: ignore[operator]
            d = dt.element(a.lo.dtype)  # type: ignore[union-attr]
            return Interval(const(min(ps), d), const(max(ps), d))
        sa, sb = self._sign(a), self._sign(b)
        m = self._op
        if sa > 0 and sb > 0:
            return Interval(m(Mul, a.lo, b.lo), m(Mul, a.hi, b.hi))
        if sa > 0 and sb < 0:
            return Interval(m(Mul, a.hi, b.lo), m(Mul, a.lo, b.hi))
        if sa < 0 and sb > 0:
            return Interval(m(Mul, a.lo, b.hi), m(Mul, a.hi, b.lo))
        if sa < 0 and sb < 0:
            return Interval(m(Mul, a.hi, b.hi), m(Mul, a.lo, b.lo))
        return Interval.everything()

    def eval(self, e: Expr) -> Interval:  # noqa: C901 - one branch per node kind
        if isinstance(e, Var):
            iv = self.dom.get(e)
            return Interval.point(e) if iv is None else iv
        if isinstance(e, (IntImm, FloatImm)):
            return Interval.point(e)
        if not dt.is_int(e.dtype) and not dt.is_bool(e.dtype):
            return Interval.everything()
        if isinstance(e, (CmpOp, And, Or, Not)):
            return Interval(const(0, "bool"), const(1, "bool"))
        if isinstance(e, BinaryOp):
            a, b = self.eval(e.a), self.eval(e.b)
            if isinstance(e, Add):
                return self.add(a, b)
            if isinstance(e, Sub):
                return Interval(self._op(Sub, a.lo, b.hi), self._op(Sub, a.hi, b.lo))
            if isinstance(e, Mul):
                return self.mul(a, b)
            if isinstance(e, (FloorDiv, FloorMod)):
                return self._divmod(e, a, b)
            if isinstance(e, Min):
                lo = self._op(Min, a.lo, b.lo)
                return Interval(lo, self._op(Min, a.hi, b.hi) if _both(a.hi, b.hi) else _either(a.hi, b.hi))
            if isinstance(e, Max):
                lo = self._op(Max, a.lo, b.lo) if _both(a.lo, b.lo) else _either(a.lo, b.lo)
                return Interval(lo, self._op(Max, a.hi, b.hi))
            return self._dtype(e)  # Div (truncating) is rare in index math
        if isinstance(e, Select):
            t, f = self.eval(e.t), self.eval(e.f)
            return Interval(self._op(Min, t.lo, f.lo), self._op(Max, t.hi, f.hi))
        if isinstance(e, Cast):
            src, dst = dtype_bounds(e.value.dtype), dtype_bounds(e.dtype)
            if dt.is_float(e.value.dtype) or not (dst[0] <= src[0] and src[1] <= dst[1]):
                return self._dtype(e)  # narrowing may wrap
            v = self.eval(e.value)
            lo = None if v.lo is None else self.s.visit(Cast(e.dtype, v.lo))
            hi = None if v.hi is None else self.s.visit(Cast(e.dtype, v.hi))
            return Interval(lo, hi)
        if isinstance(e, Broadcast):
            return self.eval(e.value)
        if isinstance(e, Ramp):
            el = dt.element(e.dtype)
            span = Interval(const(0, el), const(e.lanes - 1, el))
            return self.add(self.eval(e.base), self.mul(self.eval(e.stride), span))
        if isinstance(e, Let):
            saved = self.dom.get(e.var)
            self.dom[e.var] = self.eval(e.value)
            try:
                return self.eval(e.body)
            finally:
                if saved is None:
                    del self.dom[e.var]
                else:
                    self.dom[e.var] = saved
        return self._dtype(e)  # loads, calls: only what the dtype says

    def _divmod(self, e: FloorDiv | FloorMod, a: Interval, b: Interval) -> Interval:
        c = self._const(b.lo) if b.is_point else None
        if isinstance(e, FloorDiv):
            if c is not None and c != 0:
                lo, hi = self._op(FloorDiv, a.lo, b.lo), self._op(FloorDiv, a.hi, b.lo)
                return Interval(lo, hi) if c > 0 else Interval(hi, lo)
            if b.lo is not None and self.s.bounds_of(b.lo)[0] >= 1 and self._sign(a) > 0:
                lo = self._op(FloorDiv, a.lo, b.hi) if b.hi is not None else const(0, e.dtype)
                return Interval(lo, self._op(FloorDiv, a.hi, b.lo))
            return Interval.everything()
        if c is not None and c > 0:
            if a.lo is not None and a.hi is not None:
                q = self.s.visit(binop(Sub, binop(FloorDiv, a.hi, c), binop(FloorDiv, a.lo, c)))
                if isinstance(q, IntImm) and q.value == 0:  # one period: x % c is x - k*c
                    return Interval(self._op(FloorMod, a.lo, b.lo), self._op(FloorMod, a.hi, b.lo))
            return Interval(const(0, e.dtype), const(c - 1, e.dtype))
        if b.lo is not None and self.s.bounds_of(b.lo)[0] >= 1:
            return Interval(const(0, e.dtype), self._op(Sub, b.hi, const(1, e.dtype)))
        return Interval.everything()


__all__ = [
    "ConstBounds",
    "Interval",
    "can_prove",
    "const_bounds",
    "dtype_bounds",
    "eval_interval",
    "mul_bounds",
]

"""The expression simplifier: a table of rewrite rules applied bottom-up to a fixpoint.

Every rule is one line of `RULES` with its algebra next to it, and every rule is checked by
random evaluation (tests/arith/test_simplify.py). Integer ``+``, ``-`` and ``* constant`` are
not rewritten rule by rule but normalised through a *linear form* (``sum c_i * t_i + k`` with the
terms in a fixed order), which is what makes ``(i*32 + j) - i*32`` become ``j`` however the sum
was nested.

Semantics are never changed: integer rules assume no overflow (as the rest of the compiler
does), float expressions are only constant-folded (IEEE-exact operations only) and multiplied
or divided by exactly 1.0 (which IEEE leaves unchanged); ``x * 0.0`` and ``x + 0.0`` stay.

``ranges`` maps a variable to ``(min, extent)``, meaning ``min <= var < min + extent``; they let
``x // 32 -> 0`` and ``min(i, 100) -> i`` fire. Results are memoised per call by node identity,
and nothing is rebuilt when no rule fires, so ``simplify(e) is e`` for a simplified ``e``.

>>> from tecomp.ir import Var
>>> i, j = Var("i"), Var("j")
>>> print(simplify((i * 32 + j) // 32, {j: (0, 32)}), simplify(2 * (i + 1) - 2))
i i * 2
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from math import gcd
from typing import Any

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
    BufferLoad,
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
    StringImm,
    Sub,
    Var,
    const,
)
from ..ir.functor import ExprMutator, free_vars, substitute
from ..ir.printer import expr_str
from ..ir.structural import structural_equal
from .evaluate import evaluate
from .interval import (
    INF,
    Bound,
    ConstBounds,
    Ext,
    Lin,
    Ranges,
    Terms,
    VarBounds,
    lin_add,
    lin_scale,
    linear_bounds,
    norm_ranges,
)

_LEAVES = (IntImm, FloatImm, StringImm, Var)
_MAX_REWRITES = 64  # per node; rules terminate long before, this only bounds a future bug


# predicates and small builders ------------------------------------------------------------------


def _iv(e: Expr) -> int | None:
    """The integer constant ``e`` is (a vector of), or None."""
    if isinstance(e, Broadcast):
        e = e.value
    if isinstance(e, IntImm) and not dt.is_bool(e.dtype):
        return e.value
    return None


def _pos(e: Expr) -> int | None:
    """A positive scalar integer constant, or None (the divisors the div/mod rules handle)."""
    return e.value if isinstance(e, IntImm) and e.value > 0 and not dt.is_bool(e.dtype) else None


def _bv(e: Expr) -> bool | None:
    if isinstance(e, Broadcast):
        e = e.value
    if isinstance(e, IntImm) and dt.is_bool(e.dtype):
        return bool(e.value)
    return None


def _fv(e: Expr) -> float | None:
    if isinstance(e, Broadcast):
        e = e.value
    return e.value if isinstance(e, FloatImm) else None


def _int(e: Expr) -> bool:
    return dt.is_int(e.dtype)


def _sint(e: Expr) -> bool:
    """A scalar integer: the domain of the linear form and of bound reasoning."""
    return dt.is_int(e.dtype) and dt.lanes(e.dtype) == 1


def _same(a: Expr, b: Expr) -> bool:
    return structural_equal(a, b)


def _holds(u: str, t: str) -> bool:
    """Every value of dtype ``t`` survives a round trip through dtype ``u``."""
    if dt.is_bool(t):
        return dt.is_int(u) or dt.is_bool(u)
    if dt.is_int(t) and dt.is_int(u):
        if dt.is_uint(t) == dt.is_uint(u):
            return dt.bits(u) >= dt.bits(t)
        return dt.is_uint(t) and dt.bits(u) > dt.bits(t)
    if not (dt.is_float(t) and dt.is_float(u)):
        return False
    # every value survives only if both the exponent range and the mantissa are at least as
    # wide: float16 (5, 10) and bfloat16 (8, 7) do not hold each other although both are 16 bits
    (eu, mu), (et, mt) = _FLOAT_FORMAT[dt.element(u)], _FLOAT_FORMAT[dt.element(t)]
    return eu >= et and mu >= mt


# (exponent bits, mantissa bits) of each float dtype
_FLOAT_FORMAT = {"float16": (5, 10), "bfloat16": (8, 7), "float32": (8, 23), "float64": (11, 52)}


def _decide(op: type[CmpOp], lo: Ext, hi: Ext) -> bool | None:
    """Truth of ``d op 0`` for every ``d`` in ``[lo, hi]``, or None if it depends on ``d``."""
    if op is LT:
        return True if hi < 0 else False if lo >= 0 else None
    if op is LE:
        return True if hi <= 0 else False if lo > 0 else None
    if op is GT:
        return True if lo > 0 else False if hi <= 0 else None
    if op is GE:
        return True if lo >= 0 else False if hi < 0 else None
    ne = lo > 0 or hi < 0
    if op is EQ:
        return True if lo == hi == 0 else False if ne else None
    return True if ne else False if lo == hi == 0 else None  # NE


_NEGATE: dict[type[CmpOp], type[CmpOp]] = {LT: GE, LE: GT, GT: LE, GE: LT, EQ: NE, NE: EQ}
_FLIP: dict[type[CmpOp], type[CmpOp]] = {LT: GT, LE: GE, GT: LT, GE: LE, EQ: EQ, NE: NE}
_FIELDS: dict[type, tuple[str, ...]] = {}


class Simplifier(ExprMutator):
    """Simplifies expressions under one ``ranges`` context, memoising across calls.

    Create one per scope and call it many times (the Simplify pass does); `simplify` is the
    one-shot form.
    """

    def __init__(self, ranges: Ranges | None = None, var_bounds: VarBounds | None = None) -> None:
        self.ranges = norm_ranges(ranges)
        self.cb = ConstBounds(self.ranges, var_bounds)
        self._memo: dict[int, tuple[Expr, Expr]] = {}
        self._lin: dict[int, tuple[Expr, Lin]] = {}
        self._hash: dict[int, tuple[Expr, int]] = {}
        self._interned: dict[int, list[Expr]] = {}
        self._str: dict[int, tuple[Expr, str]] = {}
        self.fallback_depth = 0  # nesting of the symbolic fallback (ranges may refer to each other)
        self._plain: Simplifier | None = None
        # vars whose range is symbolic: bounds through them need the interval fallback
        self.symbolic = {v for v, (mn, ext) in self.ranges.items()
                          if not isinstance(mn, IntImm) or not isinstance(ext, IntImm)}

    def __call__(self, e: Expr) -> Expr:
        return self.visit(e)

    # the rewrite engine ---------------------------------------------------------------------
    def visit(self, e: Expr) -> Expr:
        m = self._memo.get(id(e))
        if m is not None and m[0] is e:
            return m[1]
        if isinstance(e, _LEAVES):
            return e
        r = self._rewrite(self._find(e)(self, e))
        self._memo[id(e)] = (e, r)
        if r is not e:
            self._memo[id(r)] = (r, r)
        return r

    def _rewrite(self, e: Expr) -> Expr:
        """Apply the first rule that fires, re-simplify what it built, repeat until none fires."""
        for _ in range(_MAX_REWRITES):
            for rule in _rules_for(type(e)):
                out = rule.fn(self, e)
                if out is not None and out is not e:
                    break
            else:
                return e
            m = self._memo.get(id(out))
            if m is not None and m[0] is out:
                return m[1]
            if isinstance(out, _LEAVES):
                return out
            e = self._find(out)(self, out)  # children of a rule's output may be new nodes
        return e

    # queries --------------------------------------------------------------------------------
    def prove(self, cond: Expr) -> bool:
        """True when ``cond`` simplifies to true under this context's ranges."""
        return _bv(self.visit(cond)) is True

    def bounds_of(self, e: Expr) -> Bound:
        """Constant ``(lo, hi)`` of ``e`` (simplified first), -inf/inf where unknown."""
        r = self.visit(e)
        if _sint(r):
            terms, k = self.linear(r)
            return self.lin_bounds(terms, k, r.dtype)
        return self.cb.get(r)

    def lin_bounds(self, terms: Terms, k: int, dtype: str) -> Bound:
        """Constant bounds of the linear form ``sum c*t + k`` (see `interval.linear_bounds`)."""
        return linear_bounds(self, terms, k, dtype)

    def plain(self) -> Simplifier:
        """A simplifier without ranges, shared for the symbolic-interval fallback."""
        if self._plain is None:
            self._plain = Simplifier()
        return self._plain

    # linear form ----------------------------------------------------------------------------
    def linear(self, e: Expr) -> Lin:
        """``e`` (a scalar integer) as ``({term: coeff}, constant)``; callers must not mutate it."""
        m = self._lin.get(id(e))
        if m is not None and m[0] is e:
            return m[1]
        r: Lin
        if isinstance(e, IntImm):
            r = ({}, e.value)
        elif isinstance(e, (Add, Sub, Mul)) and e.a.dtype == e.dtype == e.b.dtype:
            if isinstance(e, Add):
                r = lin_add(self.linear(e.a), self.linear(e.b), 1)
            elif isinstance(e, Sub):
                r = lin_add(self.linear(e.a), self.linear(e.b), -1)
            elif isinstance(e.b, IntImm):
                r = lin_scale(self.linear(e.a), e.b.value)
            elif isinstance(e.a, IntImm):
                r = lin_scale(self.linear(e.b), e.a.value)
            else:
                r = self._term(e)
        else:
            r = self._term(e)
        self._lin[id(e)] = (e, r)
        return r

    def _term(self, e: Expr) -> Lin:
        t = self.intern(e)
        return {id(t): (t, 1)}, 0

    def intern(self, e: Expr) -> Expr:
        """The first-seen expression structurally equal to ``e`` (so terms can be dict keys)."""
        bucket = self._interned.setdefault(self._shash(e), [])
        for x in bucket:
            if x is e or structural_equal(x, e):
                return x
        bucket.append(e)
        return e

    def _shash(self, e: Expr) -> int:
        m = self._hash.get(id(e))
        if m is not None and m[0] is e:
            return m[1]
        if isinstance(e, Var):
            h = id(e)
        else:
            names = _FIELDS.get(type(e))
            if names is None:
                names = _FIELDS[type(e)] = tuple(f.name for f in fields(e))  # type: ignore[arg-type]
            h = hash((type(e).__name__, *(self._hfield(getattr(e, n)) for n in names)))
        self._hash[id(e)] = (e, h)
        return h

    def _hfield(self, v: Any) -> int:
        if isinstance(v, Expr):
            return self._shash(v)
        if isinstance(v, tuple):
            return hash(tuple(self._hfield(x) for x in v))
        try:
            return hash(v)
        except TypeError:
            return id(v)

    def _key(self, t: Expr) -> str:
        m = self._str.get(id(t))
        if m is None or m[0] is not t:
            m = self._str[id(t)] = (t, expr_str(t))
        return m[1]

    def rebuild(self, terms: Iterable[tuple[Expr, int]], k: int, dtype: str) -> Expr:
        """The canonical expression of a linear form.

        Terms by decreasing |coefficient| then by printed form (``io*32 + ii``), positive ones
        first and the negative ones subtracted; the constant last (``i*2 + 3``), or first when
        every term is negative (``3 - i``). Any prefix of a canonical sum is canonical, so the
        partial sums built here are fixpoints too.
        """
        items = sorted((tc for tc in terms if tc[1]), key=lambda tc: (-abs(tc[1]), self._key(tc[0])))
        acc: Expr | None = None
        for t, c in items:
            if c > 0:
                x = t if c == 1 else Mul(t, IntImm(c, dtype))
                acc = x if acc is None else Add(acc, x)
        if acc is None and k > 0 and items:
            acc, k = IntImm(k, dtype), 0
        for t, c in items:
            if c < 0:
                if acc is None:
                    acc = Mul(t, IntImm(c, dtype))
                else:
                    acc = Sub(acc, t if c == -1 else Mul(t, IntImm(-c, dtype)))
        if acc is None:
            return IntImm(k, dtype)
        if k:
            acc = Add(acc, IntImm(k, dtype)) if k > 0 else Sub(acc, IntImm(-k, dtype))
        return acc

    def recombine(self, terms: Terms, k: int) -> Lin:
        """Fold ``x//c`` terms back with their partner: ``(x//c)*c + x%c -> x``, ``x - (x//c)*c -> x%c``."""
        changed = True
        while changed:
            changed = False
            for key, (f, fc) in terms.items():
                if not isinstance(f, FloorDiv) or (c := _pos(f.b)) is None:
                    continue
                x = self.intern(f.a)
                for key2, (m, mc) in terms.items():
                    if isinstance(m, FloorMod) and _pos(m.b) == c and self.intern(m.a) is x \
                            and fc == mc * c:
                        rest = {q: v for q, v in terms.items() if q not in (key, key2)}
                        terms, k = lin_add((rest, k), lin_scale(self.linear(x), mc), 1)
                        changed = True
                        break
                if changed:
                    break
                if fc % c == 0:
                    kk = -fc // c
                    xt, xk = self.linear(x)
                    if xt and all(terms.get(q, (None, 0))[1] == kk * v for q, (_, v) in xt.items()):
                        rest = {q: v for q, v in terms.items() if q != key}
                        terms, k = lin_add((rest, k), lin_scale((xt, xk), kk), -1)
                        mod = self.intern(FloorMod(x, IntImm(c, x.dtype)))
                        terms, k = lin_add((terms, k), ({id(mod): (mod, kk)}, 0), 1)
                        changed = True
                        break
        return terms, k

    def canonical(self, e: Expr) -> Expr | None:
        terms, k = self.recombine(*self.linear(e))
        r = self.rebuild(terms.values(), k, e.dtype)
        return None if _same(r, e) else r


def simplify(e: Expr, ranges: Ranges | None = None, *, var_bounds: VarBounds | None = None) -> Expr:
    """``e`` rewritten to a simpler equivalent under ``ranges`` (var -> (min, extent)).

    ``var_bounds`` gives constant ``(lo, hi)`` bounds (None: unbounded) of vars that are not
    loop variables, e.g. ``{n: (0, None)}`` for a shape dimension. Returns ``e`` itself when
    nothing simplifies.
    """
    if isinstance(e, _LEAVES):
        return e
    return Simplifier(ranges, var_bounds).visit(e)


# rules --------------------------------------------------------------------------------------------

RuleFn = Callable[[Simplifier, Any], "Expr | None"]


@dataclass(frozen=True, slots=True)
class Rule:
    """One rewrite: applies to instances of ``node``; ``fn`` returns the rewrite or None."""

    node: type[Expr]
    algebra: str
    fn: RuleFn


def _fold(s: Simplifier, e: Any) -> Expr | None:
    """Evaluate a node whose operands are all immediates (same semantics as `evaluate`)."""
    kids = (e.a, e.b) if isinstance(e, (BinaryOp, CmpOp, And, Or)) else \
        (e.a,) if isinstance(e, Not) else (e.value,) if isinstance(e, Cast) else ()
    if not kids or not all(isinstance(x, (IntImm, FloatImm)) for x in kids):
        return None
    if dt.is_float(e.dtype) and isinstance(e, (FloorDiv, FloorMod)):
        return None  # codegen's floor(a / b) and numpy's floor_divide differ in the last ulp
    try:
        v = evaluate(e, {})
    except (ZeroDivisionError, OverflowError):
        return None  # undefined at run time; leave it for the user to see
    if isinstance(e, (Min, Max)) and any(isinstance(x, FloatImm) and x.value != x.value for x in kids):
        return None  # NaN handling of min/max is the backend's choice
    return const(v, e.dtype)  # type: ignore[arg-type]


def _bcast(s: Simplifier, e: Any) -> Expr | None:
    a, b = e.a, e.b
    if isinstance(a, Broadcast) and isinstance(b, Broadcast) and a.lanes == b.lanes:
        return Broadcast(type(e)(a.value, b.value), a.lanes)
    return None


def _ramp_add(s: Simplifier, e: Add | Sub) -> Expr | None:
    a, b, op = e.a, e.b, type(e)
    if not _int(e):
        return None  # b1 + i*s1 + b2 + i*s2 rounds differently from (b1+b2) + i*(s1+s2)
    if isinstance(a, Ramp) and isinstance(b, Ramp):
        return Ramp(op(a.base, b.base), op(a.stride, b.stride), a.lanes)
    if isinstance(a, Ramp) and isinstance(b, Broadcast):
        return Ramp(op(a.base, b.value), a.stride, a.lanes)
    if isinstance(a, Broadcast) and isinstance(b, Ramp):
        stride = b.stride if op is Add else Sub(IntImm(0, b.stride.dtype), b.stride)
        return Ramp(op(a.value, b.base), stride, b.lanes)
    return None


def _ramp_mul(s: Simplifier, e: Mul) -> Expr | None:
    a, b = (e.a, e.b) if isinstance(e.a, Ramp) else (e.b, e.a)
    if _int(e) and isinstance(a, Ramp) and isinstance(b, Broadcast):
        return Ramp(Mul(a.base, b.value), Mul(a.stride, b.value), a.lanes)
    return None


def _ramp_divmod(s: Simplifier, e: FloorDiv | FloorMod) -> Expr | None:
    a, b = e.a, e.b
    if not (isinstance(a, Ramp) and isinstance(b, Broadcast)) or (c := _pos(b.value)) is None:
        return None
    st = _iv(a.stride)
    if st is None or st < 0:
        return None
    first = s.visit(FloorDiv(a.base, b.value))
    last = s.visit(FloorDiv(Add(a.base, IntImm(st * (a.lanes - 1), a.base.dtype)), b.value))
    if not _same(first, last):
        return None  # the lanes straddle a multiple of c
    if isinstance(e, FloorDiv):
        return Broadcast(first, a.lanes)
    return Ramp(FloorMod(a.base, IntImm(c, a.base.dtype)), a.stride, a.lanes)


def _canon(s: Simplifier, e: Add | Sub | Mul) -> Expr | None:
    if not _sint(e) or not (e.a.dtype == e.dtype == e.b.dtype):
        return None
    if isinstance(e, Mul) and not isinstance(e.a, IntImm) and not isinstance(e.b, IntImm):
        return None  # a product of two non-constants is a term, not a linear form
    return s.canonical(e)


def _mul_order(s: Simplifier, e: Mul) -> Expr | None:
    if _sint(e) and _iv(e.a) is None and _iv(e.b) is None and s._key(e.b) < s._key(e.a):
        return Mul(e.b, e.a)
    return None


def _div_range(s: Simplifier, e: FloorDiv) -> Expr | None:
    c = _pos(e.b)
    if c is None or not _sint(e):
        return None
    lo, hi = s.bounds_of(e.a)
    if lo == -INF or hi == INF or lo // c != hi // c:  # type: ignore[operator]
        return None
    return IntImm(int(lo // c), e.dtype)  # type: ignore[operator]


def _mod_range(s: Simplifier, e: FloorMod) -> Expr | None:
    c = _pos(e.b)
    if c is None or not _sint(e):
        return None
    lo, hi = s.bounds_of(e.a)
    if lo == -INF or hi == INF or lo // c != hi // c:  # type: ignore[operator]
        return None
    q = int(lo // c)  # type: ignore[operator]
    return e.a if q == 0 else Sub(e.a, IntImm(q * c, e.dtype))


def _div_div(s: Simplifier, e: FloorDiv) -> Expr | None:
    a, b = _pos(e.b), e.a
    if a is None or not isinstance(b, FloorDiv) or (c := _pos(b.b)) is None or not _sint(e):
        return None
    return FloorDiv(b.a, IntImm(a * c, e.dtype))


def _mod_div(s: Simplifier, e: FloorDiv) -> Expr | None:
    a, m = _pos(e.b), e.a
    if a is None or not isinstance(m, FloorMod) or (c := _pos(m.b)) is None or c % a or not _sint(e):
        return None
    return FloorMod(FloorDiv(m.a, IntImm(a, e.dtype)), IntImm(c // a, e.dtype))


def _mod_mod(s: Simplifier, e: FloorMod) -> Expr | None:
    c, m = _pos(e.b), e.a
    if c is None or not isinstance(m, FloorMod) or (mc := _pos(m.b)) is None or mc % c:
        return None
    return FloorMod(m.a, e.b)


def _split(s: Simplifier, e: FloorDiv | FloorMod) -> Expr | None:
    """Move the multiples of c out of x: quotient terms for //, dropped terms for %."""
    c = _pos(e.b)
    if c is None or c == 1 or not _sint(e) or e.a.dtype != e.dtype:
        return None
    terms, k = s.linear(e.a)
    q = [(t, v // c) for t, v in terms.values() if v % c == 0]
    r = [(t, v) for t, v in terms.values() if v % c]
    if isinstance(e, FloorMod):
        if not q and -c < k < c:
            return None
        return FloorMod(s.rebuild(r, k if -c < k < c else k % c, e.dtype), e.b)
    qk = k // c if k % c == 0 else 0
    if not q and not qk:
        return None
    rest = FloorDiv(s.rebuild(r, k - qk * c, e.dtype), e.b)
    return Add(s.rebuild(q, qk, e.dtype), rest)


def _gcd(s: Simplifier, e: FloorDiv | FloorMod) -> Expr | None:
    """(g*y) // (g*c) -> y // c and (g*y) % (g*c) -> (y % c) * g for g = gcd of everything."""
    c = _pos(e.b)
    if c is None or c == 1 or not _sint(e) or e.a.dtype != e.dtype:
        return None
    terms, k = s.linear(e.a)
    g = gcd(c, k, *(v for _, v in terms.values()))
    if g <= 1:
        return None
    y = s.rebuild([(t, v // g) for t, v in terms.values()], k // g, e.dtype)
    if isinstance(e, FloorDiv):
        return FloorDiv(y, IntImm(c // g, e.dtype))
    return Mul(FloorMod(y, IntImm(c // g, e.dtype)), IntImm(g, e.dtype))


def _div_low(s: Simplifier, e: FloorDiv) -> Expr | None:
    """(a*y + z) // c -> y // (c/a) for a dividing c and 0 <= z < a: the low part z never
    carries into a multiple of a, so it never reaches c. Tried with the fewest large terms
    first (the largest a), so ``(ko*8 + ki*2) // 64`` with ``ki`` in [0, 4) is ``ko // 8``.
    It is what makes every lane of ``ramp(k*v, 1, v) // g`` one quotient when ``v`` divides
    ``g`` (a vector narrower than a convolution's group: `_ramp_divmod` compares the first
    and last lanes)."""
    c = _pos(e.b)
    if c is None or c == 1 or not _sint(e) or e.a.dtype != e.dtype:
        return None
    terms, k = s.linear(e.a)
    ordered = sorted(terms.items(), key=lambda kv: -abs(kv[1][1]))
    for p in range(1, len(ordered) + 1):
        big, small = ordered[:p], dict(ordered[p:])
        a = gcd(c, *(v for _, (_, v) in big))
        if a <= 1:
            break  # more terms only shrink the gcd
        if not small and k % a == 0:
            break  # nothing low: `_gcd`'s case
        lo, hi = s.lin_bounds(small, k % a, e.dtype) if small else (k % a, k % a)
        if lo != -INF and hi != INF and 0 <= lo and hi < a:  # type: ignore[operator]
            y = s.rebuild([(t, v // a) for _, (t, v) in big], k // a, e.dtype)
            return FloorDiv(y, IntImm(c // a, e.dtype))
    return None


def _tdiv_range(s: Simplifier, e: Div) -> Expr | None:
    c = _iv(e.b)
    if c is None or c == 0 or not _sint(e):
        return None
    lo, hi = s.bounds_of(e.a)
    return IntImm(0, e.dtype) if -abs(c) < lo and hi < abs(c) else None


def _minmax(s: Simplifier, e: Min | Max) -> Expr | None:
    """min(a, b) -> a when a - b <= 0 is provable (and the three mirror images)."""
    if not _sint(e) or e.a.dtype != e.b.dtype:
        return None
    terms, k = lin_add(s.linear(e.a), s.linear(e.b), -1)
    lo, hi = s.lin_bounds(terms, k, e.dtype)
    lower, upper = (e.a, e.b) if isinstance(e, Min) else (e.b, e.a)
    if hi <= 0:
        return lower
    if lo >= 0:
        return upper
    return None


def _absorb(s: Simplifier, e: Min | Max) -> Expr | None:
    other = Max if isinstance(e, Min) else Min
    for a, b in ((e.a, e.b), (e.b, e.a)):
        if _int(e) and isinstance(b, other) and (_same(b.a, a) or _same(b.b, a)):
            return a
    return None


def _minmax_const(s: Simplifier, e: Min | Max) -> Expr | None:
    a = e.a
    if _sint(e) and type(a) is type(e) and isinstance(a.b, IntImm) and isinstance(e.b, IntImm):  # type: ignore[attr-defined]
        return type(e)(a.a, type(e)(a.b, e.b))  # type: ignore[attr-defined]
    return None


def _cmp(s: Simplifier, e: CmpOp) -> Expr | None:
    """Decide a - b against 0 by bounds; otherwise cancel terms common to both sides."""
    if not _sint(e.a) or e.a.dtype != e.b.dtype:
        return None
    la, lb = s.linear(e.a), s.linear(e.b)
    terms, k = lin_add(la, lb, -1)
    verdict = _decide(type(e), *s.lin_bounds(terms, k, e.a.dtype))
    if verdict is not None:
        return const(verdict, e.dtype)
    if len(terms) == len(la[0]) + len(lb[0]) and not (la[1] and lb[1]):
        return None
    pos = [(t, c) for t, c in terms.values() if c > 0]
    neg = [(t, -c) for t, c in terms.values() if c < 0]
    d = e.a.dtype
    if not pos:  # k - N op 0  <=>  N flip(op) k
        return _FLIP[type(e)](s.rebuild(neg, 0, d), IntImm(k, d))
    return type(e)(s.rebuild(pos, 0, d), s.rebuild(neg, -k, d))


def _not_cmp(s: Simplifier, e: Not) -> Expr | None:
    a = e.a
    if isinstance(a, CmpOp) and _int(a.a):  # !(a < b) == a >= b fails for NaN, so ints only
        return _NEGATE[type(a)](a.a, a.b)
    return None


def _cast_cast(s: Simplifier, e: Cast) -> Expr | None:
    v = e.value
    if isinstance(v, Cast) and v.value.dtype == e.dtype and _holds(v.dtype, e.dtype):
        return v.value
    return None


def _let_inline(s: Simplifier, e: Let) -> Expr | None:
    if isinstance(e.value, (IntImm, FloatImm, Var)) or e.var not in free_vars(e.body):
        return substitute(e.body, {e.var: e.value})  # type: ignore[no-any-return]
    return None


def _point(s: Simplifier, e: BinaryOp | Select) -> Expr | None:
    if not _sint(e):
        return None
    lo, hi = s.cb.get(e)
    return IntImm(int(lo), e.dtype) if lo == hi else None


def _bcast1(s: Simplifier, e: Not | Cast) -> Expr | None:
    v = e.a if isinstance(e, Not) else e.value
    if not isinstance(v, Broadcast):
        return None
    op = Not(v.value) if isinstance(e, Not) else Cast(dt.element(e.dtype), v.value)
    return Broadcast(op, v.lanes)


def _const_right(s: Simplifier, e: Min | Max) -> Expr | None:
    if _sint(e) and isinstance(e.a, IntImm) and not isinstance(e.b, IntImm):
        return type(e)(e.b, e.a)
    return None


def _select_bool(s: Simplifier, e: Select) -> Expr | None:
    if e.cond.dtype != e.dtype:
        return None
    t, f = _bv(e.t), _bv(e.f)
    return e.cond if t is True and f is False else Not(e.cond) if t is False and f is True else None


def _load_pred(s: Simplifier, e: BufferLoad) -> Expr | None:
    if e.predicate is not None and _bv(e.predicate) is True:
        return BufferLoad(e.buffer, e.indices)
    return None


RULES: tuple[Rule, ...] = (
    # -- constant folding and vectors of constants (every dtype)
    Rule(BinaryOp, "c1 op c2 -> c  (ints wrap to their dtype; floats round to theirs)", _fold),
    Rule(CmpOp, "c1 cmp c2 -> true|false", _fold),
    Rule(And, "c1 && c2 -> c", _fold),
    Rule(Or, "c1 || c2 -> c", _fold),
    Rule(Not, "!c -> c'", _fold),
    Rule(Cast, "T(c) -> c'  (float -> int saturates, NaN -> 0)", _fold),
    Rule(BinaryOp, "x(a) op x(b) -> x(a op b)  (x(v) is a broadcast)", _bcast),
    Rule(CmpOp, "x(a) cmp x(b) -> x(a cmp b)", _bcast),
    Rule(And, "x(a) && x(b) -> x(a && b)", _bcast),
    Rule(Or, "x(a) || x(b) -> x(a || b)", _bcast),
    Rule(Not, "!x(a) -> x(!a)", _bcast1),
    Rule(Cast, "T(x(a)) -> x(T(a))", _bcast1),
    # -- identities (ints, vectors of ints too)
    Rule(Add, "x + 0 -> x", lambda s, e: e.a if _int(e) and _iv(e.b) == 0 else None),
    Rule(Add, "0 + x -> x", lambda s, e: e.b if _int(e) and _iv(e.a) == 0 else None),
    Rule(Sub, "x - 0 -> x", lambda s, e: e.a if _int(e) and _iv(e.b) == 0 else None),
    Rule(Sub, "x - x -> 0", lambda s, e: const(0, e.dtype) if _int(e) and _same(e.a, e.b) else None),
    Rule(Mul, "x * 1 -> x", lambda s, e: e.a if _int(e) and _iv(e.b) == 1 else None),
    Rule(Mul, "1 * x -> x", lambda s, e: e.b if _int(e) and _iv(e.a) == 1 else None),
    Rule(Mul, "x * 0 -> 0, 0 * x -> 0  (ints only: inf * 0 is nan)",
         lambda s, e: const(0, e.dtype) if _int(e) and 0 in (_iv(e.a), _iv(e.b)) else None),
    Rule(Mul, "x * 1.0 -> x, 1.0 * x -> x  (exact in IEEE)",
         lambda s, e: e.a if _fv(e.b) == 1.0 else e.b if _fv(e.a) == 1.0 else None),
    Rule(Div, "x / 1 -> x, x / 1.0 -> x  (exact in IEEE)",
         lambda s, e: e.a if _iv(e.b) == 1 or _fv(e.b) == 1.0 else None),
    Rule(FloorDiv, "x // 1 -> x", lambda s, e: e.a if _int(e) and _iv(e.b) == 1 else None),
    Rule(FloorMod, "x % 1 -> 0", lambda s, e: const(0, e.dtype) if _int(e) and _iv(e.b) == 1 else None),
    # -- ramps of ints: lane k of ramp(b, s) is b + k*s
    Rule(Ramp, "ramp(b, 0, n) -> x(b)",
         lambda s, e: Broadcast(e.base, e.lanes) if _iv(e.stride) == 0 else None),
    Rule(Add, "ramp(b1, s1) + ramp(b2, s2) -> ramp(b1 + b2, s1 + s2); ramp(b, s) + x(c) -> ramp(b + c, s)",
         _ramp_add),
    Rule(Sub, "ramp(b1, s1) - ramp(b2, s2) -> ramp(b1 - b2, s1 - s2); x(c) - ramp(b, s) -> ramp(c - b, -s)",
         _ramp_add),
    Rule(Mul, "ramp(b, s) * x(c) -> ramp(b*c, s*c)", _ramp_mul),
    Rule(FloorDiv, "ramp(b, s, n) // x(c) -> x(b // c)  if every lane has the same quotient", _ramp_divmod),
    Rule(FloorMod, "ramp(b, s, n) % x(c) -> ramp(b % c, s, n)  if every lane has the same quotient",
         _ramp_divmod),
    # -- the linear form of scalar ints: sum c_i*t_i + k, like terms merged, terms ordered
    Rule(Add, "a + b -> canonical sum  ((i*32 + j) - i*32 -> j;  (x//c)*c + x%c -> x)", _canon),
    Rule(Sub, "a - b -> canonical sum  (x + 3 - x -> 3;  x - (x//c)*c -> x%c)", _canon),
    Rule(Mul, "(a + b) * c -> a*c + b*c;  c * a -> a * c", _canon),
    Rule(Mul, "b * a -> a * b  (non-constant factors in printed order)", _mul_order),
    # -- floor division and modulo by a positive constant c
    Rule(FloorDiv, "x // c -> q  if q*c <= x < (q+1)*c", _div_range),
    Rule(FloorMod, "x % c -> x - q*c  if q*c <= x < (q+1)*c", _mod_range),
    Rule(FloorDiv, "(x // a) // b -> x // (a*b)", _div_div),
    Rule(FloorDiv, "(x % (a*b)) // a -> (x // a) % b", _mod_div),
    Rule(FloorMod, "(x % (a*c)) % c -> x % c", _mod_mod),
    Rule(FloorDiv, "(y*c + z) // c -> y + z // c", _split),
    Rule(FloorMod, "(y*c + z) % c -> z % c", _split),
    Rule(FloorDiv, "(g*y) // (g*c) -> y // c", _gcd),
    Rule(FloorDiv, "(a*y + z) // c -> y // (c/a)  if a divides c and 0 <= z < a", _div_low),
    Rule(FloorMod, "(g*y) % (g*c) -> (y % c) * g", _gcd),
    Rule(Div, "x / c -> 0  (truncating) if |x| < |c|", _tdiv_range),
    Rule(BinaryOp, "e -> c  if the bounds of the integer e are [c, c]  (0 // j -> 0 for j >= 1)", _point),
    Rule(Select, "select(p, a, b) -> c  if the bounds of both a and b are [c, c]", _point),
    # -- min / max
    Rule(Min, "min(x, x) -> x", lambda s, e: e.a if _same(e.a, e.b) else None),
    Rule(Max, "max(x, x) -> x", lambda s, e: e.a if _same(e.a, e.b) else None),
    Rule(Min, "min(c, x) -> min(x, c)  (ints)", _const_right),
    Rule(Max, "max(c, x) -> max(x, c)  (ints)", _const_right),
    Rule(Min, "min(a, b) -> a if a - b <= 0, b if a - b >= 0", _minmax),
    Rule(Max, "max(a, b) -> a if a - b >= 0, b if a - b <= 0", _minmax),
    Rule(Min, "min(x, max(x, y)) -> x;  min(max(x, y), x) -> x  (ints)", _absorb),
    Rule(Max, "max(x, min(x, y)) -> x;  max(min(x, y), x) -> x  (ints)", _absorb),
    Rule(Min, "min(min(x, c1), c2) -> min(x, min(c1, c2))", _minmax_const),
    Rule(Max, "max(max(x, c1), c2) -> max(x, max(c1, c2))", _minmax_const),
    # -- comparisons of scalar ints
    Rule(CmpOp, "a cmp b -> true|false if the bounds of a - b decide; else cancel common terms", _cmp),
    # -- logic
    Rule(And, "true && x -> x, x && true -> x",
         lambda s, e: e.b if _bv(e.a) is True else e.a if _bv(e.b) is True else None),
    Rule(And, "false && x -> false, x && false -> false",
         lambda s, e: const(False, e.dtype) if False in (_bv(e.a), _bv(e.b)) else None),
    Rule(Or, "false || x -> x, x || false -> x",
         lambda s, e: e.b if _bv(e.a) is False else e.a if _bv(e.b) is False else None),
    Rule(Or, "true || x -> true, x || true -> true",
         lambda s, e: const(True, e.dtype) if True in (_bv(e.a), _bv(e.b)) else None),
    Rule(And, "x && x -> x", lambda s, e: e.a if _same(e.a, e.b) else None),
    Rule(Or, "x || x -> x", lambda s, e: e.a if _same(e.a, e.b) else None),
    Rule(Not, "!!x -> x", lambda s, e: e.a.a if isinstance(e.a, Not) else None),
    Rule(Not, "!(a < b) -> a >= b  (and the other five; ints only)", _not_cmp),
    # -- select
    Rule(Select, "select(true, t, f) -> t", lambda s, e: e.t if _bv(e.cond) is True else None),
    Rule(Select, "select(false, t, f) -> f", lambda s, e: e.f if _bv(e.cond) is False else None),
    Rule(Select, "select(c, t, t) -> t", lambda s, e: e.t if _same(e.t, e.f) else None),
    Rule(Select, "select(!c, t, f) -> select(c, f, t)",
         lambda s, e: Select(e.cond.a, e.f, e.t) if isinstance(e.cond, Not) else None),
    Rule(Select, "select(c, true, false) -> c;  select(c, false, true) -> !c", _select_bool),
    # -- casts, lets, loads
    Rule(Cast, "T(x: T) -> x", lambda s, e: e.value if e.value.dtype == e.dtype else None),
    Rule(Cast, "T(U(x: T)) -> x  if U holds every value of T", _cast_cast),
    Rule(Let, "let v = c|w in b -> b[v := c|w];  let v = x in b -> b  if v is unused", _let_inline),
    Rule(BufferLoad, "A[i if true] -> A[i]", _load_pred),
)

_BY_TYPE: dict[type, tuple[Rule, ...]] = {}


def _rules_for(t: type) -> tuple[Rule, ...]:
    r = _BY_TYPE.get(t)
    if r is None:
        r = _BY_TYPE[t] = tuple(rule for rule in RULES if issubclass(t, rule.node))
    return r


__all__ = ["RULES", "Rule", "Simplifier", "simplify"]

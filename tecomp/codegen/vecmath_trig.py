"""Vectorizable tan, asin, acos, atan, atan2 and float64-safe exp10, hypot, sinh, cosh,
asinh, acosh, atanh, emitted as plain LLVM IR.

Why this module exists: LLVM has intrinsics for these (``llvm.tan``, ``llvm.atan2``...),
but its x86 backend scalarizes their vector forms into one libm call per lane
(``atanf`` eight times for a ``<8 x float>``), which makes a vectorized kernel no faster
than a scalar one.  The kernels here use the same building blocks as `vecmath` (arithmetic,
``llvm.fmuladd``/``sqrt``/``fabs``/``copysign`` and ``select``), so one emitted sequence is
vector code for every lane count.  The one branch is tan's: finite arguments of 2^30 and
beyond go to libm lane by lane (see `_tan`), so tan is exact there too.

Algorithms and coefficients are Cephes' double-precision ones (Stephen L. Moshier,
netlib.org/cephes: ``atan.c``, ``asin.c``, ``tan.c``, ``sinh.c``), ~1 ulp of float64.
float32 (and the 16-bit floats, which the code generator computes as float32) are evaluated
in float64 and rounded once, which gives results within ~0.5 ulp of the correctly rounded
float32 value and makes every float32 subnormal a normal float64 number; float64 vectors
have half the lanes, still several times faster than one libm call per lane.

exp10, hypot and the hyperbolic functions were vector code only for float16/float32
(`vecmath.VIA_F64`, formulas evaluated in float64 that overflow or cancel for float64
arguments) and one libm call per lane for float64; their float64-safe kernels here (`WIDE`,
within 2 ulp of float64 in the tests) serve both now.

Special values follow C99 Annex F (as numpy does): the sign of zero is kept by the odd
functions, ``asin``/``acos`` of ``|x| > 1`` and ``tan`` of +-inf are NaN, ``atan(+-inf)``
is +-pi/2, and ``atan2`` implements every zero/infinity quadrant rule.

`vecmath` imports this module to register the functions, so the few kernels that build on
`vecmath`'s exp/log kernels import them inside the function, at code-generation time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from llvmlite import ir

if TYPE_CHECKING:
    from .vecmath import _Emitter

__all__ = ["TAN_ACCURATE_BELOW", "TRIG", "WIDE"]

_NAN = math.nan
_INF = math.inf
# pi/2 and pi as a double plus the rounding error of that double: (hi - a) + lo keeps the
# last bit that a plain subtraction from the rounded constant would lose.
_PIO2 = (math.pi / 2, 6.123233995736765886130e-17)
_PI = (math.pi, 1.2246467991473531772e-16)
_PIO4 = math.pi / 4
_MOREBITS = 6.123233995736765886130e-17  # pi/2 - fl(pi/2) (Cephes MOREBITS)
_LN10 = (2.302585092994045684018, -2.1707562233822493508e-16)  # fl(ln 10), ln 10 - fl(ln 10)

# Cephes atan.c: atan(t) = t + t^3 P(t^2)/Q(t^2) on 0 <= t <= 0.66 (Q monic, degree 5),
# reached through atan(x) = pi/2 + atan(-1/x) beyond tan(3pi/8) and
# atan(x) = pi/4 + atan((x-1)/(x+1)) between 0.66 and tan(3pi/8).
_ATAN_P = (-8.750608600031904122785e-1, -1.615753718733365076637e1, -7.500855792314704667340e1,
           -1.228866684490136173410e2, -6.485021904942025371773e1)
_ATAN_Q = (1.0, 2.485846490142306297962e1, 1.650270098316988542046e2,
           4.328810604912902668951e2, 4.853903996359136964868e2, 1.945506571482613964425e2)
_T3P8 = 2.41421356237309504880  # tan(3pi/8)

# Cephes asin.c: asin(a) = a + a^3 P(a^2)/Q(a^2) for a <= 0.625, and with z = 1 - a
# asin(a) = pi/2 - sqrt(2z) (1 + z R(z)/S(z)) beyond (Q, S monic).
_ASIN_P = (4.253011369004428248960e-3, -6.019598008014123785661e-1, 5.444622390564711410273e0,
           -1.626247967210700244449e1, 1.956261983317594739197e1, -8.198089802484824371615e0)
_ASIN_Q = (1.0, -1.474091372988853791896e1, 7.049610280856842141659e1,
           -1.471791292232726029859e2, 1.395105614657485689735e2, -4.918853881490881290097e1)
_ASIN_R = (2.967721961301243206100e-3, -5.634242780008963776856e-1, 6.968710824104713396794e0,
           -2.556901049652824852289e1, 2.853665548261061424989e1)
_ASIN_S = (1.0, -2.194779531642920639778e1, 1.470656354026814941758e2,
           -3.838770957603691357202e2, 3.424398657913078477438e2)

# Cephes tan.c: tan(r) = r + r^3 P(r^2)/Q(r^2) on |r| <= pi/4 (Q monic, degree 4).
_TAN_P = (-1.30936939181383777646e4, 1.15351664838587416140e6, -1.79565251976484877988e7)
_TAN_Q = (1.0, 1.36812963470692954678e4, -1.32089234440210967447e6,
          2.50083801823357915839e7, -5.38695755929454629881e7)
# pi/4 in five parts for the Cody-Waite reduction r = x - j pi/4 (one fma per part): four
# of 24 significant bits, so the partial results stay on a coarse grid and every step is
# exact while r is small (a large r only needs ordinary relative accuracy), and a last full
# double; the sum is within 4e-49 of pi/4.  tan near its zeros and poles needs r to full
# *relative* precision: with the three-part sin.c split, tan(fl(pi/2)) was off by 11 ulp.
_TAN_DP = tuple(float.fromhex(h) for h in (
    "0x1.921fb6p-1", "-0x1.777a5cp-26", "-0x1.ee59dap-51", "0x1.98a2e0p-78",
    "0x1.b839a252049c1p-105"))
# Below this |x| the Cody-Waite reduction is exact enough (Cephes' "lossth"); lanes at or
# beyond it are recomputed by libm's tan, whose Payne-Hanek reduction is exact (`_tan`).
TAN_ACCURATE_BELOW = 2.0**30


def _atan_nonneg(d: _Emitter, a: ir.Value) -> ir.Value:
    """atan(a) for a >= 0 (+inf gives pi/2, NaN gives NaN), Cephes' three intervals done
    with selects: one division forms the reduced argument of whichever interval applies."""
    big = d.cmp(">", a, d.c(_T3P8))
    mid = d.cmp(">", a, d.c(0.66))
    num = d.sel(big, d.c(-1.0), d.sel(mid, d.sub(a, d.c(1.0)), a))
    den = d.sel(big, a, d.sel(mid, d.add(a, d.c(1.0)), d.c(1.0)))
    t = d.div(num, den)  # -1/inf is -0, so atan(inf) lands exactly on pi/2
    base = d.sel(big, d.c(_PIO2[0]), d.sel(mid, d.c(_PIO4), d.c(0.0)))
    corr = d.sel(big, d.c(_MOREBITS), d.sel(mid, d.c(0.5 * _MOREBITS), d.c(0.0)))
    z = d.mul(t, t)
    r = d.div(d.mul(z, d.poly(z, _ATAN_P)), d.poly(z, _ATAN_Q))
    y = d.fma(t, r, t)
    return d.add(base, d.add(y, corr))


def _atan(d: _Emitter, x: ir.Value) -> ir.Value:
    """Odd: evaluated on |x| and sign-restored, so atan(-0) = -0 and atan(-inf) = -pi/2."""
    return d.copysign(_atan_nonneg(d, d.fabs(x)), x)


def _atan2(d: _Emitter, y: ir.Value, x: ir.Value) -> ir.Value:
    """atan2(y, x) = +-(atan(min/max) folded into the right octant) with C99's rules.

    The ratio of the smaller to the larger magnitude lies in [0, 1], so it never
    overflows; only its rounding (0.5 ulp) adds to the kernel's error.  0/0 and inf/inf
    are replaced by the limits C99 prescribes (0 and 1), the octant fold uses the
    two-part pi/2 and pi, x's sign bit (so -0 counts as negative: atan2(+-0, -0) = +-pi)
    picks the left half-plane, and y's sign the result's sign.  NaN in either gives NaN.
    """
    b = d.b
    ax, ay = d.fabs(x), d.fabs(y)
    swap = d.cmp(">", ay, ax)
    t = d.div(d.sel(swap, ax, ay), d.sel(swap, ay, ax))
    both_inf = b.and_(d.cmp("==", ax, d.c(_INF)), d.cmp("==", ay, d.c(_INF)))
    t = d.sel(both_inf, d.c(1.0), t)
    t = d.sel(d.cmp("==", ay, d.c(0.0)), d.c(0.0), t)
    a = _atan_nonneg(d, t)
    # Fold into the octant in one rounding step: base + a or base - a with base 0, pi/2
    # (|y| > |x|) or pi (x < 0); folding twice would round pi - pi/2 up by an ulp.
    x_neg = b.icmp_signed("<", d.bits(x), d.ci(0))
    base_hi = d.sel(swap, d.c(_PIO2[0]), d.sel(x_neg, d.c(_PI[0]), d.c(0.0)))
    base_lo = d.sel(swap, d.c(_PIO2[1]), d.sel(x_neg, d.c(_PI[1]), d.c(0.0)))
    a = d.sel(b.xor(swap, x_neg), b.fneg(a), a)
    res = d.copysign(d.add(d.add(base_hi, a), base_lo), y)
    return d.sel(b.fcmp_unordered("uno", x, y), d.add(x, y), res)


def _asin(d: _Emitter, x: ir.Value) -> ir.Value:
    """Cephes asin: a rational in a^2 for |x| <= 0.625, else pi/2 - sqrt(2(1-a))(1 + ...)
    with 1 - a exact (Sterbenz), which keeps full accuracy up to |x| = 1.

    |x| > 1 (including +-inf) makes 1 - a negative, so sqrt gives NaN; -0 keeps its sign.
    """
    a = d.fabs(x)
    zz = d.mul(a, a)
    small = d.fma(a, d.div(d.mul(zz, d.poly(zz, _ASIN_P)), d.poly(zz, _ASIN_Q)), a)
    w = d.sub(d.c(1.0), a)
    p = d.div(d.mul(w, d.poly(w, _ASIN_R)), d.poly(w, _ASIN_S))
    s = d.intr("sqrt", d.add(w, w))
    big = d.sub(d.c(_PIO4), s)
    big = d.sub(big, d.fma(s, p, d.c(-_MOREBITS)))
    big = d.add(big, d.c(_PIO4))
    res = d.sel(d.cmp(">", a, d.c(0.625)), big, small)
    return d.copysign(res, x)


def _acos(d: _Emitter, x: ir.Value) -> ir.Value:
    """Cephes acos with one asin evaluation: 2 asin(sqrt((1-x)/2)) for x > 0.5 (exact
    argument, no cancellation near x = 1), else (pi/4 - asin(x)) + pi/4 with the low bits
    of pi/2 added back.  |x| > 1 and NaN give NaN through asin."""
    hi = d.cmp(">", x, d.c(0.5))
    arg = d.sel(hi, d.intr("sqrt", d.fma(x, d.c(-0.5), d.c(0.5))), x)
    s = _asin(d, arg)
    lo = d.add(d.add(d.sub(d.c(_PIO4), s), d.c(_MOREBITS)), d.c(_PIO4))
    return d.sel(hi, d.add(s, s), lo)


def _tan(d: _Emitter, x: ir.Value) -> ir.Value:
    """Cephes tan: |x| = j pi/4 + r with j even and |r| <= pi/4, tan(r) by the rational,
    -1/tan(r) when j/2 is odd, and x's sign folded in (tan(-0) = -0); +-inf, NaN -> NaN.

    The five-part Cody-Waite reduction (`_TAN_DP`) gives r to ~1 ulp *relative* for
    |x| < 2^30 (`TAN_ACCURATE_BELOW`), next to tan's zeros and poles too.  Larger finite
    arguments need the exact (Payne-Hanek) reduction, which has no cheap vector form, so
    when any lane holds one, a rarely taken branch recomputes those lanes with libm's
    ``tan`` (exact for every double); kernels whose data stay below 2^30 never leave
    vector code.
    """
    b = d.b
    ax = d.fabs(x)
    axc = d.clamp(ax, 0.0, TAN_ACCURATE_BELOW)  # fptosi stays in i32 range; NaN -> 2^30
    j = d.to_i32(d.mul(axc, d.c(4.0 / math.pi)))
    j = b.and_(b.add(j, ir.Constant(d.i32, 1)), ir.Constant(d.i32, -2))  # round up to even
    yj = d.from_i32(j)
    r = axc
    for part in _TAN_DP:
        r = d.fma(yj, d.c(-part), r)
    w = d.mul(r, r)
    t = d.fma(d.mul(r, w), d.div(d.poly(w, _TAN_P), d.poly(w, _TAN_Q)), r)
    cot = b.icmp_unsigned("!=", b.and_(j, ir.Constant(d.i32, 2)), ir.Constant(d.i32, 0))
    t = d.sel(cot, d.div(d.c(-1.0), t), t)
    sign = b.and_(d.bits(x), d.ci(-(1 << (d.nbits - 1))))
    res = d.from_bits(b.xor(d.bits(t), sign))
    res = d.sel(b.fcmp_unordered("==", ax, d.c(_INF)), d.c(_NAN), res)  # inf/NaN -> NaN
    huge = b.and_(d.cmp(">=", ax, d.c(TAN_ACCURATE_BELOW)), d.cmp("<", ax, d.c(_INF)))
    return _libm_lanes(d, "tan", x, huge, res)


def _libm_lanes(d: _Emitter, sym: str, x: ir.Value, mask: ir.Value, fast: ir.Value) -> ir.Value:
    """``fast`` with the lanes selected by ``mask`` replaced by libm's float64 ``sym`` of x,
    computed lane by lane in a branch that runs only when some lane is selected.

    Called as the scalar intrinsic ``llvm.<sym>.f64``, which LLVM lowers to the libm call
    and the JIT resolves like any libm call it emits itself.
    """
    b = d.b
    module = b.module
    f64 = ir.DoubleType()
    name = f"llvm.{sym}.f64"
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(f64, [f64]), name=name)
    if d.lanes is None:
        anyset = mask
    else:  # <N x i1> -> iN: nonzero iff some lane is set
        anyset = b.icmp_unsigned("!=", b.bitcast(mask, ir.IntType(d.lanes)),
                                 ir.Constant(ir.IntType(d.lanes), 0))
    entry = b.block
    slow = b.append_basic_block(f"{sym}.libm_lanes")
    done = b.append_basic_block(f"{sym}.done")
    b.cbranch(anyset, slow, done)
    b.position_at_end(slow)
    if d.lanes is None:
        exact: ir.Value = b.call(fn, [x])
    else:
        exact = fast
        for i in range(d.lanes):
            lane = ir.Constant(ir.IntType(32), i)
            exact = b.insert_element(exact, b.call(fn, [b.extract_element(x, lane)]), lane)
    exact = d.sel(mask, exact, fast)
    slow_end = b.block
    b.branch(done)
    b.position_at_end(done)
    out = b.phi(d.ty)
    out.add_incoming(fast, entry)
    out.add_incoming(exact, slow_end)
    return out


def _exp10(d: _Emitter, x: ir.Value) -> ir.Value:
    """10^x = exp(x ln10) with x ln10 carried as a double-double (product error by Dekker's
    exact product, plus x times the low part of ln10), so the ~1 ulp of `vecmath`'s exp is
    all the error; a plain x*ln10 would put up to |x ln10| ulp (~700) into the result.

    Uses `vecmath`'s exp kernel, imported here because `vecmath` imports this module.
    """
    from .vecmath import _exp_impl, _two_prod_err

    xc = d.clamp(x, -400.0, 400.0)  # 10^x is 0 or inf beyond +-324; keeps products finite
    hi = d.mul(xc, d.c(_LN10[0]))
    lo = d.add(_two_prod_err(d, xc, d.c(_LN10[0]), hi), d.mul(xc, d.c(_LN10[1])))
    return d.sel(d.uno(x), x, _exp_impl(d, hi, lo=lo))


def _hypot(d: _Emitter, x: ir.Value, y: ir.Value) -> ir.Value:
    """sqrt(x^2 + y^2) with both scaled by the same power of two when the larger magnitude
    is beyond 2^+-500, so the squares neither overflow nor underflow (the scaling is exact);
    the sum of squares is one fma, ~1 ulp in all.  C's rule: inf if either operand is
    infinite, even if the other is NaN; otherwise NaN propagates."""
    b = d.b
    ax, ay = d.fabs(x), d.fabs(y)
    big = d.sel(d.cmp(">", ax, ay), ax, ay)
    scale = d.sel(d.cmp(">", big, d.c(2.0**500)), d.c(2.0**-600),
                  d.sel(d.cmp("<", big, d.c(2.0**-500)), d.c(2.0**600), d.c(1.0)))
    xs, ys = d.mul(ax, scale), d.mul(ay, scale)
    r = d.intr("sqrt", d.fma(xs, xs, d.mul(ys, ys)))
    r = d.div(r, scale)  # a power of two: exact unless the result is subnormal
    r = d.sel(b.fcmp_unordered("uno", x, y), d.add(x, y), r)
    inf = b.or_(d.cmp("==", ax, d.c(_INF)), d.cmp("==", ay, d.c(_INF)))
    return d.sel(inf, d.c(_INF), r)


# ---- hyperbolic functions, float64-safe ----------------------------------------------------
# The textbook forms below were the float16/float32 kernels (evaluated in float64, where no
# float32 argument reaches the float64 limits); for float64 itself they are patched where an
# intermediate overflows (x^2, exp|x|) and made odd-symmetric where 1 - x would cancel.
# Cephes sinh.c: sinh(x) = x + x^3 P(x^2)/Q(x^2) for |x| <= 1 (Q monic).
_SINH_P = (-7.89474443963537015605e-1, -1.63725857525983828727e2, -1.15614435765005216044e4,
           -3.51754964808151394800e5)
_SINH_Q = (1.0, -2.77711081420602794433e2, 3.61578279834431989373e4, -2.11052978884890840399e6)
_SQUARE_SAFE = 2.0**28  # beyond: sqrt(1 + x^2) == |x| to double precision, x^2 may overflow
_EXP_SAFE = 709.0  # exp(|x|) is finite up to ~709.78; sinh/cosh up to ~710.48


def _sinh(d: _Emitter, x: ir.Value) -> ir.Value:
    """Cephes sinh.c's x + x^3 P(x^2)/Q(x^2) for |x| <= 1 (the expm1 form is ~5 ulp there),
    (em + em / (em + 1)) / 2 with em = expm1(|x|) up to 709, and beyond, where exp(|x|)
    overflows before sinh does, (h/2) * h with h = expm1(|x|/2) = exp(|x|/2) to double
    precision (|x|/2 is exact; ~2 ulp).  One expm1 serves both; sign restored."""
    from .vecmath import _expm1

    ax = d.fabs(x)
    z = d.mul(ax, ax)
    near = d.fma(d.mul(ax, z), d.div(d.poly(z, _SINH_P), d.poly(z, _SINH_Q)), ax)
    big = d.cmp(">", ax, d.c(_EXP_SAFE))
    em = _expm1(d, d.sel(big, d.mul(ax, d.c(0.5)), ax))  # NaN passes through
    r = d.mul(d.c(0.5), d.add(em, d.div(em, d.add(em, d.c(1.0)))))
    r = d.sel(big, d.mul(d.mul(em, d.c(0.5)), em), r)
    r = d.sel(d.cmp("<=", ax, d.c(1.0)), near, r)
    return d.copysign(r, x)


def _cosh(d: _Emitter, x: ir.Value) -> ir.Value:
    """(e + 1/e) / 2 with e = exp(|x|) up to 709; beyond, where exp(|x|) overflows before
    cosh does, (h/2) * h with h = exp(|x|/2) (exact halving, ~2 ulp).  NaN stays NaN."""
    from .vecmath import _exp_impl

    ax = d.fabs(x)
    big = d.cmp(">", ax, d.c(_EXP_SAFE))
    ex = _exp_impl(d, d.sel(big, d.mul(ax, d.c(0.5)), ax))
    r = d.mul(d.c(0.5), d.add(ex, d.div(d.c(1.0), ex)))
    return d.sel(big, d.mul(d.mul(ex, d.c(0.5)), ex), r)


def _asinh(d: _Emitter, x: ir.Value) -> ir.Value:
    """asinh|x| = log1p(|x| + x^2 / (1 + sqrt(1 + x^2))) (no cancellation), or
    log|x| + ln2 beyond 2^28 (error 1/(4x^2), below an ulp); sign restored."""
    from .vecmath import _log, _log1p

    ax = d.fabs(x)
    t = d.mul(ax, ax)
    r = _log1p(d, d.add(ax, d.div(t, d.add(d.c(1.0), d.intr("sqrt", d.add(d.c(1.0), t))))))
    far = d.add(_log(d, ax), d.c(math.log(2.0)))  # inf stays inf
    return d.copysign(d.sel(d.cmp(">", ax, d.c(_SQUARE_SAFE)), far, r), x)


def _acosh(d: _Emitter, x: ir.Value) -> ir.Value:
    """acosh(x) = log1p(t + sqrt(t (t + 2))) with t = x - 1 (exact near 1), or
    log x + ln2 beyond 2^28; x < 1 and NaN give NaN."""
    from .vecmath import _log, _log1p

    t = d.sub(x, d.c(1.0))
    r = _log1p(d, d.add(t, d.intr("sqrt", d.mul(t, d.add(t, d.c(2.0))))))
    r = d.sel(d.cmp(">", x, d.c(_SQUARE_SAFE)), d.add(_log(d, x), d.c(math.log(2.0))), r)
    return d.sel(d.cmp(">=", x, d.c(1.0)), r, d.c(_NAN))


def _atanh(d: _Emitter, x: ir.Value) -> ir.Value:
    """atanh|x| = log1p(2|x| / (1 - |x|)) / 2 with 1 - |x| exact near 1 (computing on x
    itself would cancel in 1 + u near x = -1); +-inf at +-1, NaN beyond, -0 kept."""
    from .vecmath import _log1p

    ax = d.fabs(x)
    r = d.mul(d.c(0.5), _log1p(d, d.div(d.add(ax, ax), d.sub(d.c(1.0), ax))))
    return d.copysign(r, x)


_Impl = Callable[..., ir.Value]


def _via_f64(impl: _Impl) -> _Impl:
    """float64 as is; float32 widened, evaluated in float64 and rounded once."""
    def emit(e: _Emitter, *args: ir.Value) -> ir.Value:
        if e.is64:
            return impl(e, *args)
        d = e.wide()
        r = impl(d, *(e.b.fpext(a, d.ty) for a in args))
        return e.b.fptrunc(r, e.ty)

    emit.__doc__ = impl.__doc__
    return emit


# name -> (arity, emitter), merged into `vecmath._TABLE`.
TRIG: dict[str, tuple[int, _Impl]] = {
    "tan": (1, _via_f64(_tan)),
    "asin": (1, _via_f64(_asin)),
    "acos": (1, _via_f64(_acos)),
    "atan": (1, _via_f64(_atan)),
    "atan2": (2, _via_f64(_atan2)),
}
# float64 kernels that `vecmath.VIA_F64` also uses for float16/float32 (one code path).
WIDE: dict[str, tuple[int, _Impl]] = {
    "exp10": (1, _exp10), "hypot": (2, _hypot), "sinh": (1, _sinh), "cosh": (1, _cosh),
    "asinh": (1, _asinh), "acosh": (1, _acosh), "atanh": (1, _atanh),
}
TRIG.update({name: (arity, _via_f64(impl)) for name, (arity, impl) in WIDE.items()})

"""Branch-free, vectorizable elementary functions emitted directly as LLVM IR.

Why this module exists: LLVM lowers vector math intrinsics such as
``llvm.exp.v16f32`` by scalarizing them into one libm call per lane, which throws
away the SIMD throughput of generated kernels.  Here every transcendental function is
written with plain IR arithmetic, integer bit manipulation on the IEEE-754 fields and
``select`` (never branches), so one emitted sequence works unchanged for ``float``,
``double`` and ``<N x float|double>`` with any lane count and stays vector code.

Internally only intrinsics that LLVM lowers to native vector instructions are used
(sqrt, fabs, floor, copysign, fmuladd); the user-facing ``fma`` maps to the exact
``llvm.fma`` (a libm call only on targets without FMA hardware).

Algorithms follow the Cephes Math Library (Stephen L. Moshier, netlib.org/cephes):
Cody-Waite range reduction followed by polynomial or rational approximations, using
the published Cephes coefficients (``expf.c``, ``exp.c``, ``logf.c``, ``log.c``,
``log2.c``, ``log10.c``, ``tanhf.c``, ``tanh.c``, ``sinf.c``, ``sin.c``, ``ndtr.c``).
The single exception is the f32 ``erf``, whose coefficients were fitted for this
module (see ``_erf``).  Special values (+-0, +-inf, NaN, overflow, underflow,
subnormals) are patched with ``select``.  Polynomials use ``llvm.fmuladd`` (i.e. the
``contract`` permission, fused where the target has FMA); no other fast-math flags
are set, because ``nnan``/``ninf`` would allow LLVM to delete exactly those patches.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

from llvmlite import ir

from .vecmath_trig import _TAN_DP, TRIG, WIDE, _libm_lanes

__all__ = ["SUPPORTED", "VIA_F64", "emit_ldexp", "emit_math", "emit_nextafter", "emit_via_f64"]

_INF = math.inf
_NAN = math.nan
_LN2 = math.log(2.0)
_LOG2E = 1.0 / _LN2

# ---- Coefficients (highest degree first, as consumed by _Emitter.poly). --------------
# Cephes expf.c: exp(r) = 1 + r + r^2 P(r) on |r| <= ln2/2 (minimax, ~1 ulp).
_EXPF_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3,
           4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
# Cephes exp.c (double): Pade form exp(r) = 1 + 2 rP(r^2) / (Q(r^2) - rP(r^2)).
_EXP_P = (1.26177193074810590878e-4, 3.02994407707441961300e-2, 9.99999999999999999910e-1)
_EXP_Q = (3.00198505138664455042e-6, 2.52448340349684104192e-3,
          2.27265548208155028766e-1, 2.00000000000000000009e0)
# Cody-Waite splits of ln 2 (Cephes): the high parts have so few significant bits that
# n * hi is exact for every n we produce, so x - n*ln2 loses nothing to cancellation.
_EXPF_LN2 = (0.693359375, -2.12194440e-4)                          # expf.c C1, C2
_EXP_LN2 = (6.93145751953125e-1, 1.42860682030941723212e-6)         # exp.c C1, C2
_LOG_LN2 = (0.693359375, -2.121944400546905827679e-4)               # log.c / logf.c
# fdlibm's ln2 split for the double-double log of pow: 32-bit hi, k*hi exact for |k| < 2^21.
_LN2_HI, _LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10

# Cephes logf.c: log(1+f) = f - f^2/2 + f^3 P(f) for sqrt(1/2)-1 <= f < sqrt(2)-1.
_LOGF_P = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
           1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
           3.3333331174e-1)
# Cephes log.c (double): same form with the rational P(f)/Q(f), Q monic.
_LOG_P = (1.01875663804580931796e-4, 4.97494994976747001425e-1, 4.70579119878881725854e0,
          1.44989225341610930846e1, 1.79368678507819816313e1, 7.70838733755885391666e0)
_LOG_Q = (1.0, 1.12873587189167450590e1, 4.52279145837532221105e1, 8.29875266912776603211e1,
          7.11544750618563894466e1, 2.31251620126765340583e1)
# Cephes log2.c / log10.c: log2(e) - 1, and log10(e), log10(2) split as exact hi + lo.
_LOG2EA = 4.4269504088896340735992e-1
_L10E = (4.3359375e-1, 7.00731903251827651129e-4)
_L102 = (3.0078125e-1, 2.48745663981195213739e-4)

# Cephes tanhf.c: tanh(x) = x + x^3 P(x^2) for |x| < 0.625.
_TANHF_P = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2,
            1.33314422036e-1, -3.33332819422e-1)
# Cephes tanh.c (double): tanh(x) = x + x^3 P(x^2)/Q(x^2) for |x| < 0.625, Q monic.
_TANH_P = (-9.64399179425052238628e-1, -9.92877231001918586564e1, -1.61468768441708447952e3)
_TANH_Q = (1.0, 1.12811678491632931402e2, 2.23548839060100448583e3, 4.84406305325125486048e3)

# Cephes sin.c: pi/4 split in three parts (Cody-Waite), used for both dtypes, and
# the sinf.c / sin.c minimax polynomials for sin and cos on [-pi/4, pi/4].
_SINF_P = (-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1)
_COSF_P = (2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2)
_SIN_P = (1.58962301576546568060e-10, -2.50507477628578072866e-8, 2.75573136213857245213e-6,
          -1.98412698295895385996e-4, 8.33333333332211858878e-3, -1.66666666666666307295e-1)
_COS_P = (-1.13585365213876817300e-11, 2.08757008419747316778e-9, -2.75573141792967388112e-7,
          2.48015872888517045348e-5, -1.38888888888730564116e-3, 4.16666666666665929218e-2)

# f32 erf, fitted for this module (Chebyshev interpolation in double precision with
# scipy.special as reference, converted to monomials, rounded to f32):
#  * |x| < 1:  erf(x) = x * A(x^2); A interpolates erf(sqrt z)/sqrt z on z in [0, 1]
#    (degree 5, max rel. error 1.7e-7 when evaluated in f32).
#  * 1 <= |x| <= 4: erf(x) = 1 - exp(-x^2) * B(u), u = (2|x| - 5)/3 in [-1, 1]; B
#    interpolates the entire function erfcx(x) = exp(x^2) erfc(x) (degree 10, rel.
#    error 3e-7 of erfcx, i.e. < 1e-7 of erf).  erf(4) rounds to 1 in f32.
_ERFF_A = (-5.64806e-4, 4.921762e-3, -2.6715055e-2, 1.1280317e-1, -3.7612343e-1,
           1.1283791)
_ERFF_B = (9.294974e-05, -2.4518644e-4, 3.7647728e-4, -9.162726e-4, 2.4183842e-3,
           -5.6112334e-3, 1.24867e-2, -2.6997937e-2, 5.6110628e-2, -1.1152139e-1,
           2.1080637e-1)
# Cephes ndtr.c (double): erf(x) = x T(x^2)/U(x^2) for |x| < 1 and
# erfc(x) = exp(-x^2) P(x)/Q(x) for 1 <= x < 8 (U, Q monic).  erf(6) == 1 in f64.
_ERF_T = (9.60497373987051638749e0, 9.00260197203842689217e1, 2.23200534594684319226e3,
          7.00332514112805075473e3, 5.55923013010394962768e4)
_ERF_U = (1.0, 3.35617141647503099647e1, 5.21357949780152679795e2, 4.59432382970980127987e3,
          2.26290000613890934246e4, 4.92673942608635921086e4)
_ERFC_P = (2.46196981473530512524e-10, 5.64189564831068821977e-1, 7.46321056442269912687e0,
           4.86371970985681366614e1, 1.96520832956077098242e2, 5.26445194995477358631e2,
           9.34528527171957607540e2, 1.02755188689515710272e3, 5.57535335369399327526e2)
_ERFC_Q = (1.0, 1.32281951154744992508e1, 8.67072140885989742329e1, 3.54937778887819891062e2,
           9.75708501743205489753e2, 1.82390916687909736289e3, 2.24633760818710981792e3,
           1.65666309194161350182e3, 5.57535340817727675546e2)


class _Emitter:
    """Typed helpers over an IRBuilder for one float type (scalar or vector).

    Constants are splatted to the value type automatically, so the algorithms below
    read the same for every element type and lane count.
    """

    def __init__(self, builder: ir.IRBuilder, ty: ir.Type) -> None:
        elem = ty.element if isinstance(ty, ir.VectorType) else ty
        if not isinstance(elem, (ir.FloatType, ir.DoubleType)):
            raise TypeError(f"vecmath needs float/double scalars or vectors, got {ty}")
        self.b = builder
        self.ty = ty
        self.is64 = isinstance(elem, ir.DoubleType)
        self.lanes: int | None = ty.count if isinstance(ty, ir.VectorType) else None
        self.nbits = 64 if self.is64 else 32
        self.mant_bits = 52 if self.is64 else 23
        self.bias = 1023 if self.is64 else 127
        self.ity = self.like(ir.IntType(self.nbits))  # same-width integer for bit tricks
        self.i32 = self.like(ir.IntType(32))
        scalar = "f64" if self.is64 else "f32"
        self.suffix = scalar if self.lanes is None else f"v{self.lanes}{scalar}"

    def like(self, elem: ir.Type) -> ir.Type:
        """``elem`` in this emitter's shape (same lane count, or scalar)."""
        return elem if self.lanes is None else ir.VectorType(elem, self.lanes)

    def wide(self) -> _Emitter:
        """An emitter for float64 values of this shape (to evaluate float32 math in float64)."""
        return _Emitter(self.b, self.like(ir.DoubleType()))

    # -- constants and arithmetic -------------------------------------------------
    def c(self, v: float) -> ir.Constant:
        return ir.Constant(self.ty, v)

    def ci(self, v: int, ty: ir.Type | None = None) -> ir.Constant:
        return ir.Constant(self.ity if ty is None else ty, v)

    def add(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fadd(a, b)

    def sub(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fsub(a, b)

    def mul(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fmul(a, b)

    def div(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.fdiv(a, b)

    def intr(self, name: str, *args: ir.Value) -> ir.Value:
        """Call the overloaded intrinsic ``llvm.<name>.<suffix>`` of type T(T, ...).

        Declared by hand because llvmlite's ``declare_intrinsic`` cannot name vector
        overloads; an existing declaration in the module is reused.
        """
        module = self.b.module
        full = f"llvm.{name}.{self.suffix}"
        fn = module.globals.get(full)
        if fn is None:
            fn = ir.Function(module, ir.FunctionType(self.ty, [self.ty] * len(args)), name=full)
        return self.b.call(fn, list(args))

    def fma(self, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
        """a*b + c, fused where the target has FMA (``llvm.fmuladd``), never a libcall."""
        return self.intr("fmuladd", a, b, c)

    def poly(self, x: ir.Value, coeffs: Sequence[float]) -> ir.Value:
        """Horner evaluation of sum(coeffs[i] * x^(n-i)); highest degree first."""
        acc: ir.Value = self.c(coeffs[0])
        for k in coeffs[1:]:
            acc = self.fma(acc, x, self.c(k))
        return acc

    def fabs(self, x: ir.Value) -> ir.Value:
        return self.intr("fabs", x)

    def copysign(self, mag: ir.Value, sign: ir.Value) -> ir.Value:
        return self.intr("copysign", mag, sign)

    def rint(self, x: ir.Value) -> ir.Value:
        """Round to nearest-even for |x| < 2^(mant-1) by the 1.5*2^mant magic constant.

        Pure add/sub, so it vectorizes on every target (llvm.rint may be a libcall
        without SSE4.1); it stays exact because no reassoc flag is set.
        """
        magic = self.c(1.5 * 2.0 ** self.mant_bits)
        return self.sub(self.add(x, magic), magic)

    # -- comparisons and selection -------------------------------------------------
    def cmp(self, op: str, a: ir.Value, b: ir.Value) -> ir.Value:
        """Ordered comparison: false whenever an operand is NaN."""
        return self.b.fcmp_ordered(op, a, b)

    def uno(self, x: ir.Value) -> ir.Value:
        return self.b.fcmp_unordered("uno", x, x)

    def sel(self, cond: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
        return self.b.select(cond, a, b)

    def clamp(self, x: ir.Value, lo: float, hi: float) -> ir.Value:
        """Clamp to [lo, hi], mapping NaN to ``hi`` so a later fptosi is never poison."""
        x = self.sel(self.cmp("<", x, self.c(hi)), x, self.c(hi))
        return self.sel(self.cmp(">", x, self.c(lo)), x, self.c(lo))

    # -- integer views --------------------------------------------------------------
    def bits(self, x: ir.Value) -> ir.Value:
        return self.b.bitcast(x, self.ity)

    def from_bits(self, i: ir.Value) -> ir.Value:
        return self.b.bitcast(i, self.ty)

    def to_i32(self, x: ir.Value) -> ir.Value:
        """fptosi to i32 lanes (cvttps2dq / cvttpd2dq exist everywhere, unlike f64->i64)."""
        return self.b.fptosi(x, self.i32)

    def widen(self, i: ir.Value) -> ir.Value:
        """Sign-extend i32 lanes to the float-width integer type."""
        return self.b.sext(i, self.ity) if self.is64 else i

    def from_i32(self, i: ir.Value) -> ir.Value:
        return self.b.sitofp(i, self.ty)

    def ldexp(self, p: ir.Value, n: ir.Value) -> ir.Value:
        """p * 2^n for i32 lanes n, as two multiplies by 2^(n/2) built in the exponent field.

        Splitting keeps each factor a normal number for |n| up to ~2*bias, so results
        that overflow become inf and results in the subnormal range are rounded once.
        """
        n1 = self.b.ashr(n, ir.Constant(self.i32, 1))
        n2 = self.b.sub(n, n1)
        out = p
        for k in (n1, n2):
            e = self.b.add(self.widen(k), self.ci(self.bias))
            out = self.mul(out, self.from_bits(self.b.shl(e, self.ci(self.mant_bits))))
        return out


# ---- exp family ----------------------------------------------------------------------
def _expm1_reduced(e: _Emitter, r: ir.Value) -> ir.Value:
    """exp(r) - 1 for a reduced |r| <= ln2/2, computed without cancellation."""
    if e.is64:
        rr = e.mul(r, r)
        px = e.mul(r, e.poly(rr, _EXP_P))
        t = e.div(px, e.sub(e.poly(rr, _EXP_Q), px))
        return e.add(t, t)
    return e.fma(e.poly(r, _EXPF_P), e.mul(r, r), r)


def _exp_impl(e: _Emitter, x: ir.Value, base2: bool = False,
              lo: ir.Value | None = None) -> ir.Value:
    """exp(x) (or 2^x): x = n*ln2 + r, exp(x) = 2^n * exp(r).

    ``lo`` is an optional tiny correction, exp(x + lo), used by the double-double pow.
    """
    # Clamp bounds lie just beyond overflow / total underflow, so the clamped value
    # still yields inf / 0, and n stays in the range that `ldexp` handles.
    if e.is64:
        xmin, xmax = (-1076.0, 1025.0) if base2 else (-746.0, 710.0)
    else:
        xmin, xmax = (-151.0, 129.0) if base2 else (-105.0, 89.0)
    xc = e.clamp(x, xmin, xmax)
    if base2:
        n = e.rint(xc)
        r = e.mul(e.sub(xc, n), e.c(_LN2))  # xc - n is exact (Sterbenz)
    else:
        n = e.rint(e.mul(xc, e.c(_LOG2E)))
        c1, c2 = _EXP_LN2 if e.is64 else _EXPF_LN2
        r = e.fma(n, e.c(-c1), xc)
        r = e.fma(n, e.c(-c2), r)
    if lo is not None:
        r = e.add(r, lo)
    y = e.add(_expm1_reduced(e, r), e.c(1.0))
    res = e.ldexp(y, e.to_i32(n))
    return e.sel(e.uno(x), x, res)


def _expm1(e: _Emitter, x: ir.Value) -> ir.Value:
    """Near 0 use the reduced-range kernel directly; elsewhere exp(x) - 1 is accurate."""
    small = e.cmp("<", e.fabs(x), e.c(0.5 * _LN2))
    res = e.sel(small, _expm1_reduced(e, x), e.sub(_exp_impl(e, x), e.c(1.0)))
    return e.sel(e.cmp("==", x, e.c(0.0)), x, res)  # keep the sign of -0


# ---- log family ----------------------------------------------------------------------
def _log_parts(e: _Emitter, x: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    """Split x = 2^k (1 + f), sqrt(1/2) <= 1+f < sqrt(2) (Cephes frexp step).

    Returns (k, f, z=f*f, y=f^3 R(f)) so that log(1+f) = f - z/2 + y.  Only valid for
    finite x > 0; callers patch the special values.
    """
    # Subnormals lack the implicit bit: scale them into the normal range first.
    shift = e.mant_bits + 1
    tiny = e.cmp("<", x, e.c(2.0 ** (1 - e.bias)))
    xs = e.sel(tiny, e.mul(x, e.c(2.0**shift)), x)
    bits = e.bits(xs)
    b = e.b
    biased = b.and_(b.lshr(bits, e.ci(e.mant_bits)), e.ci(2 * e.bias + 1))
    # Mantissa with exponent of 0.5: m in [0.5, 1); frexp exponent = biased - (bias-1).
    mant_mask = (1 << e.mant_bits) - 1
    m = e.from_bits(b.or_(b.and_(bits, e.ci(mant_mask)), e.ci((e.bias - 1) << e.mant_bits)))
    expo = b.sub(biased, e.ci(e.bias - 1))
    if e.is64:
        expo = b.trunc(expo, e.i32)  # i32 -> f64 converts natively on all x86 vectors
    k = e.add(e.from_i32(expo), e.sel(tiny, e.c(-float(shift)), e.c(0.0)))
    below = e.cmp("<", m, e.c(math.sqrt(0.5)))
    k = e.sub(k, e.sel(below, e.c(1.0), e.c(0.0)))
    f = e.sub(e.sel(below, e.add(m, m), m), e.c(1.0))
    z = e.mul(f, f)
    if e.is64:
        rat = e.div(e.poly(f, _LOG_P), e.poly(f, _LOG_Q))
    else:
        rat = e.poly(f, _LOGF_P)
    return k, f, z, e.mul(e.mul(f, z), rat)


def _log_special(e: _Emitter, x: ir.Value, res: ir.Value) -> ir.Value:
    """log(+inf)=+inf, log(+-0)=-inf, log(x<0)=NaN, log(NaN)=NaN."""
    res = e.sel(e.cmp("==", x, e.c(_INF)), x, res)
    res = e.sel(e.cmp("==", x, e.c(0.0)), e.c(-_INF), res)
    return e.sel(e.cmp(">=", x, e.c(0.0)), res, e.c(_NAN))


def _log(e: _Emitter, x: ir.Value) -> ir.Value:
    k, f, z, y = _log_parts(e, x)
    c1, c2 = _LOG_LN2
    y = e.fma(k, e.c(c2), y)
    y = e.fma(z, e.c(-0.5), y)
    res = e.fma(k, e.c(c1), e.add(f, y))
    return _log_special(e, x, res)


def _log2(e: _Emitter, x: ir.Value) -> ir.Value:
    """Cephes log2: log2(e) = 1 + LOG2EA keeps f and the tail exact-ish; powers of 2 are exact."""
    k, f, z, y = _log_parts(e, x)
    y = e.fma(z, e.c(-0.5), y)
    res = e.mul(y, e.c(_LOG2EA))
    res = e.fma(f, e.c(_LOG2EA), res)
    res = e.add(e.add(e.add(res, y), f), k)
    return _log_special(e, x, res)


def _log10(e: _Emitter, x: ir.Value) -> ir.Value:
    """Cephes log10: log10(e) and log10(2) in hi+lo parts, smallest terms summed first."""
    k, f, z, y = _log_parts(e, x)
    y = e.fma(z, e.c(-0.5), y)
    res = e.mul(e.add(f, y), e.c(_L10E[1]))
    res = e.fma(y, e.c(_L10E[0]), res)
    res = e.fma(f, e.c(_L10E[0]), res)
    res = e.fma(k, e.c(_L102[1]), res)
    res = e.fma(k, e.c(_L102[0]), res)
    return _log_special(e, x, res)


def _log1p(e: _Emitter, x: ir.Value) -> ir.Value:
    """Goldberg's trick: with u = fl(1+x), log1p(x) = log(u) * x / (u-1) is accurate
    because the rounding error of 1+x cancels in the ratio (u == 1 gives x)."""
    u = e.add(x, e.c(1.0))
    d = e.sub(u, e.c(1.0))
    res = e.mul(_log(e, u), e.div(x, d))
    res = e.sel(e.cmp("==", d, e.c(0.0)), x, res)
    return e.sel(e.cmp("==", x, e.c(_INF)), x, res)


# ---- power, hyperbolic, sigmoid, erf -------------------------------------------------
def _two_sum(e: _Emitter, a: ir.Value, b: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Knuth's TwoSum: a + b = s + err exactly (needs no reassociation: no fast-math)."""
    s = e.add(a, b)
    bb = e.sub(s, a)
    return s, e.add(e.sub(a, e.sub(s, bb)), e.sub(b, bb))


def _two_prod_err(e: _Emitter, a: ir.Value, b: ir.Value, p: ir.Value) -> ir.Value:
    """Dekker's exact product error a*b - p for p = fl(a*b), via Veltkamp splitting.

    Used instead of llvm.fma, which is a scalar libcall on targets without FMA.
    Only valid for |a|, |b| < 2^996 (callers discard the result otherwise).
    """
    def split(v: ir.Value) -> tuple[ir.Value, ir.Value]:
        t = e.mul(v, e.c(134217729.0))  # 2^27 + 1
        hi = e.sub(t, e.sub(t, v))
        return hi, e.sub(v, hi)

    (ah, al), (bh, bl) = split(a), split(b)
    err = e.add(e.sub(e.mul(ah, bh), p), e.mul(ah, bl))
    return e.add(e.add(err, e.mul(al, bh)), e.mul(al, bl))


def _log_dd(e: _Emitter, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """log(x) as an unevaluated f64 sum hi + lo with ~2^-57 relative error.

    Cephes' log(1+f) = f - f^2/2 + y is re-summed with exact TwoSum/TwoProduct steps;
    only y (tiny relative to the result) carries ordinary rounding error.
    """
    k, f, z, y = _log_parts(e, x)
    zerr = _two_prod_err(e, f, f, z)
    t, terr = _two_sum(e, e.mul(z, e.c(-0.5)), y)
    hi, hierr = _two_sum(e, f, t)
    lo = e.add(e.add(hierr, terr), e.mul(zerr, e.c(-0.5)))
    sh, se = _two_sum(e, e.mul(k, e.c(_LN2_HI)), hi)
    lo = e.add(e.add(se, lo), e.mul(k, e.c(_LN2_LO)))
    hi = e.add(sh, lo)
    return _log_special(e, x, hi), e.sub(lo, e.sub(hi, sh))


def _pow(e: _Emitter, x: ir.Value, y: ir.Value) -> ir.Value:
    """pow(x, y) = sign * exp(y * log|x|) with C99/numpy special cases.

    f32 is evaluated in f64, where the plain product y*log(x) is already far more
    accurate than f32 needs.  f64 carries log|x| and y*log|x| as double-double values,
    because a rounded y*log(x) would put |y log x| ulp of error (up to ~700 ulp) into
    the result; this way it is ~1 ulp for moderate |y log x| and <= ~2e-15 relative
    near the overflow limit, and exact cases like (-2)^3 come out exact.
    """
    if not e.is64:
        d = _Emitter(e.b, e.like(ir.DoubleType()))
        r = _pow(d, e.b.fpext(x, d.ty), e.b.fpext(y, d.ty))
        return e.b.fptrunc(r, e.ty)
    b = e.b
    ax = e.fabs(x)
    lh, ll = _log_dd(e, ax)
    ph = e.mul(y, lh)
    pl = e.add(_two_prod_err(e, y, lh, ph), e.mul(y, ll))
    # Past |y log x| ~ 746 the result is 0 or inf anyway, and the error terms may be NaN.
    pl = e.sel(e.cmp("<", e.fabs(ph), e.c(1000.0)), pl, e.c(0.0))
    mag = _exp_impl(e, ph, lo=pl)
    half = e.mul(y, e.c(0.5))
    is_int = e.cmp("==", e.intr("floor", y), y)  # true for +-inf (even), false for NaN
    is_odd = b.and_(is_int, e.cmp("!=", e.intr("floor", half), half))
    res = e.sel(is_odd, e.copysign(mag, x), mag)
    # Negative finite base with non-integer exponent has no real result.
    neg_base = b.and_(e.cmp("<", x, e.c(0.0)), e.cmp(">", x, e.c(-_INF)))
    res = e.sel(b.and_(neg_base, b.not_(is_int)), e.c(_NAN), res)
    # pow(+-1, +-inf) = 1 (the log path gives 0 * inf = NaN), pow(x, 0) = pow(1, y) = 1.
    unit = b.and_(e.cmp("==", ax, e.c(1.0)), e.cmp("==", e.fabs(y), e.c(_INF)))
    unit = b.or_(unit, b.or_(e.cmp("==", y, e.c(0.0)), e.cmp("==", x, e.c(1.0))))
    return e.sel(unit, e.c(1.0), res)


def _tanh(e: _Emitter, x: ir.Value) -> ir.Value:
    """Odd polynomial/rational for |x| < 0.625 (no cancellation near 0), otherwise
    1 - 2/(exp(2|x|)+1), which saturates to exactly 1 once exp overflows to inf."""
    ax = e.fabs(x)
    z = e.mul(ax, ax)
    if e.is64:
        rat = e.div(e.poly(z, _TANH_P), e.poly(z, _TANH_Q))
    else:
        rat = e.poly(z, _TANHF_P)
    small = e.fma(e.mul(ax, z), rat, ax)
    ex = _exp_impl(e, e.add(ax, ax))
    large = e.sub(e.c(1.0), e.div(e.c(2.0), e.add(ex, e.c(1.0))))
    res = e.sel(e.cmp("<", ax, e.c(0.625)), small, large)
    return e.copysign(res, x)


def _sigmoid(e: _Emitter, x: ir.Value) -> ir.Value:
    """With t = exp(-|x|) in (0, 1] (never overflows): 1/(1+t) for x >= 0, t/(1+t)
    for x < 0; the latter avoids the cancellation of 1 - 1/(1+t)."""
    t = _exp_impl(e, e.b.fneg(e.fabs(x)))
    r = e.div(e.c(1.0), e.add(e.c(1.0), t))
    return e.sel(e.cmp(">=", x, e.c(0.0)), r, e.mul(t, r))


def _erf(e: _Emitter, x: ir.Value) -> ir.Value:
    """erf via x*A(x^2) for |x| < 1 and 1 - exp(-x^2)*erfcx-approximation beyond.

    Computed on |x| and sign-restored with copysign (odd function, keeps -0).
    """
    ax = e.fabs(x)
    z = e.mul(ax, ax)
    if e.is64:
        near = e.mul(ax, e.div(e.poly(z, _ERF_T), e.poly(z, _ERF_U)))
        xb = e.clamp(ax, 1.0, 6.0)
        tail = e.div(e.poly(xb, _ERFC_P), e.poly(xb, _ERFC_Q))
    else:
        near = e.mul(ax, e.poly(z, _ERFF_A))
        xb = e.clamp(ax, 1.0, 4.0)
        u = e.fma(xb, e.c(2.0 / 3.0), e.c(-5.0 / 3.0))
        tail = e.poly(u, _ERFF_B)
    erfc = e.mul(_exp_impl(e, e.b.fneg(e.mul(xb, xb))), tail)
    far = e.sub(e.c(1.0), erfc)
    res = e.copysign(e.sel(e.cmp("<", ax, e.c(1.0)), near, far), x)
    return e.sel(e.uno(x), x, res)


# ---- sin / cos -----------------------------------------------------------------------
def _sincos(e: _Emitter, x: ir.Value, want_cos: bool) -> ir.Value:
    """Cephes sin/cos: reduce |x| by j*pi/4 (j even), then pick the sin or cos
    polynomial and the sign from the octant j mod 8.

    The reduction always runs in f64 with tan's five-part pi/4 (`vecmath_trig._TAN_DP`),
    which keeps r accurate *relative* to itself next to the zeros of sin and cos too (the
    three-part Cephes split left float64 sin(k pi) thousands of ulp off), so f32 stays
    accurate far beyond the 8192 limit of an f32 reduction. Finite lanes with |x| >= 2^30
    (Cephes' loss threshold) are recomputed by libm's exact reduction in a branch taken only
    when some lane is that large (`vecmath_trig._libm_lanes`).
    """
    b = e.b
    ax = e.fabs(x)
    d = e if e.is64 else _Emitter(b, e.like(ir.DoubleType()))
    axd = ax if e.is64 else b.fpext(ax, d.ty)
    axd = d.clamp(axd, 0.0, 2.0**30)  # keeps fptosi in i32 range; maps NaN to 2^30
    j = d.to_i32(d.mul(axd, d.c(4.0 / math.pi)))
    j = b.and_(b.add(j, ir.Constant(e.i32, 1)), ir.Constant(e.i32, -2))  # round j up to even
    yj = d.from_i32(j)
    r = axd
    for part in _TAN_DP:
        r = d.fma(yj, d.c(-part), r)
    if not e.is64:
        r = b.fptrunc(r, e.ty)
    z = e.mul(r, r)
    sin_r = e.fma(e.mul(r, z), e.poly(z, _SIN_P if e.is64 else _SINF_P), r)
    cos_r = e.fma(e.mul(z, z), e.poly(z, _COS_P if e.is64 else _COSF_P), e.mul(z, e.c(-0.5)))
    cos_r = e.add(cos_r, e.c(1.0))
    swap = b.icmp_unsigned("!=", b.and_(j, ir.Constant(e.i32, 2)), ir.Constant(e.i32, 0))
    if want_cos:
        res = e.sel(swap, sin_r, cos_r)
        neg = b.and_(b.add(j, ir.Constant(e.i32, 2)), ir.Constant(e.i32, 4))
    else:
        res = e.sel(swap, cos_r, sin_r)
        neg = b.and_(j, ir.Constant(e.i32, 4))
    # Move octant bit 2 into the float sign bit; sin is odd, so also fold in x's sign.
    negw = b.zext(neg, e.ity) if e.is64 else neg
    flip = b.shl(negw, e.ci(e.nbits - 3))
    if not want_cos:
        flip = b.xor(flip, b.and_(e.bits(x), e.ci(-(1 << (e.nbits - 1)))))
    res = e.from_bits(b.xor(e.bits(res), flip))
    res = e.sel(b.fcmp_unordered("==", ax, e.c(_INF)), e.c(_NAN), res)  # inf/NaN -> NaN
    # finite lanes beyond the reduction's range: libm's float64 sin/cos (exact reduction);
    # a float32 result goes through float64 and back, which is exact for its value
    xd = x if e.is64 else b.fpext(x, d.ty)
    huge = b.and_(d.cmp(">=", d.fabs(xd), d.c(2.0**30)), d.cmp("<", d.fabs(xd), d.c(_INF)))
    fast = res if e.is64 else b.fpext(res, d.ty)
    out = _libm_lanes(d, "cos" if want_cos else "sin", xd, huge, fast)
    return out if e.is64 else b.fptrunc(out, e.ty)


# ---- Functions that are native vector instructions: plain intrinsics. ----------------
def _intrinsic(name: str, arity: int = 1) -> Callable[..., ir.Value]:
    def emit(e: _Emitter, *args: ir.Value) -> ir.Value:
        return e.intr(name, *args)

    emit.__doc__ = f"llvm.{name} ({arity} operand(s)); lowers to native vector code."
    return emit


def _rsqrt(e: _Emitter, x: ir.Value) -> ir.Value:
    """Correctly rounded sqrt then divide (no approximate rsqrt: no fast-math)."""
    return e.div(e.c(1.0), e.intr("sqrt", x))


_Impl = Callable[..., ir.Value]
_TABLE: dict[str, tuple[int, _Impl]] = {
    "exp": (1, _exp_impl),
    "exp2": (1, functools.partial(_exp_impl, base2=True)),
    "expm1": (1, _expm1),
    "log": (1, _log),
    "log2": (1, _log2),
    "log10": (1, _log10),
    "log1p": (1, _log1p),
    "sqrt": (1, _intrinsic("sqrt")),
    "rsqrt": (1, _rsqrt),
    "tanh": (1, _tanh),
    "sigmoid": (1, _sigmoid),
    "erf": (1, _erf),
    "abs": (1, _intrinsic("fabs")),
    "fabs": (1, _intrinsic("fabs")),
    "floor": (1, _intrinsic("floor")),
    "ceil": (1, _intrinsic("ceil")),
    # Half-to-even, matching numpy.round / torch.round (C round() is half-away).
    "round": (1, _intrinsic("roundeven")),
    "trunc": (1, _intrinsic("trunc")),
    "fma": (3, _intrinsic("fma", 3)),
    "power": (2, _pow),
    "pow": (2, _pow),
    "sin": (1, functools.partial(_sincos, want_cos=False)),
    "cos": (1, functools.partial(_sincos, want_cos=True)),
    **TRIG,  # tan, asin, acos, atan, atan2 and the `VIA_F64` functions (vecmath_trig)
}

SUPPORTED: frozenset[str] = frozenset(_TABLE)


def emit_math(builder: ir.IRBuilder, name: str, args: list[ir.Value]) -> ir.Value:
    """Emit `name(*args)` for float/double scalars or vectors; returns a value of the same type.

    All operands must share one type.  Raises ValueError for unknown names or a wrong
    operand count and TypeError for non-floating-point operands.
    """
    try:
        arity, impl = _TABLE[name]
    except KeyError:
        known = sorted(SUPPORTED)
        raise ValueError(f"unsupported math function {name!r}; known: {known}") from None
    if len(args) != arity:
        raise ValueError(f"{name} takes {arity} operand(s), got {len(args)}")
    ty = args[0].type
    if any(a.type != ty for a in args[1:]):
        raise TypeError(f"{name}: operands must share one type, got {[str(a.type) for a in args]}")
    return impl(_Emitter(builder, ty), *args)


# ---- float16/float32 functions evaluated in float64 --------------------------------------
# TVM's hyperbolic/exp10/hypot functions have no cheap float32 kernels, but float64 kernels
# accurate to ~1 ulp of float64, evaluated on the widened operands and rounded once, give
# float32 results within ~0.5 ulp, in vector code (float64 vectors have half the lanes, still
# far faster than one libm call per lane). The kernels live in vecmath_trig (`WIDE`), written
# to be float64-safe, so they also serve float64 itself (through `_TABLE`).
VIA_F64: dict[str, tuple[int, _Impl]] = dict(WIDE)


def _f64_like(t: ir.Type) -> ir.Type:
    return ir.VectorType(ir.DoubleType(), t.count) if isinstance(t, ir.VectorType) else ir.DoubleType()


def emit_via_f64(builder: ir.IRBuilder, name: str, args: list[ir.Value]) -> ir.Value:
    """`name` (a key of `VIA_F64`) of half/float scalars or vectors, computed in float64 and
    rounded once to the operands' type."""
    arity, impl = VIA_F64[name]
    if len(args) != arity:
        raise ValueError(f"{name} takes {arity} operand(s), got {len(args)}")
    ty = args[0].type
    wide = _f64_like(ty)
    d = _Emitter(builder, wide)
    r = impl(d, *(builder.fpext(a, wide) for a in args))
    return builder.fptrunc(r, ty)


def emit_ldexp(builder: ir.IRBuilder, x: ir.Value, n: ir.Value) -> ir.Value:
    """x * 2^n for half/float ``x`` and i32 ``n`` (same lane count), rounded once: the product
    is exact in float64 once n is clamped to +-400 (beyond that every half/float result is
    already 0 or inf), and the one rounding is the conversion back."""
    ty = x.type
    wide = _f64_like(ty)
    d = _Emitter(builder, wide)
    b = builder
    lo, hi = ir.Constant(n.type, -400), ir.Constant(n.type, 400)
    nc = b.select(b.icmp_signed("<", n, lo), lo, n)
    nc = b.select(b.icmp_signed(">", nc, hi), hi, nc)
    e = b.add(b.sext(nc, d.ity), d.ci(d.bias))
    scale = d.from_bits(b.shl(e, d.ci(d.mant_bits)))  # 2^n, a normal float64
    return b.fptrunc(d.mul(b.fpext(x, wide), scale), ty)


def emit_nextafter(builder: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """C's nextafter(x, y) on the IEEE bits, for any float type and lane count: one step of
    the integer representation away from or toward zero; +-0 steps to the smallest subnormal
    with y's sign; x == y gives y (so nextafter(0, -0) is -0); a NaN operand gives NaN."""
    b = builder
    ty = x.type
    elem = ty.element if isinstance(ty, ir.VectorType) else ty
    width = {ir.HalfType: 16, ir.FloatType: 32, ir.DoubleType: 64}[type(elem)]
    ity: ir.Type = ir.IntType(width)
    if isinstance(ty, ir.VectorType):
        ity = ir.VectorType(ity, ty.count)
    zero = ir.Constant(ty, 0.0)
    bits = b.bitcast(x, ity)
    away = b.icmp_unsigned("==", b.fcmp_ordered(">", y, x), b.fcmp_ordered(">", x, zero))
    step = b.select(away, ir.Constant(ity, 1), ir.Constant(ity, -1))
    r = b.bitcast(b.add(bits, step), ty)
    tiny = b.bitcast(b.or_(b.and_(b.bitcast(y, ity), ir.Constant(ity, -(1 << (width - 1)))),
                           ir.Constant(ity, 1)), ty)
    r = b.select(b.fcmp_ordered("==", x, zero), tiny, r)
    r = b.select(b.fcmp_ordered("==", x, y), y, r)
    return b.select(b.fcmp_unordered("uno", x, y), b.fadd(x, y), r)

"""Vectorizable, exact ``fmod`` emitted as LLVM IR (float16/float32 values, any lane count).

Why this module exists: LLVM has no vector remainder: ``frem <8 x float>`` is scalarised by
the x86 backend into one ``fmodf`` call per lane, which made a vectorized loop holding
``te.fmod`` no faster than a scalar one. The remainder of two floats is always exactly
representable, so an exact algorithm needs no rounding argument, only exact steps:

float32 operands are widened to float64 (every float32, subnormals included, is a normal
float64) and reduced as ``r = |x|``, ``Y = |y|``; while ``r >= Y`` in some lane, one step
takes off a multiple of ``Ys = Y * 2^s``, where ``s = max(0, e - 28)`` and ``e`` is the
difference of the binary exponents of ``r`` and ``Y``: then ``r / Ys < 2^29``, so
``q = trunc(r / Ys)`` is at most one too large (the division rounds to nearest and ``q``
is far below 2^53), ``q * Ys`` (at most 30 + 24 bits) is exact, and ``r - q * Ys`` is
exact (both are multiples of the unit of ``Ys`` and the difference is below ``2 * Ys``);
a negative difference gets ``Ys`` added back. Each step removes 28 or more exponent
steps, so at most ten steps (float32 exponents span 277 binades) and usually one. The
loop is a real loop (a branch on "any lane still above ``Y``"), the lanes already done
keep their value.

Special values follow C99 Annex F and glibc/numpy bit for bit: the result has the sign of
``x`` (``fmod(-4, 2)`` is ``-0``), ``|x| < |y|`` and ``y = +-inf`` give ``x``, a NaN
operand propagates (``x + y``), and ``fmod(+-inf, y)``/``fmod(x, +-0)`` are the default
NaN of x86 (sign bit set, ``0xffc00000``), as glibc computes ``(x * y) / (x * y)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

if TYPE_CHECKING:
    from .vecmath import _Emitter

__all__ = ["emit_fmod", "emit_ldexp64"]

_STEP_BITS = 28  # quotient bits per step: q * Ys must stay within float64's 53 bits


def _any(b: ir.IRBuilder, cond: ir.Value) -> ir.Value:
    """The i1 "some lane of ``cond`` is true" (``cond`` itself for a scalar)."""
    if not isinstance(cond.type, ir.VectorType):
        return cond
    i1 = ir.IntType(1)
    fn = b.module.globals.get(f"llvm.vector.reduce.or.v{cond.type.count}i1")
    if fn is None:
        fn = ir.Function(b.module, ir.FunctionType(i1, [cond.type]),
                         f"llvm.vector.reduce.or.v{cond.type.count}i1")
    return b.call(fn, [cond])


def emit_fmod(builder: ir.IRBuilder, x: ir.Value, y: ir.Value, fused: bool = False) -> ir.Value:
    """C's ``fmod(x, y)`` of float (or, with ``fused``, double) scalars or vectors of one
    type, exact, as vector code. ``fused``: the target has FMA, which the double algorithm
    needs (``llvm.fma`` would be a libm call per lane without it)."""
    from .vecmath import _Emitter  # noqa: F811 (at run time: vecmath imports much)

    b = builder
    ty = x.type
    f = _Emitter(b, ty)
    if f.is64 and not fused:
        raise ValueError("the vector float64 fmod needs a target with FMA")
    d = f if f.is64 else f.wide()
    X, Y = (x, y) if f.is64 else (b.fpext(x, d.ty), b.fpext(y, d.ty))
    ax, ay = d.fabs(X), d.fabs(Y)
    nan_in = b.or_(d.uno(X), d.uno(Y))
    invalid = b.or_(d.cmp("==", ax, d.c(float("inf"))), d.cmp("==", ay, d.c(0.0)))
    bad = b.or_(nan_in, invalid)
    start = d.sel(bad, d.c(0.0), ax)  # r = 0: such lanes never step

    pre = b.block
    loop = b.append_basic_block("fmod.step")
    done = b.append_basic_block("fmod.done")
    b.branch(loop)
    b.position_at_end(loop)
    r = b.phi(d.ty)
    r.add_incoming(start, pre)
    rem = _step(d, r, ay, native=f.is64)
    nxt = d.sel(d.cmp(">=", r, ay), rem, r)
    r.add_incoming(nxt, b.block)
    b.cbranch(_any(b, d.cmp(">=", nxt, ay)), loop, done)
    b.position_at_end(done)

    res = f.copysign(nxt if f.is64 else b.fptrunc(nxt, ty), x)  # exact: remainders are floats
    dflt = f.from_bits(f.ci(_DEFAULT_NAN[f.nbits]))  # x86's default NaN, as glibc returns
    special = f.sel(b.or_(f.uno(x), f.uno(y)), f.add(x, y), dflt)
    return f.sel(bad, special, res)


# x86's default NaN (sign bit set, quiet), as signed integers of the float's width
_DEFAULT_NAN = {32: 0xFFC00000 - (1 << 32), 64: 0xFFF8000000000000 - (1 << 64)}


def _step(d: _Emitter, r: ir.Value, ay: ir.Value, native: bool) -> ir.Value:
    """One reduction step of ``r`` (where ``r >= ay``; other lanes' results are discarded)
    by a multiple of ``Ys = ay * 2^s``, ``s = max(0, e - step)`` for the exponent gap e.

    Widened float32 (``native`` False): 28 quotient bits, so ``q * Ys`` is exact in float64,
    and Ys is built in the exponent field (every value is a normal float64). float64:
    50 quotient bits (the quotient stays below 2^52, so ``q`` is at most one too large),
    ``r - q * Ys`` in one fma, exact because the true difference is a multiple of the
    unit of Ys below Ys in magnitude; subnormals get their exponent from ``v * 2^54`` and
    Ys from multiplies by powers of two (exact: Ys <= r never overflows)."""
    b = d.b
    if native:
        def expo(v: ir.Value) -> ir.Value:
            sub = d.cmp("<", v, d.c(2.0 ** -1022))
            v54 = d.sel(sub, d.mul(v, d.c(2.0 ** 54)), v)
            e = b.lshr(d.bits(v54), d.ci(52))
            return b.select(sub, b.sub(e, d.ci(54)), e)

        s = b.sub(b.sub(expo(r), expo(ay)), d.ci(50))
        s = b.select(b.icmp_signed(">", s, d.ci(0)), s, d.ci(0))
        # at most 2046, `ldexp`'s limit (a quotient below 2^52 for the widest gap, 2097)
        s = b.select(b.icmp_signed(">", s, d.ci(2046)), d.ci(2046), s)
        ys = d.ldexp(ay, b.trunc(s, d.i32))
        q = d.intr("trunc", d.div(r, ys))
        rem = d.intr("fma", d.b.fneg(q), ys, r)
    else:
        s = b.sub(b.sub(b.lshr(d.bits(r), d.ci(52)), b.lshr(d.bits(ay), d.ci(52))),
                  d.ci(_STEP_BITS))
        s = b.select(b.icmp_signed(">", s, d.ci(0)), s, d.ci(0))
        ys = d.from_bits(b.add(d.bits(ay), b.shl(s, d.ci(52))))  # Y * 2^s, exact
        q = d.intr("trunc", d.div(r, ys))
        rem = d.sub(r, d.mul(q, ys))
    return d.sel(d.cmp("<", rem, d.c(0.0)), d.add(rem, ys), rem)


def emit_ldexp64(builder: ir.IRBuilder, x: ir.Value, n: ir.Value) -> ir.Value:
    """C's ``ldexp(x, n)`` of double scalars or vectors ``x`` and i32 ``n`` (same lanes),
    rounded once, as vector code (float64 has no wider type to compute in, which is how
    `vecmath.emit_ldexp` rounds float32 once).

    Only the last multiply may round: a growing scale (n > 0) is exact until it overflows,
    which the later factors cannot undo, so several factors (`_Emitter.ldexp`) are fine; a
    shrinking one first scales x down exactly, no further than 2^-1022 (still normal),
    then multiplies once by the remaining power of two, a normal or subnormal constant
    (down to 2^-1074; anything smaller gives 0 from there as well)."""
    from .vecmath import _Emitter  # noqa: F811 (at run time: vecmath imports much)

    b = builder
    d = _Emitter(b, x.type)
    i32 = d.i32

    def c(v: int) -> ir.Constant:
        return ir.Constant(i32, v)

    def clamp(v: ir.Value, lo: int, hi: int) -> ir.Value:
        v = b.select(b.icmp_signed("<", v, c(lo)), c(lo), v)
        return b.select(b.icmp_signed(">", v, c(hi)), c(hi), v)

    n = clamp(n, -2200, 2200)  # beyond, every double result is already 0 or inf
    biased = b.trunc(b.and_(b.lshr(d.bits(x), d.ci(52)), d.ci(0x7FF)), i32)
    ex = b.sub(biased, c(1023))  # floor(log2|x|) for normal x; -1023 for 0 and subnormals
    floor_n = b.sub(c(-1022), ex)  # the shrink that lands x on 2^-1022
    na = b.select(b.icmp_signed(">", n, floor_n), n, floor_n)
    na = clamp(na, -2044, 0)  # `_Emitter.ldexp`'s factors stay normal down to 2^-2044
    x1 = d.ldexp(x, na)  # exact: stays normal
    nb = b.sub(n, na)
    grow = d.ldexp(x1, clamp(nb, 0, 1100))  # in two parts: a subnormal x may need 2098
    grow = d.ldexp(grow, clamp(b.sub(nb, c(1100)), 0, 1100))
    nbs = clamp(nb, -1074, 0)
    normal = b.shl(b.sext(b.add(nbs, c(1023)), d.ity), d.ci(52))
    subn = b.shl(d.ci(1), b.sext(b.add(nbs, c(1074)), d.ity))
    p2 = d.from_bits(b.select(b.icmp_signed(">=", nbs, c(-1022)), normal, subn))
    return d.sel(b.icmp_signed(">", nb, c(0)), grow, d.mul(x1, p2))

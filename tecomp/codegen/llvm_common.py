"""Pieces of LLVM IR generation that do not depend on the target: types, constants, casts,
intrinsic declarations and the dispatch of math/bit calls.

Kept apart from `llvm_cpu` so that a GPU backend can reuse them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from llvmlite import ir

from ..errors import CodegenError
from ..ir import dtype as dt

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
PTR = ir.PointerType()
VOID = ir.VoidType()

I16 = ir.IntType(16)
F32 = ir.FloatType()

# 16-bit floats are float in registers (computed in float32) and their i16 bits in memory.
_SCALAR: dict[str, ir.Type] = {
    "float16": F32, "bfloat16": F32, "float32": F32, "float64": ir.DoubleType(),
    "int8": I8, "int16": ir.IntType(16), "int32": I32, "int64": I64,
    "uint8": I8, "uint16": ir.IntType(16), "uint32": I32, "uint64": I64,
    "bool": I1, "handle": PTR, "void": VOID,
}


def llvm_type(dtype: str, memory: bool = False) -> ir.Type:
    """LLVM type of ``dtype``; bool is i1 in registers but i8 in ``memory`` (numpy layout);
    float16/bfloat16 are float in registers and their i16 bit patterns in ``memory``."""
    el = dt.element(dtype)
    try:
        if memory and el in ("bool", "float16", "bfloat16"):
            t = I8 if el == "bool" else I16
        else:
            t = _SCALAR[el]
    except KeyError:
        raise CodegenError(f"the LLVM backend does not support dtype {dtype!r}") from None
    n = dt.lanes(dtype)
    return ir.VectorType(t, n) if n > 1 else t


def opaque(v: ir.Value) -> ir.Value:
    """Give an alloca/global llvmlite's opaque ``ptr`` type.

    llvmlite still types allocas and globals as typed pointers (``[4 x float]*``) and then
    refuses stores through GEPs of them; the printed IR does not depend on this type.
    """
    v.type = PTR
    return v


def mangle(t: ir.Type) -> str:
    """Overload suffix of an intrinsic name for type ``t`` (``v16f32``, ``i64``, ``p0``)."""
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{mangle(t.element)}"
    if isinstance(t, ir.IntType):
        return f"i{t.width}"
    if isinstance(t, ir.HalfType):
        return "f16"
    if isinstance(t, ir.FloatType):
        return "f32"
    if isinstance(t, ir.DoubleType):
        return "f64"
    if isinstance(t, ir.PointerType):
        return "p0"
    raise CodegenError(f"cannot mangle LLVM type {t}")


def declare(module: ir.Module, name: str, fnty: ir.FunctionType) -> ir.Function:
    """The function ``name`` of ``module``, declared with ``fnty`` on first use."""
    fn = module.globals.get(name)
    if fn is None:
        return ir.Function(module, fnty, name)
    if not isinstance(fn, ir.Function) or fn.function_type != fnty:
        raise CodegenError(
            f"symbol {name!r} is used with two different signatures: "
            f"{getattr(fn, 'function_type', fn)} and {fnty}"
        )
    return fn


def intrinsic(module: ir.Module, base: str, overloads: tuple[ir.Type, ...], ret: ir.Type,
              args: tuple[ir.Type, ...]) -> ir.Function:
    """Declare ``llvm.<base>.<mangled overloads>`` with the given signature."""
    name = ".".join(["llvm." + base, *(mangle(t) for t in overloads)])
    return declare(module, name, ir.FunctionType(ret, args))


def call_intrinsic(b: ir.IRBuilder, base: str, args: list[ir.Value],
                   ret: ir.Type | None = None, overloads: tuple[ir.Type, ...] | None = None,
                   fastmath: tuple[str, ...] = ()) -> ir.Value:
    """Call an overloaded intrinsic whose overload is, by default, the first operand's type."""
    ret = args[0].type if ret is None else ret
    ov = (args[0].type,) if overloads is None else overloads
    fn = intrinsic(b.module, base, ov, ret, tuple(a.type for a in args))
    return b.call(fn, args, fastmath=fastmath)


def const(dtype: str, value: int | float | bool) -> ir.Constant:
    """An LLVM constant of ``dtype`` (vectors are splats)."""
    el = dt.element(dtype)
    if dt.is_half(el):
        # an immediate of a 16-bit type is a 16-bit value (folding keeps it so: evaluate.py)
        value = float(dt.round_to(np.float64(value), el))
    elif dt.is_float(el):
        value = float(value)
    elif el == "bool":
        value = int(bool(value))
    else:
        bits = dt.bits(el)
        value = int(value) & ((1 << bits) - 1)  # uint64 / wrap-around: two's complement bits
    st = llvm_type(el)
    n = dt.lanes(dtype)
    if n > 1:
        return ir.Constant(ir.VectorType(st, n), [ir.Constant(st, value)] * n)
    return ir.Constant(st, value)


def shuffle_mask(idx: Iterable[int]) -> ir.Constant:
    """A shufflevector lane list."""
    vals = [ir.Constant(I32, i) for i in idx]
    return ir.Constant(ir.VectorType(I32, len(vals)), vals)


def concat_vectors(b: ir.IRBuilder, lo: ir.Value, hi: ir.Value) -> ir.Value:
    """The vector of ``lo``'s lanes then ``hi``'s (two vectors of one type)."""
    return b.shuffle_vector(lo, hi, shuffle_mask(range(2 * lo.type.count)))


def splat(b: ir.IRBuilder, v: ir.Value, lanes: int) -> ir.Value:
    """Broadcast scalar ``v`` to ``lanes`` lanes (insertelement + zero shuffle)."""
    if isinstance(v, ir.Constant) and not isinstance(v.type, ir.VectorType):
        return ir.Constant(ir.VectorType(v.type, lanes), [v] * lanes)
    vt = ir.VectorType(v.type, lanes)
    one = b.insert_element(ir.Constant(vt, ir.Undefined), v, ir.Constant(I32, 0))
    return b.shuffle_vector(one, ir.Constant(vt, ir.Undefined), shuffle_mask([0] * lanes))


def cast(b: ir.IRBuilder, v: ir.Value, src: str, dst: str) -> ir.Value:
    """Convert ``v`` from ``src`` to ``dst`` (bool: != 0; float -> int saturates, see below).

    Float -> int truncates toward zero and saturates: values above the integer type's range
    give its max, below it its min (0 for unsigned, so negative floats give 0), NaN gives 0.
    Plain ``fptosi``/``fptoui`` would be poison out of range, and x86 lowerings of that poison
    differ between AVX2 and AVX-512, so results would depend on the CPU.

    16-bit floats are float32 in registers: a cast from one is a cast from float32, a cast
    to one rounds once, to nearest even (`round_half`), and stays a float32 value.
    """
    sl, dl = dt.lanes(src), dt.lanes(dst)
    if sl == 1 and dl > 1:
        return splat(b, cast(b, v, src, dt.element(dst)), dl)
    se, de = dt.element(src), dt.element(dst)
    if se == de:
        return v
    if dt.is_half(de):
        return round_half(b, v, src, de)
    if dt.is_half(se):
        se, src = "float32", dt.with_lanes("float32", sl)
        if de == "float32":
            return v
    ty = llvm_type(dst)
    if de == "bool":
        zero = const(src, 0)
        return b.fcmp_unordered("!=", v, zero) if dt.is_float(se) else b.icmp_unsigned("!=", v, zero)
    if dt.is_float(se) and dt.is_float(de):
        return b.fpext(v, ty) if dt.bits(de) > dt.bits(se) else b.fptrunc(v, ty)
    if dt.is_float(se):
        return float_to_int_sat(b, v, src, dst)
    unsigned_src = se == "bool" or dt.is_uint(se)
    if dt.is_float(de):
        return b.uitofp(v, ty) if unsigned_src else b.sitofp(v, ty)
    sb, db = dt.bits(se), dt.bits(de)
    if sb == db:
        return v  # int32 <-> uint32: same bits
    if db < sb:
        return b.trunc(v, ty)
    return b.zext(v, ty) if unsigned_src else b.sext(v, ty)


# 16-bit floats -------------------------------------------------------------------------------
# How conversions are emitted is a property of the target, recorded on the module by the
# code generator (`set_half_conversions`): "hw" uses LLVM's fptrunc/fpext between float and
# half/bfloat (x86 F16C: vcvtps2ph/vcvtph2ps, AVX512-FP16; NVPTX: cvt.rn.f16.f32,
# cvt.rn.bf16.f32 on sm_80+), "soft" emits exact integer bit arithmetic that vectorises
# (without F16C LLVM would call a libgcc helper per lane). Both round to nearest even and
# give the same bits for every non-NaN input (NaNs stay NaN).


def set_half_conversions(module: ir.Module, float16: str, bfloat16: str) -> None:
    """Record how ``module`` converts float <-> float16 / bfloat16 ("hw" or "soft")."""
    module.tecomp_half = {"float16": float16, "bfloat16": bfloat16}  # type: ignore[attr-defined]


def _half_mode(b: ir.IRBuilder, el: str) -> str:
    modes = getattr(b.module, "tecomp_half", None)
    return "soft" if modes is None else modes[el]  # type: ignore[no-any-return]


def _vty(t: ir.Type, n: int) -> ir.Type:
    return ir.VectorType(t, n) if n > 1 else t


def _ic(t: ir.Type, value: int) -> ir.Constant:
    """An integer constant of (vector) type ``t``; ``value`` as unsigned or signed bits."""
    w = (t.element if isinstance(t, ir.VectorType) else t).width
    value &= (1 << w) - 1
    value -= (value >> (w - 1)) << w  # LLVM's parser wants the signed form
    if isinstance(t, ir.VectorType):
        return ir.Constant(t, [ir.Constant(t.element, value)] * t.count)
    return ir.Constant(t, value)


def _lanes_of(v: ir.Value) -> int:
    return v.type.count if isinstance(v.type, ir.VectorType) else 1


def round_half(b: ir.IRBuilder, v: ir.Value, src: str, el: str) -> ir.Value:
    """``v`` (of ``src``) rounded to the 16-bit float ``el``, as a float32 value.

    Ints go through float64 (exact up to 32 bits) and float64 is first rounded to float32
    *to odd* (`_f64_to_f32_odd`), which makes the second rounding exact: one correct
    rounding overall, as `dtype.round_to` computes it.
    """
    n = dt.lanes(src)
    se = dt.element(src)
    if se == "bool":
        return b.uitofp(v, _vty(F32, n))  # 0 and 1 are exact
    if dt.is_int(se):
        f64 = _vty(ir.DoubleType(), n)
        v = b.uitofp(v, f64) if dt.is_uint(se) else b.sitofp(v, f64)
        se = "float64"
    if se == "float64":
        v = _f64_to_f32_odd(b, v)
    return half_to_f32(b, f32_to_half(b, v, el), el)


def _f64_to_f32_odd(b: ir.IRBuilder, d: ir.Value) -> ir.Value:
    n = _lanes_of(d)
    i32, f32 = _vty(I32, n), _vty(F32, n)
    r = b.fptrunc(d, f32)
    u = b.bitcast(r, i32)
    fin = b.fcmp_ordered("<", call_intrinsic(b, "fabs", [d]), _fc(d.type, math.inf))
    past = b.fcmp_ordered(">", call_intrinsic(b, "fabs", [b.fpext(r, d.type)]),
                          call_intrinsic(b, "fabs", [d]))
    u = b.select(b.and_(fin, past), b.sub(u, _ic(i32, 1)), u)
    inexact = b.and_(fin, b.fcmp_ordered("!=", b.fpext(b.bitcast(u, f32), d.type), d))
    u = b.select(inexact, b.or_(u, _ic(i32, 1)), u)
    return b.bitcast(u, f32)


def _fc(t: ir.Type, value: float) -> ir.Constant:
    if isinstance(t, ir.VectorType):
        return ir.Constant(t, [ir.Constant(t.element, value)] * t.count)
    return ir.Constant(t, value)


def f32_to_half(b: ir.IRBuilder, v: ir.Value, el: str) -> ir.Value:
    """float32 ``v`` -> the i16 bits of ``el`` (float16 or bfloat16), round to nearest even."""
    n = _lanes_of(v)
    i16, i32 = _vty(I16, n), _vty(I32, n)
    if _half_mode(b, el) == "hw":
        h = b.fptrunc(v, _vty(ir.HalfType() if el == "float16" else _BF16, n))
        return b.bitcast(h, i16)
    u = b.bitcast(v, i32)
    if el == "bfloat16":
        # RNE on the low 16 bits: add 0x7fff plus the kept lsb, then shift (a carry into the
        # exponent is the correct rounding up, to inf past the max); NaN: quiet, keep sign.
        lsb = b.and_(b.lshr(u, _ic(i32, 16)), _ic(i32, 1))
        r = b.lshr(b.add(b.add(u, _ic(i32, 0x7FFF)), lsb), _ic(i32, 16))
        nan = b.icmp_unsigned(">", b.and_(u, _ic(i32, 0x7FFFFFFF)), _ic(i32, 0x7F800000))
        q = b.or_(b.lshr(u, _ic(i32, 16)), _ic(i32, 0x40))
        return b.trunc(b.select(nan, q, r), i16)
    # float16 (F. Giesen's float_to_half_fast3_rtne): normal results round the mantissa with
    # integer adds; results below 2^-14 are denormal and are rounded by the FP adder itself
    # (adding 0.5 aligns the value's bits to the f16 denormal grid, RNE); at or above 2^16
    # the result is inf (values in [65520, 65536) carry into inf on the normal path).
    sign = b.and_(u, _ic(i32, 0x80000000))
    a = b.xor(u, sign)
    over = b.icmp_unsigned(">=", a, _ic(i32, 0x47800000))
    nan = b.icmp_unsigned(">", a, _ic(i32, 0x7F800000))
    inf_or_nan = b.select(nan, b.or_(_ic(i32, 0x7E00), b.and_(b.lshr(a, _ic(i32, 13)),
                                                                  _ic(i32, 0x3FF))),
                          _ic(i32, 0x7C00))
    magic = _fc(_vty(F32, n), 0.5)
    den = b.sub(b.bitcast(b.fadd(b.bitcast(a, _vty(F32, n)), magic), i32), _ic(i32, 0x3F000000))
    odd = b.and_(b.lshr(a, _ic(i32, 13)), _ic(i32, 1))
    nrm = b.lshr(b.add(b.add(a, _ic(i32, ((15 - 127) << 23) + 0xFFF & 0xFFFFFFFF)), odd),
                 _ic(i32, 13))
    r = b.select(over, inf_or_nan,
                 b.select(b.icmp_unsigned("<", a, _ic(i32, 0x38800000)), den, nrm))
    return b.trunc(b.or_(r, b.lshr(sign, _ic(i32, 16))), i16)


class BFloatType(ir.types._BaseFloatType):
    """LLVM's ``bfloat`` (llvmlite has no such type); only converted to/from, never computed."""

    null = "0.0"
    intrinsic_name = "bf16"

    def __str__(self) -> str:
        return "bfloat"


BFloatType._create_instance()
_BF16 = BFloatType()


def half_to_f32(b: ir.IRBuilder, h: ir.Value, el: str) -> ir.Value:
    """The i16 bits ``h`` of ``el`` (float16 or bfloat16) -> float32 (exact)."""
    n = _lanes_of(h)
    i32, f32 = _vty(I32, n), _vty(F32, n)
    if el == "bfloat16":  # the top half of a float32
        return b.bitcast(b.shl(b.zext(h, i32), _ic(i32, 16)), f32)
    if _half_mode(b, el) == "hw":
        return b.fpext(b.bitcast(h, _vty(ir.HalfType(), n)), f32)
    # float16 (F. Giesen's half_to_float): shift exponent and mantissa into place and
    # rebias; inf/NaN get the float exponent; zero/denormals are renormalised by a subtract.
    u = b.shl(b.and_(b.zext(h, i32), _ic(i32, 0x7FFF)), _ic(i32, 13))
    e = b.and_(u, _ic(i32, 0x0F800000))
    u = b.add(u, _ic(i32, (127 - 15) << 23))
    infnan = b.add(u, _ic(i32, (128 - 16) << 23))
    den = b.bitcast(b.fsub(b.bitcast(b.add(u, _ic(i32, 1 << 23)), f32), _fc(f32, 2.0 ** -14)),
                    i32)
    u = b.select(b.icmp_unsigned("==", e, _ic(i32, 0x0F800000)), infnan,
                 b.select(b.icmp_unsigned("==", e, _ic(i32, 0)), den, u))
    sign = b.shl(b.and_(b.zext(h, i32), _ic(i32, 0x8000)), _ic(i32, 16))
    return b.bitcast(b.or_(u, sign), f32)


def float_to_int_sat(b: ir.IRBuilder, v: ir.Value, src: str, dst: str) -> ir.Value:
    """Float ``v`` (``src``) to integer ``dst``: truncate toward zero, clamp to ``dst``'s
    range, NaN -> 0 (the semantics of ``llvm.fpto[su]i.sat``).

    Scalars call the intrinsic (x86: cvttss2si plus two cmovs). LLVM's x86 backend splits
    the vector intrinsic into one scalar conversion per lane, so vectors get the same result
    from lane-wise compares and selects around a plain ``fptosi``/``fptoui``: NaN (and, for
    unsigned, anything below 0) is replaced first, then the float is clamped to the range
    when its bounds are exact floats (int8/int16 from float32, int32 from float64), else the
    lanes at or above 2**bits (signed: 2**(bits-1)) take the maximum after the conversion.
    Either way the conversion itself only ever sees in-range values (or an unselected lane).
    """
    se, de = dt.element(src), dt.element(dst)
    lanes = dt.lanes(src)
    if dt.is_half(se):  # a float32 value in registers
        se = "float32"
    unsigned = dt.is_uint(de)
    ty = llvm_type(dt.with_lanes(de, lanes))
    if lanes == 1:
        base = "fptoui.sat" if unsigned else "fptosi.sat"
        return call_intrinsic(b, base, [v], ret=ty, overloads=(ty, v.type))
    bits = dt.bits(de)
    lo, hi = (0, (1 << bits) - 1) if unsigned else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    fdt = dt.with_lanes(se, lanes)
    zero = const(fdt, 0.0)
    if unsigned:  # NaN > 0 is false, so one select maps NaN and negatives to 0
        x = b.select(b.fcmp_ordered(">", v, zero), v, zero)
    else:
        x = b.select(b.fcmp_ordered("ord", v, v), v, zero)
        flo = const(fdt, float(lo))  # a power of two: exact
        x = b.select(b.fcmp_ordered("<", x, flo), flo, x)
    if hi < 1 << (24 if se == "float32" else 53):  # hi is an exact float: clamp, then convert
        fhi = const(fdt, float(hi))
        x = b.select(b.fcmp_ordered(">", x, fhi), fhi, x)
        return b.fptoui(x, ty) if unsigned else b.fptosi(x, ty)
    conv = b.fptoui(x, ty) if unsigned else b.fptosi(x, ty)  # poison only where replaced
    over = b.fcmp_ordered(">=", x, const(fdt, float(hi + 1)))
    return b.select(over, const(dt.with_lanes(de, lanes), hi), conv)


def to_i64(b: ir.IRBuilder, v: ir.Value, dtype: str) -> ir.Value:
    """Widen an integer index (scalar or vector) to 64 bits, honouring its signedness."""
    want = I64 if dt.lanes(dtype) == 1 else ir.VectorType(I64, dt.lanes(dtype))
    if v.type == want:
        return v
    return b.zext(v, want) if dt.is_uint(dtype) or dt.is_bool(dtype) else b.sext(v, want)


# Math and bit calls --------------------------------------------------------------------------

# Vectorizable exp/log/tanh/... written as plain IR (LLVM's own vector math intrinsics are
# scalarised into one libm call per lane).
from .vecmath import SUPPORTED as VECMATH_SUPPORTED  # noqa: E402
from .vecmath import emit_math as _vecmath_emit  # noqa: E402

# Float functions LLVM has intrinsics for (used when vecmath does not provide them). Those
# that are not native instructions become one libm call per lane.
_FLOAT_INTRINSICS = {
    "exp": "exp", "exp2": "exp2", "exp10": "exp10", "log": "log", "log2": "log2",
    "log10": "log10", "sqrt": "sqrt", "fabs": "fabs", "abs": "fabs", "floor": "floor",
    "ceil": "ceil", "trunc": "trunc", "round": "roundeven", "nearbyint": "nearbyint",
    "sin": "sin", "cos": "cos", "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan",
    "sinh": "sinh", "cosh": "cosh", "tanh": "tanh", "pow": "pow", "power": "pow",
    "fma": "fma", "copysign": "copysign", "minimum": "minimum", "maximum": "maximum",
    "atan2": "atan2",
}
# Float functions only libm has: called lane by lane.
_LIBM = {"erf": "erf", "log1p": "log1p", "expm1": "expm1", "fmod": "fmod", "asinh": "asinh",
         "acosh": "acosh", "atanh": "atanh", "cbrt": "cbrt", "hypot": "hypot"}
_INT_INTRINSICS = {"popcount": "ctpop", "abs": "abs", "clz": "ctlz", "ctz": "cttz"}
_BITWISE = {"bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "shift_left",
            "shift_right"}

MATH_NAMES: frozenset[str] = frozenset(
    set(VECMATH_SUPPORTED) | set(_FLOAT_INTRINSICS) | set(_LIBM) | set(_INT_INTRINSICS)
    | _BITWISE | {"sigmoid", "rsqrt", "isnan", "isinf", "isfinite", "likely", "reinterpret"}
)


def _libm_call(b: ir.IRBuilder, name: str, args: list[ir.Value], el: str) -> ir.Value:
    """Call the scalar libm function per lane (``erff`` for float32, ``erf`` for float64)."""
    return call_per_lane(b, name + ("f" if el == "float32" else ""), args, el)


def call_per_lane(b: ir.IRBuilder, sym: str, args: list[ir.Value], el: str) -> ir.Value:
    """Call the scalar function ``sym`` (of element type ``el``) on each lane of vector
    ``args`` (or once on scalars) and gather the results."""
    sty = llvm_type(el)
    fn = declare(b.module, sym, ir.FunctionType(sty, [sty] * len(args)))
    t = args[0].type
    if not isinstance(t, ir.VectorType):
        return b.call(fn, args)
    out: ir.Value = ir.Constant(t, ir.Undefined)
    for i in range(t.count):
        lane = ir.Constant(I32, i)
        r = b.call(fn, [b.extract_element(a, lane) for a in args])
        out = b.insert_element(out, r, lane)
    return out


def _float_math(b: ir.IRBuilder, name: str, args: list[ir.Value], dtype: str) -> ir.Value:
    el = dt.element(dtype)
    if dt.is_half(el):  # 16-bit floats are float32 values in registers: float32's math
        return _float_math(b, name, args, dt.compute_dtype(dtype))
    if name == "isnan":
        return b.fcmp_unordered("uno", args[0], args[0])
    if name in ("isinf", "isfinite"):
        mag = call_intrinsic(b, "fabs", [args[0]])
        inf = const(dtype, math.inf)
        return b.fcmp_ordered("==", mag, inf) if name == "isinf" else b.fcmp_ordered("<", mag, inf)
    if name in VECMATH_SUPPORTED:
        return _vecmath_emit(b, name, args)
    if name == "sigmoid":  # 1 / (1 + exp(-x))
        one = const(dtype, 1.0)
        e = _float_math(b, "exp", [b.fneg(args[0])], dtype)
        return b.fdiv(one, b.fadd(one, e))
    if name == "rsqrt":
        return b.fdiv(const(dtype, 1.0), call_intrinsic(b, "sqrt", args))
    if name in _FLOAT_INTRINSICS:
        return call_intrinsic(b, _FLOAT_INTRINSICS[name], args)
    if name in _LIBM:
        return _libm_call(b, _LIBM[name], args, el)
    raise CodegenError(f"math function {name!r} is not defined for {dtype}")


def _int_math(b: ir.IRBuilder, name: str, args: list[ir.Value], dtype: str) -> ir.Value:
    if name in ("abs", "fabs"):
        if dt.is_uint(dtype) or dt.is_bool(dtype):
            return args[0]
        return call_intrinsic(b, "abs", [args[0], ir.Constant(I1, 0)])
    if name in ("clz", "ctz"):
        return call_intrinsic(b, _INT_INTRINSICS[name], [args[0], ir.Constant(I1, 0)])
    if name == "popcount":
        return call_intrinsic(b, "ctpop", args)
    if name == "bitwise_and":
        return b.and_(args[0], args[1])
    if name == "bitwise_or":
        return b.or_(args[0], args[1])
    if name == "bitwise_xor":
        return b.xor(args[0], args[1])
    if name == "bitwise_not":
        return b.not_(args[0])
    if name == "shift_left":
        return b.shl(args[0], args[1])
    if name == "shift_right":
        return b.lshr(args[0], args[1]) if dt.is_uint(dtype) else b.ashr(args[0], args[1])
    if name in ("isnan", "isinf"):
        return const(dt.with_lanes("bool", dt.lanes(dtype)), False)
    if name == "isfinite":
        return const(dt.with_lanes("bool", dt.lanes(dtype)), True)
    if name in ("floor", "ceil", "trunc", "round", "nearbyint"):
        return args[0]
    raise CodegenError(f"math function {name!r} is not defined for {dtype}")


def emit_math_call(b: ir.IRBuilder, name: str, args: list[ir.Value], arg_dtypes: list[str],
                   ret_dtype: str) -> ir.Value:
    """Emit the pure intrinsic ``name`` (a non-extern tecomp ``Call``) on evaluated args."""
    if not args:
        raise CodegenError(f"call to {name!r} needs at least one argument")
    if name == "likely":
        return args[0]
    if name == "reinterpret":
        src, n = dt.element(arg_dtypes[0]), dt.lanes(ret_dtype)
        v = args[0]
        if dt.is_half(src):  # its 16 bits: the value rounded (a no-op for a loaded value)
            v = f32_to_half(b, v, src)
        if dt.is_half(ret_dtype):
            return half_to_f32(b, b.bitcast(v, _vty(I16, n)), dt.element(ret_dtype))
        return b.bitcast(v, llvm_type(ret_dtype))
    dtype = arg_dtypes[0]
    if dt.is_float(dtype):
        return _float_math(b, name, args, dtype)
    return _int_math(b, name, args, dtype)


__all__ = [
    "F32", "I1", "I16", "I32", "I64", "I8", "f32_to_half", "half_to_f32", "round_half",
    "set_half_conversions", "MATH_NAMES", "PTR", "VOID", "call_intrinsic", "cast", "const",
    "call_per_lane", "concat_vectors", "declare", "emit_math_call", "float_to_int_sat", "intrinsic", "llvm_type",
    "mangle", "opaque", "shuffle_mask", "splat", "to_i64",
]

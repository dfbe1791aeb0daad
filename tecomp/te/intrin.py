"""Math intrinsics, conditionals and dtype limits for declarations."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..errors import TecompError
from ..ir import dtype as dt
from ..ir.expr import (
    SHIFTS,
    And,
    Broadcast,
    Call,
    Div,
    Expr,
    ExprLike,
    FloorDiv,
    FloorMod,
    IntImm,
    Max,
    Min,
    Not,
    Or,
    Select,
    StringImm,
    as_bool,
    binop,
    bitwise,
    const,
    promote,
    shift,
    to_expr,
)
from ..ir.expr import (
    bitwise_not as bitwise_not,
)

FLOAT_UNARY = (
    "exp", "exp2", "exp10", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "tanh", "sigmoid",
    "erf", "floor", "ceil", "round", "trunc", "nearbyint", "sin", "cos", "tan", "sinh", "cosh",
    "asin", "acos", "atan", "asinh", "acosh", "atanh",
)
FLOAT_BINARY = ("atan2", "hypot", "copysign", "nextafter", "fmod")


def _float_arg(name: str, x: ExprLike) -> Expr:
    e = to_expr(x)
    if not dt.is_float(e.dtype):
        e = e.astype("float32")
    return e


def _unary(name: str) -> Any:
    def f(x: ExprLike) -> Expr:
        e = _float_arg(name, x)
        return Call(e.dtype, name, (e,))

    f.__name__ = name
    f.__doc__ = f"Element-wise ``{name}`` (float arguments; ints are converted to float32)."
    return f


exp = _unary("exp")
exp2 = _unary("exp2")
log = _unary("log")
log2 = _unary("log2")
log10 = _unary("log10")
sqrt = _unary("sqrt")
rsqrt = _unary("rsqrt")
tanh = _unary("tanh")
sigmoid = _unary("sigmoid")
erf = _unary("erf")
floor = _unary("floor")
ceil = _unary("ceil")
round = _unary("round")  # noqa: A001
trunc = _unary("trunc")
sin = _unary("sin")
cos = _unary("cos")
exp10 = _unary("exp10")
log1p = _unary("log1p")
nearbyint = _unary("nearbyint")
tan = _unary("tan")
sinh = _unary("sinh")
cosh = _unary("cosh")
asin = _unary("asin")
acos = _unary("acos")
atan = _unary("atan")
asinh = _unary("asinh")
acosh = _unary("acosh")
atanh = _unary("atanh")


def _float_pair(name: str, x: ExprLike, y: ExprLike) -> tuple[Expr, Expr]:
    """Both operands in one float dtype (ints become float32, as for the unary functions)."""
    ex = to_expr(x, y.dtype if isinstance(y, Expr) else None)
    ey = to_expr(y, ex.dtype)
    ex, ey = promote(ex, ey)
    if not dt.is_float(ex.dtype):
        ex, ey = ex.astype("float32"), ey.astype("float32")
    return ex, ey


def _binary(name: str, doc: str) -> Any:
    def f(x: ExprLike, y: ExprLike) -> Expr:
        a, b = _float_pair(name, x, y)
        return Call(a.dtype, name, (a, b))

    f.__name__ = name
    f.__doc__ = doc
    return f


atan2 = _binary("atan2", "``atan2(y, x)``: the angle of the point (x, y), in (-pi, pi].")
hypot = _binary("hypot", "``sqrt(x*x + y*y)`` without overflow or underflow on the way "
                         "(inf when either is inf, even with a NaN).")
copysign = _binary("copysign", "The magnitude of ``x`` with the sign bit of ``y``.")
nextafter = _binary("nextafter", "The next float after ``x`` in the direction of ``y``.")
fmod = _binary("fmod", "C's ``fmod``: ``x - trunc(x / y) * y`` computed exactly (the sign of "
                       "``x``).")


def ldexp(x: ExprLike, exp: ExprLike) -> Expr:
    """``x * 2**exp`` rounded once (``exp`` an integer expression; ``x`` float)."""
    ex = _float_arg("ldexp", x)
    en = to_expr(exp)
    if not dt.is_int(en.dtype):
        raise TypeError(f"ldexp needs an integer exponent, got {en} of type {en.dtype}")
    if dt.bits(en.dtype) > 32 or dt.element(en.dtype) == "uint32":
        # beyond +-100000 every float result is already 0 or inf: clamp, then narrow safely
        en = Max(Min(en, const(100000, en.dtype)), const(-100000 if not dt.is_uint(en.dtype)
                                                           else 0, en.dtype))
    en = en.astype("int32")
    if dt.lanes(ex.dtype) != dt.lanes(en.dtype):
        if dt.lanes(ex.dtype) == 1:
            ex = Broadcast(ex, dt.lanes(en.dtype))
        elif dt.lanes(en.dtype) == 1:
            en = Broadcast(en, dt.lanes(ex.dtype))
    return Call(ex.dtype, "ldexp", (ex, en))


def _predicate(name: str, on_int: bool) -> Any:
    def f(x: ExprLike) -> Expr:
        e = to_expr(x)
        bool_dt = dt.with_lanes("bool", dt.lanes(e.dtype))
        if not dt.is_float(e.dtype):  # an integer is never NaN nor infinite (TVM folds it too)
            return const(on_int, bool_dt)
        return Call(bool_dt, name, (e,))

    f.__name__ = name
    f.__doc__ = f"Element-wise ``{name}`` (a bool expression; constant {on_int} for integers)."
    return f


isnan = _predicate("isnan", False)
isinf = _predicate("isinf", False)
isfinite = _predicate("isfinite", True)


def infinity(dtype: str) -> Expr:
    """``+inf`` of the float ``dtype`` (TVM's ``tir.infinity``; integers have none)."""
    d = dt.canonical(dtype)
    if not dt.is_float(d):
        raise TypeError(f"infinity is only defined for float dtypes, not {d}")
    return const(np.inf, d)


def likely(cond: ExprLike) -> Expr:
    """Mark ``cond`` as likely true (a branch hint; the value is ``cond`` itself)."""
    c = to_expr(cond)
    if isinstance(c, IntImm):
        return c
    return Call(c.dtype, "likely", (c,))


# integers and bits --------------------------------------------------------------------------


def _int_arg(name: str, x: ExprLike) -> Expr:
    e = to_expr(x)
    if not dt.is_int(e.dtype):
        raise TypeError(f"{name} needs an integer operand, got {e} of type {e.dtype}")
    return e


def popcount(x: ExprLike) -> Expr:
    """The number of 1 bits of integer ``x`` (of its two's complement bits; same dtype)."""
    e = _int_arg("popcount", x)
    return Call(e.dtype, "popcount", (e,))


def clz(x: ExprLike) -> Expr:
    """The number of leading zero bits of integer ``x``, as int32 (TVM leaves ``clz(0)``
    undefined; here it is the bit width)."""
    e = _int_arg("clz", x)
    return Call(dt.with_lanes("int32", dt.lanes(e.dtype)), "clz", (e,))


def bitwise_and(x: ExprLike, y: ExprLike) -> Expr:
    """``x & y`` (integers bit by bit; bools: logical and)."""
    return bitwise("bitwise_and", x, y)


def bitwise_or(x: ExprLike, y: ExprLike) -> Expr:
    """``x | y`` (integers bit by bit; bools: logical or)."""
    return bitwise("bitwise_or", x, y)


def bitwise_xor(x: ExprLike, y: ExprLike) -> Expr:
    """``x ^ y`` (integers bit by bit; bools: ``x != y``)."""
    return bitwise("bitwise_xor", x, y)


def shift_left(x: ExprLike, y: ExprLike) -> Expr:
    """``x << y`` (see `tecomp.ir.expr.shift` for the rules on the amount)."""
    return shift(SHIFTS[0], x, y)


def shift_right(x: ExprLike, y: ExprLike) -> Expr:
    """``x >> y``: arithmetic for signed, logical for unsigned ``x``."""
    return shift(SHIFTS[1], x, y)


def reinterpret(dtype: str, value: ExprLike) -> Expr:
    """The bits of ``value`` read as ``dtype`` (a bitcast; TVM's argument order). The element
    widths must match (``reinterpret("int32", f32)``); vector lanes are kept."""
    e = to_expr(value)
    d = dt.canonical(dtype)
    if dt.lanes(d) == 1 and dt.lanes(e.dtype) > 1:
        d = dt.with_lanes(d, dt.lanes(e.dtype))
    if d == e.dtype:
        return e
    src, dst = dt.element(e.dtype), dt.element(d)
    for x in (src, dst):
        if not (dt.is_int(x) or dt.is_float(x)):
            raise TypeError(f"reinterpret works on integer and float dtypes, not {x}")
    if dt.bits(src) != dt.bits(dst) or dt.lanes(d) != dt.lanes(e.dtype):
        raise TypeError(f"reinterpret needs the same bit width: {e.dtype} ({dt.bits(src)} bits) "
                        f"cannot be read as {d} ({dt.bits(dst)} bits)")
    return Call(d, "reinterpret", (e,))


# division -----------------------------------------------------------------------------------


def _fold(e: Expr) -> Expr:
    """Fold an integer division of two constants (TVM does at construction, so shapes written
    ``ceildiv(10, 3)`` stay constants)."""
    from ..arith.evaluate import binary

    if (isinstance(e, (Div, FloorDiv, FloorMod)) and isinstance(e.a, IntImm)
            and isinstance(e.b, IntImm) and e.b.value != 0 and dt.is_int(e.dtype)):
        return IntImm(int(binary(type(e), e.a.value, e.b.value, e.dtype)), e.dtype)
    return e


def _nonzero(name: str, a: Expr, b: Expr) -> None:
    """TVM refuses a constant zero divisor when the expression is built ("Divide by zero");
    so does this, before the simplifier could fold ``x % 0`` into something quiet."""
    v = b.value if isinstance(b, Broadcast) else b
    if isinstance(v, IntImm) and v.value == 0 and dt.is_int(v.dtype):
        raise TecompError(f"{name}({a}, {b}): integer division by the constant 0")


def _int_division(name: str, a: ExprLike, b: ExprLike) -> tuple[Expr, Expr]:
    ea = to_expr(a, b.dtype if isinstance(b, Expr) else None)
    eb = to_expr(b, ea.dtype)
    ea, eb = promote(ea, eb)
    _nonzero(name, ea, eb)
    if not dt.is_int(ea.dtype):
        hint = "; for floats use te.trunc(a / b)" if name == "truncdiv" else (
            "; for floats use te.ceil(a / b)" if name == "ceildiv" else "")
        raise TypeError(f"{name} is integer division, got {ea} and {eb} of type {ea.dtype}{hint}")
    return ea, eb


def _checked(e: Expr, name: str) -> Expr:
    assert isinstance(e, (Div, FloorDiv, FloorMod))
    _nonzero(name, e.a, e.b)
    return e


def div(a: ExprLike, b: ExprLike) -> Expr:
    """TVM's ``tir.div``: true division for floats, truncating (C) division for integers."""
    return _fold(_checked(binop(Div, a, b), "div"))


def truncdiv(a: ExprLike, b: ExprLike) -> Expr:
    """Integer division rounding toward zero (C's ``/``): ``truncdiv(-7, 2) == -3``."""
    ea, eb = _int_division("truncdiv", a, b)
    return _fold(Div(ea, eb))


def truncmod(a: ExprLike, b: ExprLike) -> Expr:
    """The remainder of `truncdiv` (C's ``%``; the sign of ``a``): ``truncmod(-7, 2) == -1``.
    On floats it is C's ``fmod``.

    Integers are written ``a - truncdiv(a, b) * b`` so that the simplifier and bound
    inference, which know ``Div``, reason about it (LLVM turns it back into one ``srem``).
    """
    ea = to_expr(a, b.dtype if isinstance(b, Expr) else None)
    eb = to_expr(b, ea.dtype)
    ea, eb = promote(ea, eb)
    if dt.is_float(ea.dtype):
        return Call(ea.dtype, "fmod", (ea, eb))
    ea, eb = _int_division("truncmod", ea, eb)
    if isinstance(ea, IntImm) and isinstance(eb, IntImm) and eb.value != 0:
        from ..arith.evaluate import trunc_div, wrap_int

        return IntImm(wrap_int(ea.value - trunc_div(ea.value, eb.value) * eb.value, ea.dtype),
                      ea.dtype)
    return ea - Div(ea, eb) * eb


def floordiv(a: ExprLike, b: ExprLike) -> Expr:
    """Division rounding toward -inf (Python's ``//``); on floats ``floor(a / b)``."""
    return _fold(_checked(binop(FloorDiv, a, b), "floordiv"))


def floormod(a: ExprLike, b: ExprLike) -> Expr:
    """The remainder of `floordiv` (Python's ``%``; the sign of ``b``); on floats
    ``a - floor(a / b) * b``."""
    return _fold(_checked(binop(FloorMod, a, b), "floormod"))


indexdiv = floordiv
indexmod = floormod


def ceildiv(a: ExprLike, b: ExprLike) -> Expr:
    """Integer division rounding toward +inf: ``ceildiv(7, 2) == 4``, ``ceildiv(-7, 2) == -3``.

    TVM writes it ``(a + b - 1) // b``, which is the ceiling only for ``b > 0``; that form is
    kept for positive divisors (the simplifier knows it) and negative ones use
    ``(a + b + 1) // b``, so every sign gives the ceiling. Like TVM's, ``a + b - 1`` may wrap
    for ``a`` within ``b`` of the dtype's maximum.
    """
    ea, eb = _int_division("ceildiv", a, b)
    if isinstance(eb, IntImm):
        adj = eb.value - 1 if eb.value > 0 else eb.value + 1
        return _fold(FloorDiv(_fold_add(ea, adj), eb)) if adj else _fold(FloorDiv(ea, eb))
    if dt.is_uint(ea.dtype):
        return FloorDiv(ea + eb - 1, eb)
    return Select(eb > 0, FloorDiv(ea + eb - 1, eb), FloorDiv(ea + eb + 1, eb))


def _fold_add(a: Expr, k: int) -> Expr:
    if isinstance(a, IntImm):
        from ..arith.evaluate import wrap_int

        return IntImm(wrap_int(a.value + k, a.dtype), a.dtype)
    return a + k


def abs(x: ExprLike) -> Expr:  # noqa: A001
    """Absolute value for ints and floats."""
    e = to_expr(x)
    if dt.is_float(e.dtype):
        return Call(e.dtype, "fabs", (e,))
    if dt.is_uint(e.dtype) or dt.is_bool(e.dtype):
        return e
    return Select(e < 0, -e, e)


def power(x: ExprLike, y: ExprLike) -> Expr:
    a, b = promote(_float_arg("power", x), to_expr(y, to_expr(x).dtype))
    if not dt.is_float(b.dtype):
        b = b.astype(a.dtype)
    return Call(a.dtype, "pow", (a, b))


pow = power  # noqa: A001


def max(a: ExprLike, b: ExprLike) -> Expr:  # noqa: A001
    ea = to_expr(a, b.dtype if isinstance(b, Expr) else None)
    return Max(*promote(ea, to_expr(b, ea.dtype)))


def min(a: ExprLike, b: ExprLike) -> Expr:  # noqa: A001
    ea = to_expr(a, b.dtype if isinstance(b, Expr) else None)
    return Min(*promote(ea, to_expr(b, ea.dtype)))


def if_then_else(cond: ExprLike, t: ExprLike, f: ExprLike) -> Expr:
    """``t`` where ``cond`` holds, else ``f``; only the chosen side is evaluated.

    That makes padding safe: ``if_then_else(i >= 1, A[i - 1], 0.0)`` never reads ``A[-1]``.
    A constant condition picks its side at once (as TVM does).
    """
    c0 = to_expr(cond)
    if isinstance(c0, IntImm):
        et = to_expr(t, f.dtype if isinstance(f, Expr) else None)
        ef = to_expr(f, et.dtype)
        et, ef = promote(et, ef)
        return et if c0.value else ef
    c = as_bool(to_expr(cond))
    et = to_expr(t, f.dtype if isinstance(f, Expr) else None)
    ef = to_expr(f, et.dtype)
    et, ef = promote(et, ef)
    return Select(c, et, ef)


def all(*conds: ExprLike) -> Expr:  # noqa: A001
    """Logical and of every condition (``te.all(i > 0, j < n)``)."""
    if len(conds) == 1 and isinstance(conds[0], (tuple, list)):
        conds = tuple(conds[0])
    if not conds:
        raise TecompError("te.all needs at least one condition")
    out = as_bool(to_expr(conds[0]))
    for c in conds[1:]:
        out = And(out, as_bool(to_expr(c)))
    return out


def any(*conds: ExprLike) -> Expr:  # noqa: A001
    """Logical or of every condition."""
    if len(conds) == 1 and isinstance(conds[0], (tuple, list)):
        conds = tuple(conds[0])
    if not conds:
        raise TecompError("te.any needs at least one condition")
    out = as_bool(to_expr(conds[0]))
    for c in conds[1:]:
        out = Or(out, as_bool(to_expr(c)))
    return out


def select(cond: ExprLike, t: ExprLike, f: ExprLike) -> Expr:
    """TVM's ``tir.Select``. TVM evaluates both sides; here only the chosen one runs (the same
    node as `if_then_else`), which gives the same values and never faults where TVM would."""
    return if_then_else(cond, t, f)


def logical_not(c: ExprLike) -> Expr:
    return Not(as_bool(to_expr(c)))


def min_value(dtype: str) -> Expr:
    """The smallest value of ``dtype`` (-inf for floats, the way reductions want it)."""
    d = dt.canonical(dtype)
    if dt.is_float(d):
        return const(-np.inf, d)
    if dt.is_bool(d):
        return const(False, d)
    return const(int(np.iinfo(dt.to_numpy(d)).min), d)


def max_value(dtype: str) -> Expr:
    """The largest value of ``dtype`` (+inf for floats)."""
    d = dt.canonical(dtype)
    if dt.is_float(d):
        return const(np.inf, d)
    if dt.is_bool(d):
        return const(True, d)
    return const(int(np.iinfo(dt.to_numpy(d)).max), d)


def call_extern(dtype: str, name: str, *args: ExprLike) -> Expr:
    """Call the C function ``name`` (resolved when the kernel is JIT-compiled or linked)."""
    return Call(dt.canonical(dtype) if dtype != "void" else "int32", name,
                tuple(to_expr(a) for a in args), extern=True)


def call_pure_extern(dtype: str, name: str, *args: ExprLike) -> Expr:
    """TVM's ``call_pure_extern``: `call_extern` of a C function without side effects
    (tecomp never moves or merges extern calls, so the two are the same call)."""
    return call_extern(dtype, name, *args)


def _llvm_args(name: str, args: tuple[ExprLike, ...]) -> tuple[Expr, ...]:
    if not isinstance(name, str) or not name.startswith("llvm.") or len(name) <= 5:
        raise TecompError(f"call_llvm_intrin: {name!r} is not an LLVM intrinsic name (they "
                          "start with 'llvm.', e.g. 'llvm.ctpop' or 'llvm.x86.sse42.crc32.32.32')")
    # TVM before 0.9 took a num_signature operand first (tvm.tir.const(n, "uint32")): accept
    # and drop it, as the overload types come from the operands here (as in TVM 0.9+)
    if len(args) >= 2 and (type(args[0]) is int
                           or (isinstance(args[0], IntImm) and args[0].dtype == "uint32")):
        args = args[1:]
    return tuple(to_expr(a) for a in args)


def call_llvm_intrin(dtype: str, name: str, *args: ExprLike) -> Expr:
    """Call the LLVM intrinsic ``name`` (``"llvm.ctpop"``, ``"llvm.fma"``, a target's
    ``"llvm.x86.*"``/``"llvm.nvvm.*"``) returning ``dtype`` on ``args`` (TVM's signature; an
    old-TVM ``num_signature`` first operand is accepted and ignored). Overloaded names may be
    given without their type suffix: the operand and return types pick the overload. The CPU
    codegen checks the call in a child process first (LLVM aborts the process on some bad
    intrinsics), so a wrong name or signature is a CodegenError; the interpreter and GPU
    emulator run only a handful (`LLVM_EQUIVALENTS`)."""
    return Call("void" if dtype == "void" else dt.canonical(dtype), name,
                _llvm_args(name, args), extern=True)


def call_llvm_pure_intrin(dtype: str, name: str, *args: ExprLike) -> Expr:
    """`call_llvm_intrin` of an intrinsic without side effects (the same call here)."""
    return call_llvm_intrin(dtype, name, *args)


# LLVM intrinsics the interpreter and the GPU emulator evaluate, as the tecomp intrinsic with
# the same semantics (base name: the overload suffixes ".f32", ".v4i32"... removed)
LLVM_EQUIVALENTS = {
    "fabs": "fabs", "sqrt": "sqrt", "fma": "fma", "copysign": "copysign", "floor": "floor",
    "ceil": "ceil", "trunc": "trunc", "rint": "rint", "nearbyint": "nearbyint", "exp": "exp",
    "exp2": "exp2", "log": "log", "log2": "log2", "log10": "log10", "sin": "sin", "cos": "cos",
    "pow": "pow", "minnum": "fmin", "maxnum": "fmax", "ctpop": "popcount",
}
_OVERLOAD = re.compile(r"(v\d+|nxv\d+)?(i\d+|f16|bf16|f32|f64|f80|f128|p\d+)")


def llvm_equivalent(name: str) -> str | None:
    """The tecomp intrinsic computing the LLVM intrinsic ``name``, or None."""
    parts = name.split(".")[1:]
    while len(parts) > 1 and _OVERLOAD.fullmatch(parts[-1]):
        parts.pop()
    return LLVM_EQUIVALENTS.get(".".join(parts))


_TIR_NAMES = (*FLOAT_UNARY, *FLOAT_BINARY, "popcount", "clz", "isnan", "isinf", "isfinite",
              "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "shift_left",
              "shift_right", "fabs", "pow", "ldexp", "likely", "if_then_else", "fma")


def call_intrin(dtype: str, name: str, *args: ExprLike) -> Expr:
    """TVM's generic ``call_intrin(dtype, name, *args)``: ``"tir.exp"`` (or ``"exp"``) and
    the other tecomp intrinsics, ``"llvm.*"`` (`call_llvm_intrin`), ``"tir.call_extern"``/
    ``"tir.call_pure_extern"`` (a symbol name first). The result has ``dtype``."""
    if not isinstance(name, str):
        raise TecompError(f"call_intrin: the intrinsic name must be a string, got {name!r}")
    if name.startswith("llvm."):
        return call_llvm_intrin(dtype, name, *args)
    short = name[4:] if name.startswith("tir.") else name
    if short in ("call_extern", "call_pure_extern"):
        sym = args[0].value if isinstance(args[0], StringImm) else args[0] if args else None
        if not isinstance(sym, str):
            raise TecompError(f"call_intrin({name!r}): the first operand must be the symbol name")
        return call_extern(dtype, sym, *args[1:])
    if short in ("call_llvm_intrin", "call_llvm_pure_intrin") and args and isinstance(args[0], str):
        return call_llvm_intrin(dtype, args[0], *args[1:])
    if short not in _TIR_NAMES:
        raise TecompError(
            f"call_intrin: unknown intrinsic {name!r}; known: 'llvm.*' (an LLVM intrinsic), "
            f"'tir.call_extern', 'tir.call_pure_extern' and tir.{{{', '.join(sorted(set(_TIR_NAMES)))}}}")
    d = dt.canonical(dtype)
    ops = [to_expr(a) for a in args]
    if short == "fma":
        if len(ops) != 3:
            raise TecompError(f"call_intrin('tir.fma') takes 3 operands, got {len(ops)}")
        ops = [o if o.dtype == d else o.astype(d) for o in ops]
        return Call(d, "fma", tuple(ops))
    fn: Any = {"fabs": abs, "pow": power}.get(short) or globals()[short]
    r: Expr = fn(*ops)
    return r if r.dtype == d else r.astype(d)

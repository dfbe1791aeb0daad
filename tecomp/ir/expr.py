"""Expression nodes of the IR.

One frozen dataclass per node. Nodes compare and hash by identity (``eq=False``) because
``==``/``<`` on expressions *build* IR (``te.if_then_else(i == 0, ...)``); structural equality is
`tecomp.ir.structural_equal`. ``bool(expr)`` raises, so ``if a < b:`` on IR fails loudly instead
of silently taking a branch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

from ..errors import TecompError
from . import dtype as dt

if TYPE_CHECKING:
    from .buffer import Buffer

ExprLike = Union["Expr", int, float, bool]


class Expr:
    """Base of all expressions; carries ``dtype`` and the operator overloads."""

    __slots__ = ()
    dtype: str

    def __bool__(self) -> bool:
        raise TecompError(
            f"cannot use the IR expression {self} as a Python bool; use te.if_then_else, "
            "te.all/te.any, or compare with tecomp.ir.structural_equal"
        )

    # arithmetic -------------------------------------------------------------------------------
    def __add__(self, o: ExprLike) -> Expr:
        return binop(Add, self, o)

    def __radd__(self, o: ExprLike) -> Expr:
        return binop(Add, o, self)

    def __sub__(self, o: ExprLike) -> Expr:
        return binop(Sub, self, o)

    def __rsub__(self, o: ExprLike) -> Expr:
        return binop(Sub, o, self)

    def __mul__(self, o: ExprLike) -> Expr:
        return binop(Mul, self, o)

    def __rmul__(self, o: ExprLike) -> Expr:
        return binop(Mul, o, self)

    def __truediv__(self, o: ExprLike) -> Expr:
        _check_true_div(self, o)
        return binop(Div, self, o)

    def __rtruediv__(self, o: ExprLike) -> Expr:
        _check_true_div(o, self)
        return binop(Div, o, self)

    def __floordiv__(self, o: ExprLike) -> Expr:
        return binop(FloorDiv, self, o)

    def __rfloordiv__(self, o: ExprLike) -> Expr:
        return binop(FloorDiv, o, self)

    def __mod__(self, o: ExprLike) -> Expr:
        return binop(FloorMod, self, o)

    def __rmod__(self, o: ExprLike) -> Expr:
        return binop(FloorMod, o, self)

    def __neg__(self) -> Expr:
        return binop(Sub, const(0, self.dtype), self)

    # bits: logical on bools, bitwise on integers (TVM's operators); floats are refused
    def __invert__(self) -> Expr:
        return bitwise_not(self)

    def __and__(self, o: ExprLike) -> Expr:
        return bitwise("bitwise_and", self, o)

    def __rand__(self, o: ExprLike) -> Expr:
        return bitwise("bitwise_and", o, self)

    def __or__(self, o: ExprLike) -> Expr:
        return bitwise("bitwise_or", self, o)

    def __ror__(self, o: ExprLike) -> Expr:
        return bitwise("bitwise_or", o, self)

    def __xor__(self, o: ExprLike) -> Expr:
        return bitwise("bitwise_xor", self, o)

    def __rxor__(self, o: ExprLike) -> Expr:
        return bitwise("bitwise_xor", o, self)

    def __lshift__(self, o: ExprLike) -> Expr:
        return shift("shift_left", self, o)

    def __rlshift__(self, o: ExprLike) -> Expr:
        return shift("shift_left", o, self)

    def __rshift__(self, o: ExprLike) -> Expr:
        return shift("shift_right", self, o)

    def __rrshift__(self, o: ExprLike) -> Expr:
        return shift("shift_right", o, self)

    # comparisons build IR ----------------------------------------------------------------------
    def __lt__(self, o: ExprLike) -> Expr:
        return cmpop(LT, self, o)

    def __le__(self, o: ExprLike) -> Expr:
        return cmpop(LE, self, o)

    def __gt__(self, o: ExprLike) -> Expr:
        return cmpop(GT, self, o)

    def __ge__(self, o: ExprLike) -> Expr:
        return cmpop(GE, self, o)

    def __eq__(self, o: object) -> Expr:  # type: ignore[override]
        return cmpop(EQ, self, o)  # type: ignore[arg-type]

    def __ne__(self, o: object) -> Expr:  # type: ignore[override]
        return cmpop(NE, self, o)  # type: ignore[arg-type]

    __hash__ = object.__hash__

    def equal(self, o: ExprLike) -> Expr:
        """``self == o`` as an expression (TVM's spelling, e.g. ``tx.var.equal(0)``)."""
        return cmpop(EQ, self, o)

    def same_as(self, o: object) -> bool:
        """Whether ``o`` is this very node (TVM's reference equality, not structural)."""
        return self is o

    def astype(self, dtype: str) -> Expr:
        """Cast to ``dtype`` (no-op when the dtype already matches)."""
        d = dt.canonical(dtype)
        if dt.lanes(self.dtype) > 1:
            d = dt.with_lanes(d, dt.lanes(self.dtype))
        return self if d == self.dtype else Cast(d, self)

    def __str__(self) -> str:
        from .printer import expr_str

        return expr_str(self)

    __repr__ = __str__


# leaves -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class IntImm(Expr):
    value: int
    dtype: str = "int32"

    def __int__(self) -> int:  # a constant reads as a number (TVM's IntImm does too)
        return self.value


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class FloatImm(Expr):
    value: float
    dtype: str = "float32"

    def __float__(self) -> float:
        return self.value


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class StringImm(Expr):
    value: str
    dtype: str = "handle"


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Var(Expr):
    """A scalar variable; identity is the object, the name is only for printing."""

    name: str
    dtype: str = "int32"


# arithmetic and logic -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class BinaryOp(Expr):
    a: Expr
    b: Expr
    dtype: str = field(default="")

    def __post_init__(self) -> None:
        if not self.dtype:
            object.__setattr__(self, "dtype", self.a.dtype)


class Add(BinaryOp):
    __slots__ = ()


class Sub(BinaryOp):
    __slots__ = ()


class Mul(BinaryOp):
    __slots__ = ()


class Div(BinaryOp):
    """True division for floats; truncating (C) division for integers."""

    __slots__ = ()


class FloorDiv(BinaryOp):
    __slots__ = ()


class FloorMod(BinaryOp):
    __slots__ = ()


class Min(BinaryOp):
    __slots__ = ()


class Max(BinaryOp):
    __slots__ = ()


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class CmpOp(Expr):
    a: Expr
    b: Expr
    dtype: str = field(default="")

    def __post_init__(self) -> None:
        if not self.dtype:
            object.__setattr__(self, "dtype", dt.with_lanes("bool", dt.lanes(self.a.dtype)))


class EQ(CmpOp):
    __slots__ = ()


class NE(CmpOp):
    __slots__ = ()


class LT(CmpOp):
    __slots__ = ()


class LE(CmpOp):
    __slots__ = ()


class GT(CmpOp):
    __slots__ = ()


class GE(CmpOp):
    __slots__ = ()


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class And(Expr):
    a: Expr
    b: Expr
    dtype: str = field(default="")

    def __post_init__(self) -> None:
        if not self.dtype:
            object.__setattr__(self, "dtype", self.a.dtype)


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Or(Expr):
    a: Expr
    b: Expr
    dtype: str = field(default="")

    def __post_init__(self) -> None:
        if not self.dtype:
            object.__setattr__(self, "dtype", self.a.dtype)


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Not(Expr):
    a: Expr
    dtype: str = field(default="")

    def __post_init__(self) -> None:
        if not self.dtype:
            object.__setattr__(self, "dtype", self.a.dtype)


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Select(Expr):
    """``cond ? t : f`` where only the chosen side is evaluated (loads in the other are safe)."""

    cond: Expr
    t: Expr
    f: Expr
    dtype: str = field(default="")

    def __post_init__(self) -> None:
        if not self.dtype:
            object.__setattr__(self, "dtype", self.t.dtype)


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Cast(Expr):
    dtype: str
    value: Expr


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Call(Expr):
    """A pure intrinsic (``exp``, ``sqrt``...) or, with ``extern=True``, a C symbol."""

    dtype: str
    name: str
    args: tuple[Expr, ...]
    extern: bool = False


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Let(Expr):
    var: Var
    value: Expr
    body: Expr
    dtype: str = field(default="")

    def __post_init__(self) -> None:
        if not self.dtype:
            object.__setattr__(self, "dtype", self.body.dtype)


# vectors --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Ramp(Expr):
    """The vector ``[base, base+stride, ..., base+(lanes-1)*stride]``."""

    base: Expr
    stride: Expr
    lanes: int
    dtype: str = field(default="")

    def __post_init__(self) -> None:
        if not self.dtype:
            object.__setattr__(self, "dtype", dt.with_lanes(self.base.dtype, self.lanes))


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Broadcast(Expr):
    value: Expr
    lanes: int
    dtype: str = field(default="")

    def __post_init__(self) -> None:
        if not self.dtype:
            object.__setattr__(self, "dtype", dt.with_lanes(self.value.dtype, self.lanes))


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class VectorReduce(Expr):
    """Horizontal reduction of a vector to a scalar (``op`` is "add", "mul", "min" or "max")."""

    op: str
    value: Expr
    dtype: str = field(default="")

    def __post_init__(self) -> None:
        if not self.dtype:
            object.__setattr__(self, "dtype", dt.element(self.value.dtype))


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Shuffle(Expr):
    """Lanes picked from vectors: lane ``k`` is lane ``indices[k]`` of the vectors' lanes laid
    end to end (LLVM's ``shufflevector``, with any number of inputs). A transposed copy
    (`tecomp.passes.transpose_copy`) moves 8 x 8 blocks through registers with it."""

    vectors: tuple[Expr, ...]
    indices: tuple[int, ...]
    dtype: str = field(default="")

    def __post_init__(self) -> None:
        if not self.vectors or not self.indices:
            raise TecompError("Shuffle needs at least one vector and one index")
        elem = dt.element(self.vectors[0].dtype)
        if any(dt.element(v.dtype) != elem for v in self.vectors):
            raise TecompError(f"Shuffle of vectors of different types: {[v.dtype for v in self.vectors]}")
        total = sum(dt.lanes(v.dtype) for v in self.vectors)
        if any(not 0 <= i < total for i in self.indices):
            raise TecompError(f"Shuffle index out of range 0..{total - 1}: {self.indices}")
        if not self.dtype:
            object.__setattr__(self, "dtype", dt.with_lanes(elem, len(self.indices)))


# memory ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class BufferLoad(Expr):
    """Read ``buffer[indices]``; after flattening there is one index. ``predicate`` masks lanes."""

    buffer: Buffer
    indices: tuple[Expr, ...]
    dtype: str = field(default="")
    predicate: Expr | None = None

    def __post_init__(self) -> None:
        if not self.dtype:
            n = max((dt.lanes(i.dtype) for i in self.indices), default=1)
            object.__setattr__(self, "dtype", dt.with_lanes(self.buffer.dtype, n))


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class ProducerLoad(Expr):
    """Read of a te.Tensor at the declaration level (``A[i, k]`` inside te.compute)."""

    producer: Any  # te.Tensor; typed loosely to keep ir independent of te
    indices: tuple[Expr, ...]
    dtype: str = field(default="")

    def __post_init__(self) -> None:
        if not self.dtype:
            object.__setattr__(self, "dtype", self.producer.dtype)


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class Reduce(Expr):
    """A commutative reduction over ``axis`` (te level only; lowering turns it into a loop)."""

    combiner: Any  # te.CommReducer
    source: tuple[Expr, ...]
    axis: tuple[Any, ...]  # IterVars
    condition: Expr
    value_index: int
    init: tuple[Expr, ...] = ()
    dtype: str = field(default="")

    def __post_init__(self) -> None:
        if not self.dtype:
            object.__setattr__(self, "dtype", self.source[self.value_index].dtype)


# construction helpers -----------------------------------------------------------------------


def const(value: int | float | bool, dtype: str | None = None) -> Expr:
    """An immediate of ``dtype`` (inferred from the Python type when omitted)."""
    if dtype is None:
        if isinstance(value, bool):
            dtype = "bool"
        elif isinstance(value, int):
            dtype = "int32" if -(2**31) <= value < 2**31 else "int64"
        else:
            dtype = "float32"
    dtype = dt.canonical(dtype)
    n = dt.lanes(dtype)
    if n > 1:
        return Broadcast(const(value, dt.element(dtype)), n)
    if dt.is_float(dtype):
        return FloatImm(float(value), dtype)
    if dt.is_bool(dtype):
        return IntImm(int(bool(value)), dtype)
    return IntImm(int(value), dtype)


def to_expr(v: object, like: str | None = None) -> Expr:
    """Turn a Python scalar into an immediate; ``like`` gives the dtype of the other operand."""
    if isinstance(v, Expr):
        return v
    if hasattr(v, "as_expr"):
        return v.as_expr()  # type: ignore[no-any-return]  # IterVar, Tensor of rank 0
    if isinstance(v, (bool, int, float)) or type(v).__module__ == "numpy":
        pv = v.item() if hasattr(v, "item") else v  # numpy scalars
        if like is not None and not dt.is_bool(like):
            el = dt.element(like)
            if isinstance(pv, float) and not dt.is_float(el):
                return const(pv)
            if dt.is_int(el) and isinstance(pv, int) and not isinstance(pv, bool):
                import numpy as np

                info = np.iinfo(el)
                if not info.min <= pv <= info.max:  # would wrap silently; numpy 2 raises too
                    raise TecompError(f"the Python integer {pv} does not fit in {el}, the dtype "
                                      f"of the other operand; cast that operand first "
                                      f"(e.g. x.astype('int64'))")
            return const(pv, el)  # type: ignore[arg-type]
        return const(pv)  # type: ignore[arg-type]
    raise TecompError(f"cannot use {v!r} of type {type(v).__name__} in an expression")


def _rank(d: str) -> tuple[int, int]:
    e = dt.element(d)
    kind = 0 if e == "bool" else (2 if dt.is_float(e) else 1)
    return kind, dt.bits(e)


def promote(a: Expr, b: Expr) -> tuple[Expr, Expr]:
    """Implicit conversion of mismatched operands: float beats int, wider beats narrower."""
    if a.dtype == b.dtype:
        return a, b
    la, lb = dt.lanes(a.dtype), dt.lanes(b.dtype)
    if la != lb:
        if la == 1:
            a = Broadcast(a, lb)
        elif lb == 1:
            b = Broadcast(b, la)
        else:
            raise TecompError(f"lane mismatch between {a.dtype} and {b.dtype}")
        if a.dtype == b.dtype:
            return a, b
    target = a.dtype if _rank(a.dtype) >= _rank(b.dtype) else b.dtype
    if dt.is_half(a.dtype) and dt.is_half(b.dtype):  # float16 with bfloat16: neither holds
        target = dt.with_lanes("float32", dt.lanes(a.dtype))  # the other (as in ml_dtypes)
    return (a if a.dtype == target else Cast(target, a)), (b if b.dtype == target else Cast(target, b))


DIV_AMBIGUITY = (
    "TVM supports multiple types of integer divisions, please call div, indexdiv/indexmod, "
    "floordiv/floormod or truncdiv/truncmod directly to avoid ambiguity in the code.")


class DivisionAmbiguityError(TecompError, RuntimeError):
    """``/`` of two integer operands (TVM raises a RuntimeError there, hence the base)."""


def _signed_int_like(v: object) -> bool:
    """A Python int or a signed-integer expression: the operands whose ``/`` TVM calls
    ambiguous (for unsigned ones truncating and flooring agree)."""
    if isinstance(v, Expr):
        return dt.is_int(v.dtype) and not dt.is_uint(v.dtype)
    if hasattr(v, "as_expr"):  # IterVar, rank-0 Tensor
        return _signed_int_like(v.as_expr())
    if type(v).__module__ == "numpy":
        import numpy as np

        return isinstance(v, np.signedinteger)
    return isinstance(v, int)


def _check_true_div(a: ExprLike, b: ExprLike) -> None:
    """TVM's ``PrimExpr.__truediv__``: ``/`` of two integer operands is refused, since it
    could mean truncating (C) or flooring (Python) division; a float operand divides in
    float. The error names the operands and the functions to call instead."""
    if _signed_int_like(a) and _signed_int_like(b):
        raise DivisionAmbiguityError(
            f"{DIV_AMBIGUITY} Both operands of {a} / {b} are integers: te.truncdiv rounds "
            "toward zero (C), te.floordiv (or //) toward minus infinity (Python); cast one "
            "operand to a float type for a true division")


def binop(cls: type[BinaryOp], a: ExprLike, b: ExprLike) -> Expr:
    ea = to_expr(a, b.dtype if isinstance(b, Expr) else None)
    eb = to_expr(b, ea.dtype)
    ea, eb = promote(ea, eb)
    if dt.is_bool(ea.dtype) and cls not in (Min, Max):
        raise TecompError(
            f"arithmetic ({cls.__name__}) on bool values {ea} and {eb}: use & / | / ~ for logic, "
            "or cast first (x.astype('int32'))"
        )
    return cls(ea, eb)


def cmpop(cls: type[CmpOp], a: ExprLike, b: ExprLike) -> Expr:
    ea = to_expr(a, b.dtype if isinstance(b, Expr) else None)
    eb = to_expr(b, ea.dtype)
    ea, eb = promote(ea, eb)
    return cls(ea, eb)


def as_bool(e: Expr) -> Expr:
    return e if dt.is_bool(e.dtype) else NE(e, const(0, e.dtype))


def is_const_int(e: object, value: int | None = None) -> bool:
    return isinstance(e, IntImm) and (value is None or e.value == value)


def const_value(e: Expr) -> int | float | None:
    """The Python value of an immediate, or None."""
    if isinstance(e, (IntImm, FloatImm)):
        return e.value
    return None


# bitwise operations ---------------------------------------------------------------------------
# They are pure intrinsic Calls (named as TVM's builtins) on integers; on bools &, | and ^ are
# the logical And, Or and !=, which every backend already handles without a Call.

BITWISE_BINARY = ("bitwise_and", "bitwise_or", "bitwise_xor")
SHIFTS = ("shift_left", "shift_right")


def _int_operands(name: str, a: ExprLike, b: ExprLike, allow_bool: bool) -> tuple[Expr, Expr]:
    ea = to_expr(a, b.dtype if isinstance(b, Expr) else None)
    eb = to_expr(b, ea.dtype)
    for e in (ea, eb):
        if not (dt.is_int(e.dtype) or (allow_bool and dt.is_bool(e.dtype))):
            kinds = "integer or bool" if allow_bool else "integer"
            raise TypeError(f"{name} needs {kinds} operands, got {e} of type {e.dtype}")
    return promote(ea, eb)


def _fold_int(name: str, x: int, y: int, dtype: str) -> int:
    bits = dt.bits(dtype)
    mask = (1 << bits) - 1
    if name == "bitwise_and":
        r = x & y
    elif name == "bitwise_or":
        r = x | y
    elif name == "bitwise_xor":
        r = x ^ y
    elif name == "shift_left":
        r = x << y
    else:
        r = x >> y  # Python ints: arithmetic for negative (signed) values, logical otherwise
    r &= mask
    if not dt.is_uint(dtype) and r >> (bits - 1):
        r -= 1 << bits
    return r


def bitwise(name: str, a: ExprLike, b: ExprLike) -> Expr:
    """``bitwise_and``/``bitwise_or``/``bitwise_xor`` of ints (logical And/Or/!= on bools)."""
    ea, eb = _int_operands(name, a, b, allow_bool=True)
    if dt.is_bool(ea.dtype):
        if name == "bitwise_and":
            return And(ea, eb)
        return Or(ea, eb) if name == "bitwise_or" else NE(ea, eb)
    if isinstance(ea, IntImm) and isinstance(eb, IntImm):  # folded as TVM does
        return IntImm(_fold_int(name, ea.value, eb.value, ea.dtype), ea.dtype)
    return Call(ea.dtype, name, (ea, eb))


def bitwise_not(a: ExprLike) -> Expr:
    """``~a``: every bit flipped for ints, logical not for bools."""
    e = to_expr(a)
    if dt.is_bool(e.dtype):
        return Not(e)
    if not dt.is_int(e.dtype):
        raise TypeError(f"bitwise_not (~) needs an integer or bool operand, got {e} of type "
                        f"{e.dtype}")
    if isinstance(e, IntImm):
        return IntImm(_fold_int("bitwise_xor", e.value, -1, e.dtype), e.dtype)
    return Call(e.dtype, "bitwise_not", (e,))


def shift(name: str, a: ExprLike, b: ExprLike) -> Expr:
    """``shift_left``/``shift_right`` of integers: arithmetic right shift for signed types,
    logical for unsigned (as C and TVM). A constant amount must lie in [0, bits) (TVM's check);
    a computed amount is taken modulo the bit width (x86's and Java's rule; C and TVM leave it
    undefined, and LLVM would make it poison)."""
    ea, eb = _int_operands(name, a, b, allow_bool=False)
    bits = dt.bits(ea.dtype)
    amount = eb.value if isinstance(eb, IntImm) else None
    if isinstance(eb, Broadcast) and isinstance(eb.value, IntImm):
        amount = eb.value.value
    if amount is not None:
        if not 0 <= amount < bits:
            raise TecompError(f"{name} by {amount}: the shift amount must be in [0, {bits}) "
                              f"for {ea.dtype}")
        if amount == 0:
            return ea
        if isinstance(ea, IntImm):
            return IntImm(_fold_int(name, ea.value, amount, ea.dtype), ea.dtype)
    return Call(ea.dtype, name, (ea, eb))

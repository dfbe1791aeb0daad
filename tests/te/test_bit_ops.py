"""Integers and bits as TVM spells them: popcount, clz, bitwise_and/or/xor/not,
shift_left/right, the ``& | ^ ~ << >>`` operators (with reflected forms) and reinterpret.

Kernels run JIT-compiled (scalar and vectorized) and in the interpreter against numpy, for
signed and unsigned types of every width.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tecomp as tc
from tecomp import te
from tecomp.errors import TecompError
from tecomp.ir.expr import NE, And, Call, IntImm, Not, Or
from tecomp.runtime import interp

N = 64
DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def _data(dtype: str, seed: int) -> np.ndarray:
    info = np.iinfo(dtype)
    rng = np.random.default_rng(seed)
    a = rng.integers(info.min, info.max, N, dtype=dtype, endpoint=True)
    a[:5] = [0, info.max, info.min, 1, info.max // 3]
    return a


def _popcount(a: np.ndarray) -> np.ndarray:
    return np.bitwise_count(a.view(f"uint{a.dtype.itemsize * 8}")).astype(a.dtype)


def _clz(a: np.ndarray) -> np.ndarray:
    bits = a.dtype.itemsize * 8
    u = a.view(f"uint{bits}")
    return np.array([bits - int(x).bit_length() for x in u], "int32")


def _kernels(dtype: str) -> dict[str, tuple[Any, Any]]:
    """name -> (te body of (A[i], B[i], S[i]), numpy reference of (a, b, s))."""
    bits = np.dtype(dtype).itemsize * 8
    return {
        "and": (lambda x, y, s: x & y, lambda a, b, s: a & b),
        "or": (lambda x, y, s: x | y, lambda a, b, s: a | b),
        "xor": (lambda x, y, s: te.bitwise_xor(x, y), lambda a, b, s: a ^ b),
        "not": (lambda x, y, s: ~x, lambda a, b, s: ~a),
        "rand": (lambda x, y, s: 5 & x, lambda a, b, s: a & np.array(5, dtype)),
        "shl": (lambda x, y, s: x << s, lambda a, b, s: a << s),
        "shr": (lambda x, y, s: te.shift_right(x, s), lambda a, b, s: a >> s),
        "shl3": (lambda x, y, s: x << 3, lambda a, b, s: a << np.array(3, dtype)),
        "shr3": (lambda x, y, s: x >> 3, lambda a, b, s: a >> np.array(3, dtype)),
        # amounts beyond the width are taken modulo it (defined here; TVM leaves it undefined)
        "shl_wide": (lambda x, y, s: x << (s + bits), lambda a, b, s: a << s),
        "popcount": (lambda x, y, s: te.popcount(x), lambda a, b, s: _popcount(a)),
        "clz": (lambda x, y, s: te.clz(x), lambda a, b, s: _clz(a)),
    }


@pytest.mark.parametrize("dtype", DTYPES)
def test_bit_operations_match_numpy(dtype: str) -> None:
    bits = np.dtype(dtype).itemsize * 8
    a, b = _data(dtype, 1), _data(dtype, 2)
    s = (np.random.default_rng(3).integers(0, bits, N)).astype(dtype)
    A, B, S = (te.placeholder((N,), dtype, name=n) for n in "ABS")
    kernels = _kernels(dtype)
    for lanes in (1, 16):
        triples: list[Any] = []
        lowered: dict[str, Any] = {}
        outs: dict[str, Any] = {}
        for name, (body, _) in kernels.items():
            C = te.compute((N,), (lambda f: lambda i: f(A[i], B[i], S[i]))(body), name="C")
            sch = te.create_schedule(C.op)
            if lanes > 1:
                _, xi = sch[C].split(C.op.axis[0], factor=lanes)
                sch[C].vectorize(xi)
            text = str(C.op.body)
            ins = [t for t in (A, B, S) if f"{t.name}[" in text]  # unused arguments are refused
            triples.append((sch, [*ins, C], name))
            lowered[name] = tc.lower(sch, [*ins, C], name=name)
            outs[name] = (C.dtype, [arr for t, arr in zip((A, B, S), (a, b, s)) if t in ins])
        mod = tc.build(triples)
        for name, (_, ref) in kernels.items():
            odt, arrays = outs[name]
            with np.errstate(over="ignore"):
                want = np.asarray(ref(a, b, s)).astype(odt)
            got = np.zeros(N, odt)
            mod[name](*arrays, got)
            np.testing.assert_array_equal(got, want, err_msg=f"{name} {dtype} lanes={lanes}")
            if lanes == 1 or dtype in ("int32", "uint8"):
                ref_out = np.zeros(N, odt)
                interp.run(lowered[name], *arrays, ref_out)
                np.testing.assert_array_equal(ref_out, want, err_msg=f"{name} (interpreter)")


@pytest.mark.parametrize(("src", "dst"), [("float32", "int32"), ("float32", "uint32"),
                                          ("float64", "int64"), ("int32", "float32"),
                                          ("uint64", "float64")])
def test_reinterpret_keeps_the_bits(src: str, dst: str) -> None:
    if src.startswith("float"):
        a = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1.5, 3.0] * 8, src)
    else:
        a = _data(src, 4)
    A = te.placeholder((N,), src, name="A")
    C = te.compute((N,), lambda i: te.reinterpret(dst, A[i]), name="C")
    want = a.view(dst)
    for lanes in (1, 8):
        sch = te.create_schedule(C.op)
        if lanes > 1:
            _, xi = sch[C].split(C.op.axis[0], factor=lanes)
            sch[C].vectorize(xi)
        got = np.zeros(N, dst)
        tc.build(sch, [A, C])(a, got)
        np.testing.assert_array_equal(got.view(src), a)  # bit for bit, NaN payloads too
        ref = np.zeros(N, dst)
        interp.run(tc.lower(sch, [A, C]), a, ref)
        np.testing.assert_array_equal(ref.view(src), want.view(src))


def test_float_bit_tricks_through_reinterpret() -> None:
    """The classic TVM idiom: clear the sign bit of a float through its int32 bits."""
    A = te.placeholder((N,), "float32", name="A")
    C = te.compute((N,), lambda i: te.reinterpret(
        "float32", te.reinterpret("int32", A[i]) & 0x7FFFFFFF), name="C")
    a = np.random.default_rng(0).standard_normal(N).astype("float32")
    a[:3] = [-0.0, -np.inf, np.nan]
    got = np.zeros(N, "float32")
    tc.build(te.create_schedule(C.op), [A, C])(a, got)
    np.testing.assert_array_equal(got, np.abs(a))
    assert not np.signbit(got).any()


def test_operators_build_tvm_calls_and_logic_on_bools() -> None:
    x, y = te.var("x"), te.var("y")
    for e, name in ((x & y, "bitwise_and"), (x | y, "bitwise_or"), (x ^ y, "bitwise_xor"),
                    (~x, "bitwise_not"), (x << y, "shift_left"), (x >> y, "shift_right"),
                    (3 & x, "bitwise_and"), (3 | x, "bitwise_or"), (3 ^ x, "bitwise_xor"),
                    (1 << x, "shift_left"), (256 >> x, "shift_right")):
        assert isinstance(e, Call) and e.name == name and e.dtype == "int32", e
    assert str(1 << x) == "shift_left(1, x)"  # reflected forms keep the operand order
    c, d = x > 0, y > 0
    assert isinstance(c & d, And) and isinstance(c | d, Or)
    assert isinstance(c ^ d, NE) and isinstance(~c, Not)
    i = te.reduce_axis((0, 4), name="i")  # IterVars take the operators too
    assert isinstance(i & 1, Call) and isinstance(1 << i, Call)
    u = te.var("u", "uint8")
    assert (u & 1).dtype == "uint8" and te.popcount(u).dtype == "uint8"
    assert te.clz(te.var("w", "int64")).dtype == "int32"


@settings(max_examples=200, deadline=None, derandomize=True)
@given(a=st.integers(-2**31, 2**31 - 1), b=st.integers(-2**31, 2**31 - 1),
       k=st.integers(0, 31))
def test_constants_fold_with_c_semantics(a: int, b: int, k: int) -> None:
    def val(e: Any) -> int:
        assert isinstance(e, IntImm), e
        return e.value

    i32 = np.int32
    assert val(tc.const(a) & b) == int(i32(a) & i32(b))
    assert val(tc.const(a) | b) == int(i32(a) | i32(b))
    assert val(tc.const(a) ^ b) == int(i32(a) ^ i32(b))
    assert val(~tc.const(a)) == int(~i32(a))
    assert val(tc.const(a) >> k) == int(i32(a) >> i32(k))
    assert val(tc.const(a) << k) == int((np.uint32(a & 0xFFFFFFFF) << np.uint32(k)).view(i32))
    assert val(tc.const(a & 0xFFFFFFFF, "uint32") >> k) == (a & 0xFFFFFFFF) >> k  # logical


def test_bad_operands_name_what_is_wrong() -> None:
    f, x = te.var("f", "float32"), te.var("x")
    with pytest.raises(TypeError, match="popcount needs an integer operand.*float32"):
        te.popcount(f)
    with pytest.raises(TypeError, match="clz needs an integer operand.*bool"):
        te.clz(x > 0)
    with pytest.raises(TypeError, match="shift_left needs integer operands.*float32"):
        _ = f << 1
    with pytest.raises(TypeError, match="shift_right needs integer operands.*float32"):
        _ = x >> f
    with pytest.raises(TypeError, match="bitwise_and needs integer or bool operands.*float32"):
        _ = x & f
    with pytest.raises(TypeError, match="bitwise_not.*float32"):
        _ = ~f
    with pytest.raises(TecompError, match=r"shift amount must be in \[0, 32\)"):
        _ = x << 32
    with pytest.raises(TecompError, match=r"shift amount must be in \[0, 8\)"):
        _ = te.var("b", "int8") >> -1
    with pytest.raises(TypeError, match="same bit width.*float32.*int64"):
        te.reinterpret("int64", f)
    with pytest.raises(TypeError, match="integer and float dtypes.*bool"):
        te.reinterpret("bool", te.var("c", "int8"))
    assert te.reinterpret("float32", f) is f

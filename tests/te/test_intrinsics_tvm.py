"""TVM's math intrinsics and expression helpers: exp10, log1p, tan, sinh, cosh, asin, acos,
atan, asinh, acosh, atanh, atan2, hypot, copysign, nextafter, fmod, ldexp, nearbyint, isnan,
isfinite, isinf, infinity, likely; Tensor.__call__, Expr.equal/astype/same_as, te.select.

Results are compared with numpy (or float64/longdouble references rounded once) on arrays
holding the edge values (NaN, +-inf, +-0, subnormals, the largest finite values) plus random
ones, JIT-compiled scalar and vectorized and in the interpreter, float32 and float64:
NaN positions and the sign of zeros and infinities must agree exactly, other values to a few
ulp. Also: the printer, the serializer (tuning workers get the DAG as JSON) and structural
equality of the new nodes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.ir.expr import Call, FloatImm, IntImm, Select
from tecomp.ir.structural import structural_equal, structural_hash
from tecomp.runtime import interp
from tecomp.te.serialize import dag_from_json, dag_to_json

Ref = Callable[..., np.ndarray]


def _edges(dtype: str) -> np.ndarray:
    fi = np.finfo(dtype)
    tiny = float(fi.smallest_subnormal)
    vals = [np.nan, np.inf, -np.inf, 0.0, -0.0, tiny, -tiny, tiny * 1000, float(fi.tiny),
            -float(fi.tiny), float(fi.max), -float(fi.max), 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5,
            0.9999, -0.9999, 1.0001, 10.0, -10.0, 88.0, -88.0, 700.0, 1e-7, 3.14159, 100.5]
    with np.errstate(over="ignore"):
        return np.array(vals, dtype)


def _inputs(dtype: str, n: int = 128, seed: int = 0) -> np.ndarray:
    e = _edges(dtype)
    rng = np.random.default_rng(seed)
    rest = rng.standard_normal(n - e.size) * rng.choice([0.01, 1.0, 4.0, 30.0], n - e.size)
    return np.concatenate([e, rest.astype(dtype)])


def _wide(fn: Callable[..., Any], dtype: str) -> Ref:
    """A reference evaluated in a wider type and rounded once to ``dtype``."""
    wide = np.float64 if dtype == "float32" else np.longdouble

    def ref(*xs: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(fn(*(x.astype(wide) for x in xs))).astype(dtype)

    return ref


UNARY: dict[str, Callable[[str], Ref]] = {
    "exp10": lambda d: _wide(lambda x: np.power(x.dtype.type(10), x), d),
    "log1p": lambda d: _wide(np.log1p, d),
    "tan": lambda d: _wide(np.tan, d),
    "sinh": lambda d: _wide(np.sinh, d),
    "cosh": lambda d: _wide(np.cosh, d),
    "asin": lambda d: _wide(np.arcsin, d),
    "acos": lambda d: _wide(np.arccos, d),
    "atan": lambda d: _wide(np.arctan, d),
    "asinh": lambda d: _wide(np.arcsinh, d),
    "acosh": lambda d: _wide(np.arccosh, d),
    "atanh": lambda d: _wide(np.arctanh, d),
    "nearbyint": lambda d: _wide(np.rint, d),
}
BINARY: dict[str, Callable[[str], Ref]] = {
    "atan2": lambda d: _wide(np.arctan2, d),
    "hypot": lambda d: _wide(np.hypot, d),
    "copysign": lambda d: lambda x, y: np.copysign(x, y),
    "nextafter": lambda d: lambda x, y: np.nextafter(x, y),
    "fmod": lambda d: lambda x, y: np.fmod(x, y),
}
# ulps allowed against the rounded wide reference (libm and the float64-evaluated float32
# kernels are within 1-2; float64 tan of huge arguments and acos near 1 get a little more)
ULPS = {"float32": 2, "float64": 4}


def _ulp_diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in units in the last place (via the ordered integer representation)."""
    it = np.int32 if a.dtype == np.float32 else np.int64
    # in Python integers: a float64 holds int64 bit patterns only to ~1024, so a 1-ulp
    # difference of float64 values would read as 0 or 1024
    ia, ib = a.view(it).astype(object), b.view(it).astype(object)
    top = int(np.iinfo(it).min)
    ia = np.where(ia < 0, top - ia, ia)
    ib = np.where(ib < 0, top - ib, ib)
    return np.abs(ia - ib).astype(np.float64)


def assert_close(got: np.ndarray, want: np.ndarray, ulps: int, what: str) -> None:
    nan = np.isnan(want)
    assert (np.isnan(got) == nan).all(), f"{what}: NaN at {np.nonzero(np.isnan(got) != nan)}"
    special = ~nan & ((want == 0) | np.isinf(want))
    bad = special & ((got != want) | (np.signbit(got) != np.signbit(want)))
    assert not bad.any(), f"{what}: got {got[bad]} want {want[bad]} (zeros/infinities)"
    d = _ulp_diff(got[~nan], want[~nan])
    assert d.max(initial=0) <= ulps, f"{what}: {d.max()} ulp, at {got[~nan][d.argmax()]} " \
        f"want {want[~nan][d.argmax()]}"


def _module(bodies: dict[str, Callable[..., Any]], placeholders: list[te.Tensor], n: int,
            lanes: int) -> tuple[Any, dict[str, Any]]:
    triples, lowered = [], {}
    for name, body in bodies.items():
        C = te.compute((n,), body, name="C")
        s = te.create_schedule(C.op)
        if lanes > 1:
            _, xi = s[C].split(C.op.axis[0], factor=lanes)
            s[C].vectorize(xi)
        # kernels named k_<fn>: a kernel named like a libm symbol (hypot) would clash with it
        triples.append((s, [*placeholders, C], f"k_{name}"))
        lowered[name] = tc.lower(s, [*placeholders, C], name=f"k_{name}")
    mod = tc.build(triples)
    return (lambda name: mod[f"k_{name}"]), lowered


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_unary_math_at_the_edges(dtype: str) -> None:
    x = _inputs(dtype)
    n = x.size
    A = te.placeholder((n,), dtype, name="A")
    bodies = {name: (lambda f: lambda i: f(A[i]))(getattr(te, name)) for name in UNARY}
    for lanes in (1, 8):
        mod, lowered = _module(bodies, [A], n, lanes)
        for name, mk in UNARY.items():
            want = mk(dtype)(x)
            got = np.zeros(n, dtype)
            mod(name)(x, got)
            assert_close(got, want, ULPS[dtype], f"{name} {dtype} lanes={lanes}")
            if lanes == 1:
                ref = np.zeros(n, dtype)
                interp.run(lowered[name], x, ref)
                assert_close(ref, want, ULPS[dtype], f"{name} {dtype} (interpreter)")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_binary_math_at_the_edges(dtype: str) -> None:
    e = _edges(dtype)
    rng = np.random.default_rng(1)
    x = np.concatenate([np.repeat(e, e.size), (rng.standard_normal(96) * 20).astype(dtype)])
    y = np.concatenate([np.tile(e, e.size), (rng.standard_normal(96) * 3).astype(dtype)])
    n = x.size
    A, B = te.placeholder((n,), dtype, name="A"), te.placeholder((n,), dtype, name="B")
    bodies = {name: (lambda f: lambda i: f(A[i], B[i]))(getattr(te, name)) for name in BINARY}
    for lanes in (1, 4):
        mod, lowered = _module(bodies, [A, B], n, lanes)
        for name, mk in BINARY.items():
            with np.errstate(all="ignore"):
                want = mk(dtype)(x, y)
            got = np.zeros(n, dtype)
            mod(name)(x, y, got)
            exact = 0 if name in ("copysign", "nextafter", "fmod") else ULPS[dtype]
            assert_close(got, want, exact, f"{name} {dtype} lanes={lanes}")
            if lanes == 1:
                ref = np.zeros(n, dtype)
                interp.run(lowered[name], x, y, ref)
                assert_close(ref, want, exact, f"{name} {dtype} (interpreter)")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ldexp_rounds_once_into_subnormals_and_overflows(dtype: str) -> None:
    x = _inputs(dtype, n=64)
    k = np.random.default_rng(2).integers(-1200, 1200, x.size).astype("int32")
    k[:8] = [0, 1, -1, -149, -1074, 127, 1023, 2000]
    A, K = te.placeholder((x.size,), dtype, name="A"), te.placeholder((x.size,), "int32", name="K")
    with np.errstate(over="ignore"):
        want = np.ldexp(x, k)
    for lanes in (1, 8):
        mod, lowered = _module({"ld": lambda i: te.ldexp(A[i], K[i])}, [A, K], x.size, lanes)
        got = np.zeros(x.size, dtype)
        mod("ld")(x, k, got)
        assert_close(got, want, 0, f"ldexp {dtype} lanes={lanes}")
        ref = np.zeros(x.size, dtype)
        interp.run(lowered["ld"], x, k, ref)
        assert_close(ref, want, 0, f"ldexp {dtype} (interpreter)")
    big = te.ldexp(A[0], te.var("e", "int64"))  # a wide exponent is clamped, then narrowed
    assert isinstance(big, Call) and big.args[1].dtype == "int32"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_predicates_and_infinity(dtype: str) -> None:
    x = _inputs(dtype, n=64)
    A = te.placeholder((x.size,), dtype, name="A")
    bodies = {
        "isnan": lambda i: te.isnan(A[i]), "isinf": lambda i: te.isinf(A[i]),
        "isfinite": lambda i: te.isfinite(A[i]),
        "inf": lambda i: te.if_then_else(A[i] < te.infinity(dtype), 1, 0),
    }
    want = {"isnan": np.isnan(x), "isinf": np.isinf(x), "isfinite": np.isfinite(x),
            "inf": (x < np.inf).astype("int32")}
    for lanes in (1, 8):
        mod, _ = _module(bodies, [A], x.size, lanes)
        for name, w in want.items():
            got = np.zeros(x.size, w.dtype)
            mod(name)(x, got)
            np.testing.assert_array_equal(got, w, err_msg=f"{name} lanes={lanes}")
    i = te.var("i")
    assert isinstance(te.isnan(i), IntImm) and te.isnan(i).value == 0  # ints: folded
    assert te.isfinite(i).value == 1 and te.isnan(i).dtype == "bool"
    inf = te.infinity(dtype)
    assert isinstance(inf, FloatImm) and inf.value == np.inf and inf.dtype == dtype
    with pytest.raises(TypeError, match="infinity is only defined for float dtypes, not int32"):
        te.infinity("int32")


def test_float32_kernels_stay_vector_code() -> None:
    """The hyperbolic functions, exp10, hypot, nextafter and ldexp are vector code for float32
    (evaluated in float64 or on the bits), not one libm call per lane."""
    n = 64
    A, B = te.placeholder((n,), "float32", name="A"), te.placeholder((n,), "float32", name="B")
    K = te.placeholder((n,), "int32", name="K")
    C = te.compute((n,), lambda i: te.sinh(A[i]) + te.cosh(A[i]) + te.exp10(A[i])
                   + te.asinh(A[i]) + te.acosh(A[i]) + te.atanh(A[i]) + te.hypot(A[i], B[i])
                   + te.nextafter(A[i], B[i]) + te.ldexp(A[i], K[i]), name="C")
    s = te.create_schedule(C.op)
    _, xi = s[C].split(C.op.axis[0], factor=8)
    s[C].vectorize(xi)
    ll = tc.build(s, [A, B, K, C]).get_source("ll")
    calls = {c for c in ("sinh", "cosh", "exp10", "asinh", "acosh", "atanh", "hypot",
                         "nextafter", "ldexp") if f"@{c}f(" in ll or f"@{c}(" in ll}
    assert not calls, f"scalar libm calls left: {calls}"


def test_likely_and_nearbyint_ties_to_even() -> None:
    n = 8
    A = te.placeholder((n,), "float32", name="A")
    C = te.compute((n,), lambda i: te.if_then_else(te.likely(A[i] > 0), te.nearbyint(A[i]),
                                                   -A[i]), name="C")
    a = np.array([0.5, 1.5, 2.5, -2.5, 3.5, 1e-40, 7.49, 0.0], "float32")
    got = np.zeros(n, "float32")
    tc.build(te.create_schedule(C.op), [A, C])(a, got)
    np.testing.assert_array_equal(got, np.where(a > 0, np.rint(a), -a))
    c = te.likely(te.var("i") > 0)
    assert isinstance(c, Call) and c.name == "likely" and c.dtype == "bool"
    t = tc.const(True)
    assert te.likely(t) is t


def test_integer_arguments_become_float32_as_for_exp() -> None:
    i = te.var("i")
    assert te.sinh(i).dtype == "float32" and te.atan2(i, 2).dtype == "float32"
    assert te.hypot(te.var("d", "float64"), 1).dtype == "float64"
    with pytest.raises(TypeError, match="ldexp needs an integer exponent.*float32"):
        te.ldexp(1.0, te.var("f", "float32"))


def test_tensor_call_equal_astype_same_as_select() -> None:
    n = 6
    A = te.placeholder((n, 2), "float32", name="A")
    B = te.compute((n, 2), lambda *i: A(*i) * 2, name="B")  # A(*i) is A[i]
    C = te.compute((n,), lambda i: te.select(B(i, 0).equal(B[i, 1]), 1.0, B(i, 1)), name="C")
    D = te.compute((n,), lambda i: te.if_then_else(i >= 1, C[i - 1], 0.0).astype("float64"),
                   name="D")  # lazy: C[-1] is never read
    s = te.create_schedule(D.op)
    a = np.arange(2 * n, dtype="float32").reshape(n, 2)
    a[2] = [5, 5]
    got = np.zeros(n, "float64")
    tc.build(s, [A, D])(a, got)
    c = np.where(a[:, 0] == a[:, 1], 1.0, a[:, 1] * 2)
    np.testing.assert_array_equal(got, np.concatenate([[0.0], c[:-1]]))
    x = te.var("x")
    e = x + 1
    assert e.same_as(e) and not e.same_as(x + 1)
    assert structural_equal(e, x + 1)
    assert isinstance(te.select(x > 0, x, 0), Select)
    assert te.if_then_else(True, x, 0) is x  # a constant condition picks its side (as TVM)
    assert tc.tir.Select is not None and str(tc.tir.Select(x > 0, 1, 2)) == "select(x > 0, 1, 2)"


def test_print_serialize_and_structural_equality_of_new_nodes() -> None:
    n = 8
    A = te.placeholder((n,), "float32", name="A")
    Iv = te.placeholder((n,), "int32", name="I")
    C = te.compute((n,), lambda i: te.copysign(te.sinh(A[i]), -0.0) + te.nextafter(A[i], 0.0)
                   + te.ldexp(A[i], Iv[i] & 7) + te.reinterpret("float32", Iv[i] >> 1)
                   + (te.popcount(Iv[i]) + te.clz(Iv[i]) + te.truncmod(Iv[i], 3)).astype("float32")
                   + te.if_then_else(te.isnan(A[i]), te.infinity("float32"), 0.0), name="C")
    text = str(C.op.body[0])
    for word in ("copysign", "sinh", "-0.0f", "nextafter", "ldexp", "bitwise_and",
                 "reinterpret", "shift_right", "popcount", "clz", "isnan", "inff"):
        assert word in text, (word, text)
    A2, I2, C2 = dag_from_json(json.loads(json.dumps(dag_to_json([A, Iv, C]))))
    assert str(C2.op.body[0]) == text
    rng = np.random.default_rng(0)
    a = rng.standard_normal(n).astype("float32")
    a[0] = np.nan
    iv = rng.integers(-1000, 1000, n).astype("int32")
    outs = []
    for args in ([A, Iv, C], [A2, I2, C2]):
        out = np.zeros(n, "float32")
        tc.build(te.create_schedule(args[2].op), args)(a, iv, out)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    # -0.0 and 0.0 are different constants; every NaN is the same one
    pz, nz = FloatImm(0.0), FloatImm(-0.0)
    assert not structural_equal(pz, nz)
    assert structural_equal(FloatImm(float("nan")), FloatImm(float("nan")))
    assert structural_hash(FloatImm(float("nan"))) == structural_hash(FloatImm(float("nan")))
    x = te.var("x", "float32")
    assert not structural_equal(te.copysign(x, 0.0), te.copysign(x, -0.0))
    assert structural_equal(te.popcount(te.var("i") & 3), te.popcount(te.var("i") & 3)) is False
    i = te.var("i")
    assert structural_equal(te.popcount(i & 3), te.popcount(i & 3))
    assert not structural_equal(i << 1, i >> 1)


def test_simplifier_keeps_negative_zero() -> None:
    """copysign(x, -0.0) must not become copysign(x, 0.0) by interning equal-looking zeros."""
    n = 4
    A = te.placeholder((n,), "float32", name="A")
    C = te.compute((n,), lambda i: te.copysign(A[i], 0.0) + te.copysign(A[i], -0.0) * 3.0,
                   name="C")
    a = np.array([1.0, -2.0, 0.0, 5.0], "float32")
    got = np.zeros(n, "float32")
    tc.build(te.create_schedule(C.op), [A, C])(a, got)
    np.testing.assert_array_equal(got, np.abs(a) - 3.0 * np.abs(a))

"""float16 and bfloat16 end to end on the CPU: 16-bit storage, float32 arithmetic rounded once
when stored or cast (docs/design.md, "16-bit floats"), exact conversions on the hardware (F16C)
and software paths, numpy float16 / ml_dtypes.bfloat16 / uint16 arrays, and the interpreter
agreeing bit for bit."""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.arith.simplify import simplify
from tecomp.ir import dtype as dt
from tecomp.ir.expr import Cast, FloatImm
from tecomp.runtime import interp

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

HALVES = ["float16", "bfloat16"]
NP = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
# the host (F16C where the CPU has it) and a CPU without F16C (the software conversions)
TARGETS = ["llvm", "llvm -mcpu=x86-64"]


def bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).view(np.uint16)


def same(got: np.ndarray, want: np.ndarray) -> None:
    """Bitwise equal, except that any NaN matches any NaN (payloads are the converter's)."""
    g, w = np.asarray(got), np.asarray(want)
    gn, wn = np.isnan(g.astype(np.float32)), np.isnan(w.astype(np.float32))
    assert (gn == wn).all(), (g[gn != wn], w[gn != wn])
    ok = gn | (bits(g) == bits(w))
    assert ok.all(), (g[~ok], w[~ok])


def edge_f32() -> np.ndarray:
    """float32 values on the edges of float16/bfloat16 rounding."""
    f16 = [0.0, -0.0, 1.0, 65504.0, 65519.99, 65520.0, 65536.0, 6.1035156e-05, 6.0e-08,
           5.96e-08, 2.98e-08, 2.9802322e-08, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11,
           2049.0, 2051.0, -2049.0, 3.0517578e-05, 1e-10, 1e30, -1e30]
    bf = [1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 3.3895314e38, 3.4028235e38, 1e-40, 9.2e-41,
          -1.0e-45, 1.17549435e-38, 256.5, 257.0, 259.0]
    special = [np.inf, -np.inf, np.nan, -np.nan]
    rng = np.random.default_rng(0)
    rand = rng.standard_normal(200) * 10.0 ** rng.integers(-9, 6, 200)
    vals = np.array(f16 + bf + special + rand.tolist(), np.float64)
    return np.concatenate([vals, -vals]).astype(np.float32)


def ref_round(x: np.ndarray, dtype: str) -> np.ndarray:
    """numpy's / ml_dtypes' own conversion, the reference."""
    return np.asarray(x).astype(NP[dtype])


def build(s: te.Schedule, args: list[te.Tensor], target: str) -> Callable[..., None]:
    return tc.build(s, args, target=target)  # type: ignore[no-any-return]


def unary_kernel(src: str, dst: str, n: int, vectorize: bool,
                 fn: Callable[[te.Tensor, te.Var], object] | None = None
                 ) -> tuple[te.Schedule, list[te.Tensor]]:
    A = te.placeholder((n,), src, name="A")
    B = te.compute((n,), fn and (lambda i: fn(A, i)) or (lambda i: A[i].astype(dst)), name="B")
    s = te.create_schedule(B.op)
    if vectorize:
        _, xi = s[B].split(B.op.axis[0], factor=8)
        s[B].vectorize(xi)
    return s, [A, B]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize("dst", HALVES)
def test_round_float32_to_half_edges(dst: str, vectorize: bool, target: str) -> None:
    a = edge_f32()
    n = len(a) - len(a) % 8
    a = a[:n]
    s, args = unary_kernel("float32", dst, n, vectorize)
    out = np.zeros(n, NP[dst])
    build(s, args, target)(a, out)
    same(out, ref_round(a, dst))
    # the interpreter (the reference semantics) agrees, and so does constant folding
    ref = np.zeros(n, NP[dst])
    interp.run(tc.lower(s, args), a, ref)
    same(ref, out)
    folded = np.array([simplify(Cast(dst, FloatImm(float(v), "float32"))).value  # type: ignore[attr-defined]
                       for v in a], np.float64)
    same(dt.round_to(folded, dst).astype(NP[dst]), out)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize("dst", HALVES)
def test_round_float64_and_ints_to_half(dst: str, vectorize: bool, target: str) -> None:
    # float64 values next to float16/bfloat16 ties: a float32 detour would round twice
    base = [1.0 + 2.0 ** -11 + 2.0 ** -40, 1.0 + 2.0 ** -8 + 2.0 ** -40, 1.0 + 2.0 ** -8 - 2.0 ** -40,
            65520.0 - 2.0 ** -30, 1e300, -1e-300, 2.0 ** -24 * 1.5000001, np.inf, np.nan, -0.0,
            0.1, 1 / 3, 257.0 + 2.0 ** -30, 3.3961776e38 * (1 - 2.0 ** -40)]
    a = np.array((base + [-v for v in base]) * 2, np.float64)[:32]
    s, args = unary_kernel("float64", dst, 32, vectorize)
    out = np.zeros(32, NP[dst])
    build(s, args, target)(a, out)
    want = dt.round_to(a, dst).astype(NP[dst])
    same(out, want)
    if dst == "float16":
        same(out, a.astype(np.float16))  # numpy rounds float64 -> float16 once
    for src in ["int32", "uint8", "int64", "int16"]:
        info = np.iinfo(src)
        vals = np.array([0, 1, -1, 2049, 2051, 257, 259, 65519, 65520, 123456789, info.max,
                         info.min] * 3, np.int64)[:32]
        x = np.clip(vals, info.min, info.max).astype(src)
        s, args = unary_kernel(src, dst, 32, vectorize)
        out = np.zeros(32, NP[dst])
        build(s, args, target)(x, out)
        same(out, dt.round_to(x.astype(np.float64), dst).astype(NP[dst]))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize("src", HALVES)
def test_widen_half_every_bit_pattern(src: str, vectorize: bool, target: str) -> None:
    """All 65536 16-bit patterns (denormals, infs, NaNs) widen exactly to float32 and float64,
    and a float32 -> half -> store round trip gives the bits back (NaNs stay NaN)."""
    n = 1 << 16
    a = np.arange(n, dtype=np.uint32).astype(np.uint16).view(NP[src])
    want = a.astype(np.float32)
    for dst, npd in [("float32", np.float32), ("float64", np.float64)]:
        s, args = unary_kernel(src, dst, n, vectorize)
        out = np.zeros(n, npd)
        build(s, args, target)(a, out)
        got = out.astype(np.float32)
        assert ((got.view(np.uint32) == want.view(np.uint32)) | np.isnan(want)).all()
    s, args = unary_kernel(src, src, n, vectorize, lambda A, i: A[i] * 1.0)
    out = np.zeros(n, NP[src])
    build(s, args, target)(a, out)
    same(out, a)


@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize("dtype", HALVES)
def test_half_to_int_saturates(dtype: str, vectorize: bool) -> None:
    a = np.array([0.0, -0.0, 1.5, -1.5, 127.9, 128.0, -129.0, 300.0, 65504.0, -65504.0,
                  np.inf, -np.inf, np.nan, 255.5, 2.5, -2.5], np.float32).astype(NP[dtype])
    for dst in ["int8", "uint8", "int16", "uint16", "int32", "int64"]:
        s, args = unary_kernel(dtype, dst, 16, vectorize)
        out = np.zeros(16, dst)
        build(s, args, "llvm")(a, out)
        want = interp.saturating_float_to_int(a.astype(np.float32), dst)
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize("dtype", HALVES)
def test_elementwise_computes_in_float32_rounds_on_store(dtype: str, vectorize: bool,
                                                         target: str) -> None:
    n = 1003  # a vector tail
    rng = np.random.default_rng(1)
    a = (rng.standard_normal(n) * 100).astype(NP[dtype])
    b = (rng.standard_normal(n) * 100).astype(NP[dtype])
    A = te.placeholder((n,), dtype, name="A")
    B = te.placeholder((n,), dtype, name="B")
    C = te.compute((n,), lambda i: te.max(A[i] * B[i] + A[i] / B[i] - 0.1, A[i]), name="C")
    s = te.create_schedule(C.op)
    if vectorize:
        _, xi = s[C].split(C.op.axis[0], factor=16)
        s[C].vectorize(xi)
    f = build(s, [A, B, C], target)
    c = np.zeros(n, NP[dtype])
    f(a, b, c)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    c01 = np.float32(dt.round_to(np.float64(0.1), dtype))  # the constant is a 16-bit value
    want = np.maximum(a32 * b32 + a32 / b32 - c01, a32).astype(NP[dtype])
    same(c, want)
    ref = np.zeros(n, NP[dtype])
    interp.run(tc.lower(s, [A, B, C]), a, b, ref)
    same(ref, c)


@pytest.mark.parametrize("dtype", HALVES)
def test_reduction_accumulates_in_float32(dtype: str) -> None:
    n, m = 64, 4096
    rng = np.random.default_rng(2)
    a = rng.random((n, m)).astype(NP[dtype])
    A = te.placeholder((n, m), dtype, name="A")
    k = te.reduce_axis((0, m), name="k")
    S = te.compute((n,), lambda i: te.sum(A[i, k].astype("float32"), axis=k), name="S")
    H = te.compute((n,), lambda i: S[i].astype(dtype), name="H")
    s = te.create_schedule(H.op)
    ko, ki = s[S].split(k, factor=16)
    s[S].compute_at(s[H], H.op.axis[0])
    f = build(s, [A, H], "llvm")
    h = np.zeros(n, NP[dtype])
    f(a, h)
    want = a.astype(np.float64).sum(axis=1)
    # one rounding to 16 bits plus float32 accumulation error: far below a 16-bit ulp
    np.testing.assert_allclose(h.astype(np.float64), want, rtol=2 ** -7 if dtype == "bfloat16"
                               else 2 ** -10)
    ref = np.zeros(n, NP[dtype])
    interp.run(tc.lower(s, [A, H]), a, ref)
    np.testing.assert_allclose(ref.astype(np.float64), h.astype(np.float64), rtol=1e-6)


def test_bfloat16_takes_uint16_bit_patterns_and_rejects_other_dtypes() -> None:
    n = 16
    A = te.placeholder((n,), "bfloat16", name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0, name="B")
    s = te.create_schedule(B.op)
    f = build(s, [A, B], "llvm")
    a = np.linspace(-3, 3, n).astype(ml_dtypes.bfloat16)
    out = np.zeros(n, np.uint16)
    f(a.view(np.uint16), out)
    same(out.view(ml_dtypes.bfloat16), (a.astype(np.float32) * 2).astype(ml_dtypes.bfloat16))
    with pytest.raises(TypeError, match=r"expected dtype bfloat16 \(an ml_dtypes.bfloat16 array"):
        f(a.astype(np.float32), out)
    with pytest.raises(TypeError, match="expected dtype bfloat16"):
        f(a.astype(np.float16), out)
    H = te.placeholder((n,), "float16", name="H")
    G = te.compute((n,), lambda i: H[i] + 1.0, name="G")
    g = build(te.create_schedule(G.op), [H, G], "llvm")
    with pytest.raises(TypeError, match="expected dtype float16"):
        g(np.zeros(n, np.float32), np.zeros(n, np.float16))


def test_dtype_strings_and_promotion() -> None:
    assert dt.canonical(ml_dtypes.bfloat16) == "bfloat16"
    assert dt.canonical(np.float16) == "float16"
    assert dt.is_float("bfloat16x8") and dt.bits("bfloat16") == 16
    A = te.placeholder((4,), "float16", name="A")
    B = te.placeholder((4,), "bfloat16", name="B")
    assert (A[0] + B[0]).dtype == "float32"  # neither 16-bit type holds the other
    assert (A[0] + 1.5).dtype == "float16"
    assert (B[0] * 2).dtype == "bfloat16"


def test_f16c_conversions_in_the_assembly() -> None:
    """With F16C the conversions are vcvtph2ps/vcvtps2ph; without, integer code (no calls)."""
    n = 64
    A = te.placeholder((n,), "float16", name="A")
    B = te.compute((n,), lambda i: A[i] * A[i], name="B")
    s = te.create_schedule(B.op)
    _, xi = s[B].split(B.op.axis[0], factor=8)
    s[B].vectorize(xi)
    hw = tc.build(s, [A, B], target="llvm -mcpu=haswell").get_source("asm")
    assert "vcvtph2ps" in hw and "vcvtps2ph" in hw
    soft = tc.build(s, [A, B], target="llvm -mcpu=x86-64").get_source("asm")
    assert "vcvtph2ps" not in soft and "__extendhfsf2" not in soft and "__truncsfhf2" not in soft

"""Every integer width, signed and unsigned, and bool end to end: placeholders, wrapping
arithmetic, int <-> int casts (wrap), float -> int casts (saturate), reductions, scalar and
vectorized, against numpy and the interpreter."""

from __future__ import annotations

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.runtime import interp

INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def values(dtype: str, n: int, seed: int = 0) -> np.ndarray:
    info = np.iinfo(dtype)
    edges = [info.min, info.max, 0, 1, info.max - 1, info.min + 1, info.max // 2]
    rng = np.random.default_rng(seed)
    rand = rng.integers(info.min, info.max, n - len(edges), dtype=dtype, endpoint=True)
    return np.concatenate([np.array(edges, dtype), rand])


def sched(out: te.Tensor, vectorize: bool) -> te.Schedule:
    s = te.create_schedule(out.op)
    if vectorize:
        _, xi = s[out].split(out.op.axis[0], factor=16)
        s[out].vectorize(xi)
    return s


def no_signed_overflow(dtype: str, a: np.ndarray) -> np.ndarray:
    """int32/int64 arithmetic is generated with `nsw` (llvm_base: index arithmetic must not
    wrap, so LLVM can widen induction variables): overflow there is undefined, unlike the
    narrow and unsigned types, which wrap like numpy. Keep those products in range."""
    if dtype in ("int32", "int64"):
        half = 1 << (np.iinfo(dtype).bits // 2 - 2)
        return np.clip(a, -half, half).astype(dtype)
    return a


@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize("dtype", INTS)
def test_wrapping_arithmetic(dtype: str, vectorize: bool) -> None:
    n = 203
    A = te.placeholder((n,), dtype, name="A")
    B = te.placeholder((n,), dtype, name="B")
    C = te.compute((n,), lambda i: A[i] * B[i] + A[i] - B[i], name="C")
    D = te.compute((n,), lambda i: te.max(A[i], B[i]) - te.min(A[i], B[i]), name="D")
    s = te.create_schedule([C.op, D.op])
    for T in (C, D):
        if vectorize:
            _, xi = s[T].split(T.op.axis[0], factor=16)
            s[T].vectorize(xi)
    f = tc.build(s, [A, B, C, D])
    a = no_signed_overflow(dtype, values(dtype, n, 1))
    b = no_signed_overflow(dtype, values(dtype, n, 2))
    c, d = np.zeros(n, dtype), np.zeros(n, dtype)
    f(a, b, c, d)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(c, a * b + a - b)
        np.testing.assert_array_equal(d, np.maximum(a, b) - np.minimum(a, b))
    rc, rd = np.zeros(n, dtype), np.zeros(n, dtype)
    interp.run(tc.lower(s, [A, B, C, D]), a, b, rc, rd)
    np.testing.assert_array_equal(rc, c)
    np.testing.assert_array_equal(rd, d)


@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize("src", INTS + ["bool"])
def test_int_casts_wrap(src: str, vectorize: bool) -> None:
    n = 64
    a = (np.random.default_rng(3).integers(0, 2, n).astype(bool) if src == "bool"
         else values(src, n))
    for dst in INTS + ["bool", "float32", "float64"]:
        A = te.placeholder((n,), src, name="A")
        B = te.compute((n,), lambda i: A[i].astype(dst), name="B")
        s = sched(B, vectorize)
        out = np.zeros(n, dst)
        tc.build(s, [A, B])(a, out)
        want = (a != 0) if dst == "bool" else a.astype(dst)  # numpy wraps int -> int
        np.testing.assert_array_equal(out, want, err_msg=f"{src} -> {dst}")
        ref = np.zeros(n, dst)
        interp.run(tc.lower(s, [A, B]), a, ref)
        np.testing.assert_array_equal(ref, out, err_msg=f"{src} -> {dst} (interpreter)")


@pytest.mark.parametrize("vectorize", [False, True])
@pytest.mark.parametrize("dst", INTS)
def test_float_to_int_saturates(dst: str, vectorize: bool) -> None:
    info = np.iinfo(dst)
    a = np.array([0.0, -0.0, 0.5, -0.5, 1.9, -1.9, np.nan, np.inf, -np.inf, float(info.max),
                  float(info.min), float(info.max) * 2, float(info.min) * 2 - 1, 1e30, -1e30,
                  float(info.max) + 0.5], np.float64)
    for src in ["float32", "float64", "float16", "bfloat16"]:
        A = te.placeholder((16,), src, name="A")
        B = te.compute((16,), lambda i: A[i].astype(dst), name="B")
        s = sched(B, vectorize)
        x = a.astype(src if src != "bfloat16" else tc.ir.dtype.to_numpy("bfloat16"))
        out = np.zeros(16, dst)
        tc.build(s, [A, B])(x, out)
        want = interp.saturating_float_to_int(x.astype(np.float64), dst)
        np.testing.assert_array_equal(out, want, err_msg=f"{src} -> {dst}")


@pytest.mark.parametrize("dtype", INTS + ["bool"])
def test_reductions(dtype: str) -> None:
    n, m = 8, 100
    rng = np.random.default_rng(4)
    a = (rng.integers(0, 2, (n, m)).astype(bool) if dtype == "bool"
         else values(dtype, n * m, 5).reshape(n, m))
    A = te.placeholder((n, m), dtype, name="A")
    k = te.reduce_axis((0, m), name="k")
    mx = te.compute((n,), lambda i: te.max(A[i, k], axis=k), name="mx")
    k2 = te.reduce_axis((0, m), name="k2")
    mn = te.compute((n,), lambda i: te.min(A[i, k2], axis=k2), name="mn")
    outs = [mx, mn]
    if dtype != "bool":
        k3 = te.reduce_axis((0, m), name="k3")
        outs.append(te.compute((n,), lambda i: te.sum(A[i, k3], axis=k3), name="sm"))
    s = te.create_schedule([o.op for o in outs])
    f = tc.build(s, [A, *outs])
    got = [np.zeros(n, dtype) for _ in outs]
    f(a, *got)
    np.testing.assert_array_equal(got[0], a.max(axis=1))
    np.testing.assert_array_equal(got[1], a.min(axis=1))
    if dtype not in ("bool", "int32", "int64"):  # no sums that overflow with nsw
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(got[2], a.sum(axis=1, dtype=dtype))


@pytest.mark.parametrize("dtype", INTS)
def test_vectorized_reduction_into_wider_accumulator(dtype: str) -> None:
    n = 256
    a = values(dtype, n)
    acc = "uint64" if dtype.startswith("u") else "int64"
    A = te.placeholder((n,), dtype, name="A")
    B = te.compute((n,), lambda i: A[i].astype(acc) * 3, name="B")
    s = sched(B, True)
    out = np.zeros(n, acc)
    tc.build(s, [A, B])(a, out)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out, a.astype(acc) * np.array(3, acc))

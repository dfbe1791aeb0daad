"""Operator tests: declaration + hand schedule + compiled result vs numpy (and the interpreter)."""

from __future__ import annotations

import numpy as np
import pytest
from numpy_refs import numpy_conv

import tecomp as tc
from tecomp import te
from tecomp.runtime import interp

RNG = np.random.default_rng(0)


def rand(shape, dtype="float32"):
    if np.dtype(dtype).kind == "f":
        return RNG.standard_normal(shape).astype(dtype)
    if dtype == "bool":
        return RNG.integers(0, 2, shape).astype(bool)
    info = np.iinfo(dtype)
    return RNG.integers(max(info.min, -100), min(info.max, 100), shape).astype(dtype)


def check(s, args, inputs, expect, rtol=1e-5, atol=1e-5, interp_too=True):
    f = tc.build(s, args, target="llvm")
    outs = [np.zeros(e.shape, e.dtype) for e in expect]
    f(*inputs, *outs)
    for o, e in zip(outs, expect):
        np.testing.assert_allclose(o, e, rtol=rtol, atol=atol)
    if interp_too:
        func = tc.lower(s, args)
        outs2 = [np.zeros(e.shape, e.dtype) for e in expect]
        interp.run(func, *inputs, *outs2)
        for o, e in zip(outs2, expect):
            np.testing.assert_allclose(o, e, rtol=rtol, atol=atol)
    return f


def test_elementwise_broadcast():
    n, m = 37, 19
    A = te.placeholder((n, m), name="A")
    B = te.placeholder((m,), name="B")
    C = te.compute((n, m), lambda i, j: A[i, j] * 2 + B[j], name="C")
    s = te.create_schedule(C.op)
    a, b = rand((n, m)), rand((m,))
    check(s, [A, B, C], [a, b], [a * 2 + b])


def test_matmul_tiled_nondivisible():
    n, k, m = 45, 33, 70
    A = te.placeholder((n, k), name="A")
    B = te.placeholder((k, m), name="B")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    io, jo, ii, ji = s[C].tile(i, j, 8, 16)
    ro, ri = s[C].split(s[C].op.reduce_axis[0], factor=4)
    s[C].reorder(io, jo, ro, ri, ii, ji)
    s[C].vectorize(ji)
    s[C].parallel(io)
    a, b = rand((n, k)), rand((k, m))
    check(s, [A, B, C], [a, b], [a @ b], rtol=1e-4, atol=1e-4)


def test_batch_matmul():
    bs, n, k, m = 3, 16, 12, 20
    A = te.placeholder((bs, n, k), name="A")
    B = te.placeholder((bs, k, m), name="B")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((bs, n, m), lambda b, i, j: te.sum(A[b, i, r] * B[b, r, j], axis=r), name="C")
    s = te.create_schedule(C.op)
    b_, i, j = s[C].op.axis
    jo, ji = s[C].split(j, factor=8)
    s[C].vectorize(ji)
    s[C].parallel(s[C].fuse(b_, i))
    a, bb = rand((bs, n, k)), rand((bs, k, m))
    check(s, [A, B, C], [a, bb], [a @ bb], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stride,pad", [(1, 1), (2, 1), (1, 0)])
def test_conv2d_nchw(stride, pad):
    N, CI, H, W, CO, K = 1, 3, 10, 9, 4, 3
    X = te.placeholder((N, CI, H, W), name="X")
    Wt = te.placeholder((CO, CI, K, K), name="W")
    P = te.compute(
        (N, CI, H + 2 * pad, W + 2 * pad),
        lambda n, c, y, x: te.if_then_else(
            te.all(y >= pad, y < H + pad, x >= pad, x < W + pad), X[n, c, y - pad, x - pad], 0.0),
        name="P")
    OH, OW = (H + 2 * pad - K) // stride + 1, (W + 2 * pad - K) // stride + 1
    rc = te.reduce_axis((0, CI), name="rc")
    ry = te.reduce_axis((0, K), name="ry")
    rx = te.reduce_axis((0, K), name="rx")
    Y = te.compute(
        (N, CO, OH, OW),
        lambda n, f, y, x: te.sum(P[n, rc, y * stride + ry, x * stride + rx] * Wt[f, rc, ry, rx],
                                  axis=[rc, ry, rx]),
        name="Y")
    s = te.create_schedule(Y.op)
    s[P].compute_inline()
    n, f, y, x = s[Y].op.axis
    s[Y].parallel(f)
    xo, xi = s[Y].split(x, factor=4)
    s[Y].vectorize(xi)
    xv, wv = rand((N, CI, H, W)), rand((CO, CI, K, K))
    check(s, [X, Wt, Y], [xv, wv], [numpy_conv(xv, wv, stride, pad)], rtol=1e-4, atol=1e-4)


def test_depthwise_conv2d_compute_at():
    N, C, H, W, K, pad = 1, 4, 12, 12, 3, 1
    X = te.placeholder((N, C, H, W), name="X")
    Wt = te.placeholder((C, K, K), name="W")
    P = te.compute((N, C, H + 2, W + 2), lambda n, c, y, x: te.if_then_else(
        te.all(y >= pad, y < H + pad, x >= pad, x < W + pad), X[n, c, y - pad, x - pad], 0.0), name="P")
    ry = te.reduce_axis((0, K), name="ry")
    rx = te.reduce_axis((0, K), name="rx")
    Y = te.compute((N, C, H, W), lambda n, c, y, x: te.sum(P[n, c, y + ry, x + rx] * Wt[c, ry, rx],
                                                           axis=[ry, rx]), name="Y")
    s = te.create_schedule(Y.op)
    n, c, y, x = s[Y].op.axis
    yo, yi = s[Y].split(y, factor=4)
    s[P].compute_at(s[Y], yo)
    s[Y].vectorize(x)
    xv, wv = rand((N, C, H, W)), rand((C, K, K))
    xp = np.pad(xv, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros((N, C, H, W), "float32")
    for a in range(K):
        for b in range(K):
            ref += xp[:, :, a:a + H, b:b + W] * wv[None, :, a, b, None, None]
    check(s, [X, Wt, Y], [xv, wv], [ref], rtol=1e-4, atol=1e-4)


def test_max_pool():
    N, C, H, W = 1, 3, 8, 8
    X = te.placeholder((N, C, H, W), name="X")
    ry = te.reduce_axis((0, 2), name="ry")
    rx = te.reduce_axis((0, 2), name="rx")
    Y = te.compute((N, C, H // 2, W // 2),
                   lambda n, c, y, x: te.max(X[n, c, y * 2 + ry, x * 2 + rx], axis=[ry, rx]), name="Y")
    s = te.create_schedule(Y.op)
    xv = rand((N, C, H, W))
    ref = xv.reshape(N, C, H // 2, 2, W // 2, 2).max(axis=(3, 5))
    check(s, [X, Y], [xv], [ref])


def test_avg_pool():
    N, C, H, W = 2, 3, 6, 6
    X = te.placeholder((N, C, H, W), name="X")
    ry = te.reduce_axis((0, 3), name="ry")
    rx = te.reduce_axis((0, 3), name="rx")
    S = te.compute((N, C, 2, 2), lambda n, c, y, x: te.sum(X[n, c, y * 3 + ry, x * 3 + rx], axis=[ry, rx]), name="S")
    Y = te.compute((N, C, 2, 2), lambda n, c, y, x: S[n, c, y, x] / 9.0, name="Y")
    s = te.create_schedule(Y.op)
    xv = rand((N, C, H, W))
    ref = xv.reshape(N, C, 2, 3, 2, 3).mean(axis=(3, 5))
    check(s, [X, Y], [xv], [ref])


def _softmax(n, m):
    A = te.placeholder((n, m), name="A")
    k1 = te.reduce_axis((0, m), name="k1")
    k2 = te.reduce_axis((0, m), name="k2")
    mx = te.compute((n,), lambda i: te.max(A[i, k1], axis=k1), name="mx")
    e = te.compute((n, m), lambda i, j: te.exp(A[i, j] - mx[i]), name="e")
    sm = te.compute((n,), lambda i: te.sum(e[i, k2], axis=k2), name="sm")
    out = te.compute((n, m), lambda i, j: e[i, j] / sm[i], name="out")
    return A, mx, e, sm, out


def test_softmax_fused():
    n, m = 13, 50
    A, mx, e, sm, out = _softmax(n, m)
    s = te.create_schedule(out.op)
    i, j = s[out].op.axis
    s[out].parallel(i)
    for t in (mx, e, sm):
        s[t].compute_at(s[out], i)
    jo, ji = s[out].split(j, factor=16)
    s[out].vectorize(ji)
    a = rand((n, m))
    ex = np.exp(a - a.max(1, keepdims=True))
    check(s, [A, out], [a], [ex / ex.sum(1, keepdims=True)])


def test_layernorm():
    n, m = 7, 33
    A = te.placeholder((n, m), name="A")
    G = te.placeholder((m,), name="G")
    k = te.reduce_axis((0, m), name="k")
    k2 = te.reduce_axis((0, m), name="k2")
    total = te.compute((n,), lambda i: te.sum(A[i, k], axis=k), name="total")
    mean = te.compute((n,), lambda i: total[i] / m, name="mean")
    sq = te.compute((n,), lambda i: te.sum((A[i, k2] - mean[i]) * (A[i, k2] - mean[i]), axis=k2), name="sq")
    out = te.compute((n, m), lambda i, j: (A[i, j] - mean[i]) * te.rsqrt(sq[i] / m + 1e-5) * G[j],
                     name="out")
    s = te.create_schedule(out.op)
    i, j = s[out].op.axis
    s[mean].compute_inline()
    s[total].compute_at(s[out], i)
    s[sq].compute_at(s[out], i)
    a, g = rand((n, m)), rand((m,))
    mu = a.mean(1, keepdims=True)
    ref = (a - mu) / np.sqrt(a.var(1, keepdims=True) + 1e-5) * g
    check(s, [A, G, out], [a, g], [ref], rtol=1e-4, atol=1e-4)


def test_symbolic_dims():
    n = te.var("n")
    A = te.placeholder((n, 8), name="A")
    B = te.compute((n, 8), lambda i, j: A[i, j] + 1.0, name="B")
    s = te.create_schedule(B.op)
    s[B].vectorize(s[B].op.axis[1])
    f = tc.build(s, [A, B])
    for rows in (1, 5, 33):
        a = rand((rows, 8))
        b = np.empty_like(a)
        f(a, b)
        np.testing.assert_allclose(b, a + 1)


def test_argmax_tuple_reducer():
    n, m = 6, 11
    A = te.placeholder((n, m), name="A")
    argmax = te.comm_reducer(
        lambda x, y: (te.if_then_else(x[1] >= y[1], x[0], y[0]), te.if_then_else(x[1] >= y[1], x[1], y[1])),
        lambda t0, t1: (tc.const(-1, t0), te.min_value(t1)),
        name="argmax")
    k = te.reduce_axis((0, m), name="k")
    idx, val = te.compute((n,), lambda i: argmax((k, A[i, k]), axis=k), name="am")
    s = te.create_schedule(idx.op)
    a = rand((n, m))
    f = tc.build(s, [A, idx, val])
    oi, ov = np.zeros(n, "int32"), np.zeros(n, "float32")
    f(a, oi, ov)
    np.testing.assert_array_equal(oi, a.argmax(1))
    np.testing.assert_allclose(ov, a.max(1))

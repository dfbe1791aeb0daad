"""Workloads shared by the tuning tests (module level: measurement workers import them)."""

from __future__ import annotations

import tuning
from tecomp import te

# the shipped declarations (registered there), re-exported for the tests
from tuning.workloads import matmul as matmul
from tuning.workloads import softmax as softmax


@tuning.register_workload
def matmul_relu(n: int, k: int, m: int) -> list[te.Tensor]:
    A = te.placeholder((n, k), "float32", name="A")
    B = te.placeholder((k, m), "float32", name="B")
    bias = te.placeholder((m,), "float32", name="bias")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    D = te.compute((n, m), lambda i, j: te.max(C[i, j] + bias[j], 0.0), name="D")
    return [A, B, bias, D]


@tuning.register_workload
def conv2d(n: int, c: int, h: int, w: int, f: int, kh: int, kw: int, pad: int) -> list[te.Tensor]:
    data = te.placeholder((n, c, h, w), "float32", name="data")
    kern = te.placeholder((f, c, kh, kw), "float32", name="kernel")
    hp, wp = h + 2 * pad, w + 2 * pad
    padded = te.compute(
        (n, c, hp, wp),
        lambda b, ch, y, x: te.if_then_else(
            te.all(y >= pad, y < h + pad, x >= pad, x < w + pad), data[b, ch, y - pad, x - pad], 0.0),
        name="pad")
    oh, ow = hp - kh + 1, wp - kw + 1
    rc = te.reduce_axis((0, c), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    out = te.compute(
        (n, f, oh, ow),
        lambda b, o, y, x: te.sum(padded[b, rc, y + ry, x + rx] * kern[o, rc, ry, rx], axis=[rc, ry, rx]),
        name="conv")
    return [data, kern, out]


@tuning.register_workload
def elementwise(n: int, m: int) -> list[te.Tensor]:
    A = te.placeholder((n, m), "float32", name="A")
    B = te.placeholder((n, m), "float32", name="B")
    T = te.compute((n, m), lambda i, j: A[i, j] * 2.0 + B[i, j], name="T")
    C = te.compute((n, m), lambda i, j: te.sigmoid(T[i, j]) * B[i, j], name="C")
    return [A, B, C]


@tuning.register_workload
def add_one(n: int) -> list[te.Tensor]:
    A = te.placeholder((n,), "float32", name="A")
    B = te.compute((n,), lambda i: A[i] + 1.0, name="B")
    return [A, B]


@tuning.register_workload
def same_names(n: int) -> list[te.Tensor]:
    A = te.placeholder((n,), "float32", name="A")
    B = te.compute((n,), lambda i: A[i] + 1.0)
    return [A, te.compute((n,), lambda i: B[i] * 2.0)]


@tuning.register_workload
def symbolic() -> list[te.Tensor]:
    n = te.var("n")
    A = te.placeholder((n,), "float32", name="A")
    return [A, te.compute((n,), lambda i: A[i] + 1.0, name="B")]


@tuning.register_workload
def matmul_tc(m: int, n: int, k: int, dtype: str = "float16") -> list[te.Tensor]:
    """fp16/bf16 inputs, fp32 accumulation: the shape the tensor-core sketch takes."""
    A = te.placeholder((m, k), dtype, name="A")
    B = te.placeholder((k, n), dtype, name="B")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r].astype("float32") * B[r, j].astype("float32"),
                                               axis=r), name="C")
    return [A, B, C]

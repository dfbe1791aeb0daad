"""Standard workloads, registered for tuning and for the ``tecomp tune`` command line.

Each returns its tensors in kernel-argument order (inputs, then outputs). Shapes are plain
ints so the workload key is stable across processes.
"""

from __future__ import annotations

from tecomp import te

from .task import register_workload


@register_workload
def matmul(n: int, k: int, m: int) -> list[te.Tensor]:
    """``C[n, m] = A[n, k] @ B[k, m]`` (fp32)."""
    A = te.placeholder((n, k), "float32", name="A")
    B = te.placeholder((k, m), "float32", name="B")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    return [A, B, C]


@register_workload
def batch_matmul(b: int, n: int, k: int, m: int) -> list[te.Tensor]:
    """``C[b, n, m] = A[b, n, k] @ B[b, k, m]`` (fp32)."""
    A = te.placeholder((b, n, k), "float32", name="A")
    B = te.placeholder((b, k, m), "float32", name="B")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((b, n, m), lambda x, i, j: te.sum(A[x, i, r] * B[x, r, j], axis=r), name="C")
    return [A, B, C]


def _pad(data: te.Tensor, pad: int, name: str) -> te.Tensor:
    n, c, h, w = (int(x.value) for x in data.shape)  # type: ignore[attr-defined]
    return te.compute(
        (n, c, h + 2 * pad, w + 2 * pad),
        lambda b, ch, y, x: te.if_then_else(
            te.all(y >= pad, y < h + pad, x >= pad, x < w + pad), data[b, ch, y - pad, x - pad], 0.0),
        name=name)


@register_workload
def conv2d(N: int, CI: int, H: int, W: int, CO: int, KH: int, KW: int, stride: int, pad: int) -> list[te.Tensor]:
    """NCHW conv2d with an OIHW kernel, zero padding ``pad`` and ``stride`` (fp32)."""
    data = te.placeholder((N, CI, H, W), "float32", name="data")
    kernel = te.placeholder((CO, CI, KH, KW), "float32", name="kernel")
    padded = _pad(data, pad, "pad")
    OH = (H + 2 * pad - KH) // stride + 1
    OW = (W + 2 * pad - KW) // stride + 1
    rc = te.reduce_axis((0, CI), name="rc")
    ry = te.reduce_axis((0, KH), name="ry")
    rx = te.reduce_axis((0, KW), name="rx")
    out = te.compute(
        (N, CO, OH, OW),
        lambda b, f, y, x: te.sum(padded[b, rc, y * stride + ry, x * stride + rx] * kernel[f, rc, ry, rx],
                                  axis=[rc, ry, rx]),
        name="conv")
    return [data, kernel, out]


@register_workload
def depthwise_conv2d(N: int, C: int, H: int, W: int, KH: int, KW: int, stride: int, pad: int) -> list[te.Tensor]:
    """NCHW depthwise conv2d (one KHxKW filter per channel), zero padding, fp32."""
    data = te.placeholder((N, C, H, W), "float32", name="data")
    kernel = te.placeholder((C, KH, KW), "float32", name="kernel")
    padded = _pad(data, pad, "pad")
    OH = (H + 2 * pad - KH) // stride + 1
    OW = (W + 2 * pad - KW) // stride + 1
    ry = te.reduce_axis((0, KH), name="ry")
    rx = te.reduce_axis((0, KW), name="rx")
    out = te.compute(
        (N, C, OH, OW),
        lambda b, c, y, x: te.sum(padded[b, c, y * stride + ry, x * stride + rx] * kernel[c, ry, rx],
                                  axis=[ry, rx]),
        name="dwconv")
    return [data, kernel, out]


@register_workload
def softmax(n: int, m: int) -> list[te.Tensor]:
    """Row softmax of an ``n x m`` fp32 matrix."""
    A = te.placeholder((n, m), "float32", name="A")
    k1 = te.reduce_axis((0, m), name="k1")
    mx = te.compute((n,), lambda i: te.max(A[i, k1], axis=k1), name="mx")
    e = te.compute((n, m), lambda i, j: te.exp(A[i, j] - mx[i]), name="e")
    k2 = te.reduce_axis((0, m), name="k2")
    sm = te.compute((n,), lambda i: te.sum(e[i, k2], axis=k2), name="sm")
    out = te.compute((n, m), lambda i, j: e[i, j] / sm[i], name="out")
    return [A, out]


@register_workload
def dense(n: int, k: int, m: int) -> list[te.Tensor]:
    """A linear layer as PyTorch lays it out: ``Y = X @ W.T + b`` with ``W`` of shape
    ``(m, k)`` (fp32)."""
    X = te.placeholder((n, k), "float32", name="X")
    W = te.placeholder((m, k), "float32", name="W")
    b = te.placeholder((m,), "float32", name="b")
    r = te.reduce_axis((0, k), name="r")
    Y = te.compute((n, m), lambda i, j: te.sum(X[i, r] * W[j, r], axis=r), name="Y")
    out = te.compute((n, m), lambda i, j: Y[i, j] + b[j], name="out")
    return [X, W, b, out]


@register_workload
def dense_relu(n: int, k: int, m: int) -> list[te.Tensor]:
    """``relu(X @ W.T + b)``: `dense` with its activation as an epilogue (fp32)."""
    X, W, b, lin = dense(n, k, m)
    out = te.compute((n, m), lambda i, j: te.max(lin[i, j], 0.0), name="relu")
    return [X, W, b, out]


@register_workload
def layer_norm(n: int, m: int) -> list[te.Tensor]:
    """Layer normalisation of the rows of an ``n x m`` fp32 matrix with a per-column scale and
    shift, eps 1e-5 (PyTorch's ``layer_norm(x, (m,), gamma, beta)``): the mean, then the
    variance about it, then one normalising pass."""
    X = te.placeholder((n, m), "float32", name="X")
    gamma = te.placeholder((m,), "float32", name="gamma")
    beta = te.placeholder((m,), "float32", name="beta")
    k1 = te.reduce_axis((0, m), name="k1")
    total = te.compute((n,), lambda i: te.sum(X[i, k1], axis=k1), name="total")
    inv_m = 1.0 / m
    k2 = te.reduce_axis((0, m), name="k2")
    sq = te.compute((n,), lambda i: te.sum((X[i, k2] - total[i] * inv_m) * (X[i, k2] - total[i] * inv_m),
                                           axis=k2), name="sqdev")
    out = te.compute((n, m), lambda i, j: (X[i, j] - total[i] * inv_m) * te.rsqrt(sq[i] * inv_m + 1e-5)
                     * gamma[j] + beta[j], name="out")
    return [X, gamma, beta, out]


STANDARD = {f.__name__: f for f in (matmul, batch_matmul, conv2d, depthwise_conv2d, softmax, dense, dense_relu,
                                    layer_norm)}

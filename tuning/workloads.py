"""Standard workloads, registered for tuning and for the ``tecomp tune`` command line.

Each returns its tensors in kernel-argument order (inputs, then outputs). Shapes are plain
ints so the workload key is stable across processes.
"""

from __future__ import annotations

import math

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
def conv2d_grouped(N: int, CI: int, H: int, W: int, CO: int, KH: int, KW: int, stride: int, pad: int,
                   dilation: int, groups: int) -> list[te.Tensor]:
    """NCHW grouped conv2d as PyTorch's ``conv2d(x, w, stride, pad, dilation, groups)``: the
    kernel is ``[CO, CI // groups, KH, KW]`` and output channel ``f`` reads the ``CI // groups``
    input channels of group ``f // (CO // groups)``; zero padding, fp32. ``groups == 1`` is
    `conv2d` (with dilation); ``groups == CI == CO`` a depthwise convolution."""
    if groups < 1 or CI % groups or CO % groups:
        raise ValueError(f"conv2d_grouped: {CI} input and {CO} output channels do not both split "
                         f"into {groups} groups")
    if min(N, CI, H, W, CO, KH, KW, stride, dilation) < 1 or pad < 0:
        raise ValueError(f"conv2d_grouped: bad shape {(N, CI, H, W, CO, KH, KW, stride, pad, dilation)}")
    cig, cog = CI // groups, CO // groups
    data = te.placeholder((N, CI, H, W), "float32", name="data")
    kernel = te.placeholder((CO, cig, KH, KW), "float32", name="kernel")
    padded = _pad(data, pad, "pad")
    OH = (H + 2 * pad - dilation * (KH - 1) - 1) // stride + 1
    OW = (W + 2 * pad - dilation * (KW - 1) - 1) // stride + 1
    if OH < 1 or OW < 1:
        raise ValueError(f"conv2d_grouped: a {KH}x{KW} kernel (dilation {dilation}) does not fit "
                         f"the padded {H}x{W} input")
    rc = te.reduce_axis((0, cig), name="rc")
    ry = te.reduce_axis((0, KH), name="ry")
    rx = te.reduce_axis((0, KW), name="rx")

    def channel(f: te.Expr) -> te.Expr:  # the input channel rc of f's group
        return rc.var if groups == 1 else f * cig + rc.var if cog == 1 else f // cog * cig + rc.var

    def tap(r: te.Expr) -> te.Expr:
        return r * dilation if dilation > 1 else r

    out = te.compute(
        (N, CO, OH, OW),
        lambda b, f, y, x: te.sum(padded[b, channel(f), y * stride + tap(ry.var), x * stride + tap(rx.var)]
                                  * kernel[f, rc, ry, rx], axis=[rc, ry, rx]),
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


@register_workload
def rms_norm(n: int, m: int) -> list[te.Tensor]:
    """RMS normalisation of the rows of an ``n x m`` fp32 matrix with a per-column scale, eps
    1e-6 (PyTorch's ``rms_norm(x, (m,), gamma, eps=1e-6)``): one sum of squares per row, then
    ``x * rsqrt(mean(x^2) + eps) * gamma``."""
    X = te.placeholder((n, m), "float32", name="X")
    gamma = te.placeholder((m,), "float32", name="gamma")
    k = te.reduce_axis((0, m), name="k")
    ss = te.compute((n,), lambda i: te.sum(X[i, k] * X[i, k], axis=k), name="sumsq")
    out = te.compute((n, m), lambda i, j: X[i, j] * te.rsqrt(ss[i] * (1.0 / m) + 1e-6) * gamma[j], name="out")
    return [X, gamma, out]


@register_workload
def group_norm(N: int, C: int, H: int, W: int, G: int) -> list[te.Tensor]:
    """Group normalisation of an NCHW fp32 tensor over ``G`` groups of ``C // G`` channels with a
    per-channel scale and shift, eps 1e-5 (PyTorch's ``group_norm(x, G, gamma, beta)``). Like
    `layer_norm`, the variance is taken about the mean in a second sum (stable for offset data);
    the statistics are indexed ``[n, c // (C // G)]``, which a sketch splits ``c`` by to reach
    one group at a time."""
    if C % G:
        raise ValueError(f"group_norm: {C} channels do not split into {G} groups")
    cpg = C // G
    X = te.placeholder((N, C, H, W), "float32", name="X")
    gamma = te.placeholder((C,), "float32", name="gamma")
    beta = te.placeholder((C,), "float32", name="beta")
    inv = 1.0 / (cpg * H * W)
    c1, h1, w1 = (te.reduce_axis((0, e), name=f"{a}1") for a, e in (("c", cpg), ("h", H), ("w", W)))
    total = te.compute((N, G), lambda n, g: te.sum(X[n, g * cpg + c1, h1, w1], axis=[c1, h1, w1]), name="total")
    c2, h2, w2 = (te.reduce_axis((0, e), name=f"{a}2") for a, e in (("c", cpg), ("h", H), ("w", W)))

    def dev(n: te.Expr, g: te.Expr) -> te.Expr:
        d = X[n, g * cpg + c2, h2, w2] - total[n, g] * inv
        return d * d

    sq = te.compute((N, G), lambda n, g: te.sum(dev(n, g), axis=[c2, h2, w2]), name="sqdev")
    out = te.compute(
        (N, C, H, W),
        lambda n, c, y, x: (X[n, c, y, x] - total[n, c // cpg] * inv) * te.rsqrt(sq[n, c // cpg] * inv + 1e-5)
        * gamma[c] + beta[c], name="out")
    return [X, gamma, beta, out]


@register_workload
def batch_norm_infer(N: int, C: int, H: int, W: int) -> list[te.Tensor]:
    """Inference batch normalisation of an NCHW fp32 tensor with running statistics, a scale and
    a shift, eps 1e-5 (PyTorch's ``batch_norm(x, mean, var, gamma, beta, training=False)``). The
    per-channel ``scale = gamma * rsqrt(var + eps)`` is a stage of its own (computed once per
    channel, not per element), so the pass over ``x`` is one multiply-add per element. A variance
    below 0 (never a running variance; the tuner's random inputs are uniform in [-1, 1]) counts
    as 0, so every input gives finite outputs that schedules can be checked against."""
    X = te.placeholder((N, C, H, W), "float32", name="X")
    mean = te.placeholder((C,), "float32", name="mean")
    var = te.placeholder((C,), "float32", name="var")
    gamma = te.placeholder((C,), "float32", name="gamma")
    beta = te.placeholder((C,), "float32", name="beta")
    scale = te.compute((C,), lambda c: gamma[c] * te.rsqrt(te.max(var[c], 0.0) + 1e-5), name="scale")
    shift = te.compute((C,), lambda c: beta[c] - mean[c] * scale[c], name="shift")
    out = te.compute((N, C, H, W), lambda n, c, y, x: X[n, c, y, x] * scale[c] + shift[c], name="out")
    return [X, mean, var, gamma, beta, out]



@register_workload
def dense_gelu(n: int, k: int, m: int) -> list[te.Tensor]:
    """``gelu(X @ W.T + b)`` with the tanh approximation of GELU (PyTorch's
    ``gelu(x, approximate="tanh")``: ``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))``),
    BERT's FFN activation, as an epilogue of `dense` (fp32)."""
    X, W, b, lin = dense(n, k, m)
    c = math.sqrt(2.0 / math.pi)
    out = te.compute((n, m), lambda i, j: 0.5 * lin[i, j] * (1.0 + te.tanh(
        c * (lin[i, j] + 0.044715 * lin[i, j] * lin[i, j] * lin[i, j]))), name="gelu")
    return [X, W, b, out]


@register_workload
def dense_bias_residual(n: int, k: int, m: int) -> list[te.Tensor]:
    """``X @ W.T + b + R``: `dense` with a residual add reading a second ``(n, m)`` input, as
    BERT's attention output and FFN2 projections before their layer norms (fp32)."""
    X, W, b, lin = dense(n, k, m)
    R = te.placeholder((n, m), "float32", name="R")
    out = te.compute((n, m), lambda i, j: lin[i, j] + R[i, j], name="residual")
    return [X, W, b, R, out]


STANDARD = {f.__name__: f for f in (matmul, batch_matmul, conv2d, conv2d_grouped, depthwise_conv2d, softmax, dense,
                                    dense_relu, dense_gelu, dense_bias_residual,
                                    layer_norm, rms_norm, group_norm, batch_norm_infer)}

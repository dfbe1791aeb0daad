"""numpy references shared by tests in several folders (importable from any test: the root
conftest puts this folder on ``sys.path``)."""

from __future__ import annotations

import numpy as np


def numpy_conv(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
    """Direct NCHW x OIHW convolution, one kernel tap at a time (float64 accumulation)."""
    n, _, h, wd = x.shape
    co, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))).astype(np.float64)
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, co, oh, ow))
    for y in range(kh):
        for xx in range(kw):
            win = xp[:, :, y:y + stride * (oh - 1) + 1:stride, xx:xx + stride * (ow - 1) + 1:stride]
            out += np.einsum("ncyx,fc->nfyx", win, w[:, :, y, xx])
    return out.astype(np.float32)

"""numpy references shared by tests in several folders (importable from any test: the root
conftest puts this folder on ``sys.path``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def check_best_matmul(task: Any, log: str | Path, n: int) -> None:
    """The best schedule of the ``n x n x n`` matmul ``task`` in ``log``, built here, computes
    ``a @ b``."""
    import tecomp as tc

    s, args = task.apply_best(str(log))
    f = tc.build(s, args, target="llvm")
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype("float32") for _ in range(2))
    c = np.zeros((n, n), "float32")
    f(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)

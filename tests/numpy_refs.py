"""numpy references shared by tests in several folders (importable from any test: the root
conftest puts this folder on ``sys.path``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def numpy_conv(x: np.ndarray, w: np.ndarray, stride: int, pad: int, dilation: int = 1,
               groups: int = 1) -> np.ndarray:
    """Direct NCHW x OIHW convolution, one kernel tap at a time (float64 accumulation), as
    PyTorch's ``conv2d(x, w, stride=stride, padding=pad, dilation=dilation, groups=groups)``:
    ``w`` is ``[CO, CI // groups, KH, KW]`` and output channel ``f`` reads the input channels
    of group ``f // (CO // groups)``."""
    n, ci, h, wd = x.shape
    co, cig, kh, kw = w.shape
    assert ci == cig * groups and co % groups == 0, (x.shape, w.shape, groups)
    cog = co // groups
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))).astype(np.float64)
    oh = (h + 2 * pad - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd + 2 * pad - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, co, oh, ow))
    for y in range(kh):
        for xx in range(kw):
            y0, x0 = y * dilation, xx * dilation
            win = xp[:, :, y0:y0 + stride * (oh - 1) + 1:stride, x0:x0 + stride * (ow - 1) + 1:stride]
            for g in range(groups):
                out[:, g * cog:(g + 1) * cog] += np.einsum(
                    "ncyx,fc->nfyx", win[:, g * cig:(g + 1) * cig], w[g * cog:(g + 1) * cog, :, y, xx])
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

"""fp32 conv2d (ResNet 3x3 layer) with a hand-written schedule vs PyTorch (oneDNN), same run.

The layer: NCHW data 1x64x56x56, OIHW kernel 64x64x3x3, pad 1, stride 1 (the workload
``tuning.workloads.conv2d(1, 64, 56, 56, 64, 3, 3, 1, 1)``); inputs and output keep those
layouts, the layout changes are stages of the DAG, timed with the convolution.

Schedule (what made the difference, from ~18 GFLOP/s with x vectorized as <56 x float>):

- ``pad`` computed at root: a 58-wide zero-bordered copy, so the hot loop has no conditions;
- ``kpack[co/16, ci, kh, kw, 16]``: the kernel repacked so 16 output channels are one
  contiguous zmm vector (like gemm.py packs B);
- the convolution writes an ``NCHW16c`` tile ``convc`` computed at the output's x-block:
  ``fb`` vectors of 16 channels x ``xt`` output columns of accumulators (2 x 7 = 14 zmm) held
  in registers for the whole ci/ky/kx reduction; each step is ``fb`` kernel vector loads,
  ``xt`` data broadcasts (folded into the FMA as ``{1to16}``) and ``fb * xt`` FMAs;
- the output stage unpacks the tile to NCHW with scalar stores (fully unrolled, from the
  registers), cheap next to the 576 FMAs per stored vector of work;
- the (n, co-block, y) loops are fused and run in parallel.

Printed beside the ratio: both GFLOP/s as fractions of this machine's fp32 FMA peak (of
``--threads`` cores), measured by benchmarks/peak.py (cached).

Usage: python benchmarks/conv2d.py [--fb 2] [--xt 7] [--inline-pad] [--threads N] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from peak import fma_counts  # noqa: E402
from peak import measure as measure_peak  # noqa: E402
from timing import best_of  # noqa: E402

import tecomp as tc  # noqa: E402
from tecomp import te  # noqa: E402


def conv2d_schedule(n: int = 1, ci: int = 64, h: int = 56, w: int = 56, co: int = 64, k: int = 3,
                    pad: int = 1, fv: int = 16, fb: int = 2, xt: int = 7, inline_pad: bool = False):
    """Stride-1 conv2d, NCHW in and out, with a packed kernel and an NCHW16c register tile."""
    oh, ow = h + 2 * pad - k + 1, w + 2 * pad - k + 1
    assert co % (fv * fb) == 0 and ow % xt == 0
    data = te.placeholder((n, ci, h, w), "float32", name="data")
    kernel = te.placeholder((co, ci, k, k), "float32", name="kernel")
    padded = te.compute(
        (n, ci, h + 2 * pad, w + 2 * pad),
        lambda b, c, y, x: te.if_then_else(
            te.all(y >= pad, y < h + pad, x >= pad, x < w + pad), data[b, c, y - pad, x - pad], 0.0),
        name="pad")
    kpack = te.compute((co // fv, ci, k, k, fv),
                       lambda fo, c, ky, kx, fi: kernel[fo * fv + fi, c, ky, kx], name="kpack")
    rc = te.reduce_axis((0, ci), name="rc")
    ry = te.reduce_axis((0, k), name="ry")
    rx = te.reduce_axis((0, k), name="rx")
    convc = te.compute(
        (n, co // fv, oh, ow, fv),
        lambda b, fo, y, x, fi: te.sum(padded[b, rc, y + ry, x + rx] * kpack[fo, rc, ry, rx, fi],
                                       axis=[rc, ry, rx]),
        name="convc")
    out = te.compute((n, co, oh, ow), lambda b, f, y, x: convc[b, f // fv, y, x, f % fv], name="conv")

    s = te.create_schedule(out.op)
    ax = s[kpack].op.axis
    s[kpack].parallel(ax[0])
    s[kpack].vectorize(ax[4])
    if inline_pad:
        # as fast here: the border tests depend on y/ry and the first/last column only, so
        # they are uniform, well-predicted branches around the broadcast loads
        s[padded].compute_inline()
    else:
        ax = s[padded].op.axis
        s[padded].parallel(ax[1])
        s[padded].vectorize(ax[3])  # 58 lanes: 32 + 16 + 8 + 2 after the vectorize pass

    b, f, y, x = s[out].op.axis
    fo, fi = s[out].split(f, fv * fb)
    xo, xi = s[out].split(x, xt)
    s[out].reorder(b, fo, y, xo, fi, xi)
    s[out].parallel(s[out].fuse(b, fo, y))
    s[out].unroll(fi)
    s[out].unroll(xi)

    s[convc].compute_at(s[out], xo)
    cb, cfo, cy, cx, cfi = s[convc].op.axis
    crc, cry, crx = s[convc].op.reduce_axis
    s[convc].reorder(cb, cy, crc, cry, crx, cfo, cx, cfi)
    s[convc].unroll(crx)
    s[convc].unroll(cfo)
    s[convc].unroll(cx)
    s[convc].vectorize(cfi)
    return s, [data, kernel, out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fb", type=int, default=2, help="16-channel vectors per register tile")
    ap.add_argument("--xt", type=int, default=7, help="output columns per register tile")
    ap.add_argument("--inline-pad", action="store_true", help="inline the padding into the conv")
    ap.add_argument("--threads", type=int, default=0, help="threads for both (0: all cores)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    if args.threads:
        # tecomp's OpenMP reads this when its first parallel region starts
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    pk = measure_peak(quick=True)
    if args.threads:
        torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    s, params = conv2d_schedule(fb=args.fb, xt=args.xt, inline_pad=args.inline_pad)
    f = tc.build(s, params, target="llvm", name="conv2d")
    build_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    x = rng.random((1, 64, 56, 56), dtype=np.float32)
    w = rng.random((64, 64, 3, 3), dtype=np.float32)
    o = np.zeros((1, 64, 56, 56), np.float32)
    tx, tw = torch.from_numpy(x), torch.from_numpy(w)
    f(x, w, o)
    np.testing.assert_allclose(o, torch.nn.functional.conv2d(tx, tw, padding=1).numpy(), rtol=1e-4, atol=1e-3)
    flops = 2.0 * 64 * 56 * 56 * 64 * 3 * 3

    def torch_conv() -> object:
        return torch.nn.functional.conv2d(tx, tw, padding=1)

    # interleave the two so machine noise hits both alike; PyTorch first in each round
    t_pt, t_tc = float("inf"), float("inf")
    for _ in range(4):
        t_pt = min(t_pt, best_of(torch_conv, repeat=args.repeat, number=5))
        time.sleep(0.05)  # let the OpenMP workers go idle between the two
        t_tc = min(t_tc, f.time_evaluator(number=5, repeat=args.repeat)(x, w, o).min)
        time.sleep(0.05)
    fmas = fma_counts(f.get_source("asm"))
    ymm = f", {fmas['ymm']} ymm" if fmas["ymm"] else ""
    print(f"fp32 conv2d 1x64x56x56 * 64x64x3x3 pad 1  (build {build_s:.2f} s, "
          f"{fmas['zmm']} zmm FMAs in the assembly{ymm}, register tile {args.fb * 16} co x {args.xt} x)")
    g_pt, g_tc = flops / t_pt / 1e9, flops / t_tc / 1e9
    print(f"  PyTorch (oneDNN): {g_pt:8.1f} GFLOP/s  ({t_pt * 1e3:.3f} ms)")
    print(f"  tecomp:           {g_tc:8.1f} GFLOP/s  ({t_tc * 1e3:.3f} ms)")
    threads = args.threads or None
    print(f"  ratio tecomp/PyTorch: {t_pt / t_tc:.2f}x   "
          + pk.fractions("compute", {"tecomp": g_tc, "PyTorch": g_pt}, threads))
    print(pk.line(threads))


if __name__ == "__main__":
    main()

"""fp32 GEMM 1024x1024x1024 with a hand-written schedule vs numpy (OpenBLAS), same run.

Schedule: B is packed by a layout stage into panels ``Bp[j_outer, k, j_inner]`` (contiguous
64-float rows, one cache line group per k), C is computed through a register tile written
with cache_write (``mr x 64`` accumulators: ``mr`` rows of 4 zmm vectors), the reduction is
split and partially unrolled, the tile's columns are vectorized (16-lane FMAs on AVX-512) and
the row blocks run in parallel on all cores.

Printed beside the ratio: both GFLOP/s as fractions of this machine's fp32 FMA peak, measured by
benchmarks/peak.py (cached), so figures from machines with other vector widths compare.

Usage: python benchmarks/gemm.py [--n 1024] [--repeat 5]
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


def gemm_schedule(n: int, m: int, k: int, mr: int = 6, bn: int = 64, kb: int = 4):
    A = te.placeholder((n, k), "float32", name="A")
    B = te.placeholder((k, m), "float32", name="B")
    Bp = te.compute((m // bn, k, bn), lambda x, r, y: B[r, x * bn + y], name="Bp")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, r] * Bp[j // bn, r, j % bn], axis=r), name="C")
    s = te.create_schedule(C.op)
    x, kk, y = s[Bp].op.axis
    s[Bp].parallel(x)
    s[Bp].vectorize(y)
    CC = s.cache_write(C, "local")
    i, j = s[C].op.axis
    io, jo, ii, ji = s[C].tile(i, j, mr, bn)
    s[C].parallel(io)
    s[C].vectorize(ji)
    s[CC].compute_at(s[C], jo)
    ci, cj = s[CC].op.axis
    ko, ki = s[CC].split(s[CC].op.reduce_axis[0], factor=kb)
    s[CC].reorder(ko, ki, ci, cj)
    s[CC].unroll(ki)
    s[CC].unroll(ci)
    s[CC].vectorize(cj)
    return s, [A, B, C]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    n = args.n
    pk = measure_peak(quick=True)
    t0 = time.perf_counter()
    s, params = gemm_schedule(n, n, n)
    f = tc.build(s, params, target="llvm", name="gemm")
    build_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    a = rng.random((n, n), dtype=np.float32)
    b = rng.random((n, n), dtype=np.float32)
    c = np.zeros((n, n), np.float32)
    f(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-3)
    flops = 2.0 * n**3
    # interleave the two so machine noise hits both alike; numpy first in each round
    t_np, t_tc = float("inf"), float("inf")
    for _ in range(3):
        t_np = min(t_np, best_of(lambda: a @ b, repeat=args.repeat))
        time.sleep(0.05)  # let OpenMP workers go idle so they do not steal cycles from OpenBLAS
        t_tc = min(t_tc, f.time_evaluator(number=3, repeat=args.repeat)(a, b, c).min)
        time.sleep(0.05)
    fmas = fma_counts(f.get_source("asm"))
    ymm = f", {fmas['ymm']} ymm" if fmas["ymm"] else ""
    print(f"fp32 GEMM {n}x{n}x{n}  (build {build_s:.2f} s, {fmas['zmm']} zmm FMAs in the assembly{ymm})")
    g_np, g_tc = flops / t_np / 1e9, flops / t_tc / 1e9
    print(f"  numpy (OpenBLAS): {g_np:8.1f} GFLOP/s  ({t_np * 1e3:.2f} ms)")
    print(f"  tecomp:           {g_tc:8.1f} GFLOP/s  ({t_tc * 1e3:.2f} ms)")
    print(f"  ratio tecomp/numpy: {t_np / t_tc:.2f}x   "
          + pk.fractions("compute", {"tecomp": g_tc, "numpy": g_np}))
    print(pk.line())


if __name__ == "__main__":
    main()

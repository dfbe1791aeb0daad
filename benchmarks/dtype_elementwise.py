"""fp16 / bf16 elementwise throughput against fp32, in the same run.

``c = a * b + a`` over ``N`` elements (arrays far larger than the caches), vectorized and
parallel, in float32, float16 (F16C conversions where the CPU has them, exact software ones
otherwise) and bfloat16 (exact software conversions), plus numpy's float32 and float16 for
reference. 16-bit data is computed in float32 and rounded once on store (docs/design.md), so
the 16-bit kernels move half the bytes: on a memory-bound kernel they should approach 2x the
fp32 *element* rate. GB/s counts bytes read + written (STREAM style).

    python benchmarks/dtype_elementwise.py [--n 16777216] [--target "llvm -mcpu=x86-64"]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import ml_dtypes
import numpy as np

import tecomp as tc
from tecomp import te

NP = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def kernel(dtype: str, n: int, target: str) -> Callable[..., None]:
    A = te.placeholder((n,), dtype, name="A")
    B = te.placeholder((n,), dtype, name="B")
    C = te.compute((n,), lambda i: A[i] * B[i] + A[i], name="C")
    s = te.create_schedule(C.op)
    xo, xi = s[C].split(C.op.axis[0], factor=16)
    xoo, _ = s[C].split(xo, factor=1024)
    s[C].vectorize(xi)
    s[C].parallel(xoo)
    return tc.build(s, [A, B, C], target=target, name=f"fma_{dtype}")  # type: ignore[no-any-return]


def best(fn: Callable[[], object], repeat: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--target", default="llvm")
    args = ap.parse_args()
    n = args.n
    rng = np.random.default_rng(0)
    print(f"c = a * b + a, n = {n}, target = {args.target!r}")
    print(f"{'kernel':24s} {'time ms':>9s} {'GB/s':>8s} {'Gelem/s':>8s} {'vs fp32':>8s}")
    rate32 = None
    for dtype in ["float32", "float16", "bfloat16"]:
        a = rng.standard_normal(n).astype(NP[dtype])
        b = rng.standard_normal(n).astype(NP[dtype])
        c = np.empty(n, NP[dtype])
        f = kernel(dtype, n, args.target)
        t = best(lambda: f(a, b, c))  # noqa: B023
        rate = n / t
        rate32 = rate32 or rate
        gbs = 3 * n * a.itemsize / t / 1e9
        print(f"tecomp {dtype:17s} {t * 1e3:9.2f} {gbs:8.1f} {rate / 1e9:8.2f} "
              f"{rate / rate32:7.2f}x")
    for dtype in ["float32", "float16"]:
        a = rng.standard_normal(n).astype(NP[dtype])
        b = rng.standard_normal(n).astype(NP[dtype])
        c = np.empty(n, NP[dtype])

        def run() -> None:
            np.multiply(a, b, out=c)  # noqa: B023
            np.add(c, a, out=c)  # noqa: B023

        t = best(run)
        gbs = 3 * n * a.itemsize / t / 1e9  # what the result needs, not numpy's two passes
        print(f"numpy {dtype:18s} {t * 1e3:9.2f} {gbs:8.1f} {n / t / 1e9:8.2f} "
              f"{n / t / rate32:7.2f}x")


if __name__ == "__main__":
    main()

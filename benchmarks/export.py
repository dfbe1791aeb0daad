"""Exported library vs freshly JIT-built module: the same kernels, timed in the same run.

Builds the hand-scheduled GEMM of benchmarks/gemm.py and the row softmax of
benchmarks/softmax.py into one module, exports it (``.so`` + header + manifest), loads it back
with ``tc.runtime.load_module`` (ctypes, no LLVM) and times both copies of each kernel with
``time_evaluator``, interleaved so machine noise hits both alike. A ratio near 1.00 says the
library (PIC code, linked by the system linker) is as fast as the JIT's code. Each line ends
with both copies' speed as a fraction of this machine's peak (benchmarks/peak.py, cached): the
GEMM's GFLOP/s of the fp32 FMA peak, the softmax's effective GB/s (input read once, output
written once) of the streaming bandwidth.

Usage: python benchmarks/export.py [--n 1024] [--rows 4096] [--cols 1024] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from gemm import gemm_schedule  # noqa: E402
from peak import measure as measure_peak  # noqa: E402
from softmax import numpy_softmax, softmax_schedule  # noqa: E402

import tecomp as tc  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024, help="GEMM size (n x n x n)")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    n = args.n
    pk = measure_peak(quick=True)
    s_g, p_g = gemm_schedule(n, n, n)
    s_s, p_s = softmax_schedule(args.rows, args.cols)
    t0 = time.perf_counter()
    jit = tc.build([(s_g, p_g, "gemm"), (s_s, p_s, "softmax")], target="llvm")
    t_build = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        files = jit.export_library(os.path.join(tmp, "kernels.so"))
        t_export = time.perf_counter() - t0
        t0 = time.perf_counter()
        lib = tc.runtime.load_module(files.library)
        t_load = time.perf_counter() - t0
        size_kb = os.path.getsize(files.library) / 1024

    rng = np.random.default_rng(0)
    a = rng.random((n, n), dtype=np.float32)
    b = rng.random((n, n), dtype=np.float32)
    x = rng.standard_normal((args.rows, args.cols)).astype(np.float32)
    c_jit, c_lib = np.zeros((n, n), np.float32), np.zeros((n, n), np.float32)
    y_jit, y_lib = np.empty_like(x), np.empty_like(x)
    jit["gemm"](a, b, c_jit)
    lib["gemm"](a, b, c_lib)
    jit["softmax"](x, y_jit)
    lib["softmax"](x, y_lib)
    np.testing.assert_allclose(c_lib, a @ b, rtol=1e-3)
    np.testing.assert_allclose(y_lib, numpy_softmax(x), rtol=1e-5, atol=1e-7)
    same = np.array_equal(c_jit, c_lib) and np.array_equal(y_jit, y_lib)

    cases = {"gemm": (a, b, c_jit), "softmax": (x, y_jit)}
    best = {(k, w): float("inf") for k in cases for w in ("jit", "lib")}
    paired: dict[str, list[float]] = {k: [] for k in cases}  # per-round lib/jit, robust to drift
    for r in range(args.rounds):
        for name, call_args in cases.items():
            order = ("jit", "lib") if r % 2 == 0 else ("lib", "jit")  # alternate who goes first
            t: dict[str, float] = {}
            for who in order:
                mod = jit if who == "jit" else lib
                t[who] = mod[name].time_evaluator(number=3, repeat=args.repeat)(*call_args).min
                best[name, who] = min(best[name, who], t[who])
                time.sleep(0.05)  # let OpenMP workers go idle between the two
            paired[name].append(t["lib"] / t["jit"])
    print(f"build {t_build:.2f} s, export {t_export:.2f} s ({size_kb:.0f} KiB .so), "
          f"load_module {t_load * 1e3:.1f} ms; outputs bitwise equal to the JIT's: {same}")
    flops = 2.0 * n**3
    for name, label in (("gemm", f"fp32 GEMM {n}x{n}x{n}"),
                        ("softmax", f"row softmax {args.rows}x{args.cols}")):
        tj, tl = best[name, "jit"], best[name, "lib"]
        if name == "gemm":
            extra = f"  ({flops / tj / 1e9:.1f} / {flops / tl / 1e9:.1f} GFLOP/s)"
            frac = pk.fractions("compute", {"JIT": flops / tj / 1e9, ".so": flops / tl / 1e9})
        else:
            extra, moved = "", 2 * x.nbytes / 1e9
            frac = pk.fractions("memory", {"JIT": moved / tj, ".so": moved / tl})
        print(f"  {label:28s} JIT {tj * 1e3:8.3f} ms   loaded .so {tl * 1e3:8.3f} ms   "
              f"ratio loaded/JIT: {tl / tj:.3f} (best of each), "
              f"{statistics.median(paired[name]):.3f} (median of {args.rounds} paired rounds)"
              f"{extra}   {frac}")
    print(pk.line())


if __name__ == "__main__":
    main()

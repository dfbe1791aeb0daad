"""Auto-tune fp32 GEMM (default 1024^3) with `tuning` and compare the best schedule with numpy.

The tuner gets the plain declaration ``C = A @ B`` (`tuning.workloads.matmul`, no hand-made layout stage) and a trial
budget. Afterwards the best schedule from the log is built in this process and timed against
numpy (OpenBLAS) in the same run, interleaved, as in benchmarks/gemm.py. Printed: GFLOP/s of
both, the ratio, the fraction of this machine's fp32 FMA peak -- the peak kernel of
benchmarks/peak.py timed beside the GEMM in the same rounds (`peak.PeakBeside`: the peak of a
shared VM moves by a quarter in an hour), and of its cached measurement (e.g. ~444 GFLOP/s on a
2-core AVX-512 Zen 5) --, trials per minute, and where the tuning time went (search incl.
feature extraction, build, run, model training).

Usage: python benchmarks/tune_gemm.py [--n 1024] [--trials 300] [--log gemm.jsonl] [--cost-model random]

On a machine shared with other jobs, a 1-core comparison is the steadier one:
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python benchmarks/tune_gemm.py (the peak is then the measured 1-core one).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from peak import PeakBeside, threads_used  # noqa: E402
from peak import measure as measure_peak  # noqa: E402
from timing import best_of  # noqa: E402

import tecomp as tc  # noqa: E402
import tuning  # noqa: E402
from tuning import workloads  # noqa: E402
from tuning.measure import aligned_empty, measure_empty  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", default="llvm",
                    help="CPU target to tune for, e.g. 'llvm -mcpu=znver3' (AVX2 code) on an AVX-512 machine")
    ap.add_argument("--log", default=None, help="JSON-lines log (default: a fresh temporary file)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cost-model", default="xgb", choices=["xgb", "random"],
                    help="'random' measures random candidates: the baseline the learned model must beat")
    args = ap.parse_args()
    n = args.n
    log = args.log or os.path.join(tempfile.mkdtemp(prefix="tune-gemm-"), "gemm.jsonl")
    pk = measure_peak(quick=True, target=args.target)  # before tuning: a fresh measurement must not compete with it
    task = tuning.SearchTask(workloads.matmul, (n, n, n), target=args.target)
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    res = tuning.tune([task], trials=args.trials, log=log, seed=args.seed, batch_size=args.batch,
                      cost_model=args.cost_model)[0]
    wall = time.perf_counter() - t0

    s, params = task.apply_best(log)
    f = tc.build(s, params, target=args.target, name="gemm")
    rng = np.random.default_rng(0)
    # Big numpy arrays start 16 bytes past a page, and the tuner measures there
    # (tuning.measure.MEASURE_OFFSET): the headline is on arrays so placed, numpy on the same
    # ones; the kernel on 64-byte aligned copies is printed beside (it can be faster there).
    a, b, c = (measure_empty((n, n), "float32") for _ in range(3))
    a[...] = rng.random((n, n), dtype=np.float32)
    b[...] = rng.random((n, n), dtype=np.float32)
    a0, b0, c0 = (aligned_empty((n, n), "float32") for _ in range(3))
    a0[...], b0[...] = a, b
    f(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-3)
    flops = 2.0 * n**3
    t_np, t_tc, t_tc0 = float("inf"), float("inf"), float("inf")
    beside = PeakBeside(args.target)  # the peak in the same rounds as the kernels
    for _ in range(3):
        t_np = min(t_np, best_of(lambda: a @ b, args.repeat, number=3))
        time.sleep(0.05)  # let OpenMP workers go idle so they do not steal cycles from OpenBLAS
        beside.sample()
        t_tc = min(t_tc, f.time_evaluator(number=3, repeat=args.repeat)(a, b, c).min)
        t_tc0 = min(t_tc0, f.time_evaluator(number=3, repeat=args.repeat)(a0, b0, c0).min)
        beside.sample()
        time.sleep(0.05)
    g_np, g_tc = flops / t_np / 1e9, flops / t_tc / 1e9
    cores = threads_used()
    peak = pk.fma_for(cores)
    bad = {k: v for k, v in res.errors.items() if k != "NO_ERROR"}
    # timings on a shared machine are only as good as its idleness: say how busy it was
    print(f"\nload average (1 min) before tuning {load_before:.2f}, after timing {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} cores")
    print(f"auto-tuned fp32 GEMM {n}x{n}x{n} for {args.target!r} ({args.cost_model} model): {res.new_trials} new trials "
          f"({res.trials} in the log {log}), errors {bad or 'none'}")
    print(f"  numpy (OpenBLAS):  {g_np:8.1f} GFLOP/s  ({t_np * 1e3:.2f} ms)")
    print(f"  tecomp (tuned):    {g_tc:8.1f} GFLOP/s  ({t_tc * 1e3:.2f} ms)"
          f"  [best during tuning {res.best_gflops:.1f} GFLOP/s, {pk.compute_note(res.best_gflops, cores)}]")
    print(f"    on 64-byte aligned copies (the arrays above: {a.ctypes.data % 64} bytes past 64): "
          f"{flops / t_tc0 / 1e9:.1f} GFLOP/s ({t_tc0 * 1e3:.2f} ms)")
    print(f"  ratio tecomp/numpy: {t_np / t_tc:.2f}x   fraction of the {cores}-core FMA peak measured beside "
          f"them ({beside.gflops:.1f} GFLOP/s, {pk.isa}): {g_tc / beside.gflops:.1%} (numpy {g_np / beside.gflops:.1%}); "
          f"of the cached peak ({peak:.0f} GFLOP/s): {g_tc / peak:.1%}")
    print(pk.line(cores))
    if res.new_trials:
        print(f"  tuning: {wall:.0f} s wall")
        print(res.summary())  # trials/minute and time shares, as tune() reports them


if __name__ == "__main__":
    main()

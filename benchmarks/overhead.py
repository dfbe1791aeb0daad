"""Per-call overhead of a compiled kernel and build time of the GEMM schedule.

The tuner compiles and calls thousands of kernels, so both matter:
  * call overhead: median time of calling a 1-element kernel (argument checks + ctypes call),
    next to the cost of a no-op numpy ufunc call measured in the same run;
  * build time: lower + passes + LLVM codegen + O3 + JIT of benchmarks/gemm.py's schedule,
    broken down by phase.

Neither is a speed with a peak to be a fraction of; the last line names the machine and its
measured peaks (benchmarks/peak.py, cached), so figures from different machines can be told apart.

Usage: python benchmarks/overhead.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tecomp as tc  # noqa: E402
from tecomp import te  # noqa: E402


def call_overhead(samples: int = 20000) -> tuple[float, float]:
    A = te.placeholder((1,), "float32", name="A")
    B = te.compute((1,), lambda i: A[i] + 1.0, name="B")
    f = tc.build(te.create_schedule(B.op), [A, B], name="one")
    a, b = np.zeros(1, np.float32), np.zeros(1, np.float32)
    times, np_times = [], []
    for _ in range(samples):
        t0 = time.perf_counter_ns()
        f(a, b)
        t1 = time.perf_counter_ns()
        np.add(a, 1.0, out=b)
        t2 = time.perf_counter_ns()
        times.append(t1 - t0)
        np_times.append(t2 - t1)
    return statistics.median(times) / 1e3, statistics.median(np_times) / 1e3


def build_time(repeat: int = 5) -> dict[str, float]:
    from benchmarks_gemm import gemm_schedule  # type: ignore[import-not-found]

    from tecomp.codegen.llvm_cpu import CodegenCPU
    from tecomp.codegen.llvm_jit import JITModule
    from tecomp.codegen.target import Target
    from tecomp.lowering import lower

    phases: dict[str, list[float]] = {"lower+passes": [], "codegen": [], "O3+JIT": [], "total": []}
    tgt = Target.host()
    tc.build(*gemm_schedule(1024, 1024, 1024))  # warm caches (target machine, imports)
    for _ in range(repeat):
        s, args = gemm_schedule(1024, 1024, 1024)
        t0 = time.perf_counter()
        func = lower(s, args, name="gemm")
        t1 = time.perf_counter()
        cg = CodegenCPU(tgt)
        cg.add_function(func)
        text = str(cg.module)
        t2 = time.perf_counter()
        JITModule(text, tgt, uses_openmp=cg.uses_openmp)
        t3 = time.perf_counter()
        phases["lower+passes"].append(t1 - t0)
        phases["codegen"].append(t2 - t1)
        phases["O3+JIT"].append(t3 - t2)
        phases["total"].append(t3 - t0)
    return {k: statistics.median(v) for k, v in phases.items()}


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import importlib

    sys.modules["benchmarks_gemm"] = importlib.import_module("gemm")
    us, np_us = call_overhead()
    print(f"call overhead, 1-element kernel: median {us:.2f} us  (numpy ufunc call: {np_us:.2f} us, "
          f"ratio {us / np_us:.1f}x)")
    bt = build_time()
    parts = ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in bt.items() if k != "total")
    print(f"build time, GEMM schedule: median {bt['total']:.3f} s  ({parts})")
    from peak import measure as measure_peak

    print(measure_peak(quick=True).line())


if __name__ == "__main__":
    main()

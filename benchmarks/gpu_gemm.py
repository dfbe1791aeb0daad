"""SIMT fp32 GEMM on an NVIDIA GPU: tecomp's register-blocked shared-memory schedule vs cuBLAS.

What runs everywhere: the kernel is lowered for the target, its PTX assembled by ptxas (when
installed) and the resource report printed (registers, spills, shared memory) for the launch
configuration; at ``--emulate-n`` (default 256) the same schedule is emulated on the CPU and
checked against numpy, and the emulation time printed.

With a GPU (cuda-bindings installed, a device present): GFLOP/s of the tecomp kernel and of
``torch.matmul`` (cuBLAS, TF32 off) on the same device, timed in the same run, and the ratio.
Without one it says plainly "no GPU: skipped".

    python benchmarks/gpu_gemm.py                 # 4096^3, sm_80
    python benchmarks/gpu_gemm.py --n 2048 --arch sm_90
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import tecomp as tc
from tecomp import te


def gemm_schedule(n: int, block: int = 64, threads: int = 8, kstep: int = 8) -> tuple[te.Schedule, list]:
    """The classic SIMT GEMM (TVM's CUDA GEMM tutorial): a ``block x block`` tile of C per
    thread block, ``threads x threads`` threads each accumulating a ``block/threads``-square
    sub-tile in registers (cache_write to "local"), and ``block x kstep`` tiles of A and B
    staged in shared memory by all threads cooperatively (fused, split and bound)."""
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = te.create_schedule(C.op)
    AA = s.cache_read(A, "shared", [C])
    BB = s.cache_read(B, "shared", [C])
    CL = s.cache_write(C, "local")
    y, x = s[C].op.axis
    by, yi = s[C].split(y, factor=block)
    bx, xi = s[C].split(x, factor=block)
    ty, yi = s[C].split(yi, nparts=threads)
    tx, xi = s[C].split(xi, nparts=threads)
    s[C].reorder(by, bx, ty, tx, yi, xi)
    s[C].bind(by, te.thread_axis("blockIdx.y"))
    s[C].bind(bx, te.thread_axis("blockIdx.x"))
    s[C].bind(ty, te.thread_axis("threadIdx.y"))
    s[C].bind(tx, te.thread_axis("threadIdx.x"))
    s[CL].compute_at(s[C], tx)
    yo, xo = s[CL].op.axis
    ko, ki = s[CL].split(s[CL].op.reduce_axis[0], factor=kstep)
    s[CL].reorder(ko, ki, yo, xo)
    s[CL].unroll(ki)
    for X in (AA, BB):
        s[X].compute_at(s[CL], ko)
        fused = s[X].fuse(*s[X].op.axis)
        _, ft = s[X].split(fused, factor=threads * threads)
        fty, ftx = s[X].split(ft, factor=threads)
        s[X].bind(fty, te.thread_axis("threadIdx.y"))
        s[X].bind(ftx, te.thread_axis("threadIdx.x"))
    return s, [A, B, C]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--arch", default="sm_80")
    p.add_argument("--emulate-n", type=int, default=256, help="size emulated on the CPU (0: skip)")
    p.add_argument("--repeat", type=int, default=10)
    ns = p.parse_args()
    target = f"cuda -arch={ns.arch}"

    s, args = gemm_schedule(ns.n)
    f = tc.build(s, args, target=target, name="sgemm")
    launch = {k: str(v) for k, v in f["sgemm"].launch.items()}
    print(f"SIMT GEMM {ns.n}^3 for {target}: launch {launch}")
    res = f.resources
    if res is None:
        print(f"ptxas: not run ({f['sgemm'].resources_why})")
    else:
        threads = int(launch.get("threadIdx.x", 1)) * int(launch.get("threadIdx.y", 1))
        lim = f.target.gpu
        print(f"ptxas {ns.arch}: {res.registers} registers x {threads} threads = "
              f"{res.registers * threads} of {lim.registers_per_sm} per SM; spills "
              f"{res.spill_stores}/{res.spill_loads} B; shared {res.shared_bytes} B of "
              f"{lim.static_smem}; stack {res.stack_frame} B")

    if ns.emulate_n:
        se, argse = gemm_schedule(ns.emulate_n)
        fe = tc.build(se, argse, target=target)
        rng = np.random.default_rng(0)
        a = rng.standard_normal((ns.emulate_n,) * 2, dtype=np.float32)
        b = rng.standard_normal((ns.emulate_n,) * 2, dtype=np.float32)
        c = np.zeros_like(a)
        t0 = time.perf_counter()
        fe.emulate(a, b, c)
        dt = time.perf_counter() - t0
        err = float(np.max(np.abs(c - a @ b)))
        print(f"emulated {ns.emulate_n}^3 on the CPU in {dt:.2f} s (race detector on); "
              f"max abs error vs numpy {err:.2e}")

    from tecomp.runtime.cuda import cuda_available

    ok, why = cuda_available()
    if not ok:
        print(f"no GPU: skipped ({why})")
        return
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    a_t = torch.randn(ns.n, ns.n, device=dev)
    b_t = torch.randn(ns.n, ns.n, device=dev)
    c_t = torch.empty(ns.n, ns.n, device=dev)
    f(a_t, b_t, c_t)
    torch.testing.assert_close(c_t, a_t @ b_t, rtol=1e-3, atol=1e-2)
    t_ours = f.time_evaluator(number=ns.repeat, repeat=3)(a_t, b_t, c_t).median
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.matmul(a_t, b_t, out=c_t)
    times = []
    for _ in range(3):
        start.record()
        for _ in range(ns.repeat):
            torch.matmul(a_t, b_t, out=c_t)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / ns.repeat)
    t_ref = float(np.median(times))
    flops = 2.0 * ns.n ** 3
    print(f"tecomp {flops / t_ours / 1e9:.0f} GFLOP/s, cuBLAS (TF32 off) {flops / t_ref / 1e9:.0f} "
          f"GFLOP/s on {torch.cuda.get_device_name()}: ratio {t_ref / t_ours:.2f}x")


if __name__ == "__main__":
    main()

"""SIMT fp32 GEMM and fp16 tensor-core GEMM on an NVIDIA GPU: tecomp's schedules vs cuBLAS.

What runs everywhere: the kernel is lowered for the target, its PTX assembled by ptxas (when
installed) and the resource report printed (registers, spills, shared memory) for the launch
configuration; at ``--emulate-n`` (default 256) the same schedule is emulated on the CPU and
checked against numpy, and the emulation time printed.

The tensor-core section does the same for the fp16 GEMM (fp32 accumulate) on
mma.sync.m16n8k16 + ldmatrix (sm_80+, `tuning.gpu_space.tensor_core_gemm_schedule`, the
schedule the tuner's tensor-core sketch builds too): CUTLASS's sm_80 / sm_90 mma.sync tile,
128x256 per block (``--block``, or 256x128) on 2x4 warps of 64x64, k-step 32, A and B tiles
software-pipelined with 16-byte cp.async in ``--depth`` stages (default 3), shared rows padded
by 8 elements. Its 80-110 KB of shared memory exceed the static 48 KB: the kernel takes them
as dynamic shared memory (the runtime opts in), up to the arch's per-block maximum (163 KB on
sm_80, 227 KB on sm_90), and the report prints static + dynamic against that maximum.

With a GPU (cuda-bindings installed, a device present): GFLOP/s of the tecomp kernels and of
``torch.matmul`` (cuBLAS; TF32 off for fp32, fp16 for the tensor-core one) on the same device,
timed in the same run, and the ratios.
Without one it says plainly "no GPU: skipped".

    python benchmarks/gpu_gemm.py                 # 4096^3, sm_80
    python benchmarks/gpu_gemm.py --n 2048 --arch sm_90
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tecomp as tc  # noqa: E402
from tecomp import te  # noqa: E402
from tecomp.codegen.target import Target  # noqa: E402

# the tensor-core schedule is shared with the tuner's tensor-core sketch (tuning/gpu_space.py)
from tuning.gpu_space import tc_config_problems, tc_shared_bytes, tensor_core_gemm_schedule  # noqa: E402

TC_DEPTH = 3  # cp.async stages of the benchmark's tensor-core GEMM
# block tile -> warps (threadIdx.y, threadIdx.z): 64x64 per warp, as CUTLASS's 128x256x32 /
# 256x128x32 fp16 tiles on sm_80 and sm_90 (mma.sync); 128x128 on 2x2 warps for smaller budgets
TC_BLOCKS: dict[tuple[int, int], tuple[int, int]] = {(128, 256): (2, 4), (256, 128): (4, 2), (128, 128): (2, 2)}
TC_KSTEP = 32


def tc_knobs(depth: int, limit: int = 48 * 1024, block: tuple[int, int] = (128, 128)) -> dict[str, Any]:
    """The tensor-core GEMM's knobs at ``depth`` stages within ``limit`` bytes of shared memory
    per block: ``block`` (its warps from `TC_BLOCKS`) at k-step 32 with rows padded by 8
    elements (no ldmatrix bank conflicts), unpadded when only that fits, then k-step 16, then
    the 128x128 tile. The benchmark passes the arch's opt-in maximum
    (``GPULimits.max_dynamic_smem``) and CUTLASS's 128x256; the defaults are the static-only
    schedule (128x128 at depth 3 fills the 48 KB exactly, so it stays unpadded; depth 4 takes
    k-step 16, padded)."""
    for blk in dict.fromkeys([block, (128, 128)]):
        for kstep, pad in ((TC_KSTEP, 8), (TC_KSTEP, 0), (16, 8), (16, 0)):
            if tc_shared_bytes(blk, kstep, depth, pad) <= limit:
                return {"block": blk, "warps": TC_BLOCKS[blk], "kstep": kstep, "depth": depth, "pad": pad}
    return {"block": (128, 128), "warps": (2, 2), "kstep": 16, "depth": depth, "pad": 0}


def shared_report(f: Any, name: str) -> tuple[int, int]:
    """(static, dynamic) shared bytes per block of function ``name`` of ``f``: ptxas's static
    figure (0 for a kernel above 48 KB, whose shared memory is one extern area) and the dynamic
    shared memory its launch passes (the largest of its kernels)."""
    res = f.resources
    static = res.shared_bytes if res is not None else 0
    dynamic = max((k.shared_mem for k in f[name].plan.kernels), default=0)
    return static, dynamic


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


def _report(f: Any, name: str, arch: str) -> None:
    res = f.resources
    if res is None:
        print(f"ptxas: not run ({f[name].resources_why})")
        return
    launch = f[name].launch
    threads = 1
    for tag in ("threadIdx.x", "threadIdx.y", "threadIdx.z"):
        threads *= int(str(launch.get(tag, 1)))
    lim = f.target.gpu
    static, dynamic = shared_report(f, name)
    print(f"ptxas {arch}: {res.registers} registers x {threads} threads = "
          f"{res.registers * threads} of {lim.registers_per_sm} per SM; spills "
          f"{res.spill_stores}/{res.spill_loads} B; shared {static + dynamic} B of "
          f"{lim.max_dynamic_smem} ({static} static, {dynamic} dynamic); stack {res.stack_frame} B")


def tensor_core_section(ns: argparse.Namespace, target: str) -> Any:
    """The fp16 tensor-core GEMM: ptxas resources at ``--n``, emulation at ``--emulate-n``."""
    if int(ns.arch.split("_")[1].rstrip("a")) < 80:
        print(f"tensor-core GEMM: skipped ({ns.arch} has no mma.m16n8k16 with fp32 accumulation)")
        return None
    bm, bn = (int(x) for x in ns.block.split("x"))
    knobs = tc_knobs(ns.depth, Target.parse(target).gpu.max_dynamic_smem, (bm, bn))
    s, args = tensor_core_gemm_schedule(ns.n, ns.n, ns.n, **knobs)
    f = tc.build(s, args, target=target, name="hgemm_tc")
    print(f"tensor-core fp16 GEMM {ns.n}^3 (fp32 accumulate) for {target}, {knobs}: launch "
          f"{ {k: str(v) for k, v in f['hgemm_tc'].launch.items()} }")
    _report(f, "hgemm_tc", ns.arch)
    why = tc_config_problems(ns.emulate_n, ns.emulate_n, ns.emulate_n, knobs["block"], knobs["warps"],
                             knobs["kstep"], knobs["depth"], knobs["pad"], f.target.gpu.max_dynamic_smem)
    if ns.emulate_n and why:
        print(f"tensor-core GEMM emulation at {ns.emulate_n}^3: skipped ({'; '.join(why)})")
    elif ns.emulate_n:
        n = ns.emulate_n
        se, argse = tensor_core_gemm_schedule(n, n, n, **knobs)
        fe = tc.build(se, argse, target=target)
        rng = np.random.default_rng(0)
        a = rng.standard_normal((n, n)).astype(np.float16)
        b = rng.standard_normal((n, n)).astype(np.float16)
        c = np.zeros((n, n), np.float32)
        t0 = time.perf_counter()
        fe.emulate(a, b, c)
        dt = time.perf_counter() - t0
        err = float(np.max(np.abs(c - a.astype(np.float32) @ b.astype(np.float32))))
        print(f"tensor-core GEMM emulated {n}^3 on the CPU in {dt:.2f} s (race detector on); "
              f"max abs error vs numpy (fp32) {err:.2e}")
    return f


def time_tensor_core(f: Any, ns: argparse.Namespace) -> None:
    """GFLOP/s of the tensor-core GEMM and of torch.matmul on fp16 (cuBLAS), same device."""
    import torch

    dev = torch.device("cuda")
    a_t = torch.randn(ns.n, ns.n, device=dev, dtype=torch.float16)
    b_t = torch.randn(ns.n, ns.n, device=dev, dtype=torch.float16)
    c_t = torch.empty(ns.n, ns.n, device=dev, dtype=torch.float32)
    f(a_t, b_t, c_t)
    torch.testing.assert_close(c_t, (a_t.float() @ b_t.float()), rtol=1e-2, atol=1e-1)
    t_ours = f.time_evaluator(number=ns.repeat, repeat=3)(a_t, b_t, c_t).median
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.matmul(a_t, b_t)
    times = []
    for _ in range(3):
        start.record()
        for _ in range(ns.repeat):
            torch.matmul(a_t, b_t)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / ns.repeat)
    t_ref = float(np.median(times))
    flops = 2.0 * ns.n ** 3
    print(f"tensor-core fp16: tecomp {flops / t_ours / 1e9:.0f} GFLOP/s, cuBLAS fp16 "
          f"{flops / t_ref / 1e9:.0f} GFLOP/s: ratio {t_ref / t_ours:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--arch", default="sm_80")
    p.add_argument("--emulate-n", type=int, default=256, help="size emulated on the CPU (0: skip)")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--depth", type=int, default=TC_DEPTH, choices=(1, 2, 3, 4),
                   help="cp.async pipeline stages of the tensor-core GEMM (1: none)")
    p.add_argument("--block", default="128x256", choices=[f"{m}x{n}" for m, n in TC_BLOCKS],
                   help="block tile (M x N) of the tensor-core GEMM (smaller when the arch's shared "
                        "memory cannot hold its ring)")
    ns = p.parse_args()
    target = f"cuda -arch={ns.arch}"

    s, args = gemm_schedule(ns.n)
    f = tc.build(s, args, target=target, name="sgemm")
    launch = {k: str(v) for k, v in f["sgemm"].launch.items()}
    print(f"SIMT GEMM {ns.n}^3 for {target}: launch {launch}")
    _report(f, "sgemm", ns.arch)

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

    ftc = tensor_core_section(ns, target)

    from tecomp.runtime.cuda import cuda_available

    ok, why = cuda_available()
    if not ok:
        print(f"no GPU: skipped ({why})")
        return
    import torch

    if ftc is not None:
        time_tensor_core(ftc, ns)

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

"""Time the GPU emulator on shared-memory tiled SIMT GEMMs (the classic CUDA tutorial kernels).

Two kernels, each emulated on the CPU with the race detector on and off, checked against
numpy, the time printed (best and median wall time of ``--repeat`` runs, and the median CPU
time, which is what the run takes on a machine no other job is using):

* ``hand``: built by hand in the GPU IR (docs/gpu-ir.md): 16x16 threads per block, one
  output element per thread, n/16 x n/16 blocks, the k loop in tiles of 16 staged through two
  shared buffers with a barrier after the tile load and another after its use
  (`tecomp.runtime.gpu_emulator.emulate` on the PrimFunc);
* ``te``: a te schedule built with ``tc.build(..., target="cuda")`` and run by ``f.emulate``:
  the 2-level tiling of TVM's CUDA GEMM schedules (as in tests/runtime/test_gpu_operators.py),
  a ``block`` x ``block`` tile of C per thread block, ``threads`` x ``threads`` threads each
  accumulating a register tile (cache_write "local"), A and B tiles of ``k_tile`` staged in
  shared memory by all threads (fused, split, bound) and read into registers per k step
  (cache_read "local"). Its time is compared with the issue's budget: a 256^3 SIMT GEMM
  emulated in at most 10 s.

The emulator runs the threads of a block as numpy vectors and the blocks one after another, so
its time grows with the statements each block executes: more threads per block (16 x 16
here) means fewer, wider steps.

Usage: python benchmarks/gpu_emulator.py [--n 256] [--repeat 3] [--mode hand|te|both]
       [--block 64] [--threads 16] [--k-tile 8]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tecomp as tc  # noqa: E402
from tecomp import te  # noqa: E402
from tecomp.ir import Allocate, Buffer, BufferStore, For, ForKind, PrimFunc, Var, const, seq  # noqa: E402
from tecomp.ir import expr as E  # noqa: E402
from tecomp.ir.stmt import THREAD_TAG, Stmt, barrier  # noqa: E402
from tecomp.runtime.gpu_emulator import emulate  # noqa: E402


def _tloop(v: Var, tag: str, extent: int, body: Stmt) -> For:
    return For(v, const(0), const(extent), ForKind.THREAD_BINDING, body, ((THREAD_TAG, tag),))


def _loop(v: Var, extent: int, body: Stmt) -> For:
    return For(v, const(0), const(extent), ForKind.SERIAL, body)


def simt_gemm(n: int, tile: int = 16) -> PrimFunc:
    """C = A @ B for n x n float32 matrices (n a multiple of ``tile``)."""
    A, B, C = (Buffer(x, (const(n), const(n)), "float32") for x in "ABC")
    As = Buffer("As", (const(tile * tile),), "float32", scope="shared")
    Bs = Buffer("Bs", (const(tile * tile),), "float32", scope="shared")
    acc = Buffer("acc", (const(1),), "float32", scope="local")
    bx, by, tx, ty, ko, ki = (Var(x) for x in ("bx", "by", "tx", "ty", "ko", "ki"))
    zero = const(0)

    def ld(buf: Buffer, i: E.Expr) -> E.Expr:
        return E.BufferLoad(buf, (i,))

    def st(buf: Buffer, i: E.Expr, v: E.Expr) -> BufferStore:
        return BufferStore(buf, v, (i,))

    k_loop = _loop(ko, n // tile, seq(
        st(As, ty * tile + tx, ld(A, (by * tile + ty) * n + ko * tile + tx)),
        st(Bs, ty * tile + tx, ld(B, (ko * tile + ty) * n + bx * tile + tx)),
        barrier(),
        _loop(ki, tile, st(acc, zero, ld(acc, zero) + ld(As, ty * tile + ki) * ld(Bs, ki * tile + tx))),
        barrier(),
    ))
    threads = _tloop(ty, "threadIdx.y", tile, _tloop(tx, "threadIdx.x", tile, Allocate(acc, seq(
        st(acc, zero, E.FloatImm(0.0)), k_loop, st(C, (by * tile + ty) * n + bx * tile + tx, ld(acc, zero))))))
    body = _tloop(by, "blockIdx.y", n // tile, _tloop(bx, "blockIdx.x", n // tile,
                  Allocate(As, Allocate(Bs, threads))))
    launch = {"blockIdx.x": const(n // tile), "blockIdx.y": const(n // tile),
              "threadIdx.x": const(tile), "threadIdx.y": const(tile)}
    return PrimFunc("simt_gemm", [A, B, C], body, [], {"target": "cuda -arch=sm_80", "launch": launch})


def te_gemm(n: int, block: int = 64, threads: int = 16, k_tile: int = 8) -> tuple[te.Schedule, list[te.Tensor]]:
    """C = A @ B (n x n float32) as a te schedule: shared tiles of A and B per ``k_tile`` step
    loaded cooperatively, a ``block/threads``-square register tile of C per thread."""
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = te.create_schedule(C.op)
    AS = s.cache_read(A, "shared", [C])
    BS = s.cache_read(B, "shared", [C])
    AL = s.cache_read(AS, "local", [C])
    BL = s.cache_read(BS, "local", [C])
    CL = s.cache_write(C, "local")
    thread_x = te.thread_axis((0, threads), "threadIdx.x")
    thread_y = te.thread_axis((0, threads), "threadIdx.y")
    i, j = s[C].op.axis
    by, yi = s[C].split(i, factor=block)
    bx, xi = s[C].split(j, factor=block)
    ty, yi = s[C].split(yi, nparts=threads)
    tx, xi = s[C].split(xi, nparts=threads)
    s[C].reorder(by, bx, ty, tx, yi, xi)
    s[C].bind(by, te.thread_axis("blockIdx.y"))
    s[C].bind(bx, te.thread_axis("blockIdx.x"))
    s[C].bind(ty, thread_y)
    s[C].bind(tx, thread_x)
    s[CL].compute_at(s[C], tx)
    ci, cj = s[CL].op.axis
    ko, ki = s[CL].split(s[CL].op.reduce_axis[0], factor=k_tile)
    s[CL].reorder(ko, ki, ci, cj)
    s[AS].compute_at(s[CL], ko)
    s[BS].compute_at(s[CL], ko)
    s[AL].compute_at(s[CL], ki)
    s[BL].compute_at(s[CL], ki)
    for X in (AS, BS):
        fused = s[X].fuse(*s[X].op.axis)
        _, flat = s[X].split(fused, factor=threads * threads)
        fy, fx = s[X].split(flat, factor=threads)
        s[X].bind(fy, thread_y)
        s[X].bind(fx, thread_x)
    return s, [A, B, C]


BUDGET_S = 10.0  # the issue: "a 256^3 SIMT GEMM schedule emulated in <= 10 s"


def _time_runs(run: Callable[[np.ndarray, int, bool], None], n: int, want: np.ndarray, repeat: int,
               race_check: bool) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of ``repeat`` runs, each checked against numpy. The emulator is one
    Python thread, so on a quiet machine its wall time is its CPU time; on a shared one (other
    jobs on the cores) the wall time grows and the CPU time says what a quiet run would take."""
    walls, cpus = [], []
    for r in range(repeat):
        c = np.full((n, n), np.nan, np.float32)  # an element the kernel never writes fails the check
        t0, c0 = time.perf_counter(), time.process_time()
        run(c, r, race_check)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-4)
    return walls, cpus


def _line(race_check: bool, times: tuple[list[float], list[float]], budget: float | None) -> str:
    walls, cpus = times
    best, median = min(walls), sorted(walls)[len(walls) // 2]
    cpu = sorted(cpus)[len(cpus) // 2]
    verdict = "" if budget is None else (
        f"; {'within' if median <= budget else 'OVER'} the {budget:.0f} s budget")
    return (f"  race_check={race_check!s:5}: best {best:.2f} s, median {median:.2f} s wall (median CPU "
            f"{cpu:.2f} s) over {len(walls)} runs, result matches numpy{verdict}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mode", choices=("hand", "te", "both"), default="both")
    ap.add_argument("--block", type=int, default=64, help="te mode: C tile per thread block")
    ap.add_argument("--threads", type=int, default=16, help="te mode: threads per block side")
    ap.add_argument("--k-tile", type=int, default=8, help="te mode: k step of the shared tiles")
    args = ap.parse_args()
    n = args.n
    if hasattr(os, "getloadavg"):
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (a loaded machine stretches wall "
              "times; CPU times are what a quiet run takes)")
    rng = np.random.default_rng(0)
    a, b = rng.random((n, n), "float32"), rng.random((n, n), "float32")
    want = a @ b
    # the budget is stated for 256^3; other sizes print their times without a verdict
    budget = BUDGET_S if n == 256 else None

    if args.mode in ("hand", "both"):
        f = simt_gemm(n)
        print(f"hand-built IR SIMT GEMM {n}x{n}x{n}: {(n // 16) ** 2} blocks of 16x16 threads, shared "
              f"tiles of 16 over k, {2 * n // 16} barriers per block")
        for race_check in (True, False):
            times = _time_runs(lambda c, r, rc: emulate(f, a, b, c, seed=r, race_check=rc), n, want,
                               args.repeat, race_check)
            print(_line(race_check, times, budget))

    if args.mode in ("te", "both"):
        block, threads, k_tile = args.block, args.threads, args.k_tile
        s, tensors = te_gemm(n, block, threads, k_tile)
        t0 = time.perf_counter()
        g = tc.build(s, tensors, target="cuda")
        build_s = time.perf_counter() - t0
        blocks = math.ceil(n / block) ** 2
        reg = math.ceil(block / threads)
        print(f"te schedule SIMT GEMM {n}x{n}x{n} (tc.build target=cuda, {build_s:.1f} s to build): "
              f"{blocks} blocks of {threads}x{threads} threads, {reg}x{reg} registers of C per thread, "
              f"shared tiles {block}x{k_tile} of A and B")
        for race_check in (True, False):
            times = _time_runs(lambda c, r, rc: g.emulate(a, b, c, seed=r, race_check=rc), n, want,
                               args.repeat, race_check)
            print(_line(race_check, times, budget))


if __name__ == "__main__":
    main()

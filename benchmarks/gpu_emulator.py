"""Time the GPU emulator on a shared-memory tiled SIMT GEMM (the classic CUDA tutorial kernel).

The kernel is built by hand in the GPU IR (docs/gpu-ir.md): 16x16 threads per block, one
output element per thread, n/16 x n/16 blocks, the k loop in tiles of 16 staged through two
shared buffers with a barrier after the tile load and another after its use. It is emulated on
the CPU (`tecomp.runtime.gpu_emulator.emulate`) with the race detector on and off, checked
against numpy, and the wall time of each run is printed.

Usage: python benchmarks/gpu_emulator.py [--n 256] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    n = args.n
    f = simt_gemm(n)
    rng = np.random.default_rng(0)
    a, b = rng.random((n, n), "float32"), rng.random((n, n), "float32")
    want = a @ b
    print(f"SIMT GEMM {n}x{n}x{n}: {(n // 16) ** 2} blocks of 16x16 threads, shared tiles of 16 over k, "
          f"{2 * n // 16} barriers per block")
    for race_check in (True, False):
        times = []
        for r in range(args.repeat):
            c = np.zeros((n, n), "float32")
            t0 = time.perf_counter()
            emulate(f, a, b, c, seed=r, race_check=race_check)
            times.append(time.perf_counter() - t0)
            np.testing.assert_allclose(c, want, rtol=1e-4)
        print(f"  race_check={race_check!s:5}: best {min(times):.2f} s, median {sorted(times)[len(times) // 2]:.2f} s "
              f"over {args.repeat} runs (result matches numpy)")


if __name__ == "__main__":
    main()

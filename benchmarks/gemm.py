"""fp32 GEMM 1024x1024x1024 with a hand-written schedule vs numpy (OpenBLAS), same run.

Schedule (BLIS's loop nest, expressed with cache_write and compute_at):

* B is packed by a layout stage into panels ``Bp[j // nr, k, j % nr]``: the ``nr`` columns of
  one micro-kernel contiguous per k step (``nr`` = the micro-kernel's vectors x lanes);
* the micro-kernel is ``mr`` rows x ``nr`` columns of accumulators, sized from the target's
  vector width and register count (`tuning.space_rules.microkernel_shapes`): 6 x 16 floats
  on AVX2 (12 of the 16 ymm, + 2 B vectors + 1 broadcast), 6 x 64 on AVX-512 (24 of 32 zmm);
* the output is cut into ``mr x nc`` tiles, the column blocks outermost: all row tiles of one
  block reread its ``kc x nc`` slice of ``Bp`` from L2 (256 KiB); the tile's accumulator
  buffer (``CC``, ``mr x nc``) is computed at the tile, with the reduction split into ``kc``
  blocks outside the micro-kernels: the ``mr x kc`` piece of A stays in L1 while it serves
  all ``nc / nr`` micro-kernels, whose accumulators LLVM keeps in registers across the k loop;
* the column blocks run in parallel on all cores.

Printed beside the ratio: both GFLOP/s as fractions of this machine's fp32 FMA peak, measured by
benchmarks/peak.py (cached), so figures from machines with other vector widths compare.

Usage: python benchmarks/gemm.py [--n 1024] [--repeat 5] [--mr 6 --nr 16 --nc 256 --kc 256] [--asm]
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
from tecomp.codegen.target import Target  # noqa: E402
from tuning.space_rules import microkernel_shapes, vector_registers  # noqa: E402

NC = 256  # columns of a cache block: kc x nc floats of packed B = 256 KiB, within L2
KC = 256  # k block: the A piece (mr x kc, 6 KiB) and the accumulator tile stay in L1


def _fit(extent: int, want: int, step: int) -> int:
    """The largest multiple of ``step`` that divides ``extent`` and is at most ``want``
    (at least ``step``)."""
    best = step
    for v in range(step, min(want, extent) + 1, step):
        if extent % v == 0:
            best = v
    return best


def microkernel(m: int, target: str | Target = "llvm") -> tuple[int, int]:
    """``(mr, nr)``: rows x columns (floats) of the register tile for ``target``, the best
    shape of `microkernel_shapes` whose column count divides ``m``."""
    bits = Target.parse(target).vector_bits
    lanes = bits // 32
    shapes = microkernel_shapes(lanes, vector_registers(bits), m) or [(1, 1)]
    mr, nv = shapes[0]
    return mr, nv * lanes


def gemm_schedule(n: int, m: int, k: int, mr: int | None = None, nr: int | None = None,
                  nc: int = NC, kc: int = KC, target: str | Target = "llvm"):
    if mr is None or nr is None:
        mr0, nr0 = microkernel(m, target)
        mr, nr = mr or mr0, nr or nr0
    assert m % nr == 0, "the packed panels of B hold whole micro-kernel columns"
    nc = _fit(m, max(nc, nr), nr)
    kc = _fit(k, kc, 1)
    A = te.placeholder((n, k), "float32", name="A")
    B = te.placeholder((k, m), "float32", name="B")
    Bp = te.compute((m // nr, k, nr), lambda x, r, y: B[r, x * nr + y], name="Bp")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, r] * Bp[j // nr, r, j % nr], axis=r), name="C")
    s = te.create_schedule(C.op)
    x, _, y = s[Bp].op.axis
    s[Bp].parallel(x)
    s[Bp].vectorize(y)
    CC = s.cache_write(C, "local")
    i, j = s[C].op.axis
    io, jo, ii, ji = s[C].tile(i, j, mr, nc)
    s[C].reorder(jo, io, ii, ji)  # column blocks outermost: their B slice stays in L2
    # parallel over column blocks only: fusing them with the row tiles would hide the last,
    # partial row tile (n % mr) from loop partitioning, and every micro-kernel would keep a
    # variable row count (not unrolled, 1 FMA per loop trip instead of mr x nv)
    s[C].parallel(jo)
    s[C].vectorize(ji)
    s[CC].compute_at(s[C], io)
    ci, cj = s[CC].op.axis
    cjo, cji = s[CC].split(cj, factor=nr)
    ko, ki = s[CC].split(s[CC].op.reduce_axis[0], factor=kc)
    # micro-kernel: ki over the unrolled mr rows x the vectorized nr columns; LLVM promotes
    # the mr x nr accumulators of CC to registers across ki (CC is a private stack buffer)
    s[CC].reorder(ko, cjo, ki, ci, cji)
    s[CC].unroll(ci)
    s[CC].vectorize(cji)
    return s, [A, B, C]


def _loops(asm: str) -> dict[str, list[str]]:
    """The single-block loops of x86 assembly (AT&T syntax, as ``get_source("asm")`` prints
    it): label -> its instructions, up to the jump back to the label."""
    loops: dict[str, list[str]] = {}
    label: str | None = None
    body: list[str] = []
    for raw in asm.splitlines():
        line = raw.strip()
        if line.endswith(":"):
            label, body = line[:-1], []
        elif label is not None and line and not line.startswith((".", "#")):
            body.append(line)
            words = line.split()
            if words[0].startswith("j") and words[-1] == label:
                loops[label] = body
                label = None
    return loops


def inner_loop_stats(asm: str) -> dict[str, int]:
    """Counts in the hottest loop of x86 assembly: the single-block loop (`_loops`) with the
    most FMAs. ``fma``, ``broadcast`` (vbroadcastss, or an FMA's embedded ``{1toN}``), ``load`` (vector moves from memory),
    ``stack`` (instructions touching %rsp-relative memory: spills and reloads), ``other``
    (the rest: address arithmetic, loop control). All zero when no loop has FMAs."""
    keys = ("fma", "broadcast", "load", "stack", "other")
    best: dict[str, int] = dict.fromkeys(keys, 0)
    for body in _loops(asm).values():
        st = dict.fromkeys(keys, 0)
        for ins in body:
            name, _, ops = ins.partition("\t") if "\t" in ins else ins.partition(" ")
            if name.startswith(("vfmadd", "vfnmadd")):
                st["fma"] += 1
                # AVX-512 folds the broadcast into the FMA: (%rax){1to16}
                st["broadcast"] += "{1to" in ops
            elif name.startswith("vbroadcast"):
                st["broadcast"] += 1
            elif name.startswith("vmov") and "(" in ops.split(",")[0]:
                st["load"] += 1
            else:
                st["other"] += 1
            if "(%rsp" in ops:  # spills and reloads (%rbp is a plain register here)
                st["stack"] += 1
        if st["fma"] > best["fma"]:
            best = st
    return best


def _loop_text(asm: str) -> str:
    """The text of the loop `inner_loop_stats` picks (for --asm)."""
    loops = _loops(asm)
    best = max(loops, key=lambda k: sum(x.startswith("vfmadd") for x in loops[k]), default=None)
    return "" if best is None else best + ":\n\t" + "\n\t".join(loops[best])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--mr", type=int, default=None, help="micro-kernel rows (default: from the target)")
    ap.add_argument("--nr", type=int, default=None, help="micro-kernel columns, floats (default: from the target)")
    ap.add_argument("--nc", type=int, default=NC, help="columns of a cache block")
    ap.add_argument("--kc", type=int, default=KC, help="k block")
    ap.add_argument("--asm", action="store_true", help="print the micro-kernel loop's assembly")
    args = ap.parse_args()
    n = args.n
    pk = measure_peak(quick=True)
    t0 = time.perf_counter()
    mr, nr = microkernel(n)
    mr, nr = args.mr or mr, args.nr or nr
    s, params = gemm_schedule(n, n, n, mr, nr, args.nc, args.kc)
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
    asm = f.get_source("asm")
    fmas = fma_counts(asm)
    ymm = f", {fmas['ymm']} ymm" if fmas["ymm"] else ""
    print(f"fp32 GEMM {n}x{n}x{n}  (build {build_s:.2f} s, {fmas['zmm']} zmm FMAs in the assembly{ymm})")
    lanes = Target.host().vector_bits // 32
    st = inner_loop_stats(asm)
    print(f"  micro-kernel {mr} x {nr} ({mr * (nr // lanes)} accumulators of {vector_registers(lanes * 32)} "
          f"registers), nc {args.nc}, kc {args.kc}; its loop: {st['fma']} FMAs, {st['broadcast']} broadcasts, "
          f"{st['load']} loads, {st['stack']} stack accesses, {st['other']} other")
    if args.asm:
        print(_loop_text(asm))
    g_np, g_tc = flops / t_np / 1e9, flops / t_tc / 1e9
    print(f"  numpy (OpenBLAS): {g_np:8.1f} GFLOP/s  ({t_np * 1e3:.2f} ms)")
    print(f"  tecomp:           {g_tc:8.1f} GFLOP/s  ({t_tc * 1e3:.2f} ms)")
    print(f"  ratio tecomp/numpy: {t_np / t_tc:.2f}x   "
          + pk.fractions("compute", {"tecomp": g_tc, "numpy": g_np}))
    print(pk.line())


if __name__ == "__main__":
    main()

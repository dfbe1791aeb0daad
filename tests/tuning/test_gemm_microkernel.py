"""The GEMM micro-kernel: register-file-sized tiles (`tuning.space_rules.microkernel_shapes`),
the hand schedule of benchmarks/gemm.py built from them, and the tuner's prior that draws
them (`tuning.space_rules.draw_microkernel`)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tecomp as tc
import tuning
from tecomp.codegen.target import Target
from tuning import workloads
from tuning.space import Candidate, space_for
from tuning.space_rules import (
    MICROKERNEL_NC,
    MICROKERNEL_NC_FIT_WEIGHT,
    MICROKERNEL_PANEL_BYTES,
    _row_block,
    draw_microkernel,
    gemm_like,
    microkernel_shapes,
    small_gemm,
    tile_fits,
    vector_registers,
)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))

from gemm import gemm_schedule, inner_loop_stats, microkernel  # noqa: E402


@pytest.mark.parametrize("bits", [256, 512])
def test_shapes_fit_the_register_file(bits: int) -> None:
    lanes, regs = bits // 32, vector_registers(bits)
    shapes = microkernel_shapes(lanes, regs, 1024)
    assert shapes
    for mr, nv in shapes:
        assert mr * nv + nv + 1 <= regs  # accumulators + B vectors + the broadcast
        assert 1024 % (nv * lanes) == 0
    # AVX2: 6 rows x 2 ymm (12 of 16 registers); AVX-512: 6 rows x 4 zmm (24 of 32)
    assert shapes[0] == ((6, 2) if bits == 256 else (6, 4))


def test_microkernel_from_target() -> None:
    assert microkernel(1024, "llvm -mcpu=znver1") == (6, 16)
    assert microkernel(1024, "llvm -mcpu=skylake-avx512") == (6, 64)
    mr, nr = microkernel(1024)  # the host: whatever it is, the tile fits its registers
    bits = Target.host().vector_bits
    nv = nr // (bits // 32)
    assert mr * nv + nv + 1 <= vector_registers(bits)


@pytest.mark.parametrize("n,m,k,nc,kc", [(50, 128, 64, 64, 32), (24, 64, 96, 64, 96)])
def test_hand_schedule_matches_numpy(n: int, m: int, k: int, nc: int, kc: int) -> None:
    mr, nr = microkernel(m)
    if m % nr:
        pytest.skip(f"{nr}-column micro-kernel does not divide {m}")
    s, params = gemm_schedule(n, m, k, nc=nc, kc=kc)
    f = tc.build(s, params, target="llvm")
    rng = np.random.default_rng(0)
    a = rng.random((n, k), dtype=np.float32)
    b = rng.random((k, m), dtype=np.float32)
    c = np.zeros((n, m), np.float32)
    f(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4)


def test_hand_schedule_keeps_accumulators_in_registers() -> None:
    """The micro-kernel loop of the host's schedule: mr x nv FMAs, mr broadcasts, nv loads,
    no stack traffic (the accumulators are not spilled)."""
    m = 256
    mr, nr = microkernel(m)
    # whole row tiles only: a tail of n % mr rows is a loop of its own, which LLVM may unroll
    # into more FMAs than the micro-kernel's (4 rows x 4 zmm, twice, on AVX-512 at n = 256)
    n = 40 * mr
    s, params = gemm_schedule(n, m, 128, nc=128, kc=64)
    asm = tc.build(s, params, target="llvm").get_source("asm")
    st = inner_loop_stats(asm)
    nv = nr // (Target.host().vector_bits // 32)
    assert st["stack"] == 0, st
    assert st["fma"] % (mr * nv) == 0 and st["fma"] > 0, st
    assert st["broadcast"] * nv == st["fma"], st


def test_stats_see_spills() -> None:
    asm = ".LBB0_1:\n\tvmovups\t(%rsp), %ymm1\n\tvfmadd231ps\t%ymm1, %ymm2, %ymm3\n\tjne\t.LBB0_1\n"
    assert inner_loop_stats(asm) == {"fma": 1, "broadcast": 0, "load": 1, "stack": 1, "other": 1}


def test_gemm_like() -> None:
    def op(wl, *args):
        return wl(*args)[-1].op

    assert gemm_like(op(workloads.matmul, 64, 64, 64))
    assert gemm_like(op(workloads.batch_matmul, 2, 32, 32, 32))
    assert not gemm_like(op(workloads.conv2d, 1, 8, 16, 16, 8, 3, 3, 1, 1))


@pytest.mark.parametrize("target", ["llvm", "llvm -mcpu=znver1", "llvm -mcpu=skylake-avx512"])
def test_tuner_draws_the_microkernel(target: str) -> None:
    """Fresh samples of the matmul space hold register tiles of the target's micro-kernel,
    with a k block, and build to the right result (on the host)."""
    n = 128
    task = tuning.SearchTask(workloads.matmul, (n, n, n), target=target)
    sp = space_for(task)
    rng = np.random.default_rng(0)
    bits = Target.parse(target).vector_bits
    lanes, regs = bits // 32, vector_registers(bits)
    found = []
    for _ in range(40):
        c = sp.instantiate(0, {}, rng)
        assert c is not None
        d = c.param_dict
        si, sj = d["C/S0"], d["C/S1"]
        # the column micro-kernels outside the k block (S1), their accumulators attached there
        if si[1] == 1 and sj[1] == 1 and sj[2] % lanes == 0 and d["C/at"] == 1 and d["C/vec"] == 1:
            mr, nv = si[2], sj[2] // lanes
            if (mr, nv) in microkernel_shapes(lanes, regs, n)[:3]:
                found.append(c)
    assert len(found) >= 5
    if target != "llvm":  # other CPUs' code may not run here
        return
    _check_matmul(task, found[0], (n, n, n), rng)


@pytest.mark.parametrize("sketch", ["C:tile", "C:tile+cache"])
@pytest.mark.parametrize("target", ["llvm", "llvm -mcpu=znver1", "llvm -mcpu=skylake-avx512"])
def test_small_gemm_samples_draw_the_register_tile(target: str, sketch: str) -> None:
    """Attention's per-head GEMM (12 x 128x128x64) is too small for cache blocks of columns:
    fresh samples of both GEMM sketches mostly hold a register tile of the target (rows dividing 128,
    whole vectors of columns), k around it, vectorized and unrolled, nothing packed; they
    build to the right result on the host."""
    task = tuning.SearchTask(workloads.batch_matmul, (12, 128, 128, 64), target=target)
    sp = space_for(task)
    (plain,) = [k for k, s in enumerate(sp.sketches) if s.describe() == sketch]
    bits = Target.parse(target).vector_bits
    lanes, regs = bits // 32, vector_registers(bits)
    rng = np.random.default_rng(0)
    found = []
    for _ in range(24):
        c = sp.instantiate(plain, {}, rng)
        assert c is not None
        d = c.param_dict
        si, sj = d["C/S1"], d["C/S2"]
        # the cached sketch keeps its accumulators at the register tile (at 1)
        tile = d["C/unroll_tile"] == 1 if sketch == "C:tile" else d["C/at"] == 1
        if si[:2] == (1, 1) and sj[:2] == (1, 1) and d["C/vec"] == 1 and tile:
            mr, nv = si[2], sj[2] // lanes
            assert 128 % mr == 0 and sj[2] % lanes == 0 and (mr, nv) in microkernel_shapes(lanes, regs, 64)
            assert d["C/pack_B"] == 0 and d["C/S0"] == (1, 1, 1)
            found.append(c)
    assert 6 <= len(found) <= 20  # about half: the other half are uniform draws
    assert not small_gemm(4, 4, 4) and not small_gemm(1024, 1024, 1024) and small_gemm(128, 64, 128)
    if target != "llvm":  # other CPUs' code may not run here
        return
    a = rng.random((12, 128, 128), dtype=np.float32)
    b = rng.random((12, 128, 64), dtype=np.float32)
    for c in found[:2]:
        s, params = task.apply_steps(c.steps)
        out = np.zeros((12, 128, 64), np.float32)
        tc.build(s, params, target="llvm")(a, b, out)
        np.testing.assert_allclose(out, a @ b, rtol=1e-4)


def test_tile_fits_a_partial_last_tile() -> None:
    """1024 rows are 171 micro-kernels of 6 (the last one partial), not 172."""
    assert tile_fits((171, 1, 6), 3, 1024, 64)
    assert not tile_fits((172, 1, 6), 3, 1024, 64)
    assert not tile_fits((1, 1, 128), 3, 1024, 64)  # innermost beyond the bound
    assert not tile_fits((2, 2), 3, 1024, 64) and not tile_fits(None, 1, 8, 64)


def test_tuner_draws_all_row_blocks_and_long_k_blocks() -> None:
    """The prior offers one cache block of all the rows (each column block's B packed once,
    the same work per parallel iteration) and k blocks beyond 64 (accumulators kept in
    registers over more of k); such a candidate, with a partial last row tile, builds to
    numpy's result."""
    n, m, k = 100, 256, 512
    task = tuning.SearchTask(workloads.matmul, (n, k, m), target="llvm -mcpu=znver1")
    sp = space_for(task)
    rng = np.random.default_rng(0)
    found = None
    kcs: set[int] = set()
    for _ in range(200):
        c = sp.instantiate(0, {}, rng)
        assert c is not None
        d = c.param_dict
        si, kc = d["C/S0"], d["C/R0"][0]
        if si[1] == 1 and si[2] == 6 and d["C/at"] == 1:  # the micro-kernel prior's draw
            kcs.add(kc)
            if si[0] * 6 >= n and kc >= 256:
                found = c
    assert kcs >= {64, 256, 512}, kcs
    assert found is not None
    _check_matmul(task, found, (n, k, m), rng)


def test_row_blocks_are_cut_equal() -> None:
    """A cache block of about 384 rows cuts 1024 rows into three blocks of 342 (57
    micro-kernels of 6, the last block 340 rows), not 384 + 384 + 256: equal work per
    parallel iteration. All rows is one block, and a target beyond the rows is all rows."""
    assert _row_block(1024, 6, 384) == 342
    assert _row_block(1024, 6, 0) == _row_block(1024, 6, 4096) == 1026
    assert _row_block(128, 6, 384) == 132  # before: 126 rows and a 2-row block of their own
    for ei, mr, target in [(1024, 6, 96), (1024, 6, 192), (1024, 4, 384), (3072, 6, 384), (768, 6, 384)]:
        mc = _row_block(ei, mr, target)
        blocks = -(-ei // mc)
        assert mc % mr == 0 and tile_fits((mc // mr, 1, mr), 3, ei, 64)
        assert blocks == -(-ei // target)  # as many blocks as the target asks
        # the last block short by less than a micro-kernel per block (384 + 384 + 256 is not)
        assert ei - (blocks - 1) * mc >= mc - blocks * mr
    # the prior's draws on GEMM 1024^3 use these blocks only
    task = tuning.SearchTask(workloads.matmul, (1024, 1024, 1024), target="llvm -mcpu=znver1")
    sp = space_for(task)
    rng = np.random.default_rng(1)
    rows: set[int] = set()
    for _ in range(200):
        c = sp.instantiate(0, {}, rng)
        assert c is not None
        d = c.param_dict
        if d["C/S0"][1:] == (1, 6) and d["C/at"] == 1:
            rows.add(d["C/S0"][0] * 6)
    assert rows <= {96, 174, 342, 1026} and 1026 in rows and 342 in rows, rows


def _check_matmul(task: tuning.SearchTask, cand: Candidate, nkm: tuple[int, int, int],
                  rng: np.random.Generator) -> None:
    """``cand`` of the matmul ``task`` (n x k times k x m), built for the host, gives numpy's
    product."""
    n, k, m = nkm
    s, params = task.apply_steps(cand.steps)
    f = tc.build(s, params, target="llvm")
    a = rng.random((n, k), dtype=np.float32)
    b = rng.random((k, m), dtype=np.float32)
    c_out = np.zeros((n, m), np.float32)
    f(a, b, c_out)
    np.testing.assert_allclose(c_out, a @ b, rtol=1e-4)


def _column_blocks(ei: int, ej: int, ek: int, rng: np.random.Generator, n: int = 400) -> dict[int, int]:
    """How often each cache block width ``nc`` is among ``n`` draws of `draw_microkernel` (AVX2)."""
    counts: dict[int, int] = {}
    for _ in range(n):
        t = draw_microkernel(ei, ej, ek, 256, rng)
        if t is not None:
            nc = t["j"][0] * t["j"][2]
            counts[nc] = counts.get(nc, 0) + 1
    return counts


def test_column_blocks_whose_panel_fits_l2_are_drawn_most() -> None:
    """The micro-kernels of a row run along ``nc`` columns, whose B panel (all of k) the row
    blocks reread: for 1024^3 only nc 64 keeps it within `MICROKERNEL_PANEL_BYTES` (256 KiB),
    and it is drawn `MICROKERNEL_NC_FIT_WEIGHT` times as often as each wider block. The 64-column
    block does not change which GEMMs count as small: attention's 128 x 64 x 128 still does."""
    rng = np.random.default_rng(0)
    counts = _column_blocks(1024, 1024, 1024, rng)
    assert set(counts) == set(MICROKERNEL_NC), counts
    share = MICROKERNEL_NC_FIT_WEIGHT / (MICROKERNEL_NC_FIT_WEIGHT + len(MICROKERNEL_NC) - 1)
    assert abs(counts[64] / sum(counts.values()) - share) < 0.08, counts
    assert 4 * 1024 * 64 <= MICROKERNEL_PANEL_BYTES < 4 * 1024 * 128
    # a shallow GEMM's wider panels fit too: drawn alike
    wide = _column_blocks(512, 512, 128, rng)
    assert all(abs(v / sum(wide.values()) - 0.25) < 0.08 for v in wide.values()), wide
    assert small_gemm(128, 64, 128) and small_gemm(128, 192, 128) and not small_gemm(128, 128, 128)
    assert draw_microkernel(128, 64, 128, 256, np.random.default_rng(1)) is None

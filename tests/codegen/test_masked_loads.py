"""Masked vector loads whose mask has lanes known false at run time: a padded tile copied by
vectors wider than the tile (the last lanes masked off by the tile's edge) under a row
condition. LLVM 22's x86 backend loads such lanes from memory instead of zeroing them
(`codegen.memory.MemoryMixin._masked_zero`); tecomp emits AVX's own masked loads on AVX/AVX2
targets (`codegen.llvm_cpu.CodegenCPU._masked_zero`) and a select on the frozen generic load
elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.codegen.target import Target

ROWS, COLS, TILE = 60, 28, 7  # 62 padded rows: a row loop LLVM does not unroll whole


def _padded_tile_copy(dtype: str, lanes: int) -> tuple[te.Schedule, list[te.Tensor]]:
    """C[y, x] = P[y, x] + P[y + 1, x + 1] + P[y + 2, x + 2], P the zero-padded A; P is
    computed per 7-column tile of C and copied by ``lanes``-wide vectors (9 columns)."""
    A = te.placeholder((ROWS, COLS), dtype, name="A")
    P = te.compute((ROWS + 2, COLS + 2),
                   lambda y, x: te.if_then_else(te.all(y >= 1, y < ROWS + 1, x >= 1, x < COLS + 1),
                                                A[y - 1, x - 1], 0.0 if dtype.startswith("float") else 0), name="P")
    C = te.compute((ROWS, COLS), lambda y, x: P[y, x] + P[y + 1, x + 1] + P[y + 2, x + 2], name="C")
    s = te.create_schedule(C.op)
    y, x = s[C].op.axis
    xo, xi = s[C].split(x, factor=TILE)
    s[C].reorder(xo, y, xi)
    s[P].compute_at(s[C], xo)
    _, px = s[P].op.axis
    _, pxi = s[P].split(px, factor=lanes)
    s[P].vectorize(pxi)
    return s, [A, C]


def _reference(a: np.ndarray) -> np.ndarray:
    p = np.pad(a, 1)
    return p[:ROWS, :COLS] + p[1:ROWS + 1, 1:COLS + 1] + p[2:, 2:]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("lanes", [16, 7, 4, 3])
def test_masked_off_lanes_of_a_padded_tile_are_zero(dtype: str, lanes: int) -> None:
    s, args = _padded_tile_copy(dtype, lanes)
    f = tc.build(s, args)
    a = np.random.default_rng(0).integers(1, 100, (ROWS, COLS)).astype(dtype)
    c = np.zeros((ROWS, COLS), dtype)
    f(a, c)
    np.testing.assert_array_equal(c, _reference(a))


@pytest.mark.parametrize("lanes", [16, 7])
def test_avx2_targets_load_by_avx_maskload_and_avx512_by_a_frozen_select(lanes: int) -> None:
    s, args = _padded_tile_copy("float32", lanes)
    avx2 = tc.build(s, args, target="llvm -mcpu=znver1").get_source("ll")
    assert "llvm.x86.avx.maskload.ps.256" in avx2
    s, args = _padded_tile_copy("float32", lanes)
    avx512 = tc.build(s, args, target="llvm -mcpu=skylake-avx512").get_source("ll")
    assert "llvm.x86.avx.maskload" not in avx512
    if Target.host().has_feature("avx2") and not Target.host().has_feature("avx512f"):
        s, args = _padded_tile_copy("float32", lanes)
        f = tc.build(s, args, target="llvm -mcpu=znver1")
        a = np.random.default_rng(1).standard_normal((ROWS, COLS)).astype("float32")
        c = np.zeros((ROWS, COLS), "float32")
        f(a, c)
        np.testing.assert_allclose(c, _reference(a), rtol=1e-6)

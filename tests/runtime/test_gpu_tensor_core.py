"""Tensor cores through tensorize: ldmatrix + mma.sync.m16n8k16 (fp16/bf16 in, fp32 accumulate).

The emulator's fragment tables (tecomp/runtime/gpu_mma.py) are checked against a numpy
derivation from the ISA's 8x8 building block; the intrinsics (tecomp/te/intrin_cuda.py) and
the codegen are checked by emulating whole kernels against numpy and through ptxas.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tecomp as tc
from tecomp.codegen.ptxas import find_ptxas
from tecomp.errors import TecompError
from tecomp.ir import dtype as dt
from tecomp.ir.buffer import Buffer
from tecomp.ir.expr import LT, BufferLoad, Call, FloorDiv, FloorMod, Var, const
from tecomp.ir.stmt import Allocate, BufferStore, Evaluate, For, ForKind, IfThenElse, PrimFunc, barrier, seq
from tecomp.runtime import gpu_mma
from tecomp.runtime.gpu_emulator import emulate
from tecomp.te import intrin_cuda as tci

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas (CUDA toolkit) not installed")
ARCHS = ["sm_80", "sm_90"]


def _bench() -> Any:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_gemm.py"
    spec = importlib.util.spec_from_file_location("gpu_gemm_bench", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpu_gemm_bench", mod)
    spec.loader.exec_module(mod)
    return mod


bench = _bench()
tc_gemm = bench.tensor_core_gemm_schedule


# ---- an independent derivation of the fragment layouts -----------------------------------
def _block_layout() -> np.ndarray:
    """The ISA's building block, an 8x8 matrix of b16 spread over a warp: lane l holds row
    l // 4, columns 2 (l % 4) and 2 (l % 4) + 1. [32, 2] -> flat index row * 8 + col."""
    m = np.arange(64).reshape(8, 8)
    return m.reshape(8, 4, 2).reshape(32, 2)  # rows of 8 = 4 lanes x 2 elements


def _layout_from_blocks(shape: tuple[int, int], blocks: list[tuple[int, int]], transpose: bool = False
                        ) -> np.ndarray:
    """[32, 2 * len(blocks), 2]: (row, col) each lane holds, register after register; block
    ``(r0, c0)`` is the 8x8 piece at that origin (of the transposed matrix when ``transpose``)."""
    blk = _block_layout()
    rows, cols = np.divmod(blk, 8)
    out = np.zeros((32, 2 * len(blocks), 2), np.int64)
    for j, (r0, c0) in enumerate(blocks):
        r, c = rows + r0, cols + c0
        if transpose:
            r, c = c, r
        out[:, 2 * j: 2 * j + 2, 0], out[:, 2 * j: 2 * j + 2, 1] = r, c
    assert out[..., 0].max() < shape[0] and out[..., 1].max() < shape[1]
    return out


# A (16x16, row): a0a1 | a2a3 | a4a5 | a6a7 = blocks at (0,0), (8,0), (0,8), (8,8)
A_LAYOUT = _layout_from_blocks((16, 16), [(0, 0), (8, 0), (0, 8), (8, 8)])
# B (16x8, col): B^T (8x16, n x k) in blocks (0,0) (k 0-7) and (0,8) (k 8-15)
B_LAYOUT = _layout_from_blocks((16, 8), [(0, 0), (0, 8)], transpose=True)
# C (16x8 f32): c0c1 | c2c3 = blocks at (0,0), (8,0)
C_LAYOUT = _layout_from_blocks((16, 8), [(0, 0), (8, 0)])


def test_fragment_tables_match_the_isa_building_block() -> None:
    np.testing.assert_array_equal(gpu_mma.MMA_A, A_LAYOUT)
    np.testing.assert_array_equal(gpu_mma.MMA_B, B_LAYOUT)
    np.testing.assert_array_equal(gpu_mma.MMA_C, C_LAYOUT)
    # every element of each matrix is held by exactly one (lane, register)
    for t, shape in ((gpu_mma.MMA_A, (16, 16)), (gpu_mma.MMA_B, (16, 8)), (gpu_mma.MMA_C, (16, 8))):
        flat = t[..., 0] * shape[1] + t[..., 1]
        assert sorted(flat.ravel().tolist()) == list(range(shape[0] * shape[1]))


def test_a_wrong_lane_mapping_is_caught_by_the_table_check() -> None:
    bad = gpu_mma.MMA_A.copy()
    bad[:, [2, 3, 4, 5]] = bad[:, [4, 5, 2, 3]]  # a2a3 <-> a4a5: rows/cols of the halves swapped
    assert not np.array_equal(bad, A_LAYOUT)


# ---- the warp-level semantics alone ---------------------------------------------------------
@pytest.mark.parametrize("num", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_alone(num: int, trans: bool) -> None:
    rng = np.random.default_rng(num)
    mats = rng.integers(0, 1000, size=(2, num, 8, 8))  # 2 warps
    rows = np.zeros((2, 32, 8), np.int64)
    for m in range(num):
        rows[:, 8 * m: 8 * m + 8] = mats[:, m]  # lane 8m + r supplies row r of matrix m
    out = gpu_mma.ldmatrix_warp(rows, num, trans)
    blk = _block_layout()
    for w in range(2):
        for m in range(num):
            mat = mats[w, m].T if trans else mats[w, m]
            np.testing.assert_array_equal(out[w, :, 2 * m: 2 * m + 2], mat.ravel()[blk])


def _scatter(layout: np.ndarray, mat: np.ndarray) -> np.ndarray:
    return mat[layout[..., 0], layout[..., 1]]


def test_mma_alone_on_known_fragments() -> None:
    rng = np.random.default_rng(1)
    A = rng.standard_normal((16, 16)).astype(np.float16).astype(np.float32)
    B = rng.standard_normal((16, 8)).astype(np.float16).astype(np.float32)
    C = rng.standard_normal((16, 8)).astype(np.float32)
    d = gpu_mma.mma_warp(_scatter(A_LAYOUT, A)[None], _scatter(B_LAYOUT, B)[None],
                         _scatter(C_LAYOUT, C)[None])[0]
    D = np.zeros((16, 8), np.float32)
    D[C_LAYOUT[..., 0], C_LAYOUT[..., 1]] = d
    np.testing.assert_allclose(D, A.astype(np.float64) @ B + C, rtol=1e-6, atol=1e-5)


# ---- hand-written kernels: ldmatrix into a fragment, out to global ----------------------------
def _ldmatrix_kernel(trans: bool, divergent: bool = False, sync: bool = True) -> PrimFunc:
    """Each lane of one warp writes the 8 elements ldmatrix.x4 gave it to out[lane, :]."""
    A = Buffer("A", (const(256),), "float16")
    out = Buffer("out", (const(256),), "float16")
    AS = Buffer("AS", (const(256),), "float16", scope="shared")
    frag = Buffer("frag", (const(256),), "float16", scope=tci.MATRIX_A)
    tx = Var("tx", "int32")
    row = FloorMod(tx, const(16)) * 16 + FloorDiv(tx, const(16)) * 8
    ld: Any = Evaluate(Call("int32", tci.LDMATRIX, (
        const(int(trans)), const(4), Call("handle", "address_of", (BufferLoad(frag, (const(0),)),)),
        Call("handle", "address_of", (BufferLoad(AS, (row,)),)))))
    if divergent:
        ld = IfThenElse(LT(tx, const(16)), ld)
    copy = [BufferStore(AS, BufferLoad(A, (tx * 8 + r,)), (tx * 8 + r,)) for r in range(8)]
    outs = [BufferStore(out, BufferLoad(frag, (const(j),)), (tx * 8 + j,)) for j in range(8)]
    body = Allocate(AS, seq(*copy, *([barrier()] if sync else []), Allocate(frag, seq(ld, *outs))))
    body = For(tx, const(0), const(32), ForKind.THREAD_BINDING, body, (("thread_tag", "threadIdx.x"),))
    bx = Var("bx", "int32")
    body = For(bx, const(0), const(1), ForKind.THREAD_BINDING, body, (("thread_tag", "blockIdx.x"),))
    return PrimFunc("ldm", [A, out], body,
                    attrs={"launch": {"blockIdx.x": const(1), "threadIdx.x": const(32)}})


def _expected_ldmatrix(a: np.ndarray, trans: bool) -> np.ndarray:
    """From the ISA: matrix m is the 8x8 piece at ((m % 2) * 8, (m // 2) * 8) of the 16x16 A."""
    blk = _block_layout()
    out = np.zeros((32, 8), a.dtype)
    for m in range(4):
        piece = a[(m % 2) * 8: (m % 2) * 8 + 8, (m // 2) * 8: (m // 2) * 8 + 8]
        out[:, 2 * m: 2 * m + 2] = (piece.T if trans else piece).ravel()[blk]
    return out


@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_kernel_emulated(trans: bool) -> None:
    a = np.arange(256, dtype=np.float16)
    out = np.zeros(256, np.float16)
    emulate(_ldmatrix_kernel(trans), a, out)
    np.testing.assert_array_equal(out.reshape(32, 8), _expected_ldmatrix(a.reshape(16, 16), trans))
    if not trans:  # the A fragment of the ISA's mma table
        np.testing.assert_array_equal(out.reshape(32, 8), _scatter(A_LAYOUT, a.reshape(16, 16)))


def test_warp_divergent_ldmatrix_is_an_error() -> None:
    a = np.arange(256, dtype=np.float16)
    with pytest.raises(gpu_mma.WarpDivergenceError, match="lanes .*16.* do not execute it"):
        emulate(_ldmatrix_kernel(False, divergent=True), a, np.zeros(256, np.float16))


# ---- the GEMM through tensorize -------------------------------------------------------------
def _inputs(m: int, n: int, k: int, dtype: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Arrays for the kernel (bfloat16 as uint16 bits) and the float32 reference."""
    rng = np.random.default_rng(seed)
    a32 = rng.standard_normal((m, k)).astype(np.float32)
    b32 = rng.standard_normal((k, n)).astype(np.float32)
    if dtype == "float16":
        a, b = a32.astype(np.float16), b32.astype(np.float16)
        ref = a.astype(np.float64) @ b.astype(np.float64)
    else:
        a, b = dt.f32_to_bf16_bits(a32), dt.f32_to_bf16_bits(b32)
        ref = dt.bf16_bits_to_f32(a).astype(np.float64) @ dt.bf16_bits_to_f32(b).astype(np.float64)
    return a, b, ref.astype(np.float32)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tensor_core_gemm_256_emulated(dtype: str) -> None:
    n = 256
    s, args = tc_gemm(n, n, n, dtype)
    f = tc.build(s, args, target="cuda -arch=sm_80")
    a, b, ref = _inputs(n, n, n, dtype)
    c = np.full((n, n), np.nan, np.float32)
    f.emulate(a, b, c)
    # fp32 accumulation in another order than the float64 reference: |err| ~ K * eps * |terms|
    np.testing.assert_allclose(c, ref, rtol=1e-4, atol=1e-3)


def test_non_square_gemm_and_other_tiles() -> None:
    s, args = tc_gemm(64, 128, 96, block=(64, 64), warps=(2, 1), kstep=32)
    f = tc.build(s, args, target="cuda -arch=sm_90")
    a, b, ref = _inputs(64, 128, 96, "float16", seed=3)
    c = np.zeros((64, 128), np.float32)
    f.emulate(a, b, c)
    np.testing.assert_allclose(c, ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("which", ["A", "B", "C"])
def test_a_wrong_emulator_table_shows_as_a_gemm_mismatch(which: str, monkeypatch: Any) -> None:
    table = {"A": "MMA_A", "B": "MMA_B", "C": "MMA_C"}[which]
    bad = getattr(gpu_mma, table).copy()
    bad[[0, 1]] = bad[[1, 0]]  # lanes 0 and 1 swapped
    monkeypatch.setattr(gpu_mma, table, bad)
    s, args = tc_gemm(64, 64, 32, block=(64, 64), warps=(2, 2), kstep=32)
    f = tc.build(s, args, target="cuda -arch=sm_80")
    a, b, ref = _inputs(64, 64, 32, "float16")
    c = np.zeros((64, 64), np.float32)
    f.emulate(a, b, c)
    assert np.abs(c - ref).max() > 1e-2


def test_a_wrong_intrinsic_layout_shows_as_a_gemm_mismatch(monkeypatch: Any) -> None:
    """The other side: the intrinsic's ldmatrix addresses, fed a wrong lane -> row mapping."""
    real = tci.FloorMod

    def wrong(a: Any, b: Any) -> Any:  # lane % 16 -> (lane + 1) % 16 in the ldmatrix addresses
        if isinstance(a, Var) and a.name == "lane" and getattr(b, "value", None) == 16:
            return real(a + 1, b)
        return real(a, b)

    monkeypatch.setattr(tci, "FloorMod", wrong)
    s, args = tc_gemm(64, 64, 32, block=(64, 64), warps=(2, 2), kstep=32)
    f = tc.build(s, args, target="cuda -arch=sm_80")
    a, b, ref = _inputs(64, 64, 32, "float16")
    c = np.zeros((64, 64), np.float32)
    f.emulate(a, b, c)
    assert np.abs(c - ref).max() > 1e-2


def test_fragment_ir_representation() -> None:
    s, args = tc_gemm(128, 128, 64)
    text = str(tc.lower(s, args, target="cuda -arch=sm_80"))
    assert f"scope={tci.ACCUMULATOR!r}" in text or tci.ACCUMULATOR in text
    assert "ptx_ldmatrix(0, 4," in text and "ptx_ldmatrix(1, 4," in text
    assert "ptx_mma('m16n8k16', 'float16'" in text


def test_mma_needs_fragments() -> None:
    from tecomp import te

    A = te.placeholder((16, 16), "float16", name="A")
    B = te.placeholder((16, 8), "float16", name="B")
    k = te.reduce_axis((0, 16), name="k")
    C = te.compute((16, 8), lambda i, j: te.sum(A[i, k].astype("float32") * B[k, j].astype("float32"),
                                                axis=k), name="C")
    s = te.create_schedule(C.op)
    s[C].tensorize(C.op.axis[0], tci.mma_sync())
    with pytest.raises(TecompError, match="tensor-core fragment"):
        tc.lower(s, [A, B, C], target="cuda -arch=sm_80")


# ---- software-pipelined (cp.async ring buffers read by ldmatrix) -----------------------------
# every depth and both dtypes, not their cross product: the dtype changes only the mma's
# operand type, the depth only the ring (the emulated 256^3 gemm is seconds per case)
@pytest.mark.parametrize(("dtype", "depth"), [("float16", 2), ("bfloat16", 3), ("float16", 4),
                                              ("bfloat16", 4)])
def test_pipelined_tensor_core_gemm_256_emulated(depth: int, dtype: str) -> None:
    """The benchmark's knobs per depth (128x128 blocks, 2x2 warps; k-step 32, or 16 at depth
    4; padded rows where they fit 48 KB): ldmatrix reads the slot of the ring the wait has
    retired (the emulator would raise on a read of a copy in flight)."""
    n = 256
    knobs = bench.tc_knobs(depth)
    s, args = tc_gemm(n, n, n, dtype, **knobs)
    f = tc.build(s, args, target="cuda -arch=sm_80")
    tir = f.get_source("tir")
    assert "cp_async_commit_group()" in tir and f"cp_async_wait_group({depth - 2})" in tir
    a, b, ref = _inputs(n, n, n, dtype, seed=depth)
    c = np.full((n, n), np.nan, np.float32)
    f.emulate(a, b, c)
    np.testing.assert_allclose(c, ref, rtol=1e-4, atol=1e-3)


def test_pipelined_ldmatrix_addresses_the_ring_slot() -> None:
    """Tensorized ldmatrix addresses its tile with one flat offset (address_of(AS[off])): the
    pipeline pass adds the slot's offset (a padded slot: rows x padded row length) instead of
    taking the offset for a row index of the ring buffer."""
    s, args = tc_gemm(32, 32, 64, block=(32, 32), warps=(1, 1), kstep=16, depth=2, pad=8)
    text = str(tc.lower(s, args, target="cuda -arch=sm_80"))
    # A's slot: 32 rows of 16 + 8; B's slot: 16 rows of 32 + 8
    assert re.search(r"address_of\(A_shared\[lane % 16 \* 24 \+ lane // 16 \* 8 \+ 768\]\)", text), text
    assert re.search(r"address_of\(B_shared\[lane % 16 \* 40 \+ lane // 16 \* 8 \+ 640\]\)", text), text
    a, b, ref = _inputs(32, 32, 64, "float16")
    c = np.zeros((32, 32), np.float32)
    tc.build(s, args, target="cuda -arch=sm_80").emulate(a, b, c)
    np.testing.assert_allclose(c, ref, rtol=1e-4, atol=1e-3)


def test_a_misplaced_wait_before_ldmatrix_is_caught(monkeypatch: Any) -> None:
    """Waiting for one group too few leaves tile k in flight when ldmatrix reads it."""
    from tecomp.passes import inject_software_pipeline as isp
    from tecomp.runtime.gpu_async import AsyncCopyError

    real = isp.wait_group
    monkeypatch.setattr(isp, "wait_group", lambda n: real(n + 1))
    s, args = tc_gemm(64, 64, 128, block=(64, 64), warps=(2, 2), kstep=32, depth=3)
    f = tc.build(s, args, target="cuda -arch=sm_80")
    a, b, _ = _inputs(64, 64, 128, "float16")
    with pytest.raises(AsyncCopyError, match="A_shared|B_shared"):
        f.emulate(a, b, np.zeros((64, 64), np.float32))


@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS)
def test_pipelined_tensor_core_gemm_4096_depth3_resources(arch: str) -> None:
    knobs = bench.tc_knobs(3)
    s, args = tc_gemm(4096, 4096, 4096, **knobs)
    f = tc.build(s, args, target=f"cuda -arch={arch}")
    ptx = f.get_source("ptx")
    assert "cp.async.cg.shared.global" in ptx and ", 16;" in ptx
    assert re.search(r"cp\.async\.wait_group\s+1;", ptx) and "cp.async.commit_group;" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    r = f.resources
    assert r is not None and r.spill_stores == 0 and r.spill_loads == 0 and r.local_bytes == 0
    assert r.shared_bytes == bench.tc_shared_bytes(knobs["block"], knobs["kstep"], 3, knobs["pad"])
    assert r.shared_bytes <= f.target.gpu.static_smem
    assert r.registers * 128 <= f.target.gpu.registers_per_sm


@needs_ptxas
def test_padded_ring_passes_ptxas() -> None:
    s, args = tc_gemm(256, 256, 256, "bfloat16", depth=2, pad=8)
    f = tc.build(s, args, target="cuda -arch=sm_90")
    r = f.resources
    assert r is not None and r.spill_stores == 0
    assert r.shared_bytes == 2 * (128 * 40 + 32 * 136) * 2


# ---- ptxas ----------------------------------------------------------------------------------
@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tensor_core_gemm_passes_ptxas(arch: str, dtype: str) -> None:
    s, args = tc_gemm(256, 256, 256, dtype)
    f = tc.build(s, args, target=f"cuda -arch={arch}")
    ptx = f.get_source("ptx")
    ab = "f16" if dtype == "float16" else "bf16"
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{ab}.{ab}.f32" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    assert not re.search(r"\bld\.local|\bst\.local", ptx)  # fragments stay in registers
    r = f.resources
    assert r is not None and r.spill_stores == 0 and r.spill_loads == 0 and r.local_bytes == 0
    assert r.shared_bytes == 2 * 128 * 32 * 2 and r.registers <= 255


@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS)
def test_tensor_core_gemm_4096_resources(arch: str) -> None:
    s, args = tc_gemm(4096, 4096, 4096)
    f = tc.build(s, args, target=f"cuda -arch={arch}")
    r = f.resources
    assert r is not None and r.spill_stores == 0 and r.spill_loads == 0
    assert r.registers * 128 <= f.target.gpu.registers_per_sm


@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS)
def test_hand_written_ldmatrix_kernel_passes_ptxas(arch: str) -> None:
    from tecomp.codegen.llvm_nvptx import codegen_nvptx, emit_ptx
    from tecomp.codegen.ptxas import ptxas_resources
    from tecomp.codegen.target import Target

    t = Target.parse(f"cuda -arch={arch}")
    ptx = emit_ptx(codegen_nvptx([_ldmatrix_kernel(True)], t).module, t)
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    assert ptxas_resources(ptx, arch)["ldm"].spill_stores == 0


def test_refused_below_sm_80() -> None:
    s, args = tc_gemm(128, 128, 64)
    with pytest.raises(TecompError, match="needs sm_80 or newer.*sm_75"):
        tc.build(s, args, target="cuda -arch=sm_75")


def test_threadidx_x_must_be_the_lane() -> None:
    """A lane loop narrower than the launch (64 threadIdx.x) would leave lanes out: refused."""
    from tecomp.codegen.llvm_nvptx import codegen_nvptx
    from tecomp.codegen.target import Target

    f = _ldmatrix_kernel(False, sync=False)
    f.attrs["launch"]["threadIdx.x"] = const(64)
    with pytest.raises(TecompError, match="warp-collective"):
        codegen_nvptx([f], Target.parse("cuda -arch=sm_80"))


# ---- on a device ----------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tensor_core_gemm_on_the_gpu(dtype: str) -> None:
    from tecomp.runtime import cuda

    dev = cuda.get_device(0)
    if dev.compute_capability < (8, 0):
        pytest.skip(f"tensor cores need sm_80, the device is {dev.arch}")
    arch = dev.arch if dev.compute_capability < (10, 0) else "sm_90"
    n = 512
    s, args = tc_gemm(n, n, n, dtype)
    f = tc.build(s, args, target=f"cuda -arch={arch}")
    a, b, ref = _inputs(n, n, n, dtype)
    c = np.zeros((n, n), np.float32)
    f(a, b, c)
    np.testing.assert_allclose(c, ref, rtol=1e-3, atol=1e-2)
    ce = np.zeros((n, n), np.float32)
    f.emulate(a, b, ce)
    np.testing.assert_allclose(c, ce, rtol=1e-4, atol=1e-3)

"""GPU sketches of issue 16, part 2 (no GPU here: the emulator against numpy, then ptxas):
the tensor-core sketch for batch matmul, 2-D thread blocks in the SIMT tiling, the one-kernel
row softmax, and the launch filter counting a cp.async ring's slots of shared memory."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tuning_workloads as wl
from standin_tuning import tune_with_standin

import tecomp as tc
import tuning
from tecomp import te
from tecomp.codegen.ptxas import find_ptxas
from tecomp.codegen.target import Target
from tuning.gpu_measure import STANDIN_ENV, STANDIN_TIMING, EmulatingRunner, GpuBuilder, launch_problems
from tuning.gpu_tensor_core import (
    TensorCoreConvStep,
    TensorCoreStep,
    tc_conv_operands,
    tc_conv_rows_x,
    tc_conv_shared_bytes,
    tc_gemm_operands,
    tc_shared_bytes,
    tensor_core_gemm_schedule,
)
from tuning.measure import MeasureErrorNo, MeasureInput
from tuning.records import RecordWriter, load_records
from tuning.steps import BindStep, ComputeAtStep
from tuning.task import SearchTask

CUDA = "cuda -arch=sm_80"
needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas (CUDA toolkit) not installed")


@tuning.register_workload
def batch_matmul_tc(b: int, m: int, n: int, k: int, dtype: str = "float16") -> list[te.Tensor]:
    """``C[b] = A[b] @ B[b]``, fp16/bf16 in, fp32 accumulated."""
    A = te.placeholder((b, m, k), dtype, name="X")
    B = te.placeholder((b, k, n), dtype, name="Y")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((b, m, n), lambda x, i, j: te.sum(
        A[x, i, r].astype("float32") * B[x, r, j].astype("float32"), axis=r), name="bmm")
    return [A, B, C]


@tuning.register_workload
def batch_matmul_tc_transposed(b: int, m: int, n: int, k: int) -> list[te.Tensor]:
    """``C[b] = A[b] @ B[b].T``: not the layout the sketch's ldmatrix.trans reads."""
    A = te.placeholder((b, m, k), "float16", name="X")
    B = te.placeholder((b, n, k), "float16", name="Y")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((b, m, n), lambda x, i, j: te.sum(
        A[x, i, r].astype("float32") * B[x, j, r].astype("float32"), axis=r), name="bmm")
    return [A, B, C]


@tuning.register_workload
def conv2d_nhwc_tc(n: int, h: int, w: int, ci: int, co: int, k: int, stride: int, pad: int,
                   dtype: str = "float16", dilation: int = 1) -> list[te.Tensor]:
    """NHWC input x HWIO weights, zero padding as a stage of its own, fp32 accumulation."""
    data = te.placeholder((n, h, w, ci), dtype, name="data")
    weight = te.placeholder((k, k, ci, co), dtype, name="weight")
    padded = te.compute((n, h + 2 * pad, w + 2 * pad, ci), lambda b, y, x, c: te.if_then_else(
        te.all(y >= pad, y < h + pad, x >= pad, x < w + pad), data[b, y - pad, x - pad, c],
        tc.const(0, dtype)), name="padded")
    span = dilation * (k - 1) + 1
    oh, ow = (h + 2 * pad - span) // stride + 1, (w + 2 * pad - span) // stride + 1
    ry = te.reduce_axis((0, k), name="ry")
    rx = te.reduce_axis((0, k), name="rx")
    rc = te.reduce_axis((0, ci), name="rc")
    out = te.compute((n, oh, ow, co), lambda b, y, x, o: te.sum(
        padded[b, y * stride + ry * dilation, x * stride + rx * dilation, rc].astype("float32")
        * weight[ry, rx, rc, o].astype("float32"), axis=[ry, rx, rc]), name="out")
    return [data, weight, out]


def _conv_ref(data: np.ndarray, weight: np.ndarray, stride: int, pad: int) -> np.ndarray:
    k = weight.shape[0]
    p = np.pad(data.astype(np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    oh = (p.shape[1] - k) // stride + 1
    ow = (p.shape[2] - k) // stride + 1
    out = np.zeros((data.shape[0], oh, ow, weight.shape[3]))
    for y in range(k):
        for x in range(k):
            win = p[:, y:y + stride * (oh - 1) + 1:stride, x:x + stride * (ow - 1) + 1:stride]
            out += np.einsum("nhwc,co->nhwo", win, weight[y, x].astype(np.float64))
    return out


def _fp16(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(-1, 1, shape).astype(np.float16)


def _tc_step(c: Any) -> TensorCoreStep:
    (step,) = [s for s in c.steps if isinstance(s, TensorCoreStep)]
    return step


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STANDIN_ENV, "1")


# batch matmul on tensor cores -------------------------------------------------------------------


def test_batch_matmul_tensor_core_sketch_is_recognised_from_the_compute() -> None:
    cases = [((2, 64, 64, 64), CUDA, batch_matmul_tc, True),
             ((2, 32, 64, 32, "bfloat16"), "cuda -arch=sm_90", batch_matmul_tc, True),
             ((2, 64, 64, 64), "cuda -arch=sm_75", batch_matmul_tc, False),  # no mma.m16n8k16
             ((2, 64, 48, 40), CUDA, batch_matmul_tc, False),  # k = 40: not whole 16-deep tiles
             ((2, 64, 64, 64), CUDA, batch_matmul_tc_transposed, False)]
    for args, target, func, want in cases:
        described = [s.describe() for s in SearchTask(func, args, target=target).make_space().sketches]
        assert (described[0] == "bmm:tensor_core") is want, (func.__name__, args, target, described)
        assert ("bmm:tensor_core" in described) is want
    # the stage names play no part: the structure does
    g = tc_gemm_operands(batch_matmul_tc(3, 32, 16, 48)[-1].op)
    assert g is not None and (g.batch, g.m, g.n, g.k) == (3, 32, 16, 48)
    assert g.A.name == "X" and g.B.name == "Y"
    # fp32 batch matmul: SIMT sketches only
    fp32 = SearchTask(tuning.workloads.batch_matmul, (2, 32, 32, 32), target=CUDA).make_space()
    assert all("tensor_core" not in s.describe() for s in fp32.sketches)


def test_batch_matmul_tensor_core_samples_match_numpy() -> None:
    """Seeded samples (block and warp tiles, k-step, pipeline depth, padding), emulated: the
    batch on blockIdx.z, each batch's GEMM on mma.m16n8k16, fp32 accumulation."""
    nb, m, n, k = 2, 64, 64, 64
    task = SearchTask(batch_matmul_tc, (nb, m, n, k), target=CUDA)
    space = task.make_space()
    rng = np.random.default_rng(5)
    a, b = _fp16(rng, (nb, m, k)), _fp16(rng, (nb, k, n))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    seen = set()
    for _ in range(4):
        c = space.instantiate(0, {}, rng)
        assert c is not None
        step = _tc_step(c)
        seen.add((step.block_m, step.block_n, step.kstep, step.depth, step.pad))
        assert space.instantiate(0, c.param_dict).key == c.key  # type: ignore[union-attr]
        sch, args = task.apply_steps(c.steps)
        f = tc.build(sch, args, target=CUDA, name="bmm_k")
        launch = f["bmm_k"].launch
        assert int(launch["blockIdx.z"].value) == nb and int(launch["threadIdx.x"].value) == 32
        assert "ptx_mma" in f.get_source("tir")
        out = np.full((nb, m, n), np.nan, np.float32)
        f.emulate(a, b, out)
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)
    assert len(seen) > 1


def test_batch_matmul_tensor_core_bfloat16_sample_matches_numpy() -> None:
    from tecomp.ir import dtype as dt

    nb, m, n, k = 2, 32, 32, 32
    task = SearchTask(batch_matmul_tc, (nb, m, n, k, "bfloat16"), target=CUDA)
    c = task.make_space().instantiate(0, {"bmm/tc_depth": 2}, np.random.default_rng(1))
    assert c is not None and _tc_step(c).depth == 2
    rng = np.random.default_rng(2)
    a = dt.f32_to_bf16_bits(rng.standard_normal((nb, m, k)).astype(np.float32))
    b = dt.f32_to_bf16_bits(rng.standard_normal((nb, k, n)).astype(np.float32))
    ref = dt.bf16_bits_to_f32(a).astype(np.float64) @ dt.bf16_bits_to_f32(b).astype(np.float64)
    sch, args = task.apply_steps(c.steps)
    out = np.full((nb, m, n), np.nan, np.float32)
    tc.build(sch, args, target=CUDA).emulate(a, b, out)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)


@needs_ptxas
def test_batch_matmul_tensor_core_candidate_passes_ptxas_for_sm_80() -> None:
    task = SearchTask(batch_matmul_tc, (2, 64, 64, 64), target=CUDA)
    c = task.make_space().instantiate(0, {"bmm/tc_block_m": 64, "bmm/tc_block_n": 64, "bmm/tc_warps_m": 2,
                                          "bmm/tc_warps_n": 2, "bmm/tc_kstep": 32, "bmm/tc_depth": 3,
                                          "bmm/tc_pad": 8}, np.random.default_rng(0))
    assert c is not None
    step = _tc_step(c)
    assert (step.block_m, step.block_n, step.kstep, step.depth, step.pad) == (64, 64, 32, 3, 8)
    sch, args = task.apply_steps(c.steps)
    res = tc.build(sch, args, target=CUDA).resources
    assert res.registers > 0 and res.spill_stores == 0 and res.spill_loads == 0
    # the three-slot ring is what ptxas sees, and what the sketch's estimate says
    assert res.shared_bytes == tc_shared_bytes((64, 64), 32, 3, 8)


@pytest.mark.slow  # 15-30 s on a 2-core machine (worker pools, every candidate emulated)
def test_tune_batch_matmul_tensor_core_end_to_end_with_the_emulating_stand_in(tmp_path: Path, standin: None) -> None:
    task = SearchTask(batch_matmul_tc, (2, 16, 16, 32), target=CUDA)
    tune_with_standin(task, tmp_path / "bmm.jsonl", trials=4, batch_size=2, seed=0, population=6,
                      step_type=TensorCoreStep)


# conv2d via implicit GEMM on tensor cores -------------------------------------------------------


def _conv_step(c: Any) -> TensorCoreConvStep:
    (step,) = [s for s in c.steps if isinstance(s, TensorCoreConvStep)]
    return step


def test_conv2d_tensor_core_sketch_is_recognised_from_the_compute() -> None:
    offered = [(1, 8, 8, 32, 32, 3, 1, 1), (1, 8, 8, 32, 32, 3, 2, 1), (2, 8, 8, 16, 48, 1, 1, 0),
               (1, 8, 8, 32, 32, 3, 1, 1, "bfloat16")]
    refused = [(1, 7, 7, 32, 32, 3, 1, 1),  # 7x7 outputs: no 16-pixel tile fits
               (1, 8, 8, 8, 32, 3, 1, 1),  # CI = 8: not 16 channels deep
               (1, 8, 8, 32, 24, 3, 1, 1),  # CO = 24
               (1, 8, 8, 32, 32, 3, 1, 2, "float16", 2)]  # dilated taps
    for args in offered + refused:
        described = [s.describe() for s in SearchTask(conv2d_nhwc_tc, args, target=CUDA).make_space().sketches]
        assert (described[0] == "padded:inline, out:tensor_core") is (args in offered), (args, described)
    g = tc_conv_operands(conv2d_nhwc_tc(1, 8, 8, 32, 32, 3, 2, 1)[-1].op)
    assert g is not None and (g.stride, g.oh, g.ow, g.kh, g.kw, g.ci, g.co) == (2, 4, 4, 3, 3, 32, 32)
    assert g.P.name == "padded" and g.W.name == "weight"
    assert tc_conv_rows_x(4, 4) == (4,) and tc_conv_rows_x(56, 56) == (8, 4, 2) and tc_conv_rows_x(7, 7) == ()
    # the fp32 NCHW conv of the SIMT tests: no tensor cores
    fp32 = SearchTask(wl.conv2d, (1, 4, 6, 6, 8, 3, 3, 1), target=CUDA).make_space()
    assert all("tensor_core" not in s.describe() for s in fp32.sketches)


@pytest.mark.parametrize("stride", [1, 2])
def test_conv2d_tensor_core_samples_match_numpy(stride: int) -> None:
    """1x8x8x32 -> 32 channels, 3x3, pad 1: seeded samples of the implicit GEMM (tile shape
    over the output rows and columns, warps, k-step, row padding), emulated."""
    task = SearchTask(conv2d_nhwc_tc, (1, 8, 8, 32, 32, 3, stride, 1), target=CUDA)
    space = task.make_space()
    rng = np.random.default_rng(20 + stride)
    data, weight = _fp16(rng, (1, 8, 8, 32)), _fp16(rng, (3, 3, 32, 32))
    ref = _conv_ref(data, weight, stride, 1)
    seen = set()
    for _ in range(3):
        c = space.instantiate(0, {}, rng)
        assert c is not None
        step = _conv_step(c)
        seen.add((step.rows_x, step.block_n, step.warps_n, step.kstep, step.pad))
        assert space.instantiate(0, c.param_dict).key == c.key  # type: ignore[union-attr]
        sch, args = task.apply_steps(c.steps)
        f = tc.build(sch, args, target=CUDA, name="conv_k")
        tir = f.get_source("tir")
        assert "ptx_mma" in tir and "ptx_ldmatrix" in tir
        # no im2col buffer anywhere: the kernel's only shared buffers are the input patch and
        # the weights, of the sizes the sketch's estimate gives; no intermediate in global memory
        shared = re.findall(r"allocate (\w+): float16\[(\d+)\] \(shared\)", tir)
        assert {name for name, _ in shared} == {"padded_shared", "weight_shared"}
        g = tc_conv_operands(task.outputs[0])
        assert g is not None
        assert 2 * sum(int(size) for _, size in shared) == tc_conv_shared_bytes(
            g, step.rows_x, step.block_rows, step.block_n, step.kstep, step.pad)
        assert len(f["conv_k"].kernels) == 1
        out = np.full(ref.shape, np.nan, np.float32)
        f.emulate(data, weight, out)
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)
    assert len(seen) > 1
    # mutation keeps every knob within what fits: the mutants replay onto a schedule
    x = space.instantiate(0, {"out/tc_block_n": 32, "out/tc_warps_n": 2, "out/tc_kstep": 32}, rng)
    assert x is not None
    for _ in range(4):
        y = space.mutate(x, rng)
        if y is not None and any(isinstance(st, TensorCoreConvStep) for st in y.steps):
            st = _conv_step(y)
            assert 32 % st.kstep == 0 and st.block_n % (16 * st.warps_n) == 0
            assert tc_conv_shared_bytes(g, st.rows_x, st.block_rows, st.block_n, st.kstep, st.pad) <= \
                Target.parse(CUDA).gpu.max_dynamic_smem
            task.apply_steps(y.steps)


def test_conv2d_tensor_core_bfloat16_sample_matches_numpy() -> None:
    from tecomp.ir import dtype as dt

    task = SearchTask(conv2d_nhwc_tc, (1, 8, 8, 16, 16, 3, 1, 1, "bfloat16"), target=CUDA)
    c = task.make_space().instantiate(0, {"out/tc_rows_x": 8}, np.random.default_rng(3))
    assert c is not None and _conv_step(c).rows_x == 8
    rng = np.random.default_rng(4)
    data = dt.f32_to_bf16_bits(rng.standard_normal((1, 8, 8, 16)).astype(np.float32))
    weight = dt.f32_to_bf16_bits(rng.standard_normal((3, 3, 16, 16)).astype(np.float32))
    ref = _conv_ref(dt.bf16_bits_to_f32(data), dt.bf16_bits_to_f32(weight), 1, 1)
    sch, args = task.apply_steps(c.steps)
    out = np.full(ref.shape, np.nan, np.float32)
    tc.build(sch, args, target=CUDA).emulate(data, weight, out)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)


@needs_ptxas
def test_conv2d_tensor_core_candidate_passes_ptxas_for_sm_80() -> None:
    task = SearchTask(conv2d_nhwc_tc, (1, 8, 8, 32, 32, 3, 1, 1), target=CUDA)
    knobs = {"out/tc_rows_x": 8, "out/tc_block_rows": 4, "out/tc_warps_m": 2, "out/tc_block_n": 32,
             "out/tc_warps_n": 2, "out/tc_kstep": 32, "out/tc_pad": 8}
    c = task.make_space().instantiate(0, knobs, np.random.default_rng(0))
    assert c is not None
    step = _conv_step(c)
    assert (step.rows_x, step.block_rows, step.warps_m, step.block_n, step.warps_n, step.kstep, step.pad) == \
        (8, 4, 2, 32, 2, 32, 8)
    sch, args = task.apply_steps(c.steps)
    res = tc.build(sch, args, target=CUDA).resources
    assert res.registers > 0 and res.spill_stores == 0 and res.spill_loads == 0
    g = tc_conv_operands(task.outputs[0])
    assert g is not None
    assert res.shared_bytes == tc_conv_shared_bytes(g, 8, 4, 32, 32, 8)


@pytest.mark.slow  # ~15-30 s on a 2-core machine: every tensor-core candidate is emulated
def test_tune_conv2d_tensor_core_end_to_end_with_the_emulating_stand_in(tmp_path: Path, standin: None) -> None:
    task = SearchTask(conv2d_nhwc_tc, (1, 4, 4, 16, 16, 3, 1, 1), target=CUDA)
    tune_with_standin(task, tmp_path / "conv.jsonl", trials=4, batch_size=2, seed=2, population=6,
                      step_type=TensorCoreConvStep)


# 2-D thread blocks in the SIMT tiling -----------------------------------------------------------


def test_simt_tiling_binds_two_dimensional_blocks() -> None:
    """The M tile on threadIdx.y / blockIdx.y, N on threadIdx.x / blockIdx.x, the shared
    tiles fetched by both; emulated against numpy."""
    task = SearchTask(wl.matmul, (64, 32, 48), target=CUDA)
    space = task.make_space()
    rng = np.random.default_rng(4)
    a = rng.uniform(-1, 1, (64, 32)).astype(np.float32)
    b = rng.uniform(-1, 1, (32, 48)).astype(np.float32)
    for k in range(len(space.sketches)):  # with and without shared tiles
        c = space.instantiate(k, {"C/S0": (1, 4, 2, 1), "C/S1": (1, 8, 1, 2)}, rng)
        assert c is not None
        tags = {(s.stage, s.tag) for s in c.steps if isinstance(s, BindStep)}
        assert {("C", "blockIdx.y"), ("C", "blockIdx.x"), ("C", "threadIdx.y"), ("C", "threadIdx.x")} <= tags
        if space.sketches[k].plans[0].pack:
            assert ("A.shared", "threadIdx.y") in tags and ("B.shared", "threadIdx.x") in tags
        sch, args = task.apply_steps(c.steps)
        f = tc.build(sch, args, target=CUDA, name="mm")
        launch = {t: int(e.value) for t, e in f["mm"].launch.items()}
        assert launch == {"blockIdx.y": 8, "blockIdx.x": 3, "threadIdx.y": 4, "threadIdx.x": 8}
        out = np.full((64, 48), np.nan, np.float32)
        f.emulate(a, b, out)
        np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)


def test_simt_tiling_of_a_four_dimensional_stage_fuses_the_leading_axes_on_y() -> None:
    task = SearchTask(wl.conv2d, (1, 4, 6, 6, 8, 3, 3, 1), target=CUDA)
    space = task.make_space()
    c = space.instantiate(0, {}, np.random.default_rng(8))
    assert c is not None
    tags = {s.tag for s in c.steps if isinstance(s, BindStep) and s.stage == "conv"}
    assert {"blockIdx.y", "blockIdx.x", "threadIdx.y", "threadIdx.x"} <= tags
    rng = np.random.default_rng(9)
    data = rng.uniform(-1, 1, (1, 4, 6, 6)).astype(np.float32)
    kern = rng.uniform(-1, 1, (8, 4, 3, 3)).astype(np.float32)
    padded = np.pad(data, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros((1, 8, 6, 6))
    for y in range(3):
        for x in range(3):
            ref += np.einsum("nchw,fc->nfhw", padded[:, :, y:y + 6, x:x + 6], kern[:, :, y, x])
    sch, args = task.apply_steps(c.steps)
    out = np.full((1, 8, 6, 6), np.nan, np.float32)
    tc.build(sch, args, target=CUDA).emulate(data, kern, out)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


# the one-kernel row softmax ---------------------------------------------------------------------


def _softmax_ref(a: np.ndarray) -> np.ndarray:
    e = np.exp(a.astype(np.float64) - a.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_softmax_one_kernel_sketch_is_reached_and_matches_numpy() -> None:
    """max, exp-sum and normalisation in one kernel: a block per row, both reductions across
    its threads (warp shuffles), computed at the row (benchmarks/gpu_softmax.py, by rule)."""
    rows, cols = 3, 200
    task = SearchTask(wl.softmax, (rows, cols), target=CUDA)
    space = task.make_space()
    one = "e:inline, mx:cross_thread@out, sm:cross_thread@out, out:rows"
    assert [s.describe() for s in space.sketches][0] == one
    rng = np.random.default_rng(12)
    a = rng.uniform(-4, 4, (rows, cols)).astype(np.float32)
    threads = set()
    for _ in range(3):
        c = space.instantiate(0, {}, rng)
        assert c is not None
        threads.add(c.param_dict["block/threads"])
        assert {(s.stage, s.target) for s in c.steps if isinstance(s, ComputeAtStep)} == {("mx", "out"), ("sm", "out")}
        sch, args = task.apply_steps(c.steps)
        f = tc.build(sch, args, target=CUDA, name="softmax")
        assert len(f["softmax"].kernels) == 1  # one kernel
        launch = {t: int(e.value) for t, e in f["softmax"].launch.items()}
        assert launch == {"blockIdx.x": rows, "threadIdx.x": c.param_dict["block/threads"]}
        assert "shfl_xor_sync" in f.get_source("tir")
        out = np.full_like(a, np.nan)
        f.emulate(a, out)
        np.testing.assert_allclose(out, _softmax_ref(a), rtol=1e-5, atol=1e-6)
    assert len(threads) > 1


def test_softmax_one_kernel_sketch_is_not_offered_when_a_reduction_has_another_reader() -> None:
    # the row max is an output too: it cannot live in the row kernel's shared memory only
    @tuning.register_workload
    def softmax_and_max(n: int, m: int) -> list[te.Tensor]:
        A = te.placeholder((n, m), "float32", name="A")
        k1 = te.reduce_axis((0, m), name="k1")
        mx = te.compute((n,), lambda i: te.max(A[i, k1], axis=k1), name="mx")
        k2 = te.reduce_axis((0, m), name="k2")
        sm = te.compute((n,), lambda i: te.sum(te.exp(A[i, k2] - mx[i]), axis=k2), name="sm")
        out = te.compute((n, m), lambda i, j: te.exp(A[i, j] - mx[i]) / sm[i], name="out")
        y = te.compute((n,), lambda i: mx[i] * 2.0, name="y")
        return [A, out, y]

    described = [s.describe() for s in SearchTask(softmax_and_max, (4, 64), target=CUDA).make_space().sketches]
    assert not any("@" in d for d in described) and described


# the launch filter counts a cp.async ring ------------------------------------------------------


def test_launch_filter_counts_every_slot_of_a_pipeline_ring() -> None:
    """64x256 tiles, k-step 64: one slot of A and B is 40 KB; four slots (160 KB) fit the
    166912 bytes (163 KB) a block may use on sm_80 (static + dynamic by opt-in), four padded
    slots (42 KB each) do not, and the estimate is ptxas's; sm_90's 227 KB take both."""
    task = SearchTask(wl.matmul_tc, (128, 256, 256), target=CUDA)
    tgt = Target.parse(CUDA)

    def problems(depth: int, pad: int, target: Target = tgt) -> list[str]:
        sch, args = task.apply_steps((TensorCoreStep("C", 64, 256, 2, 2, 64, depth, pad),))
        return launch_problems(sch, args, target)

    assert tc_shared_bytes((64, 256), 64, 4, 0) == 160 * 1024
    assert tc_shared_bytes((64, 256), 64, 4, 8) > 166912 > tc_shared_bytes((64, 256), 64, 3, 8)
    assert problems(4, 0) == [] and problems(3, 8) == []
    (why,) = problems(4, 8)
    assert why == (f"kernel of C: {tc_shared_bytes((64, 256), 64, 4, 8)} bytes of shared memory exceed "
                   "the 166912 bytes a block may use on sm_80 (49152 static, the rest as dynamic shared "
                   "memory by opt-in)")
    assert problems(4, 8, Target.parse("cuda -arch=sm_90")) == []
    # double_buffer: two slots (256x128 tiles padded by 8: 53 KB a slot at k-step 64, 102 KB at 128)
    for kstep, over in ((64, False), (128, True)):
        s, (A, B, C) = tensor_core_gemm_schedule(256, 128, 256, block=(256, 128), kstep=kstep, depth=1, pad=8)
        assert launch_problems(s, [A, B, C], tgt) == []
        for st in s.stages:
            if st.op.name.endswith(".shared"):
                st.double_buffer()
        why2 = launch_problems(s, [A, B, C], tgt)
        assert bool(why2) is over
        if over:
            assert f"{2 * tc_shared_bytes((256, 128), kstep, 1, 8)} bytes of shared memory exceed the 166912" in why2[0]


def test_a_ring_over_the_shared_memory_limit_is_recorded_not_built(tmp_path: Path, standin: None) -> None:
    task = SearchTask(wl.matmul_tc, (256, 128, 128), target=CUDA)
    deep = (TensorCoreStep("C", 256, 128, 4, 2, 64, 4, 0),)  # 4 slots of 48 KB: over sm_80's 163 KB
    ok = (TensorCoreStep("C", 128, 128, 2, 2, 32, 4, 0),)  # 4 slots of 16 KB: dynamic shared memory
    builder, runner = GpuBuilder(n_workers=1), EmulatingRunner(timeout=60)
    try:
        inputs = [MeasureInput(task, deep), MeasureInput(task, ok)]
        builds = builder.build(inputs)
        results = runner.run(inputs, builds)
    finally:
        builder.close()
        runner.close()
    assert builds[0].artifact is None and builds[1].artifact is not None
    assert results[0].error == MeasureErrorNo.RESOURCE_LIMIT
    # refused by the launch check, before lowering and ptxas
    assert results[0].error_msg.startswith("cannot launch: kernel of C: 196608 bytes of shared memory exceed "
                                           "the 166912 bytes")
    assert results[1].error == MeasureErrorNo.NO_ERROR, results[1].error_msg
    log = tmp_path / "ring.jsonl"
    with RecordWriter(str(log)) as w:
        for inp, res in zip(inputs, results):
            w.write(inp, res)
    recs = load_records(str(log))
    assert [r.error for r in recs] == [MeasureErrorNo.RESOURCE_LIMIT, MeasureErrorNo.NO_ERROR]
    assert recs[0].timing in (None, "") and recs[1].timing == STANDIN_TIMING


# errors -----------------------------------------------------------------------------------------


def test_gather_intrinsic_and_conv_step_reject_bad_input() -> None:
    from tecomp.errors import ScheduleError, TecompError
    from tecomp.te import intrin_cuda as tci
    from tuning.steps import State

    with pytest.raises(TecompError, match=r"product is 16, got \(3, 8\)"):
        tci.mma_sync_gather("float16", (3, 8))
    with pytest.raises(TecompError, match="stride must be a positive int, got 0"):
        tci.mma_sync_gather("float16", (2, 8), stride=0)
    with pytest.raises(TecompError, match="float16 or bfloat16, got float32"):
        tci.mma_sync_gather("float32", (16,))
    with pytest.raises(TecompError, match=r"product is 16, got \(4, 2\)"):
        tci.store_c((4, 2))
    # a conv step replayed onto a stage that is not such a conv says what it expects
    task = SearchTask(wl.matmul_tc, (32, 32, 32), target=CUDA)
    with pytest.raises(ScheduleError, match="stage C: not a conv2d the tensor-core conv schedule takes"):
        State(task).apply(TensorCoreConvStep("C", 8, 2, 1, 16, 1, 16, 0))

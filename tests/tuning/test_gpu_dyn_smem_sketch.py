"""The GPU tuner's tensor-core sketches use dynamic shared memory (no GPU here: the emulator
against numpy, then ptxas): their tiles x pipeline depth are bounded by the arch's opt-in
maximum per block (`GPULimits.max_dynamic_smem`), not the static 48 KiB, so a sample can
take a ring above 48 KiB; such a candidate builds as one extern shared area, passes the
tuner's builder (launch check and ptxas) and computes what numpy does. The GPU feature
``gpu.shared_frac`` is shared memory over that same maximum."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tuning_workloads as wl

import tecomp as tc
import tuning
from tecomp import te
from tecomp.codegen.gpu_shared import DYNAMIC_SHARED_SYMBOL
from tecomp.codegen.ptxas import find_ptxas
from tecomp.codegen.target import Target
from tuning.features import GPU_PROGRAM, N_FEATURES, PROGRAM_FEATURES, extract_features
from tuning.gpu_measure import gpu_build_job
from tuning.gpu_tensor_core import (
    TensorCoreConvStep,
    TensorCoreStep,
    tc_conv_operands,
    tc_conv_shared_bytes,
    tc_shared_bytes,
)
from tuning.measure import MeasureErrorNo
from tuning.task import SearchTask

CUDA = "cuda -arch=sm_80"
SHAPE = (64, 64, 256)  # m, n, k: four k-tiles of 64, so a ring of 4 slots is a real pipeline
SEEDS = range(64)
needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas (CUDA toolkit) not installed")


def _ring(step: TensorCoreStep) -> int:
    return tc_shared_bytes((step.block_m, step.block_n), step.kstep, step.depth, step.pad)


def _tc_step(c: Any) -> TensorCoreStep:
    (step,) = [s for s in c.steps if isinstance(s, TensorCoreStep)]
    return step


@pytest.fixture(scope="module")
def big_ring() -> dict[str, Any]:
    """The first seeded sample of the GEMM sketch whose ring exceeds the static 48 KiB."""
    task = SearchTask(wl.matmul_tc, SHAPE, target=CUDA)
    space = task.make_space()
    assert space.sketches[0].describe() == "C:tensor_core"
    lim = Target.parse(CUDA).gpu
    for seed in SEEDS:
        c = space.instantiate(0, {}, np.random.default_rng(seed))
        assert c is not None
        step = _tc_step(c)
        assert _ring(step) <= lim.max_dynamic_smem, (seed, step)
        if _ring(step) > lim.static_smem:
            return {"task": task, "cand": c, "step": step, "seed": seed}
    raise AssertionError(f"no seed of {SEEDS} draws a tensor-core ring above {lim.static_smem} bytes")


def test_a_sampled_ring_above_48_kib_builds_dynamic_and_matches_numpy(big_ring: dict[str, Any]) -> None:
    task, step = big_ring["task"], big_ring["step"]
    smem = _ring(step)
    assert smem > 48 * 1024
    sch, args = task.apply_steps(big_ring["cand"].steps)
    f = tc.build(sch, args, target=CUDA)
    (fn,) = f._functions.values()
    assert [kl.shared_mem for kl in fn.plan.kernels] == [smem]  # what the launch passes (and opts in)
    ptx = f.get_source("ptx")
    assert f".extern .shared .align 16 .b8 {DYNAMIC_SHARED_SYMBOL}[];" in ptx
    assert "mma.sync.aligned" in ptx
    if step.depth > 1:
        assert "cp.async.cg.shared.global" in ptx
    m, n, k = SHAPE
    rng = np.random.default_rng(big_ring["seed"])
    a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float16)
    out = np.full((m, n), np.nan, np.float32)
    f.emulate(a, b, out)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-3)


@needs_ptxas
def test_the_tuners_builder_and_ptxas_accept_it_for_sm_80(big_ring: dict[str, Any]) -> None:
    res = gpu_build_job(big_ring["task"], big_ring["cand"].steps, "dyn")
    assert res.error == MeasureErrorNo.NO_ERROR, res.error_msg
    assert "ptxas" not in res.info  # checked, not skipped
    (kern,) = res.info["kernels"].values()
    # ptxas sees no static shared memory; the launch passes all of it as dynamic
    assert kern["shared_bytes"] == 0 and kern["dynamic_shared_bytes"] == _ring(big_ring["step"])
    assert kern["spill_stores"] == 0 and kern["spill_loads"] == 0 and 0 < kern["registers"] <= 255


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_90"])
def test_gemm_sketch_draws_stay_within_the_arch_opt_in_maximum(arch: str) -> None:
    """On 256^3 the sketch reaches above 48 KiB on every arch and never past its maximum
    (99 KiB on sm_86, 163 KiB on sm_80, 227 KiB on sm_90)."""
    target = f"cuda -arch={arch}"
    lim = Target.parse(target).gpu
    space = SearchTask(wl.matmul_tc, (256, 256, 256), target=target).make_space()
    rings = []
    for seed in range(24):
        c = space.instantiate(0, {}, np.random.default_rng(seed))
        assert c is not None
        rings.append(_ring(_tc_step(c)))
    assert max(rings) <= lim.max_dynamic_smem, (arch, rings)
    assert max(rings) > lim.static_smem, (arch, rings)


@tuning.register_workload
def dyn_smem_conv_nhwc(n: int, h: int, w: int, ci: int, co: int) -> list[te.Tensor]:
    """A 3x3 stride-1 NHWC x HWIO conv without padding, fp16 in, fp32 out."""
    data = te.placeholder((n, h, w, ci), "float16", name="data")
    weight = te.placeholder((3, 3, ci, co), "float16", name="weight")
    ry = te.reduce_axis((0, 3), name="ry")
    rx = te.reduce_axis((0, 3), name="rx")
    rc = te.reduce_axis((0, ci), name="rc")
    out = te.compute((n, h - 2, w - 2, co), lambda b, y, x, o: te.sum(
        data[b, y + ry, x + rx, rc].astype("float32") * weight[ry, rx, rc, o].astype("float32"),
        axis=[ry, rx, rc]), name="out")
    return [data, weight, out]


def test_conv_sketch_draws_stay_within_the_opt_in_maximum() -> None:
    task = SearchTask(dyn_smem_conv_nhwc, (1, 18, 18, 64, 128), target=CUDA)
    lim = Target.parse(CUDA).gpu
    g = tc_conv_operands(task.outputs[0])
    assert g is not None
    space = task.make_space()
    sizes = []
    for seed in range(24):
        c = space.instantiate(0, {}, np.random.default_rng(seed))
        assert c is not None
        (st,) = [s for s in c.steps if isinstance(s, TensorCoreConvStep)]
        sizes.append(tc_conv_shared_bytes(g, st.rows_x, st.block_rows, st.block_n, st.kstep, st.pad))
    assert max(sizes) <= lim.max_dynamic_smem and max(sizes) > lim.static_smem, sizes


def test_shared_frac_is_a_fraction_of_the_opt_in_maximum() -> None:
    """A SIMT GEMM candidate with 72 KiB of shared tiles (dynamic on sm_80): ``gpu.shared_frac``
    is its shared bytes over the 166912 a block may use (below 1), and the vector keeps its
    length."""
    task = SearchTask(wl.matmul, (128, 128, 256), target=CUDA)  # n, k, m
    c = task.make_space().instantiate(0, {"C/S0": (1, 16, 8, 1), "C/S1": (1, 16, 1, 1), "C/R0": (8, 16)},
                                      np.random.default_rng(0))
    assert c is not None and any(getattr(s, "scope", None) == "shared" for s in c.steps)
    x = extract_features(task, c.steps)
    assert x is not None and x.shape == (N_FEATURES,) and N_FEATURES == len(PROGRAM_FEATURES)
    base = N_FEATURES - len(GPU_PROGRAM)
    shared = 2.0 ** float(x[base + GPU_PROGRAM.index("gpu.shared_bytes")]) - 1.0
    frac = float(x[base + GPU_PROGRAM.index("gpu.shared_frac")])
    assert shared == pytest.approx(128 * 128 * 4 + 128 * 16 * 4, rel=1e-4)  # A 128x128, B 128x16 fp32
    assert frac == pytest.approx(shared / 166912, rel=1e-4) and 0 < frac < 1


def test_shared_bytes_count_the_whole_ring(big_ring: dict[str, Any]) -> None:
    """The features read the nest before the GPU passes, where a pipeline of depth d is one
    buffer per operand marked by an attribute: ``gpu.shared_bytes`` counts its d slots, each
    with its rows padded by storage_align, as the kernel will allocate them (what ptxas and
    the launch see)."""
    x = extract_features(big_ring["task"], big_ring["cand"].steps)
    assert x is not None
    base = N_FEATURES - len(GPU_PROGRAM)
    shared = 2.0 ** float(x[base + GPU_PROGRAM.index("gpu.shared_bytes")]) - 1.0
    assert big_ring["step"].depth >= 2
    assert shared == pytest.approx(_ring(big_ring["step"]), rel=1e-4)

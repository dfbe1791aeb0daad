"""GPU auto-tuning (issue 16) on a machine without a GPU: the cuda sketch space builds legal
kernels (emulated against numpy), candidates that cannot launch are filtered with a recorded
reason, the tuning loop runs end to end with the emulating stand-in runner (its timings are
labelled and refused outside tests), and `tecomp tune --target cuda` stops at once."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tuning_workloads as wl
from standin_tuning import tune_with_standin

import tecomp as tc
import tuning
from tecomp.codegen.ptxas import find_ptxas
from tecomp.codegen.target import Target
from tuning import gpu_space
from tuning.cli import main
from tuning.gpu_measure import (
    STANDIN_ENV,
    STANDIN_TIMING,
    EmulatingRunner,
    GpuBuilder,
    gpu_build_job,
    ptxas_problems,
    standin_cost,
)
from tuning.gpu_space import GpuSearchSpace, TensorCoreStep
from tuning.measure import MeasureErrorNo, MeasureInput, MeasureResult
from tuning.records import RecordWriter, load_records
from tuning.steps import BindStep, StorePredicateStep, steps_from_json, steps_to_json
from tuning.task import SearchTask, TuningError
from tuning.workloads import matmul

CUDA = "cuda -arch=sm_80"


def _has_gpu() -> bool:
    from tecomp.runtime.cuda import cuda_available

    return cuda_available()[0]


def _arrays(task: SearchTask, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, tuple(int(d.value) for d in t.shape)).astype(t.dtype) for t in task.tensors]


def _reference(task: SearchTask, arrays: list[np.ndarray]) -> np.ndarray:
    out = [a.copy() for a in arrays]
    tc.build(task.create_schedule(), task.tensors, target="llvm")(*out)
    return out[-1]


def _emulate(task: SearchTask, steps: Any, arrays: list[np.ndarray]) -> np.ndarray:
    sch, args = task.apply_steps(steps)
    f = tc.build(sch, args, target=task.target)
    out = [a.copy() for a in arrays]
    out[-1][...] = np.nan
    f.emulate(*out)
    return out[-1]


# the sketch space -----------------------------------------------------------------------------

SPACES = [
    pytest.param(wl.matmul, (16, 16, 16), ["C:SSSRRSRS+cache_write+shared(A,B)", "C:SSSRRSRS+cache_write"],
                 id="gemm"),
    pytest.param(wl.conv2d, (1, 2, 6, 6, 4, 3, 3, 1),
                 ["pad:inline, conv:SSSRRSRS+cache_write+shared(pad,kernel)", "pad:inline, conv:SSSRRSRS+cache_write"],
                 id="conv2d"),
    pytest.param(wl.softmax, (4, 64), None, id="softmax"),
    pytest.param(wl.matmul_relu, (16, 16, 16), ["C:SSSRRSRS+under D+shared(A,B)", "C:SSSRRSRS+under D"],
                 id="gemm-relu"),
]


@pytest.mark.parametrize("func,args,sketches", SPACES)
def test_sketch_space_gives_legal_kernels(func: Any, args: tuple[int, ...], sketches: list[str] | None) -> None:
    task = SearchTask(func, args, target=CUDA)
    space = task.make_space()
    assert isinstance(space, GpuSearchSpace)
    described = [s.describe() for s in space.sketches]
    if sketches is not None:
        assert described == sketches
    else:  # softmax: the row max and sum reduce across threads, or a thread per row
        assert "e:inline, mx:cross_thread, sm:cross_thread" in described and "e:inline" in described
    arrays = _arrays(task)
    ref = _reference(task, arrays)
    rng = np.random.default_rng(7)  # seeded: the same candidates on every run
    for k in range(len(space.sketches)):
        for _ in range(2):
            c = space.instantiate(k, {}, rng)
            assert c is not None
            assert any(isinstance(s, BindStep) and s.tag == "threadIdx.x" for s in c.steps)
            np.testing.assert_allclose(_emulate(task, c.steps, arrays), ref, rtol=1e-4, atol=1e-4)
            # the knob values re-create the same steps (how a resumed search continues)
            assert space.instantiate(k, c.param_dict).key == c.key  # type: ignore[union-attr]


def test_sampling_is_seeded_and_respects_the_thread_limit() -> None:
    task = SearchTask(wl.matmul, (64, 64, 64), target=CUDA)
    space = task.make_space()
    a = [space.sample(np.random.default_rng(3)) for _ in range(2)]
    assert a[0] is not None and a[1] is not None and a[0].key == a[1].key
    rng = np.random.default_rng(0)
    for _ in range(20):
        c = space.sample(rng)
        assert c is not None
        p = c.param_dict
        threads = math.prod(p[f"C/S{d}"][1] for d in range(2))
        assert 32 <= threads <= 1024
    # mutation and crossover stay in the space
    x, y = space.sample(rng), space.sample(rng)
    assert x is not None and y is not None
    assert space.mutate(x, rng) is not None and space.crossover(x, y, rng) is not None


def test_cross_thread_reduction_sketch_binds_the_reduction() -> None:
    task = SearchTask(wl.softmax, (4, 64), target=CUDA)
    space = task.make_space()
    k = [s.describe() for s in space.sketches].index("e:inline, mx:cross_thread, sm:cross_thread")
    c = space.instantiate(k, {}, np.random.default_rng(0))
    assert c is not None
    preds = {s.stage for s in c.steps if isinstance(s, StorePredicateStep)}
    assert preds == {"mx", "sm"}
    sch, args = task.apply_steps(c.steps)
    assert "shfl_xor_sync" in tc.build(sch, args, target=CUDA).get_source("tir")


def test_gpu_steps_round_trip_through_json() -> None:
    steps = (BindStep("C", 0, "blockIdx.x"), StorePredicateStep("C", "threadIdx.x"))
    assert steps_from_json(steps_to_json(steps)) == steps


# launch filtering -----------------------------------------------------------------------------


def _gemm_candidate(space: Any, params: dict[str, Any]) -> Any:
    c = space.instantiate(0, params, np.random.default_rng(0))
    assert c is not None
    return c


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STANDIN_ENV, "1")


def test_candidates_that_cannot_launch_are_recorded_with_their_reason(tmp_path: Path, standin: None) -> None:
    task = SearchTask(wl.matmul, (128, 128, 256), target=CUDA)
    space = task.make_space()
    too_many = _gemm_candidate(space, {"C/S0": (1, 32, 1, 1), "C/S1": (1, 64, 1, 1), "C/R0": (1, 1)})
    # 128x128 tiles of A and 128x256 of B (float32) in shared memory: 192 KB, over sm_80's 163 KB
    too_much_smem = _gemm_candidate(space, {"C/S0": (1, 16, 8, 1), "C/S1": (1, 32, 8, 1), "C/R0": (8, 16)})
    builder = GpuBuilder(n_workers=2)
    runner = EmulatingRunner(timeout=60)
    try:
        inputs = [MeasureInput.of(task, c) for c in (too_many, too_much_smem)]
        builds = builder.build(inputs)
        results = runner.run(inputs, builds)
    finally:
        builder.close()
        runner.close()
    assert [r.error for r in results] == [MeasureErrorNo.RESOURCE_LIMIT] * 2
    assert "2048 threads per block exceed sm_80's limit of 1024" in results[0].error_msg
    assert "196608 bytes of shared memory exceed the 166912 bytes a block may use on sm_80" in results[1].error_msg
    log = tmp_path / "filtered.jsonl"
    with RecordWriter(str(log)) as w:
        for inp, res in zip(inputs, results):
            w.write(inp, res)
    recs = load_records(str(log))
    assert [r.error for r in recs] == [MeasureErrorNo.RESOURCE_LIMIT] * 2 and not any(r.timing for r in recs)


def test_ptxas_resources_filter() -> None:
    tgt = Target.parse(CUDA)
    ok = {"k": {"registers": 64, "threads": 256, "spill_stores": 0, "spill_loads": 0}}
    assert ptxas_problems(ok, tgt, allow_spills=False) == []
    heavy = {"k": {"registers": 255, "threads": 1024}}
    assert "exceed the 65536 registers" in ptxas_problems(heavy, tgt, allow_spills=False)[0]
    spills = {"k": {"registers": 255, "threads": 128, "spill_stores": 16, "spill_loads": 16}}
    assert "spills" in ptxas_problems(spills, tgt, allow_spills=False)[0]
    assert ptxas_problems(spills, tgt, allow_spills=True) == []
    # a local depot over 512 KiB per thread: cuLaunchKernel says CUDA_ERROR_INVALID_VALUE
    depot = {"k": {"registers": 88, "threads": 1, "stack_frame": 8 << 20}}
    assert "local memory per thread" in ptxas_problems(depot, tgt, allow_spills=True)[0]
    assert ptxas_problems({"k": dict(depot["k"], stack_frame=256)}, tgt, allow_spills=False) == []


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas (CUDA toolkit) not installed")
def test_a_register_tile_too_big_for_local_memory_is_a_resource_limit() -> None:
    # the candidate of an H100 tuning run (matmul 2048^3) that failed to launch: each thread
    # accumulates a 512x16 tile, which ptxas puts in an 8 MiB local depot
    task = SearchTask(matmul, (2048, 2048, 2048), target="cuda -arch=sm_90")
    steps = steps_from_json([
        {"kind": "cache_write", "stage": "C", "scope": "local"},
        {"kind": "split", "stage": "C", "axis": 0, "factors": [1, 1, 1024]},
        {"kind": "split", "stage": "C", "axis": 4, "factors": [32, 1, 64]},
        {"kind": "reorder", "stage": "C", "order": [0, 4, 1, 5, 2, 6, 3, 7]},
        {"kind": "bind", "stage": "C", "axis": 0, "tag": "blockIdx.y"},
        {"kind": "bind", "stage": "C", "axis": 1, "tag": "blockIdx.x"},
        {"kind": "bind", "stage": "C", "axis": 2, "tag": "vthread"},
        {"kind": "bind", "stage": "C", "axis": 3, "tag": "vthread"},
        {"kind": "bind", "stage": "C", "axis": 4, "tag": "threadIdx.y"},
        {"kind": "bind", "stage": "C", "axis": 5, "tag": "threadIdx.x"},
        {"kind": "compute_at", "stage": "C.local", "target": "C", "target_axis": 5},
        {"kind": "split", "stage": "C.local", "axis": 0, "factors": [512]},
        {"kind": "split", "stage": "C.local", "axis": 2, "factors": [16]},
        {"kind": "split", "stage": "C.local", "axis": 4, "factors": [8, 32]},
        {"kind": "reorder", "stage": "C.local", "order": [4, 5, 0, 2, 6, 1, 3]},
    ])
    r = gpu_build_job(task, steps, "default_function")
    assert r.error is MeasureErrorNo.RESOURCE_LIMIT and "local memory per thread" in r.error_msg, r.error_msg


# the tuning loop with the emulating stand-in ---------------------------------------------------


def test_tune_cuda_end_to_end_with_the_emulating_stand_in(tmp_path: Path, standin: None) -> None:
    task = SearchTask(wl.matmul, (16, 16, 16), target=CUDA)
    log = tmp_path / "gpu.jsonl"
    builder, runner = GpuBuilder(n_workers=2), EmulatingRunner(timeout=60)
    try:
        (res,) = tuning.tune([task], trials=6, batch_size=3, log=str(log), seed=0, builder=builder,
                             runner=runner, progress=False, remeasure=0,
                             search=tuning.SearchOptions(population=8, generations=1, fresh_pool=8))
    finally:
        builder.close()
        runner.close()
    assert res.trials == 6 and math.isfinite(res.best_cost)
    recs = load_records(str(log))
    assert len(recs) == 6
    valid = [r for r in recs if r.valid]
    assert valid and all(r.timing == STANDIN_TIMING for r in valid)
    assert all(r.error in (MeasureErrorNo.NO_ERROR, MeasureErrorNo.RESOURCE_LIMIT) for r in recs)
    # records round-trip: the task rebuilds from the log, the knobs re-create the steps
    rec = tuning.best_record(str(log), task)
    again = rec.task()
    assert again.target == task.target and again.workload_key == task.workload_key
    c = task.make_space().instantiate(rec.sketch, dict(rec.params))  # type: ignore[arg-type]
    assert c is not None and c.key == rec.key
    s, args = task.apply_best(str(log))
    arrays = _arrays(task, seed=1)
    np.testing.assert_allclose(_emulate(task, rec.steps, arrays), _reference(task, arrays), rtol=1e-4, atol=1e-4)


def test_standin_timings_are_refused_outside_tests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STANDIN_ENV, raising=False)
    with pytest.raises(TuningError, match="tecomp's own tests only"):
        EmulatingRunner()
    task = SearchTask(wl.matmul, (16, 16, 16), target=CUDA)
    fake = MeasureResult((1e-6,), MeasureErrorNo.NO_ERROR, timing=STANDIN_TIMING)
    log = tmp_path / "user.jsonl"
    with RecordWriter(str(log)) as w, pytest.raises(TuningError, match="not measurements"):
        w.write(MeasureInput(task, ()), fake)
    assert not load_records(str(log))
    assert standin_cost({"kernels": {"k": {"threads": 64, "blocks": 4, "registers": 32}}}, 1e6) > 0


@pytest.mark.skipif(_has_gpu(), reason="this machine has a GPU")
def test_tune_cuda_without_a_gpu_stops_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    task = SearchTask(wl.matmul, (16, 16, 16), target=CUDA)
    with pytest.raises(TuningError, match="needs an NVIDIA GPU"):
        tuning.tune([task], trials=4, log=str(tmp_path / "t.jsonl"), progress=False)
    assert not (tmp_path / "t.jsonl").exists()
    log = tmp_path / "cli.jsonl"
    assert main(["tune", "matmul", "--args", "16", "16", "16", "--target", "cuda", "--trials", "4",
                 "--log", str(log)]) == 2
    err = capsys.readouterr().err
    assert "needs an NVIDIA GPU" in err and "Traceback" not in err
    assert not log.exists()


def test_cuda_tasks_refuse_cpu_measurers() -> None:
    task = SearchTask(wl.matmul, (16, 16, 16), target=CUDA)
    cpu = SearchTask(wl.matmul, (16, 16, 16))
    with pytest.raises(TuningError, match="mix target kinds"):
        tuning.tune([task, cpu], trials=1, progress=False)


# the tensor-core sketch -----------------------------------------------------------------------


def _tc_steps(c: Any) -> list[Any]:
    return [s for s in c.steps if isinstance(s, TensorCoreStep)]


def test_tensor_core_sketch_is_chosen_only_where_it_fits() -> None:
    for args, target, want in (((64, 64, 128), CUDA, True), ((64, 64, 128, "bfloat16"), "cuda -arch=sm_90", True),
                               ((64, 64, 128), "cuda -arch=sm_75", False), ((64, 48, 40), CUDA, False)):
        described = [s.describe() for s in SearchTask(wl.matmul_tc, args, target=target)
                     .make_space().sketches]
        assert ("C:tensor_core" in described) is want, (args, target, described)
        if want:
            assert described[0] == "C:tensor_core"
    # fp32 inputs: the SIMT sketches only
    assert all("tensor_core" not in s.describe()
               for s in SearchTask(wl.matmul, (64, 64, 64), target=CUDA).make_space().sketches)


def test_tensor_core_sketch_samples_match_numpy() -> None:
    """Seeded samples of the sketch (block and warp tiles, k-step, pipeline depth 1-4, row
    padding) build within the target's limits and, emulated, agree with numpy."""
    m, n, k = 64, 64, 128
    task = SearchTask(wl.matmul_tc, (m, n, k), target=CUDA)
    space = task.make_space()
    assert space.sketches[0].describe() == "C:tensor_core"
    rng = np.random.default_rng(11)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float16)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    depths = set()
    for _ in range(6):
        c = space.instantiate(0, {}, rng)
        assert c is not None
        (step,) = _tc_steps(c)
        depths.add(step.depth)
        assert gpu_space.tc_shared_bytes((step.block_m, step.block_n), step.kstep, step.depth,
                                         step.pad) <= Target.parse(CUDA).gpu.max_dynamic_smem
        assert space.instantiate(0, c.param_dict).key == c.key  # type: ignore[union-attr]
        assert steps_from_json(steps_to_json(c.steps)) == c.steps
        sch, args = task.apply_steps(c.steps)
        f = tc.build(sch, args, target=CUDA)
        assert "ptx_mma" in f.get_source("tir")
        out = np.full((m, n), np.nan, np.float32)
        f.emulate(a, b, out)
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)
    assert len(depths) > 1
    # mutation keeps every knob within what fits (a redrawn value where the old one no longer does)
    x = space.instantiate(0, {"C/tc_block_m": 64, "C/tc_warps_m": 4, "C/tc_depth": 4, "C/tc_kstep": 64}, rng)
    assert x is not None
    for _ in range(4):
        y = space.mutate(x, rng)
        if y is not None and _tc_steps(y):
            (st,) = _tc_steps(y)
            assert not gpu_space.tc_config_problems(m, n, k, (st.block_m, st.block_n), (st.warps_m, st.warps_n),
                                                    st.kstep, st.depth, st.pad)


def test_tensor_core_sketch_bfloat16_sample_matches_numpy() -> None:
    from tecomp.ir import dtype as dt

    m, n, k = 32, 32, 64
    task = SearchTask(wl.matmul_tc, (m, n, k, "bfloat16"), target=CUDA)
    space = task.make_space()
    c = space.instantiate(0, {"C/tc_depth": 3, "C/tc_pad": 8}, np.random.default_rng(2))
    assert c is not None and _tc_steps(c)[0].depth == 3
    rng = np.random.default_rng(3)
    a = dt.f32_to_bf16_bits(rng.standard_normal((m, k)).astype(np.float32))
    b = dt.f32_to_bf16_bits(rng.standard_normal((k, n)).astype(np.float32))
    ref = dt.bf16_bits_to_f32(a).astype(np.float64) @ dt.bf16_bits_to_f32(b).astype(np.float64)
    sch, args = task.apply_steps(c.steps)
    out = np.full((m, n), np.nan, np.float32)
    tc.build(sch, args, target=CUDA).emulate(a, b, out)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)


def test_tune_tensor_core_gemm_end_to_end_with_the_emulating_stand_in(tmp_path: Path, standin: None) -> None:
    task = SearchTask(wl.matmul_tc, (32, 32, 64), target=CUDA)
    tune_with_standin(task, tmp_path / "tc.jsonl", trials=6, batch_size=3, seed=0, population=8,
                      step_type=TensorCoreStep)

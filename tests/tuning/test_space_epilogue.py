"""The epilogue sketch of dense layers (`tuning.space_epilogue`): the weight packed panel by
panel, the register tile vectorized over output columns, and the elementwise chain after the
reduction (bias, activation, residual add) applied to the tile before its one store."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

import tecomp as tc
import tuning
from tecomp import te
from tecomp.te.tensor import ComputeOp
from tuning import LocalBuilder, LocalRunner, SearchTask, workloads
from tuning.measure import MeasureErrorNo
from tuning.records import load_records
from tuning.space import SearchSpace
from tuning.space_epilogue import epilogue_tile_prior, packed_weight_rule, parallel_choices
from tuning.space_rules import Relayout
from tuning.steps import LayoutCacheReadStep
from tuning.task import register_workload

SHAPE = (24, 48, 40)  # n, k, m: small, with tiles that do not all divide evenly
EVEN = (32, 48, 64)  # no tail loops, whose partitioned copies would be second store statements
DENSE_PACK = Relayout("W", (1, 0), (0, 1))


@register_workload
def dense_gelu_chain(n: int, k: int, m: int) -> list[te.Tensor]:
    """A longer chain than the standard workloads': bias, then GELU (tanh), then a residual
    add reading a second input, then a scale; each a stage of its own."""
    X, W, b, gelu = workloads.dense_gelu(n, k, m)
    R = te.placeholder((n, m), "float32", name="R")
    res = te.compute((n, m), lambda i, j: gelu[i, j] + R[i, j], name="res")
    out = te.compute((n, m), lambda i, j: res[i, j] * 0.5, name="scaled")
    return [X, W, b, R, out]


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _reference(name: str, ins: list[np.ndarray]) -> np.ndarray:
    x, w, b = (a.astype(np.float64) for a in ins[:3])
    lin = x @ w.T + b
    if name == "dense_relu":
        return np.maximum(lin, 0.0)
    if name == "dense_gelu":
        return _gelu(lin)
    if name == "dense_bias_residual":
        return lin + ins[3]
    assert name == "dense_gelu_chain"
    return (_gelu(lin) + ins[3]) * 0.5


def _inputs(task: SearchTask, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, [int(d.value) for d in t.shape]).astype("float32")  # type: ignore[attr-defined]
            for t in task.tensors[:-1]]


def _run(task: SearchTask, steps: tuple, ins: list[np.ndarray]) -> np.ndarray:  # type: ignore[type-arg]
    s, args = task.apply_steps(steps)
    got = np.full([int(d.value) for d in task.tensors[-1].shape], np.nan, np.float32)  # type: ignore[attr-defined]
    tc.build(s, args)(*ins, got)
    return got


def _epilogue_sketch(space: SearchSpace) -> int:
    found = [i for i, s in enumerate(space.sketches)
             if any(p.relayout is not None and p.consumer is not None for p in s.plans)]
    assert len(found) == 1, [s.describe() for s in space.sketches]
    return found[0]


def test_rule_packs_the_transposed_weight_only() -> None:
    task = SearchTask(workloads.dense, SHAPE)
    y = next(op for op in task.ops if op.name == "Y")
    assert isinstance(y, ComputeOp) and packed_weight_rule(y) == DENSE_PACK
    # a GEMM reading B[r, j] is contiguous along j already; a convolution gets the relayout
    for w, args in ((workloads.matmul, (16, 16, 16)), (workloads.conv2d, (1, 4, 8, 8, 8, 3, 3, 1, 1))):
        t = SearchTask(w, args)
        assert all(packed_weight_rule(op) is None for op in t.outputs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["dense", "dense_relu", "dense_gelu", "dense_bias_residual", "dense_gelu_chain"])
def test_epilogue_is_fused_into_the_tile_and_the_output_stored_once(name: str) -> None:
    w = getattr(workloads, name, dense_gelu_chain)
    task = SearchTask(w, EVEN)
    space = SearchSpace(task)
    k = _epilogue_sketch(space)
    out_name = task.outputs[0].name
    plan = next(p for p in space.sketches[k].plans if p.relayout is not None)
    # the whole chain after the reduction is one consumer: the output stage
    assert plan.stage == "Y" and plan.consumer == out_name and plan.relayout == DENSE_PACK
    cand = space.instantiate(k, {}, np.random.default_rng(1))
    assert cand is not None
    assert LayoutCacheReadStep("W", "pack", ("Y",), (1, 0)) in cand.steps
    s, args = task.apply_steps(cand.steps)
    text = str(tc.lower(s, args))
    # one statement stores the output, and no other full-size buffer exists: the accumulator
    # is a tile-sized local buffer read back by the epilogue
    stores = re.findall(rf"^\s*{out_name}\[.*\] = ", text, re.M)
    assert len(stores) == 1, text
    n, _, m = EVEN
    sizes = {a: int(sz) for a, sz in re.findall(r"allocate (\w+): float32\[(\d+)\]", text)}
    assert "Y" in sizes and sizes["Y"] < n * m, text
    assert all(sz < n * m for a, sz in sizes.items() if a != "W_pack"), sizes


def test_fresh_candidates_draw_a_register_tile_and_a_parallel_panel() -> None:
    task = SearchTask(workloads.dense_relu, (128, 768, 3072))
    y = next(op for op in task.ops if op.name == "Y")
    assert isinstance(y, ComputeOp)
    rng = np.random.default_rng(0)
    for _ in range(50):
        knobs = epilogue_tile_prior("Y", y.axis, y.reduce_axis, rng)
        s0, s1 = knobs["Y/S0"], knobs["Y/S1"]
        assert s0[0] * s0[2] == 128 and s0[1] == s1[1] == 1  # every row in the tile
        assert s1[2] % 8 == 0 and 4 <= s1[2] // 8 * s0[2] <= 12  # whole vectors, 4-12 accumulators
        assert 3072 // (s1[0] * s1[2]) >= 2  # work for two cores
    # a mutation that leaves one row tile cannot make the parallel loop a single iteration
    assert parallel_choices([128, 768], [(64, 2, 1), (3, 1, 32)]) == (2, 3, 4)


@pytest.mark.parametrize("name", ["dense_relu", "dense_gelu", "dense_bias_residual"])
def test_sampled_candidates_build_and_match_numpy(name: str) -> None:
    task = SearchTask(getattr(workloads, name), SHAPE)
    space = SearchSpace(task)
    k = _epilogue_sketch(space)
    ins = _inputs(task)
    want = _reference(name, ins)
    rng = np.random.default_rng(7)
    # 7 per workload (21 in all): fresh samples of the epilogue sketch, then of the whole space
    for i in range(7):
        cand = space.instantiate(k, {}, rng) if i < 5 else space.sample(rng)
        assert cand is not None
        np.testing.assert_allclose(_run(task, cand.steps, ins), want, rtol=1e-4, atol=1e-4,
                                   err_msg=str(cand.params))
        same = space.instantiate(cand.sketch, cand.param_dict)  # knob values replay
        assert same is not None and same.key == cand.key


def test_mutation_and_crossover_stay_in_the_epilogue_sketch() -> None:
    task = SearchTask(workloads.dense_bias_residual, SHAPE)
    space = SearchSpace(task)
    k = _epilogue_sketch(space)
    rng = np.random.default_rng(11)
    a, b = space.instantiate(k, {}, rng), space.instantiate(k, {}, rng)
    assert a is not None and b is not None
    for child in (space.mutate(a, rng), space.crossover(a, b, rng)):
        assert child is not None and child.sketch == k
        assert any(isinstance(st, LayoutCacheReadStep) for st in child.steps)


def test_short_tune_of_dense_bias_residual_gives_a_verified_best(
        tmp_path: Path, pools: tuple[LocalBuilder, LocalRunner]) -> None:
    builder, runner = pools
    task = SearchTask(workloads.dense_bias_residual, SHAPE)
    log = str(tmp_path / "dense.jsonl")
    # a small search and no final re-timing (test_tune covers remeasure): the test is that
    # the sketch's tuned best is valid
    tuning.tune([task], trials=8, log=log, seed=0, batch_size=8, builder=builder, runner=runner,
                progress=False, remeasure=0,
                search=tuning.SearchOptions(population=16, generations=1, fresh_pool=16))
    recs = [r for r in load_records(log, task) if r.error == MeasureErrorNo.NO_ERROR]
    assert recs
    s, args = task.apply_best(log)
    ins = _inputs(task, 3)
    got = np.full(SHAPE[:1] + SHAPE[2:], np.nan, np.float32)
    tc.build(s, args)(*ins, got)
    np.testing.assert_allclose(got, _reference("dense_bias_residual", ins), rtol=1e-4, atol=1e-4)

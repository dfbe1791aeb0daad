"""The relayout sketch of convolutions: the weight repacked and the accumulator permuted so that
the vector runs over output channels (no gathers for any stride), found by the search itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from numpy_refs import numpy_conv

import tecomp as tc
import tuning
from tecomp import te
from tecomp.errors import ScheduleError
from tecomp.te.layout import cache_read_layout, cache_write_layout
from tuning import LocalBuilder, LocalRunner, SearchTask, workloads
from tuning.measure import MeasureErrorNo
from tuning.records import load_records
from tuning.space import SearchSpace
from tuning.space_rules import (
    CACHE_COLUMNS_MAX,
    LAYOUT_BLOCK_MAX,
    LAYOUT_VECTOR_MAX,
    REGISTER_ACC,
    REGISTER_ACC_MODE,
    Relayout,
    draw_cache_columns,
    draw_reduce_order,
    draw_register_tile,
    relayout_rule,
)
from tuning.steps import LayoutCacheReadStep, LayoutCacheWriteStep, steps_from_json, steps_to_json

CONV_RELAYOUT = Relayout("kernel", (1, 2, 3, 0), (0, 2, 3, 1))



def _inputs(task: SearchTask, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal([int(d.value) for d in t.shape]).astype("float32") for t in task.tensors[:-1]]


def _run(task: SearchTask, steps: tuple, ins: list[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:  # type: ignore[type-arg]
    s, args = task.apply_steps(steps)
    got = np.full(shape, np.nan, np.float32)
    tc.build(s, args)(*ins, got)
    return got


# the primitives -------------------------------------------------------------------------------


def test_layout_primitives_permute_and_keep_results() -> None:
    A = te.placeholder((6, 5), "float32", name="A")
    B = te.placeholder((7, 5), "float32", name="B")  # read as B[j, r]: strided along j
    r = te.reduce_axis((0, 5), name="r")
    C = te.compute((6, 7), lambda i, j: te.sum(A[i, r] * B[j, r], axis=r), name="C")
    s = te.create_schedule(C.op)
    bp = cache_read_layout(s, B, "pack", [C.op], (1, 0))
    cl = cache_write_layout(s, C, "local", (1, 0))
    assert [int(d.value) for d in bp.shape] == [5, 7] and [int(d.value) for d in cl.shape] == [7, 6]
    f = tc.build(s, [A, B, C])
    a = np.random.default_rng(1).standard_normal((6, 5)).astype("float32")
    b = np.random.default_rng(2).standard_normal((7, 5)).astype("float32")
    c = np.empty((6, 7), "float32")
    f(a, b, c)
    np.testing.assert_allclose(c, a @ b.T, rtol=1e-5, atol=1e-5)
    text = str(tc.lower(s, [A, B, C]))
    assert "B_pack" in text and "C_local" in text


def test_layout_primitives_reject_bad_input() -> None:
    A = te.placeholder((4, 3), "float32", name="A")
    C = te.compute((4, 3), lambda i, j: A[i, j] * 2, name="C")
    D = te.compute((4, 3), lambda i, j: C[i, j] + 1, name="D")
    s = te.create_schedule(D.op)
    with pytest.raises(ScheduleError, match=r"order \(0, 0\) is not a permutation of the 2 dimensions"):
        cache_read_layout(s, A, "pack", [C.op], (0, 0))
    with pytest.raises(ScheduleError, match="stage D does not read A"):
        cache_read_layout(s, A, "pack", [D.op], (1, 0))
    with pytest.raises(ScheduleError, match="give at least one reader"):
        cache_read_layout(s, A, "pack", [], (1, 0))
    with pytest.raises(ScheduleError, match="is a placeholder"):
        cache_write_layout(s, A, "local", (1, 0))
    s[D].split(D.op.axis[0], 2)
    with pytest.raises(ScheduleError, match="must come before other primitives"):
        cache_write_layout(s, D, "local", (1, 0))
    with pytest.raises(ScheduleError, match=r"order \(2, 0\) is not a permutation"):
        cache_write_layout(s, C, "local", (2, 0))


# the rule and the sketches --------------------------------------------------------------------


@pytest.mark.parametrize("args", [(1, 8, 9, 9, 16, 3, 3, 2, 1), (1, 8, 8, 8, 16, 1, 1, 1, 0),
                                  (2, 4, 7, 7, 8, 3, 3, 1, 0), (1, 4, 9, 9, 8, 1, 1, 2, 0)])
def test_rule_applies_to_every_conv(args: tuple[int, ...]) -> None:
    task = SearchTask(workloads.conv2d, args)
    assert relayout_rule(task.outputs[0]) == CONV_RELAYOUT  # type: ignore[arg-type]
    names = [s.describe() for s in SearchSpace(task).sketches]
    # the old sketches stay, first; the relayout ones follow (pad inlined, pad computed)
    assert names == ["pad:inline, conv:tile+cache", "pad:inline, conv:tile",
                     "pad:inline, conv:tile+layout kernel", "conv:tile+layout kernel"]


@pytest.mark.parametrize("func,args", [(workloads.matmul, (8, 8, 8)), (workloads.batch_matmul, (2, 4, 4, 4)),
                                       (workloads.depthwise_conv2d, (1, 8, 8, 8, 3, 3, 1, 1))])
def test_rule_leaves_gemm_and_depthwise_alone(func, args) -> None:  # type: ignore[no-untyped-def]
    task = SearchTask(func, args)
    assert all(relayout_rule(op) is None for op in task.outputs)  # type: ignore[arg-type]
    assert not any(p.relayout for s in SearchSpace(task).sketches for p in s.plans)


@pytest.mark.parametrize("args", [(1, 8, 9, 9, 16, 3, 3, 2, 1), (1, 8, 8, 8, 16, 1, 1, 1, 0),
                                  (2, 4, 7, 7, 8, 3, 3, 1, 0), (1, 6, 10, 10, 8, 3, 3, 2, 2)])
def test_relayout_candidates_match_numpy_and_replay(args: tuple[int, ...]) -> None:
    task = SearchTask(workloads.conv2d, args)
    space = SearchSpace(task)
    ins = _inputs(task)
    want = numpy_conv(ins[0], ins[1], args[7], args[8])
    rng = np.random.default_rng(3)
    for k in (2, 3):
        for _ in range(1 if args[1] > 4 else 2):
            cand = space.instantiate(k, {}, rng)
            assert cand is not None
            assert LayoutCacheWriteStep("conv", "local", (0, 2, 3, 1)) in cand.steps
            assert LayoutCacheReadStep("kernel", "pack", ("conv.local",), (1, 2, 3, 0)) in cand.steps
            got = _run(task, cand.steps, ins, want.shape)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(cand.params))
            # steps are data: a JSON round trip gives the same steps, which replay (above)
            assert steps_from_json(steps_to_json(cand.steps)) == cand.steps
            # knob values alone rebuild the same candidate
            same = space.instantiate(k, cand.param_dict)
            assert same is not None and same.key == cand.key


def test_stride_two_vectorizes_over_output_channels_without_gathers() -> None:
    args = (1, 4, 9, 9, 16, 3, 3, 2, 1)
    task = SearchTask(workloads.conv2d, args)
    space = SearchSpace(task)
    # the output-channel axis (last of the accumulator) tiled to one 8-lane vector innermost
    cand = space.instantiate(3, {"conv/S3": (1, 1, 8), "conv/unroll_tile": 0}, np.random.default_rng(0))
    assert cand is not None
    s, targs = task.apply_steps(cand.steps)
    text = str(tc.lower(s, targs))
    accumulate = [ln for ln in text.splitlines() if "conv_local[ramp(" in ln and "kernel_pack[ramp(" in ln]
    assert accumulate, text
    # the input element is broadcast (x8(...)), the weights and the accumulator are contiguous
    assert all("x8(pad[" in ln for ln in accumulate), accumulate
    ins = _inputs(task, 5)
    want = numpy_conv(ins[0], ins[1], 2, 1)
    np.testing.assert_allclose(_run(task, cand.steps, ins, want.shape), want, rtol=1e-4, atol=1e-4)


def test_mutation_and_crossover_stay_in_the_relayout_sketch() -> None:
    task = SearchTask(workloads.conv2d, (1, 4, 8, 8, 8, 3, 3, 2, 1))
    space = SearchSpace(task)
    rng = np.random.default_rng(11)
    a, b = space.instantiate(2, {}, rng), space.instantiate(2, {}, rng)
    assert a is not None and b is not None
    for child in (space.mutate(a, rng), space.crossover(a, b, rng)):
        assert child is not None and child.sketch == 2
        assert any(isinstance(st, LayoutCacheWriteStep) for st in child.steps)


def test_short_tune_measures_and_verifies_relayout_candidates(tmp_path: Path,
                                                              pools: tuple[LocalBuilder, LocalRunner]) -> None:
    builder, runner = pools
    task = SearchTask(workloads.conv2d, (1, 4, 9, 9, 8, 3, 3, 2, 1))
    log = str(tmp_path / "conv.jsonl")
    # a small search and no final re-timing (test_tune covers remeasure): the relayout
    # sketches are drawn by the fresh samples of every batch all the same
    tuning.tune([task], trials=16, log=log, seed=0, batch_size=8, builder=builder, runner=runner,
                progress=False, remeasure=0,
                search=tuning.SearchOptions(population=16, generations=1, fresh_pool=16))
    recs = load_records(log, task)
    relayout = [r for r in recs if any(isinstance(st, LayoutCacheWriteStep) for st in r.steps)]
    # the default space hands the relayout sketches to the search, and the runner checked each
    # of their kernels against the reference (a wrong result would be a recorded error)
    assert relayout and all(r.error == MeasureErrorNo.NO_ERROR for r in relayout), \
        [(r.error, r.error_msg) for r in relayout]
    best = min(relayout, key=lambda r: r.mean)
    ins = _inputs(task, 9)
    want = numpy_conv(ins[0], ins[1], 2, 1)
    np.testing.assert_allclose(_run(task, best.steps, ins, want.shape), want, rtol=1e-4, atol=1e-4)


# the register tile, the cache tile and the reduction order of the relayout sketch ------------


def test_register_tile_draws_whole_vectors_and_8_to_12_accumulators_mostly() -> None:
    rng = np.random.default_rng(0)
    accs = []
    for ef, ex, ey in [(256, 14, 14), (128, 28, 28), (64, 7, 7), (16, 9, None)]:
        for _ in range(50):
            tile = draw_register_tile(ef, ex, ey, rng)
            assert tile is not None
            fv, xv, yv = tile
            assert fv % 8 == 0 and fv <= LAYOUT_VECTOR_MAX and ef % fv == 0
            assert ex % xv == 0 and xv <= LAYOUT_BLOCK_MAX
            assert (yv == 1 if ey is None else ey % yv == 0 and yv <= LAYOUT_BLOCK_MAX)
            accs.append((ex, fv // 8 * xv * yv))
    assert {a for _, a in accs} <= set(REGISTER_ACC)
    # 8-12 accumulators where the extents allow them (7 x 7 pixels and 64 channels do not)
    assert np.mean([a in REGISTER_ACC_MODE for ex, a in accs if ex in (14, 28)]) > 0.65
    assert {a for ex, a in accs if ex == 7} <= {4, 7}
    assert draw_register_tile(4, 3, None, rng) is None  # no whole vector of channels


def test_cache_columns_and_reduce_order_draws() -> None:
    rng = np.random.default_rng(1)
    for rest, xv in [(7, 2), (14, 1), (28, 4), (1, 7)]:
        for _ in range(20):
            m = draw_cache_columns(rest, xv, rng)
            assert rest % m == 0 and (m * xv <= CACHE_COLUMNS_MAX or m == 1)
    orders = [draw_reduce_order([64, 3, 3], rng) for _ in range(200)]
    assert [(1,), (3,), (3,)] in orders  # the kernel taps innermost
    ci_inner = [o for o in orders if o is not None and o[1:] == [(1,), (1,)] and o[0] != (1,)]
    assert ci_inner and all(64 % o[0][0] == 0 and o[0][0] <= 16 for o in ci_inner)
    assert None in orders  # left to the uniform draw
    assert draw_reduce_order([], rng) is None


def test_fresh_relayout_candidates_hold_their_register_tile_in_registers() -> None:
    task = SearchTask(workloads.conv2d, (1, 16, 16, 16, 32, 3, 3, 2, 1))
    space = SearchSpace(task)
    rng = np.random.default_rng(5)
    tiled = 0
    for _ in range(40):
        cand = space.instantiate(3, {}, rng)
        assert cand is not None
        p = cand.param_dict
        s0, s1, s2, s3 = (p[f"conv/S{d}"] for d in range(4))  # accumulator axes n, y, x, co
        acc = s3[2] // 8 * s2[2] * s1[2] * s0[2]
        if s3[1] == s1[1] == s0[1] == 1 and s3[2] % 8 == 0 and acc in REGISTER_ACC:
            tiled += 1
            assert s2[1] * s2[2] <= CACHE_COLUMNS_MAX or s2[1] == 1
    # the prior (REGISTER_TILE_PRIOR) draws most fresh candidates' tiles together
    assert tiled >= 20


@pytest.mark.parametrize("extra", [
    # 2 channel vectors x 2 columns x 2 rows, 4 columns in the cache tile, taps innermost
    {"conv/S3": (1, 1, 16), "conv/S2": (1, 2, 2), "conv/S1": (1, 1, 2), "conv/S0": (1, 1, 1),
     "conv/R0": (1,), "conv/R1": (3,), "conv/R2": (3,), "conv/unroll_tile": 1},
    # 1 vector x 4 columns, input channels innermost
    {"conv/S3": (2, 1, 8), "conv/S2": (1, 1, 4), "conv/S1": (1, 1, 1), "conv/S0": (1, 1, 1),
     "conv/R0": (4,), "conv/R1": (1,), "conv/R2": (1,), "conv/unroll_tile": 1},
])
def test_register_and_cache_tiles_match_numpy_and_replay(extra: dict) -> None:  # type: ignore[type-arg]
    args = (1, 8, 16, 16, 16, 3, 3, 2, 1)
    task = SearchTask(workloads.conv2d, args)
    space = SearchSpace(task)
    cand = space.instantiate(3, extra, np.random.default_rng(2))
    assert cand is not None and all(cand.param_dict[k] == v for k, v in extra.items())
    ins = _inputs(task, 4)
    want = numpy_conv(ins[0], ins[1], 2, 1)
    np.testing.assert_allclose(_run(task, cand.steps, ins, want.shape), want, rtol=1e-4, atol=1e-4)
    same = space.instantiate(3, cand.param_dict)
    assert same is not None and same.key == cand.key
    assert steps_from_json(steps_to_json(cand.steps)) == cand.steps

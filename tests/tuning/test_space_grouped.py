"""Grouped convolutions (`workloads.conv2d_grouped`): the workload against numpy and PyTorch, the
relayout sketch with the vector over the output channels of one group (the input element a
broadcast, no gathers), a short tune, and the weight packed outside the kernel."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from numpy_refs import numpy_conv

import tecomp as tc
import tuning
from tecomp import te
from tuning import LocalBuilder, LocalRunner, SearchTask, workloads
from tuning.measure import MeasureErrorNo
from tuning.prepack import layout_copies, prepacked_steps
from tuning.records import load_records
from tuning.space import SearchSpace
from tuning.space_rules import (
    LAYOUT_VECTOR_MAX,
    Relayout,
    draw_register_tile,
    group_vectors,
    relayout_rule,
    vector_max,
)
from tuning.steps import LayoutCacheReadStep, LayoutCacheWriteStep

# (N, CI, H, W, CO, KH, KW, stride, pad, dilation, groups)
GROUPED = [(1, 16, 9, 9, 16, 3, 3, 2, 1, 1, 4),  # 4 channels per group: 4-lane vectors
           (1, 32, 8, 8, 64, 3, 3, 1, 1, 1, 4),  # 8 in, 16 out per group
           (2, 8, 7, 7, 16, 3, 3, 1, 2, 2, 2),  # dilated
           (1, 16, 6, 6, 32, 1, 1, 1, 0, 1, 2)]  # 1x1


def _inputs(task: SearchTask, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal([int(d.value) for d in t.shape]).astype("float32") for t in task.tensors[:-1]]  # type: ignore[attr-defined]


def _want(ins: list[np.ndarray], args: tuple[int, ...]) -> np.ndarray:
    return numpy_conv(ins[0], ins[1], *args[7:])


def _run(task: SearchTask, steps: tuple, ins: list[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:  # type: ignore[type-arg]
    s, args = task.apply_steps(steps)
    got = np.full(shape, np.nan, np.float32)
    tc.build(s, args)(*ins, got)
    return got


def _broadcast_input(line: str, lanes: int) -> bool:
    """The accumulation ``line`` reads the input as one scalar broadcast to ``lanes`` (padded
    inline: a broadcast select), with no vector index into it (a gather)."""
    return (re.search(rf"x{lanes}\((select\(.*)?(pad|data)\[", line) is not None
            and re.search(r"(pad|data)\[[^\]]*ramp", line) is None)


# the workload ---------------------------------------------------------------------------------


@pytest.mark.parametrize("args", GROUPED + [(1, 6, 7, 7, 6, 3, 3, 1, 2, 2, 6),  # depthwise, dilated
                                            (1, 4, 6, 6, 8, 3, 3, 2, 1, 1, 1),  # groups=1: conv2d
                                            (1, 6, 9, 9, 12, 3, 3, 3, 0, 1, 3)])
def test_workload_matches_numpy_and_torch(args: tuple[int, ...]) -> None:
    task = SearchTask(workloads.conv2d_grouped, args)
    s, targs = task.apply_steps(())
    ins = _inputs(task)
    want = _want(ins, args)
    np.testing.assert_allclose(_run(task, (), ins, want.shape), want, rtol=1e-4, atol=1e-4)
    assert [int(d.value) for d in targs[1].shape] == [args[4], args[1] // args[10], args[5], args[6]]  # type: ignore[attr-defined]
    torch = pytest.importorskip("torch")
    ref = torch.nn.functional.conv2d(torch.from_numpy(ins[0]), torch.from_numpy(ins[1]), stride=args[7],
                                     padding=args[8], dilation=args[9], groups=args[10]).numpy()
    np.testing.assert_allclose(want, ref, rtol=1e-4, atol=1e-4)


def test_groups_one_is_conv2d() -> None:
    plain = SearchTask(workloads.conv2d, (1, 4, 6, 6, 8, 3, 3, 2, 1))
    grouped = SearchTask(workloads.conv2d_grouped, (1, 4, 6, 6, 8, 3, 3, 2, 1, 1, 1))
    ins = _inputs(plain)
    np.testing.assert_array_equal(_run(plain, (), ins, (1, 8, 3, 3)), _run(grouped, (), ins, (1, 8, 3, 3)))


@pytest.mark.parametrize("args,match", [((1, 6, 8, 8, 8, 3, 3, 1, 1, 1, 4), "do not both split into 4 groups"),
                                        ((1, 8, 8, 8, 6, 3, 3, 1, 1, 1, 4), "do not both split into 4 groups"),
                                        ((1, 8, 8, 8, 8, 3, 3, 1, 1, 1, 0), "into 0 groups"),
                                        ((1, 8, 2, 2, 8, 3, 3, 1, 0, 1, 2), "does not fit"),
                                        ((1, 8, 8, 8, 8, 3, 3, 0, 1, 1, 2), "bad shape")])
def test_invalid_groups_raise(args: tuple[int, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        workloads.conv2d_grouped(*args)


# the rule and the sketches --------------------------------------------------------------------


@pytest.mark.parametrize("args,group", [(GROUPED[0], 4), (GROUPED[1], 16), (GROUPED[2], 8), (GROUPED[3], 16),
                                        ((1, 4, 6, 6, 8, 3, 3, 2, 1, 1, 1), None)])
def test_rule_applies_to_grouped_convs(args: tuple[int, ...], group: int | None) -> None:
    task = SearchTask(workloads.conv2d_grouped, args)
    rel = relayout_rule(task.outputs[0])  # type: ignore[arg-type]
    assert rel == Relayout("kernel", (1, 2, 3, 0), (0, 2, 3, 1), group)
    assert vector_max(rel) == min(LAYOUT_VECTOR_MAX, group or LAYOUT_VECTOR_MAX)
    names = [s.describe() for s in SearchSpace(task).sketches]
    assert names == ["pad:inline, conv:tile+cache", "pad:inline, conv:tile",
                     "pad:inline, conv:tile+layout kernel", "conv:tile+layout kernel"]


@pytest.mark.parametrize("width", [128, 256, 512, 1024])
def test_rule_applies_to_resnext_widths(width: int) -> None:
    """ResNeXt-50 32x4d's grouped 3x3 layers: 4, 8, 16 and 32 channels per group."""
    op = workloads.conv2d_grouped(1, width, 7, 7, width, 3, 3, 2, 1, 1, 32)[-1].op
    rel = relayout_rule(op)  # type: ignore[arg-type]
    assert rel is not None and rel.group == width // 32 == vector_max(rel)


@pytest.mark.parametrize("args", [(1, 8, 8, 8, 8, 3, 3, 1, 1, 1, 8),  # depthwise
                                  (1, 8, 8, 8, 16, 3, 3, 1, 1, 1, 8),  # 2 channels per group
                                  (1, 12, 8, 8, 12, 3, 3, 1, 1, 1, 4),  # 3 channels per group
                                  (1, 8, 6, 6, 72, 3, 3, 1, 1, 1, 2)])  # 36: wide, not 8-lane vectors
def test_rule_leaves_other_groups_alone(args: tuple[int, ...]) -> None:
    """The vector is one group, or whole 8-lane vectors within a wider one: fewer than 4
    channels (no vector worth it), a count that is not whole 4-lane vectors, or a group wider
    than `LAYOUT_VECTOR_MAX` that is not whole 8-lane vectors do not get the rewrite."""
    task = SearchTask(workloads.conv2d_grouped, args)
    assert relayout_rule(task.outputs[0]) is None  # type: ignore[arg-type]
    assert not any(p.relayout for s in SearchSpace(task).sketches for p in s.plans)


def test_rule_rejects_mixed_group_reads() -> None:
    """An input read through ``f // 4`` and ``f // 8`` at once has no single group."""
    A = te.placeholder((1, 8, 6, 6), "float32", name="A")
    K = te.placeholder((16, 2, 3), "float32", name="K")
    r = te.reduce_axis((0, 2), name="r")
    q = te.reduce_axis((0, 3), name="q")
    C = te.compute((1, 16, 4, 4), lambda b, f, y, x: te.sum(
        A[b, f // 4 + f // 8 + r, y, x + q] * K[f, r, q], axis=[r, q]), name="C")
    assert relayout_rule(C.op) is None  # type: ignore[arg-type]


def test_register_tile_divides_the_group() -> None:
    rng = np.random.default_rng(0)
    for ef, group in [(128, 4), (256, 8), (512, 16), (1024, 32), (96, 12)]:
        for _ in range(20):
            tile = draw_register_tile(ef, 28, 28, rng, group)
            assert tile is not None and tile[0] == group  # the vector is one group
            assert -(-group // 8) * tile[1] * tile[2] in range(4, 13)
    assert draw_register_tile(8, 7, 7, rng, 16) is None


@pytest.mark.parametrize("args", GROUPED)
def test_relayout_candidates_match_numpy_without_gathers(args: tuple[int, ...]) -> None:
    task = SearchTask(workloads.conv2d_grouped, args)
    space = SearchSpace(task)
    ins = _inputs(task)
    want = _want(ins, args)
    group = args[4] // args[10]
    rng = np.random.default_rng(3)
    for k in (2, 3):
        for _ in range(2):
            cand = space.instantiate(k, {}, rng)
            assert cand is not None
            assert LayoutCacheWriteStep("conv", "local", (0, 2, 3, 1)) in cand.steps
            assert LayoutCacheReadStep("kernel", "pack", ("conv.local",), (1, 2, 3, 0)) in cand.steps
            fv = cand.param_dict["conv/S3"][-1]
            assert fv == group, cand.params  # the vector is one group
            s, targs = task.apply_steps(cand.steps)
            text = str(tc.lower(s, targs))
            # no gather anywhere; with a vector (its width > 1), the input element of a group is
            # broadcast over its channels' vector of weights
            updates = [ln for ln in text.splitlines() if "conv_local[" in ln and "kernel_pack[" in ln]
            assert updates and not any(re.search(r"(pad|data)\[[^\]]*ramp", ln) for ln in updates), cand.params
            acc = [ln for ln in updates if "conv_local[ramp(" in ln and "kernel_pack[ramp(" in ln]
            assert acc and all(_broadcast_input(ln, fv) for ln in acc), (cand.params, acc[:2])
            got = _run(task, cand.steps, ins, want.shape)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(cand.params))


# (args, vector widths that divide the group): 64 and 48 channels per group
WIDE = [((1, 16, 6, 6, 128, 3, 3, 1, 1, 1, 2), (8, 16, 32)),
        ((1, 8, 7, 7, 96, 3, 3, 2, 1, 1, 2), (8, 16, 24))]


@pytest.mark.parametrize("args,widths", WIDE)
def test_a_group_wider_than_a_vector_is_cut_into_vectors_that_divide_it(
        args: tuple[int, ...], widths: tuple[int, ...]) -> None:
    task = SearchTask(workloads.conv2d_grouped, args)
    rel = relayout_rule(task.outputs[0])  # type: ignore[arg-type]
    group = args[4] // args[10]
    assert rel is not None and rel.group == group and vector_max(rel) == max(widths)
    assert group_vectors(group) == widths
    rng = np.random.default_rng(1)
    for _ in range(10):
        tile = draw_register_tile(args[4], 6, 6, rng, group)
        assert tile is not None and tile[0] in widths
    space = SearchSpace(task)
    ins = _inputs(task, 2)
    want = _want(ins, args)
    seen = set()
    for k in (2, 3):
        for _ in range(3):
            cand = space.instantiate(k, {}, rng)
            assert cand is not None
            fv = cand.param_dict["conv/S3"][-1]
            assert fv in widths, cand.params
            seen.add(fv)
            s, targs = task.apply_steps(cand.steps)
            text = str(tc.lower(s, targs))
            updates = [ln for ln in text.splitlines() if "conv_local[" in ln and "kernel_pack[" in ln]
            # every lane of a vector reads the same input channel: a broadcast, never a gather
            assert updates and not any(re.search(r"(pad|data)\[[^\]]*ramp", ln) for ln in updates), cand.params
            acc = [ln for ln in updates if "conv_local[ramp(" in ln and "kernel_pack[ramp(" in ln]
            # (a 24-lane vector is emitted as 16 + 8 lanes: each part broadcasts its element)
            lanes = [int(m.group(1)) for ln in acc if (m := re.search(r"conv_local\[ramp\(.*?, 1, (\d+)\)\]", ln))]
            assert acc and len(lanes) == len(acc) and all(n <= fv for n in lanes), (cand.params, acc[:2])
            assert all(_broadcast_input(ln, n) for ln, n in zip(acc, lanes)), (cand.params, acc[:2])
            np.testing.assert_allclose(_run(task, cand.steps, ins, want.shape), want, rtol=1e-4, atol=1e-4,
                                       err_msg=str(cand.params))
    # a hand-written tile whose vector does not divide the group is redrawn to the widest one
    given = space.instantiate(3, {"conv/S3": (1, 1, args[4] // 1)}, rng)
    assert given is not None and given.param_dict["conv/S3"][-1] in widths


def test_mutation_crossover_and_given_tiles_keep_the_group_vector() -> None:
    task = SearchTask(workloads.conv2d_grouped, GROUPED[1])  # 16 channels per group
    space = SearchSpace(task)
    rng = np.random.default_rng(11)
    a, b = space.instantiate(2, {}, rng), space.instantiate(3, {}, rng)
    assert a is not None and b is not None
    children = [space.mutate(a, rng) for _ in range(6)] + [space.crossover(a, b, rng) for _ in range(4)]
    # a tile whose vector is not the group (a log of another space, a hand-written knob) is
    # redrawn over the groups, and the candidate records the tile it used
    given = space.instantiate(3, {"conv/S3": (1, 2, 8)}, rng)
    for c in [*children, given]:
        if c is None or not any(isinstance(st, LayoutCacheWriteStep) for st in c.steps):
            continue
        assert c.param_dict["conv/S3"][-1] == 16, c.params
        same = space.instantiate(c.sketch, c.param_dict)
        assert same is not None and same.key == c.key
    assert given is not None and given.param_dict["conv/S3"][-1] == 16


def test_resnext_group_vectorizes_four_channels() -> None:
    """ResNeXt-50 32x4d's first stage: 4 channels per group, the vector one xmm of them."""
    args = (1, 32, 8, 8, 32, 3, 3, 1, 1, 1, 8)
    task = SearchTask(workloads.conv2d_grouped, args)
    cand = SearchSpace(task).instantiate(2, {"conv/S3": (2, 1, 4), "conv/unroll_tile": 0}, np.random.default_rng(0))
    assert cand is not None
    s, targs = task.apply_steps(cand.steps)
    text = str(tc.lower(s, targs))
    acc = [ln for ln in text.splitlines() if "conv_local[ramp(" in ln and "kernel_pack[ramp(" in ln]
    assert acc and all(_broadcast_input(ln, 4) for ln in acc), acc[:2]
    ins = _inputs(task, 5)
    want = _want(ins, args)
    np.testing.assert_allclose(_run(task, cand.steps, ins, want.shape), want, rtol=1e-4, atol=1e-4)


# tuning and the packed weight -----------------------------------------------------------------


def test_short_tune_verifies_and_prepacks(tmp_path: Path, pools: tuple[LocalBuilder, LocalRunner]) -> None:
    builder, runner = pools
    args = (1, 16, 9, 9, 16, 3, 3, 2, 1, 1, 2)
    task = SearchTask(workloads.conv2d_grouped, args)
    log = str(tmp_path / "gconv.jsonl")
    tuning.tune([task], trials=16, log=log, seed=0, batch_size=8, cost_model="random", remeasure=0,
                builder=builder, runner=runner, progress=False)
    recs = load_records(log, task)
    relayout = [r for r in recs if r.valid and layout_copies(r.steps)]
    assert relayout, [(r.error, r.error_msg) for r in recs]
    assert all(r.error == MeasureErrorNo.NO_ERROR for r in recs), [(r.error, r.error_msg) for r in recs]
    ins = _inputs(task, 9)
    want = _want(ins, args)
    s, targs = task.apply_best(log)
    got = np.full(want.shape, np.nan, np.float32)
    tc.build(s, targs)(*ins, got)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # the best of the log, and a relayout candidate whichever won, with the weight packed outside
    for pp in (tuning.prepacked_best(task, log), prepacked_steps(task, relayout[0].steps)):
        _check_prepacked(pp, ins, want)


@pytest.mark.parametrize("blocked", [True, False])
def test_grouped_weight_hoists(blocked: bool) -> None:
    args = GROUPED[1]
    task = SearchTask(workloads.conv2d_grouped, args)
    space = SearchSpace(task)
    ins = _inputs(task, 2)
    want = _want(ins, args)
    rng = np.random.default_rng(7)
    for k in (2, 3):
        cand = space.instantiate(k, {"conv/S3": (2, 2, 16)}, rng)
        assert cand is not None
        pp = prepacked_steps(task, cand.steps, blocked=blocked)
        assert [a.name for a in pp.args] == ["data", "kernel_pack", "conv"]
        assert pp.packs[0].order == (1, 2, 3, 0)
        # blocked: a tile of output channels (within groups) contiguous, block index first
        shape = [int(d.value) for d in pp.packs[0].packed.shape]  # type: ignore[attr-defined]
        if len(shape) == 5:
            assert blocked and shape[1:4] == [8, 3, 3] and shape[0] * shape[4] == 64
        else:
            assert shape == [8, 3, 3, 64]
        _check_prepacked(pp, ins, want)


def _check_prepacked(pp: tuning.Prepacked, ins: list[np.ndarray], want: np.ndarray) -> None:
    arrays = {"data": ins[0], "kernel": ins[1]}
    for h in pp.packs:
        packed = np.full([int(d.value) for d in h.packed.shape], np.nan, np.float32)  # type: ignore[attr-defined]
        tc.build(h.schedule, h.args)(arrays[h.source.name], packed)
        np.testing.assert_array_equal(packed, h.numpy(arrays[h.source.name]))
        arrays[h.packed.name] = packed
    got = np.full(want.shape, np.nan, np.float32)
    tc.build(*pp.kernel)(*[arrays[a.name] for a in pp.args[:-1]], got)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

"""Tuned convolutions with the weight packed once, outside the kernel (`tuning.prepack`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from numpy_refs import numpy_conv

import tecomp as tc
import tuning
from tuning import LocalBuilder, LocalRunner, SearchTask, workloads
from tuning.prepack import layout_copies, prepacked_steps
from tuning.space import SearchSpace
from tuning.steps import LayoutCacheReadStep


def _inputs(args: tuple[int, ...], seed: int) -> tuple[np.ndarray, np.ndarray]:
    n, ci, h, w, co, kh, kw, _, _ = args
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, ci, h, w)).astype("float32"),
            rng.standard_normal((co, ci, kh, kw)).astype("float32"))


def _check(pp: tuning.Prepacked, args: tuple[int, ...], seed: int) -> None:
    """The pre-transforms then the kernel, built apart, against numpy."""
    x, w = _inputs(args, seed)
    arrays: dict[str, np.ndarray] = {"data": x, "kernel": w}
    for h in pp.packs:
        packed = np.full([int(d.value) for d in h.packed.shape], np.nan, np.float32)  # type: ignore[attr-defined]
        tc.build(h.schedule, h.args)(arrays[h.source.name], packed)
        np.testing.assert_array_equal(packed, h.numpy(arrays[h.source.name]))
        arrays[h.packed.name] = packed
    want = numpy_conv(x, w, args[7], args[8])
    got = np.full(want.shape, np.nan, np.float32)
    tc.build(*pp.kernel)(*[arrays[a.name] for a in pp.args[:-1]], got)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("args", [(1, 8, 9, 9, 16, 3, 3, 2, 1), (1, 8, 8, 8, 16, 1, 1, 1, 0)])
def test_relayout_candidates_prepacked_match_numpy(args: tuple[int, ...]) -> None:
    task = SearchTask(workloads.conv2d, args)
    space = SearchSpace(task)
    rng = np.random.default_rng(3)
    for k in (2, 3):  # the relayout sketches of a conv
        cand = space.instantiate(k, {}, rng)
        assert cand is not None and layout_copies(cand.steps) == ["kernel.pack"]
        for blocked in (True, False):
            pp = prepacked_steps(task, cand.steps, blocked=blocked)
            # the packed weight takes the plain one's place among the arguments
            assert [a.name for a in pp.args] == ["data", "kernel_pack", "conv"]
            assert pp.pack[1][0] is task.tensors[1] and pp.packs[0].order == (1, 2, 3, 0)
            assert blocked or pp.packs[0].block == (None,) * 4
            _check(pp, args, 5)


def test_schedule_without_a_layout_copy_is_kept_whole() -> None:
    args = (1, 4, 6, 6, 8, 3, 3, 1, 1)
    task = SearchTask(workloads.conv2d, args)
    pp = prepacked_steps(task, ())
    assert pp.packs == () and [a.name for a in pp.args] == ["data", "kernel", "conv"]
    with pytest.raises(tuning.TuningError, match="0 pre-transforms, not one"):
        _ = pp.pack
    _check(pp, args, 1)


def test_tuned_conv_prepacked_matches_numpy_and_exports(tmp_path: Path,
                                                        pools: tuple[LocalBuilder, LocalRunner]) -> None:
    builder, runner = pools
    args = (1, 8, 9, 9, 16, 3, 3, 2, 1)
    task = SearchTask(workloads.conv2d, args)
    log = str(tmp_path / "conv.jsonl")
    # random search, no re-timing: the shortest tune that measures relayout candidates
    tuning.tune([task], trials=8, log=log, seed=0, batch_size=8, cost_model="random", remeasure=0,
                builder=builder, runner=runner, progress=False)
    pp = tuning.prepacked_best(task, log)
    best = tuning.best_record(log, task)
    assert len(pp.packs) == sum(isinstance(s, LayoutCacheReadStep) for s in best.steps)
    _check(pp, args, 9)
    # a relayout candidate of the log, whichever won: the export carries the pre-transform
    recs = [r for r in tuning.load_records(log, task) if r.valid and layout_copies(r.steps)]
    assert recs, "the short tune measured no relayout candidate"
    pp = prepacked_steps(task, recs[0].steps)
    files = pp.export_library(tmp_path / "conv.so", name="conv")
    lib = tc.runtime.load_module(files.library)
    x, w = _inputs(args, 11)
    wp = np.empty(pp.packs[0].shape, "float32")
    lib["conv_pack_kernel"](w, wp)
    np.testing.assert_array_equal(wp, pp.packs[0].numpy(w))
    want = numpy_conv(x, w, 2, 1)
    got = np.full(want.shape, np.nan, np.float32)
    lib["conv"](x, wp, got)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    about = json.loads(Path(files.manifest).read_text())
    assert "conv_pack_kernel" in json.dumps(about) and "pre_transform_of" in json.dumps(about)

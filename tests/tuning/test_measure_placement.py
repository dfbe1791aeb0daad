"""The tuner measures on arrays placed as users' numpy arrays are (16 bytes past a 64-byte
boundary), not on aligned ones a user never passes: a logged time must hold on ordinary arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tuning import SearchTask, workloads
from tuning.measure import (
    _PREPARED,
    ALIGN,
    MEASURE_OFFSET,
    MeasureErrorNo,
    RunOptions,
    _build_job,
    _prepare_job,
    _run_job,
    aligned_empty,
    kernel_args,
    measure_empty,
)
from tuning.prepack import layout_copies
from tuning.space import SearchSpace


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "float16", "complex128"])
def test_measure_empty_places_data_at_the_measuring_offset(dtype: str) -> None:
    # off a 32-byte boundary: every other AVX2 vector splits a cache line, as on numpy's arrays
    assert MEASURE_OFFSET % 32 == 16
    for shape in [(3, 5), (1,), (64, 33)]:
        a = measure_empty(shape, dtype)
        assert a.shape == shape and a.dtype == np.dtype(dtype) and a.flags.c_contiguous
        assert a.ctypes.data % ALIGN == MEASURE_OFFSET
        a[...] = 1  # the whole array lies inside its allocation
        assert aligned_empty(shape, dtype).ctypes.data % ALIGN == 0


def test_aligned_empty_rejects_an_offset_it_cannot_keep() -> None:
    with pytest.raises(ValueError, match="offset 6 must be a multiple of the item size of float32"):
        aligned_empty((4,), "float32", offset=6)
    with pytest.raises(ValueError, match="below 64"):
        aligned_empty((4,), "float32", offset=64)


def test_candidates_and_their_packed_weights_are_timed_off_alignment(tmp_path: Path) -> None:
    task = SearchTask(workloads.conv2d, (1, 8, 10, 10, 16, 3, 1, 1, 1), prepack=True)
    key = _prepare_job(task, str(tmp_path))
    arrays = _PREPARED[key]["arrays"]
    assert [a.ctypes.data % ALIGN for a in arrays] == [MEASURE_OFFSET] * len(task.tensors)
    cand = SearchSpace(task).instantiate(2, {}, np.random.default_rng(3))  # a relayout sketch
    assert cand is not None and layout_copies(cand.steps) == ["kernel.pack"]
    build = _build_job(task, cand.steps, "f")
    assert build.error == MeasureErrorNo.NO_ERROR, build.error_msg
    from tecomp.codegen.backend import backend_for

    assert build.artifact is not None
    args = kernel_args(backend_for(build.artifact.target).load(build.artifact), build, arrays)
    assert [a.ctypes.data % ALIGN for a in args] == [MEASURE_OFFSET] * len(args)
    # and the candidate computes the right answer there (the runner checks it against the
    # default schedule on these very arrays)
    err, costs, msg = _run_job(key, build, RunOptions(number=1, repeat=1, min_repeat_ms=0.0))
    assert err == "NO_ERROR" and len(costs) == 1, msg


def test_short_kernels_run_warm_before_they_are_timed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel timed at once runs slowly for tens of ms: a kernel whose call is shorter than
    ``RunOptions.warmup_ms`` runs untimed that long first (`warm_up`); a longer call warms
    itself, and ``warmup_ms=0`` turns it off."""
    import time

    import tuning.measure as m

    calls: list[float] = []

    def ev(*args: object) -> None:
        calls.append(time.perf_counter())

    t0 = time.perf_counter()
    m.warm_up(ev, [], RunOptions(warmup_ms=30.0), 0.001)
    assert calls and time.perf_counter() - t0 >= 0.03  # untimed calls for 30 ms
    calls.clear()
    m.warm_up(ev, [], RunOptions(warmup_ms=30.0), 0.05)
    m.warm_up(ev, [], RunOptions(warmup_ms=0.0), 0.001)
    assert not calls
    assert RunOptions().warmup_ms >= 30.0
    for ms in (0.0, RunOptions().warmup_ms):  # the runner's knob (0: timed at once)
        runner = m.LocalRunner(warmup_ms=ms)
        assert runner.options.warmup_ms == ms
        runner.close()
    with pytest.raises(ValueError, match="warmup_ms must be >= 0"):
        m.LocalRunner(warmup_ms=-1.0)
    # the run job warms the candidate with its own calibrated timer, before its repeats
    seen: list[tuple[float, float]] = []
    real = m.warm_up

    def spy(ev: object, args: list[np.ndarray], opts: RunOptions, first: float) -> None:
        seen.append((opts.warmup_ms, first))
        real(ev, args, opts, first)

    monkeypatch.setattr(m, "warm_up", spy)
    task = SearchTask(workloads.matmul, (32, 32, 32))
    key = _prepare_job(task, str(tmp_path))
    build = _build_job(task, (), "f")
    err, costs, msg = _run_job(key, build, RunOptions(number=1, repeat=2, min_repeat_ms=0.0, warmup_ms=5.0))
    assert err == "NO_ERROR" and len(costs) == 2, msg
    assert len(seen) == 1 and seen[0][0] == 5.0 and 0 < seen[0][1] < 1.0

"""The reference schedule (tuning/reference.py) computes what the default schedule does."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tecomp as tc
import tuning.workloads as W
from tuning import SearchTask
from tuning.reference import reference_schedule

CASES: list[tuple[Any, tuple[int, ...]]] = [
    (W.matmul, (67, 45, 83)),  # no extent a multiple of the vector: tails everywhere
    (W.batch_matmul, (3, 16, 24, 40)),
    (W.conv2d, (1, 8, 12, 12, 16, 3, 3, 2, 1)),
    (W.conv2d_grouped, (1, 16, 10, 10, 16, 3, 3, 1, 1, 1, 4)),
    (W.depthwise_conv2d, (1, 8, 9, 9, 3, 3, 1, 1)),
    (W.softmax, (7, 33)),
    (W.layer_norm, (5, 40)),
    (W.dense_gelu, (4, 32, 24)),
    (W.group_norm, (1, 8, 5, 5, 4)),
]


def _outputs(task: SearchTask, sch: Any, inputs: list[np.ndarray]) -> list[np.ndarray]:
    arrays = [x.copy() for x in inputs]
    tc.build(sch, task.tensors, target="llvm")(*arrays)
    return [arrays[k] for k, t in enumerate(task.tensors) if t.op in task.outputs]


@pytest.mark.parametrize("fn,args", CASES, ids=lambda x: getattr(x, "__name__", None))
def test_reference_schedule_computes_the_default_schedules_outputs(fn: Any, args: tuple[int, ...]) -> None:
    task = SearchTask(fn, args, target="llvm")
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(tuple(int(d.value) for d in t.shape)).astype(t.dtype)  # type: ignore[attr-defined]
              for t in task.tensors]
    want = _outputs(task, task.create_schedule(), inputs)
    got = _outputs(task, reference_schedule(task), inputs)
    for w, g in zip(want, got, strict=True):
        # each element sums its terms in the declared order either way; only FMA contraction
        # may round a product once less
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * float(np.abs(w).max()))


def test_reference_of_a_gemm_is_parallel_and_vectorized() -> None:
    task = SearchTask(W.matmul, (64, 64, 64), target="llvm")
    text = str(tc.lower(reference_schedule(task), task.tensors))
    assert "parallel" in text
    src = tc.build(reference_schedule(task), task.tensors, target="llvm").get_source()
    assert "<8 x float>" in src

"""The plain multi-level tile's ``par`` knob: every sample of an operator with real work has
a parallel loop with an iteration for each core; only a small operator may be serial."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tecomp.ir.functor import StmtVisitor
from tecomp.ir.stmt import For, ForKind
from tecomp.lowering import lower
from tuning import workloads
from tuning.space import SERIAL_FLOPS, plain_parallel_choices
from tuning.steps import AnnotationStep
from tuning.task import SearchTask


def _parallel_extents(task: SearchTask, steps: list[object]) -> list[int]:
    """The extents of the parallel loops of the lowered candidate."""
    sch, args = task.apply_steps(steps)  # type: ignore[arg-type]
    found: list[int] = []

    class V(StmtVisitor):
        def visit_For(self, f: For) -> None:
            if f.kind == ForKind.PARALLEL:
                found.append(int(f.extent.value))  # type: ignore[attr-defined]
            self.visit_stmt(f.body)

    V().visit_stmt(lower(sch, args, passes=False).body)
    return found


@pytest.mark.parametrize("args", [(12, 128, 128, 64), (12, 128, 64, 128), (4, 64, 64, 64)])
def test_batch_matmul_samples_are_parallel_over_every_core(args: tuple[int, ...]) -> None:
    task = SearchTask(workloads.batch_matmul, args)
    space = task.make_space()
    seen = 0
    for seed in range(16):
        rng = np.random.default_rng(seed)
        for k in range(len(space.sketches)):
            c = space.instantiate(k, {}, rng)
            if c is None or "C/par" not in c.param_dict:
                continue
            seen += 1
            assert c.param_dict["C/par"] >= 1, (seed, k)
            par = [s for s in c.steps if isinstance(s, AnnotationStep) and s.annotation == "parallel"
                   and s.stage == "C"]
            assert par, (seed, k, c.steps)
            assert _parallel_extents(task, c.steps) and min(_parallel_extents(task, c.steps)) >= 2, (seed, k)
    assert seen >= 16


def test_only_a_small_operator_may_be_serial() -> None:
    big = SearchTask(workloads.batch_matmul, (12, 128, 128, 64)).tensors[-1].op
    small = SearchTask(workloads.matmul, (16, 16, 16)).tensors[-1].op
    assert math.prod(int(a.dom.extent.value) for a in (*small.axis, *small.reduce_axis)) < SERIAL_FLOPS
    tiles_big = [(1, 1, 1)] * len(big.axis)
    tiles_small = [(1, 1, 1)] * len(small.axis)
    assert 0 not in plain_parallel_choices(big, tiles_big)
    assert 0 in plain_parallel_choices(small, tiles_small)
    # a tile whose S0 loops have one iteration: the options start where the fused loop has two
    one = [(4, 8, 4)] + [(1, 16, 8)] + [(1, 1, 8)] * (len(big.axis) - 2)
    opts = plain_parallel_choices(big, one)
    assert 1 not in opts and min(opts) >= 2

"""Steps: JSON round trip, stable keys, and replay identical to the hand-applied primitives."""

from __future__ import annotations

import json

import pytest
import tuning_workloads as wl

import tecomp as tc
from tecomp.errors import ScheduleError
from tuning import SearchTask
from tuning.steps import (
    AnnotationStep,
    CacheReadStep,
    CacheWriteStep,
    ComputeAtStep,
    ComputeInlineStep,
    ComputeRootStep,
    FuseStep,
    LayoutCacheReadStep,
    LayoutCacheWriteStep,
    PragmaStep,
    ReorderStep,
    RfactorStep,
    SplitStep,
    State,
    step_from_json,
    steps_from_json,
    steps_key,
    steps_to_json,
)

EVERY_KIND = (
    SplitStep("C", 0, (4, 8)), ReorderStep("C", (1, 0, 2)), FuseStep("C", (0, 1)),
    AnnotationStep("C", 2, "vectorize"), PragmaStep("C", 0, "auto_unroll_max_step", 64),
    ComputeAtStep("C.local", "C", 1), ComputeInlineStep("T"), ComputeRootStep("T"),
    CacheWriteStep("C", "local"), CacheReadStep("A", "local", ("C",)), RfactorStep("mx", 1, 1),
    LayoutCacheReadStep("W", "pack", ("conv",), (1, 2, 3, 0)), LayoutCacheWriteStep("conv", "local", (0, 2, 3, 1)),
)


def test_json_round_trip_every_kind() -> None:
    text = json.dumps(steps_to_json(EVERY_KIND))
    back = steps_from_json(json.loads(text))
    assert back == EVERY_KIND
    assert all(hash(a) == hash(b) for a, b in zip(back, EVERY_KIND))
    assert steps_key(back) == steps_key(EVERY_KIND)
    assert steps_key(EVERY_KIND[:-1]) != steps_key(EVERY_KIND)


def test_unknown_or_incomplete_step_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown step kind"):
        step_from_json({"kind": "warp_drive", "stage": "C"})
    with pytest.raises(ValueError, match="missing field"):
        step_from_json({"kind": "split", "stage": "C", "axis": 0})


def _direct_matmul(task: SearchTask) -> tc.te.Schedule:
    A, B, C = task.tensors
    s = task.create_schedule()
    CC = s.cache_write(C, "local")
    i, j = s[C].op.axis
    io, ii = s[C].split(i, factor=8)
    jo, ji = s[C].split(j, factor=16)
    s[C].reorder(io, jo, ii, ji)
    f = s[C].fuse(io, jo)
    s[C].parallel(f)
    s[C].vectorize(ji)
    s[CC].compute_at(s[C], f)
    ci, cj = s[CC].op.axis
    ko, ki = s[CC].split(s[CC].op.reduce_axis[0], factor=4)
    s[CC].reorder(ko, ci, ki, cj)
    s[CC].vectorize(cj)
    s[CC].pragma(ko, "auto_unroll_max_step", 16)
    return s


MATMUL_STEPS = (
    CacheWriteStep("C", "local"), SplitStep("C", 0, (8,)), SplitStep("C", 2, (16,)),
    ReorderStep("C", (0, 2, 1, 3)), FuseStep("C", (0, 1)), AnnotationStep("C", 0, "parallel"),
    AnnotationStep("C", 2, "vectorize"), ComputeAtStep("C.local", "C", 0),
    SplitStep("C.local", 2, (4,)), ReorderStep("C.local", (2, 0, 3, 1)),
    AnnotationStep("C.local", 3, "vectorize"), PragmaStep("C.local", 0, "auto_unroll_max_step", 16),
)


def test_replay_equals_direct_schedule() -> None:
    task = SearchTask(wl.matmul, (32, 16, 48))
    direct = tc.lower(_direct_matmul(task), task.tensors)
    s, args = task.apply_steps(steps_from_json(json.loads(json.dumps(steps_to_json(MATMUL_STEPS)))))
    assert str(tc.lower(s, args)) == str(direct)


def test_replay_rfactor_and_inline() -> None:
    task = SearchTask(wl.softmax, (8, 64))
    s = task.create_schedule()
    A, out = task.tensors
    mx = s.stages[1].op.output(0)
    ko, ki = s[mx].split(s[mx].op.reduce_axis[0], factor=16)
    s.rfactor(mx, ki, 1)
    direct = str(tc.lower(s, [A, out]))
    s2, args = task.apply_steps((SplitStep("mx", 1, (16,)), RfactorStep("mx", 2, 1)))
    assert str(tc.lower(s2, args)) == direct
    st = State(task)
    st.apply(ComputeInlineStep("e"))
    assert st.stage("e").attach_type == "inline"


def test_bad_step_raises_schedule_error() -> None:
    task = SearchTask(wl.matmul, (8, 8, 8))
    with pytest.raises(ScheduleError, match="no leaf axis"):
        task.apply_steps((SplitStep("C", 7, (2,)),))
    with pytest.raises(ScheduleError, match="no stage named"):
        task.apply_steps((SplitStep("Z", 0, (2,)),))

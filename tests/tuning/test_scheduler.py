"""The gradient task scheduler: rounds go where the weighted latency gains most (pure policy,
checked on synthetic best-cost histories; no measurement)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tuning import TuningError
from tuning.scheduler import GradientTaskScheduler, check_weights, floor_rounds


def _sched(weights: list[float], eps: float = 0.0, seed: int = 0) -> GradientTaskScheduler:
    return GradientTaskScheduler(weights, np.random.default_rng(seed), eps_greedy=eps)


def test_warm_up_gives_every_task_a_round_in_order() -> None:
    s = _sched([1.0, 100.0, 1.0], eps=1.0)  # even an always-random pick waits for the warm-up
    order = []
    for _ in range(3):
        i = s.next_task()
        assert i is not None
        order.append(i)
        s.observe(i, 1e-3)
    assert order == [0, 1, 2]


def test_a_task_that_still_improves_gets_the_round() -> None:
    s = _sched([1.0, 1.0])
    for c in (2.0, 1.5, 1.2, 1.0):  # same best now, but it got there lately
        s.observe(0, c)
    for _ in range(4):
        s.observe(1, 1.0)  # flat
    assert s.gradient(0) < s.gradient(1) < 0
    assert s.next_task() == 0
    # once it has stopped improving for a window, the two are alike again
    for _ in range(3):
        s.observe(0, 1.0)
        s.observe(1, 1.0)
    assert s.gradient(0) == pytest.approx(s.gradient(1))


def test_a_heavier_task_gets_the_round() -> None:
    s = _sched([1.0, 10.0])
    for i in (0, 1):
        for c in (2.0, 1.0):
            s.observe(i, c)
    assert s.gradient(1) == pytest.approx(10 * s.gradient(0))
    assert s.next_task() == 1
    # the weighted latency, not the cost alone: a 10x faster kernel run 10x as often is a tie
    s = _sched([1.0, 10.0])
    s.observe(0, 1.0)
    s.observe(1, 0.1)
    assert s.gradient(0) == pytest.approx(s.gradient(1))


def _simulate(weights: list[float], curves: list, rounds: int, seed: int = 0) -> list[int]:
    """Rounds given to each task when task i's best cost after r rounds is curves[i](r)."""
    s = GradientTaskScheduler(weights, np.random.default_rng(seed))
    got = [0] * len(weights)
    for _ in range(rounds):
        i = s.next_task()
        assert i is not None
        got[i] += 1
        s.observe(i, curves[i](got[i]))
    return got


def test_allocation_follows_weight_and_improvement() -> None:
    same = [lambda r: 1.0 + 1.0 / r] * 2
    # equal tasks, equal weights: an even share; weight 10: most of the rounds
    even = _simulate([1.0, 1.0], same, 40)
    assert abs(even[0] - even[1]) <= 4
    heavy = _simulate([1.0, 10.0], same, 40)
    assert heavy[1] >= 3 * heavy[0] and heavy[0] >= 1
    # a task that keeps improving (towards the same cost) beats one done after its first round
    improving = _simulate([1.0, 1.0], [lambda r: 1.0 + 2.0 * 0.9**r, lambda r: 1.0], 40)
    assert improving[0] >= improving[1] + 4
    # a seed replays the same allocation
    assert _simulate([1.0, 10.0], same, 40, seed=3) == _simulate([1.0, 10.0], same, 40, seed=3)


def test_the_floor_gives_a_light_task_its_rounds_before_the_gradient_decides() -> None:
    same = [lambda r: 1.0 + 1.0 / r] * 2
    # weight 100 takes nearly everything from the gradient alone
    starved = _simulate([1.0, 100.0], same, 40)
    assert starved[0] <= 3
    s = GradientTaskScheduler([1.0, 100.0], np.random.default_rng(0), min_rounds=6)
    got = [0, 0]
    order = []
    for _ in range(40):
        i = s.next_task()
        assert i is not None
        order.append(i)
        got[i] += 1
        s.observe(i, same[i](got[i]))
    # the floor first, the fewest rounds first (so the tasks alternate), then the gradient
    assert order[:12] == [0, 1] * 6 and got[0] >= 6 and got[1] >= 28
    # a broken task (nothing valid after failed_rounds) is not held to the floor
    b = GradientTaskScheduler([1.0, 1.0], np.random.default_rng(0), min_rounds=10, eps_greedy=0.0)
    for _ in range(3):
        b.observe(1, math.inf)
    b.observe(0, 1.0)
    assert [b.next_task() for _ in range(3)] == [0, 0, 0]


def test_floor_rounds_is_half_of_the_even_share() -> None:
    assert floor_rounds(528, 8, 11) == 33 and floor_rounds(64, 8, 2) == 4
    assert floor_rounds(528, 8, 1) == 0 and floor_rounds(4, 8, 3) == 0


def test_failing_and_retired_tasks() -> None:
    s = _sched([1.0, 1.0])
    s.observe(0, 1.0)
    s.observe(1, math.inf)  # nothing valid yet: first in line, for a while
    assert s.next_task() == 1 and s.gradient(1) == -math.inf
    s.observe(1, math.inf)
    s.observe(1, math.inf)
    assert s.gradient(1) == 0.0 and s.next_task() == 0  # probably broken: no more rounds
    assert math.isinf(s.objective())
    s.retire(0)
    assert s.next_task() == 1
    s.retire(1)
    assert s.next_task() is None and np.isnan(s.gradients()).all()


def test_weights_are_checked() -> None:
    assert check_weights(None, 3) == [1.0, 1.0, 1.0]
    assert check_weights([2, 0.5], 2) == [2.0, 0.5]
    for bad, n in (([1.0], 2), ([1.0, -1.0], 2), ([math.nan], 1), ([math.inf], 1), (["x"], 1)):
        with pytest.raises(TuningError, match="weight"):
            check_weights(bad, n)  # type: ignore[arg-type]

"""Which task to tune next: time goes where the weighted end-to-end latency gains most.

Several kernels of one network are tuned together under one trial budget. The objective is
``f = sum_i w_i * g_i``, where ``g_i`` is task ``i``'s best cost so far and ``w_i`` its weight
(how often the kernel runs per inference). After a warm-up round for every task, each round
goes to the task with the most negative estimated gradient of ``f`` per round of tuning
(Ansor's gradient-based task scheduler, Zheng et al., OSDI 2020, section 6):

    dg_i ~ alpha * backward_i + (1 - alpha) * forward_i
    backward_i = (g_i(t) - g_i(t - window)) / window        how fast it improved lately
    forward_i  = -g_i(t) / t_i                               an optimistic guess: the next
                                                              round gains 1/t_i of the best
                                                              cost (as if g ~ 1/t)
    grad_i = w_i * dg_i                                       the chain rule through f

where ``t_i`` counts rounds of task ``i``. Before the gradient decides, every task gets
``min_rounds`` rounds (`floor_rounds`: a `TASK_FLOOR` share of the budget, given out evenly).
The weighted latency is what a network's user pays, but the gradient alone starves a light
task (BERT's batch matmuls got 8-24 of 528 trials and ended at 0.67x PyTorch while the dense
layers took the rest), and a kernel left untuned is slow wherever else it is used.
The backward term follows tasks that still improve;
the forward term keeps giving rounds to tasks that have had few and to tasks whose cost (times
weight) is large, so a slow layer that occurs ten times is worth ten times the effort. With
probability ``eps_greedy`` a random live task is picked instead: the estimates come from noisy
measurements and a task wrongly judged flat would otherwise never get another round.

The scheduler is pure policy: it sees best costs, never measurements, so it can be unit tested
on synthetic histories. `tuning.tune` drives it.

>>> sched = GradientTaskScheduler([1.0, 10.0], np.random.default_rng(0))
>>> i = sched.next_task()                         # warm-up first: every task once, in order
>>> sched.observe(i, 2e-3)                        # its best cost after the round
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .task import TuningError

# the share of a multi-task budget given out evenly before the gradient decides (see above).
# BERT's suite (8 tasks, 512 trials, Zen 3): at 0.25 each task had 2 rounds first, the
# batch matmuls ended with 16-24 trials and q.kT at 0.56x PyTorch (geomean 1.03x); at 0.5
# (4 rounds) they had 32-40, q.kT 0.96x, none below 0.92x, geomean 1.15x, weighted latency
# 1.07x (1.05x before): the dense layers lost nothing measurable.
TASK_FLOOR = 0.5


def floor_rounds(trials_per_task: int, batch_size: int, n_tasks: int) -> int:
    """The rounds every task gets before the gradient decides: `TASK_FLOOR` of each task's
    even share of the budget (none for a single task: it gets everything anyway)."""
    if n_tasks <= 1 or batch_size <= 0:
        return 0
    return int(TASK_FLOOR * trials_per_task / batch_size)


def check_weights(weights: Sequence[float] | None, n_tasks: int) -> list[float]:
    """``weights`` as a list of ``n_tasks`` finite floats >= 0 (all 1.0 when None)."""
    if weights is None:
        return [1.0] * n_tasks
    try:
        out = [float(w) for w in weights]
    except (TypeError, ValueError):
        raise TuningError(f"tune: weights must be numbers, got {weights!r}") from None
    if len(out) != n_tasks:
        raise TuningError(f"tune: {len(out)} weight(s) for {n_tasks} task(s); give one per task")
    bad = [w for w in out if not math.isfinite(w) or w < 0]
    if bad:
        raise TuningError(f"tune: weights must be finite and >= 0, got {bad[0]!r}")
    return out


class GradientTaskScheduler:
    """Picks the task for each round from the best-cost history of every task.

    ``alpha`` weighs the backward (observed) against the forward (optimistic) estimate;
    ``backward_window`` is in rounds; ``failed_rounds``: a task still without any valid
    measurement after that many rounds is given no further gradient (it is probably broken,
    and an infinite cost would otherwise take every round), but may still be drawn at random.
    ``min_rounds``: rounds every working task gets before the gradient decides (the one with
    the fewest first; `floor_rounds`).
    """

    def __init__(self, weights: Sequence[float], rng: np.random.Generator, alpha: float = 0.2,
                 backward_window: int = 3, eps_greedy: float = 0.05, failed_rounds: int = 3,
                 min_rounds: int = 0) -> None:
        self.weights = check_weights(weights, len(weights))
        if not 0.0 <= alpha <= 1.0 or backward_window < 1 or not 0.0 <= eps_greedy <= 1.0:
            raise TuningError("GradientTaskScheduler: need 0 <= alpha <= 1, backward_window >= 1, "
                              "0 <= eps_greedy <= 1")
        self.rng = rng
        self.alpha = alpha
        self.backward_window = backward_window
        self.eps_greedy = eps_greedy
        self.failed_rounds = failed_rounds
        self.min_rounds = max(0, int(min_rounds))
        # per task: best cost after each of its rounds (inf until something valid)
        self.history: list[list[float]] = [[] for _ in self.weights]
        self.alive = [True] * len(self.weights)

    @property
    def n_tasks(self) -> int:
        return len(self.weights)

    def rounds(self, i: int) -> int:
        return len(self.history[i])

    def best(self, i: int) -> float:
        return self.history[i][-1] if self.history[i] else math.inf

    def observe(self, i: int, best_cost: float) -> None:
        """Task ``i`` finished a round; ``best_cost`` is its best cost (seconds) since ever."""
        self.history[i].append(float(best_cost))

    def retire(self, i: int) -> None:
        """Task ``i`` has nothing left to propose (its space is exhausted): never pick it."""
        self.alive[i] = False

    def objective(self) -> float:
        """The weighted latency ``sum_i w_i * best_i`` (inf while some weighted task has none)."""
        return sum(w * self.best(i) for i, w in enumerate(self.weights) if w > 0)

    def gradient(self, i: int) -> float:
        """Estimated change of the objective from one more round of task ``i`` (<= 0)."""
        w, h = self.weights[i], self.history[i]
        if w == 0.0:
            return 0.0
        if not h:
            return -math.inf
        g = h[-1]
        if not math.isfinite(g):
            # nothing valid yet: making the objective finite beats any finite gain, for a while
            return -math.inf if len(h) < self.failed_rounds else 0.0
        t = len(h)
        back = 0.0
        if t - 1 - self.backward_window >= 0:
            old = h[t - 1 - self.backward_window]
            # from inf to finite is "started working", which the forward term already rewards
            back = (g - old) / self.backward_window if math.isfinite(old) else 0.0
        forward = -g / t
        return w * (self.alpha * back + (1.0 - self.alpha) * forward)

    def gradients(self) -> np.ndarray:
        """`gradient` of every task (nan for a retired one)."""
        return np.array([self.gradient(i) if self.alive[i] else math.nan for i in range(self.n_tasks)])

    def next_task(self) -> int | None:
        """The task of the next round, or None when every task is retired."""
        live = [i for i in range(self.n_tasks) if self.alive[i]]
        if not live:
            return None
        for i in live:  # warm-up: a first round for every task, in order
            if not self.history[i]:
                return i
        # one draw per call whatever happens, so a run replays from its seed
        explore = self.rng.random() < self.eps_greedy
        # the floor: the working task with the fewest rounds below it (a broken one, still
        # without a valid measurement after failed_rounds, gets no more)
        short = [i for i in live if self.rounds(i) < self.min_rounds
                 and (math.isfinite(self.best(i)) or self.rounds(i) < self.failed_rounds)]
        if short:
            return min(short, key=lambda i: (self.rounds(i), i))
        grads = np.array([self.gradient(i) for i in live])
        if explore or grads.min() == grads.max():
            return live[int(self.rng.integers(len(live)))]
        return live[int(np.argmin(grads))]


__all__ = ["TASK_FLOOR", "GradientTaskScheduler", "check_weights", "floor_rounds"]

"""The re-measurement that ends a tuning run: the best candidates timed again, so that the
reported best is an honest estimate and not the luckiest of many noisy timings.

Why. The tuner keeps the fastest of hundreds of candidates, each timed once with some noise;
the one that comes out first is, among the good ones, the one timed luckiest. Re-timing it
and averaging *all* its timings kept about half that luck (the selection timing is one of
two), and picking the best of the re-timed few selects once more. So a candidate timed more
than once is judged on its re-timings only (`tuning.search.estimate`, and
`tuning.records.aggregate` for a log: the earliest valid timing is left out, kept in the
log), and the re-measurement goes on until every one of the top ``k`` by that estimate --
the winner among them -- rests on `RETIMINGS` re-timings, each taken in a round of its own
(its own reference timing), after it was selected. A candidate timed once that overtakes the
re-timed ones (their luck gone) is re-timed in the next round; the rounds are bounded
(`ROUNDS`, the last ones for the winner alone).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from .measure import MeasureInput, MeasureResult

if TYPE_CHECKING:
    from .tune import _TaskRun, _Tuner

RETIMINGS = 2  # re-timings the top candidates' estimates rest on
ROUNDS = 6  # at most, per task; the last `WINNER_ROUNDS` re-time the winner alone
WINNER_ROUNDS = 2


def remeasure(tuner: _Tuner, k: int) -> None:
    """Re-time the best ``k`` candidates of every task of ``tuner`` that measured something
    (module docstring); the tasks' ``best_cost`` follows the new estimates."""
    if k <= 0:
        return
    for run in tuner.runs:
        if run.result.new_trials:  # a resumed run that measured nothing stays put
            _remeasure_run(tuner, run, k)


def _remeasure_run(tuner: _Tuner, run: _TaskRun, k: int) -> None:
    out = run.result
    t_start = time.perf_counter()

    def log_only(inp: MeasureInput, res: MeasureResult) -> None:
        with tuner._lock:
            if tuner.writer is not None and not tuner.stopping:
                tuner.writer.write(inp, res)

    for rnd in range(ROUNDS):
        top = run.search.best(k if rnd < ROUNDS - WINNER_ROUNDS else 1)
        # timings() counts the selection timing too
        todo = [c for c in top if run.search.timings(c.key) - 1 < RETIMINGS]
        if not todo:
            break
        ins = [MeasureInput.of(run.task, c) for c in todo]
        res, tb, tr = tuner._measure(ins, log_only)
        out.build_s += tb
        out.run_s += tr
        for c, r in zip(todo, res):
            if r.valid:
                run.raw.setdefault(c.key, []).append(r.costs)
            with tuner._lock:
                cost = tuner._norm(r).mean if r.valid else math.inf
            run.search.add_timing(c.key, cost, c)
    out.best_cost = run.search.best_cost()
    out.wall_s += time.perf_counter() - t_start


__all__ = ["RETIMINGS", "ROUNDS", "WINNER_ROUNDS", "remeasure"]

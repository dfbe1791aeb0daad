"""The re-measurement that ends a tuning run: the best candidates timed again, side by side,
so that the reported best is an honest estimate and the exported kernel the fastest of them.

Why re-time. The tuner keeps the fastest of hundreds of candidates, each timed once with some
noise; the one that comes out first is, among the good ones, the one timed luckiest.
Re-timing it and averaging *all* its timings kept about half that luck (the selection timing
is one of two), so a candidate timed more than once is judged on its re-timings only
(`tuning.search.estimate`, and `tuning.records.aggregate` for a log: the earliest valid
timing is left out, kept in the log), by their median (one of them taken in a burst of the
machine does not move it).

Why side by side. Candidates timed at different moments are compared through the machine-speed
index (`tuning.speed`), a 0.1 ms reference kernel timed with each batch; it does not follow
every drift of a kernel fifty times longer. In one quick-start run the exported GEMM had been
credited with its batches' 1.44x slower reference, a slowdown the 5 ms kernel did not suffer,
and it ran 1.3x slower than the candidate ranked second. So each round times *all* of the
current top ``k`` (by their estimates) in one batch, one after another, tagged with the
round (``MeasureResult.round``, "SESSION/N", written to the log); the rounds go on until the
same candidates lead after `RETIMINGS` rounds they shared (a candidate timed once that
overtakes the re-timed ones, their luck gone, joins the next round), `ROUNDS` at most, the
last `RETIMINGS` of them for the candidates of the round before, whoever leads. The
final order is by the raw costs of the rounds all of the last round's candidates shared
(`tuning.records.rank_rounds`), which no index touches; `tuning.records.best_record` reads
the same order back from the log.

Why confirm. The winner is the fastest of the few in the rounds that ranked them: of
candidates about as fast, the one those rounds favoured, so its timings there still carry
luck (the suite's claims ran 2.8% optimistic, the geometric mean over 55 operators on an
Intel Xeon, each judged on its re-timings). So the winner is timed `CONFIRMATIONS` more times
on its own, after the rounds, marked ``confirm`` in the log, and judged on those alone (their
median: a burst in one of them moves it not); no ranking uses them.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import TYPE_CHECKING

from .measure import MeasureInput, MeasureResult
from .records import rank_rounds

if TYPE_CHECKING:
    from .space import Candidate
    from .tune import _TaskRun, _Tuner

RETIMINGS = 2  # shared rounds the final order rests on
ROUNDS = 5  # at most, per task; the last RETIMINGS admit no newcomer
CONFIRMATIONS = 3  # timings of the winner after the rounds, their median its estimate (a burst in one moves it not)


def remeasure(tuner: _Tuner, k: int) -> None:
    """Re-time the best ``k`` candidates of every task of ``tuner`` that measured something,
    side by side (module docstring); the tasks' ``best_cost`` follows the new estimates."""
    if k <= 0:
        return
    for run in tuner.runs:
        if run.result.new_trials:  # a resumed run that measured nothing stays put
            _remeasure_run(tuner, run, k)


def _remeasure_run(tuner: _Tuner, run: _TaskRun, k: int) -> None:
    out = run.result
    t_start = time.perf_counter()
    # names this re-timing's rounds in the log (the latest session of a task is the one read)
    session = f"{time.time_ns() // 1000:x}"
    tags: dict[str, str] = {}  # key -> its round's tag, while the round is measured

    def log_only(inp: MeasureInput, res: MeasureResult) -> None:
        with tuner._lock:
            if tuner.writer is not None and not tuner.stopping:
                tuner.writer.write(inp, dataclasses.replace(res, round=tags.get(inp.key, "")))

    last: list[Candidate] = []  # those timed in the last round

    def shared(keys: set[str]) -> int:  # rounds in which all of ``keys`` were timed validly
        return sum(keys <= r.keys() for r in run.rounds)

    for rnd in range(ROUNDS):
        top = run.search.best(k)
        keys = {c.key for c in top}
        if not top or (keys == {c.key for c in last} and shared(keys) >= RETIMINGS):
            break
        if rnd >= ROUNDS - RETIMINGS and last:
            # no rounds left to admit a newcomer and still time it RETIMINGS times beside
            # the others: settle the last round's candidates (those that did not fail)
            top = [c for c in last if c.key in run.rounds[-1]]
            if not top or shared({c.key for c in top}) >= RETIMINGS:
                break
        tags.clear()
        tags.update((c.key, f"{session}/{rnd}") for c in top)
        ins = [MeasureInput.of(run.task, c) for c in top]
        res, tb, tr = tuner._measure(ins, log_only, run.builds)
        out.build_s += tb
        out.run_s += tr
        times: dict[str, float] = {}
        for c, r in zip(top, res):
            if r.valid:
                run.raw.setdefault(c.key, []).append(r.costs)
                times[c.key] = r.mean
            with tuner._lock:
                cost = tuner._norm(r).mean if r.valid else math.inf
            run.search.add_timing(c.key, cost, c)
        run.rounds.append(times)
        last = top
    first = rank_rounds(run.rounds)[:1]  # as `tuning.records.ranked` reads it from the log
    _confirm(tuner, run, next((c for c in last if c.key in first), None))
    out.best_cost = run.search.best_cost()
    out.wall_s += time.perf_counter() - t_start


def _confirm(tuner: _Tuner, run: _TaskRun, winner: Candidate | None) -> None:
    """Time the final re-timing's ``winner`` (None: there is none) `CONFIRMATIONS` times
    more, in batches of its own, marked ``confirm`` in the log: its estimate rests on these
    alone (`tuning.records.aggregate`; `run.confirm` without a log). The rounds that chose it
    made it the fastest of the few timed side by side, the luckiest of them again."""
    if winner is None:
        return
    out = run.result

    def log_confirm(inp: MeasureInput, res: MeasureResult) -> None:
        with tuner._lock:
            if tuner.writer is not None and not tuner.stopping:
                tuner.writer.write(inp, dataclasses.replace(res, confirm=True))

    ins = [MeasureInput.of(run.task, winner)]
    for _ in range(CONFIRMATIONS):
        res, tb, tr = tuner._measure(ins, log_confirm, run.builds)
        out.build_s += tb
        out.run_s += tr
        if res[0].valid:
            with tuner._lock:
                norm = tuner._norm(res[0]).mean
            run.confirm.setdefault(winner.key, []).append((res[0].mean, norm))


__all__ = ["CONFIRMATIONS", "RETIMINGS", "ROUNDS", "remeasure"]

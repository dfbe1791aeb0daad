"""The logged best is an honest estimate: a candidate timed more than once is judged on its
re-timings, without the (earliest) timing that selected it -- the luckiest of many noisy
timings (tuning.remeasure, tuning.records.aggregate)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tuning_workloads as wl

import tuning
from tuning import LocalBuilder, LocalRunner
from tuning.machine import local_machine
from tuning.measure import MeasureErrorNo, MeasureInput, MeasureResult
from tuning.records import RecordWriter, aggregate, best_record, load_records, selection_split
from tuning.remeasure import CONFIRMATIONS, RETIMINGS
from tuning.search import EvolutionarySearch, estimate
from tuning.speed import SpeedIndex
from tuning.steps import AnnotationStep, SplitStep

A, B, C = [(SplitStep("C", 1, (f,)), AnnotationStep("C", 2, "vectorize")) for f in (2, 4, 8)]
OK, FAIL = MeasureErrorNo.NO_ERROR, MeasureErrorNo.RUN_ERROR


def _write(path: Path, rows: list[tuple[tuple, float, float]], ref: float | None = 1e-4,
           error: MeasureErrorNo = OK) -> None:
    """``(steps, cost, timestamp)`` records, in this order in the file."""
    task = tuning.SearchTask(wl.matmul, (16, 8, 16))
    machine = local_machine()
    with RecordWriter(str(path)) as w:
        for steps, cost, t in rows:
            ok = error == OK or cost > 0
            w.write(MeasureInput(task, steps),
                    MeasureResult((cost, cost) if ok else (), OK if ok else error, timestamp=t, machine=machine,
                                  ref_s=ref if ok else None))


def _task() -> tuning.SearchTask:
    return tuning.SearchTask(wl.matmul, (16, 8, 16))


def test_the_selection_timing_is_excluded_from_the_estimate(tmp_path: Path) -> None:
    log = tmp_path / "h.jsonl"
    # A selected at a lucky 1.0 ms, re-timed at 1.2 and 1.4 ms; the file lists a re-timing
    # first (a concurrent writer): the selection timing is the earliest by time, not by line
    _write(log, [(A, 1.2e-3, 20.0), (A, 1.0e-3, 10.0), (A, 1.4e-3, 30.0), (B, 2.0e-3, 11.0)])
    recs = load_records(str(log))
    index = SpeedIndex.from_records(recs)
    agg = {r.steps: r for r in aggregate(recs, index)}
    assert agg[A].costs == (1.2e-3, 1.2e-3, 1.4e-3, 1.4e-3)
    assert index.cost(agg[A]) == pytest.approx(1.3e-3) and agg[A].mean == pytest.approx(1.3e-3)
    assert agg[B].mean == pytest.approx(2.0e-3)  # timed once: that timing is all there is
    sel, used = selection_split([r for r in recs if r.steps == A])
    assert sel is not None and sel.timestamp == 10.0 and [r.timestamp for r in used] == [20.0, 30.0]
    # one re-timing: the estimate is that record itself
    one = tmp_path / "one.jsonl"
    _write(one, [(A, 1.0e-3, 10.0), (A, 1.5e-3, 20.0)])
    (r,) = aggregate(load_records(str(one)))
    assert r.costs == (1.5e-3, 1.5e-3) and r.timestamp == 20.0


def test_a_confirmed_winner_is_judged_on_its_confirmations_alone(tmp_path: Path) -> None:
    # A won its rounds at 1.0 and 1.1 ms (lucky, as the fastest of a few); its confirmations
    # afterwards ran 1.3, 1.2 and 5.0 ms (a burst): its estimate is their median, 1.3 ms
    task, machine = _task(), local_machine()
    log = tmp_path / "c.jsonl"
    with RecordWriter(str(log)) as w:
        for t, cost, rnd, confirm in [(10.0, 0.9e-3, "", False), (20.0, 1.0e-3, "s/0", False),
                                      (21.0, 1.1e-3, "s/1", False), (30.0, 1.3e-3, "", True),
                                      (31.0, 1.2e-3, "", True), (32.0, 5.0e-3, "", True)]:
            w.write(MeasureInput(task, A), MeasureResult((cost,), OK, timestamp=t, machine=machine,
                                                         ref_s=1e-4, round=rnd, confirm=confirm))
        w.write(MeasureInput(task, B), MeasureResult((1.5e-3,), OK, timestamp=11.0, machine=machine, ref_s=1e-4))
    recs = load_records(str(log))
    assert [r.confirm for r in recs if r.steps == A] == [False] * 3 + [True] * 3  # read back as written
    assert sum('"confirm":true' in line for line in log.read_text().splitlines()) == 3
    (agg,) = [r for r in aggregate(recs) if r.steps == A]
    assert agg.costs == (1.3e-3,)
    sel, used = selection_split([r for r in recs if r.steps == A])
    assert sel is not None and sel.timestamp == 10.0 and [r.timestamp for r in used] == [30.0, 31.0, 32.0]
    # the ranking is the rounds' (A, the only one in them), the figure the confirmations'
    best = best_record(str(log), task)
    assert best.steps == A and best.mean == pytest.approx(1.3e-3)


def test_the_earliest_valid_timing_is_the_selection_timing(tmp_path: Path) -> None:
    # a failed timing selects nothing: the first valid one is the selection timing
    log = tmp_path / "f.jsonl"
    _write(log, [(A, 0.0, 5.0)], error=FAIL)
    _write(log, [(A, 1.0e-3, 10.0), (A, 1.6e-3, 20.0)])
    (r,) = aggregate(load_records(str(log)))
    assert r.mean == pytest.approx(1.6e-3)


def test_best_record_picks_by_the_honest_estimate(tmp_path: Path) -> None:
    log = tmp_path / "b.jsonl"
    # A: selected at a lucky 0.8 ms, re-timed at 1.5 ms (the mean of all, 1.15 ms, would win);
    # B: timed once at 1.2 ms
    _write(log, [(A, 0.8e-3, 10.0), (B, 1.2e-3, 11.0), (A, 1.5e-3, 20.0)])
    best = best_record(str(log), _task())
    assert best.steps == B and best.mean == pytest.approx(1.2e-3)
    # and the normalisation applies to the re-timings alone: A re-timed while the machine
    # ran at half speed (raw 3.0 ms, reference 2e-4) is 1.5 ms at the baseline (1e-4)
    slow = tmp_path / "s.jsonl"
    _write(slow, [(A, 0.8e-3, 10.0), (B, 1.2e-3, 11.0), (C, 1.3e-3, 12.0)])
    _write(slow, [(A, 3.0e-3, 20.0)], ref=2e-4)
    recs = load_records(str(slow))
    index = SpeedIndex.from_records(recs)
    agg = {r.steps: r for r in aggregate(recs, index)}
    assert index.cost(agg[A]) == pytest.approx(1.5e-3) and agg[A].mean == pytest.approx(3.0e-3)
    assert best_record(str(slow), _task()).steps == B


def test_an_old_log_without_an_index_or_markers_reads_by_the_same_rule(tmp_path: Path) -> None:
    # a schema-1 log (tuner's CPU name, no machine lines, no speed index), as tune wrote it
    # with remeasure: each re-timed candidate's first record is its selection timing
    log = tmp_path / "v1.jsonl"
    _write(log, [(A, 0.8e-3, 10.0), (B, 1.2e-3, 11.0), (A, 1.5e-3, 20.0), (A, 1.3e-3, 21.0)])
    lines = []
    for ln in log.read_text().splitlines():
        d = json.loads(ln)
        if d.get("kind") == "machine":
            continue
        d["v"] = 1
        if "kind" not in d:
            d.pop("machine", None)
            d.pop("ref_s", None)
            d.pop("ref_kind", None)
            d.pop("ref_spread", None)
            d["host_cpu"] = "haswell"
        lines.append(json.dumps(d))
    log.write_text("\n".join(lines) + "\n")
    recs = load_records(str(log))
    assert len(recs) == 4 and all(r.ref_s is None for r in recs)
    agg = {r.steps: r for r in aggregate(recs)}
    assert agg[A].mean == pytest.approx(1.4e-3) and agg[B].mean == pytest.approx(1.2e-3)
    assert best_record(str(log), _task()).steps == B


def test_the_search_judges_a_retimed_candidate_without_its_selection_timing() -> None:
    assert estimate([1.0]) == 1.0
    assert estimate([1.0, 2.0]) == 2.0 and estimate([1.0, 2.0, 4.0]) == 3.0
    assert estimate([1.0, float("inf")]) == float("inf")
    task = _task()
    search = EvolutionarySearch(task, tuning.cost_model.RandomModel(seed=0), np.random.default_rng(0))
    search.mark_measured("a", 1.0)
    search.mark_measured("b", 1.5)
    assert search.best_cost() == 1.0 and search.timings("a") == 1
    search.add_timing("a", 2.0)
    assert search.best_cost() == 1.5 and search.measured["a"] == 2.0 and search.timings("a") == 2


def test_one_retiming_in_a_burst_of_the_machine_does_not_move_the_estimate(tmp_path: Path) -> None:
    # seen on a shared 2-core VM: a 1.0 ms kernel re-timed at 4.0 ms once (a neighbour's burst,
    # its batch's index barely slower) among re-timings at 0.99, 1.07 and 0.98 ms. The mean
    # claimed 1.76 ms; the median of the re-timings holds
    assert estimate([0.93, 4.0, 0.99, 1.07, 0.98]) == pytest.approx((0.99 + 1.07) / 2)
    assert estimate([0.93, 7.3, 1.04, 1.05]) == pytest.approx(1.05)
    assert estimate([0.9, 7.3, float("inf"), 1.05]) == float("inf")  # a failure still disqualifies
    log = tmp_path / "burst.jsonl"
    _write(log, [(A, 0.93e-3, 10.0), (A, 4.0e-3, 20.0), (A, 0.99e-3, 30.0), (A, 1.07e-3, 40.0),
                 (A, 0.98e-3, 50.0), (B, 1.1e-3, 11.0)])
    recs = load_records(str(log))
    index = SpeedIndex.from_records(recs)
    agg = {r.steps: r for r in aggregate(recs, index)}
    # four re-timings: the two middle ones (0.99 and 1.07 ms, in time order) are the estimate
    assert agg[A].costs == (0.99e-3, 0.99e-3, 1.07e-3, 1.07e-3) and agg[A].timestamp == 50.0
    assert index.cost(agg[A]) == pytest.approx(1.03e-3)
    assert best_record(str(log), _task()).steps == A  # with the mean (1.76 ms) B would win
    # the middle is by normalised cost: a re-timing at half speed (raw 2.0 ms, reference 2e-4)
    # is a 1.0 ms timing at the baseline, the middle of 0.9, 1.0 and 1.2
    half = tmp_path / "half.jsonl"
    _write(half, [(C, 0.8e-3, 10.0), (C, 0.9e-3, 20.0), (C, 1.2e-3, 40.0), (B, 1.1e-3, 11.0),
                  (B, 1.1e-3, 12.0), (A, 1.1e-3, 13.0)])
    _write(half, [(C, 2.0e-3, 30.0)], ref=2e-4)
    recs = load_records(str(half))
    index = SpeedIndex.from_records(recs)
    (c,) = [r for r in aggregate(recs, index) if r.steps == C]
    assert c.costs == (2.0e-3, 2.0e-3) and index.cost(c) == pytest.approx(1.0e-3)


def test_a_real_tune_reports_the_estimate_its_log_gives(tmp_path: Path,
                                                         pools: tuple[LocalBuilder, LocalRunner]) -> None:
    builder, runner = pools
    task = tuning.SearchTask(wl.matmul, (32, 32, 32))
    log = str(tmp_path / "mm.jsonl")
    (res,) = tuning.tune([task], trials=6, log=log, seed=0, batch_size=3, builder=builder, runner=runner,
                         search=tuning.SearchOptions(population=16, generations=1), progress=False,
                         remeasure=2)
    recs = load_records(log, task)
    index = SpeedIndex.from_records(load_records(log))
    best = best_record(log, task)
    # the winner was timed RETIMINGS times (at least) side by side after it was selected, then
    # CONFIRMATIONS times more on its own; its reported cost is the median of the confirmations
    # alone (by normalised cost): the selection timing and the rounds that chose it are in the
    # log, not in the figure
    mine = sorted((r for r in recs if r.key == best.key and r.valid), key=lambda r: r.timestamp)
    rounds_of_it = [r for r in mine if r.round]
    confirms = [r for r in mine if r.confirm]
    assert not mine[0].round and not mine[0].confirm and len(rounds_of_it) >= RETIMINGS
    assert len(confirms) == CONFIRMATIONS == 3 and mine[-CONFIRMATIONS:] == confirms
    assert not any(r.confirm for r in recs if r.key != best.key)  # the winner's alone
    assert all(not r.round for r in confirms)  # no round: they rank nobody
    middle = sorted(confirms, key=index.cost)[1]
    assert best.costs == middle.costs
    assert res.best_cost == pytest.approx(middle.mean, rel=1e-9)
    assert res.best_cost == pytest.approx(best.mean, rel=1e-9)
    assert res.best_normalised_cost == pytest.approx(index.cost(best), rel=1e-9)
    # and it won the side-by-side rounds: the lowest raw cost over the rounds its rivals shared
    rounds: dict[str, dict[str, float]] = {}
    for r in recs:
        if r.round and r.valid:
            rounds.setdefault(r.round, {})[r.key] = r.mean
    last = max(rounds, key=lambda t: int(t.rsplit("/", 1)[1]))
    shared = [rd for rd in rounds.values() if rounds[last].keys() <= rd.keys()]
    assert len(shared) >= 1 and best.key in rounds[last]
    geo = {k: np.mean([np.log(rd[k]) for rd in shared]) for k in rounds[last]}
    assert geo[best.key] == min(geo.values())

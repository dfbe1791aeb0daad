"""The final re-timing ranks the best few by raw costs taken side by side (tuning.remeasure,
tuning.records.rank_rounds/side_by_side/ranked): a speed index that does not follow a long
kernel's drift cannot make a slower kernel the exported best."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import tuning_workloads as wl

import tuning
from tuning.machine import local_machine
from tuning.measure import MeasureErrorNo, MeasureInput, MeasureResult
from tuning.records import (
    RecordWriter,
    aggregate,
    best_record,
    load_records,
    rank_rounds,
    ranked,
    record_from_json,
    record_to_json,
    side_by_side,
)
from tuning.speed import SpeedIndex
from tuning.steps import AnnotationStep, SplitStep

A, B, C, D = [(SplitStep("C", 1, (f,)), AnnotationStep("C", 2, "vectorize")) for f in (2, 4, 8, 16)]
OK, FAIL = MeasureErrorNo.NO_ERROR, MeasureErrorNo.RUN_ERROR
BASE = 1e-4  # the reference time of most records: the log's baseline


def _task() -> tuning.SearchTask:
    return tuning.SearchTask(wl.matmul, (16, 8, 16))


def _write(path: Path, rows: list[tuple[tuple, float, float, float, str]]) -> None:
    """``(steps, raw cost (<= 0: failed), timestamp, reference seconds, round)`` records."""
    task, machine = _task(), local_machine()
    with RecordWriter(str(path)) as w:
        for steps, cost, t, ref, rnd in rows:
            ok = cost > 0
            w.write(MeasureInput(task, steps),
                    MeasureResult((cost, cost) if ok else (), OK if ok else FAIL, timestamp=t, machine=machine,
                                  ref_s=ref if ok else None, round=rnd))


def test_rank_rounds_uses_the_rounds_the_last_rounds_candidates_shared() -> None:
    assert rank_rounds([]) == [] and rank_rounds([{}, {}]) == []
    # "a" timed alone early (fast: not a shared round), then "a" and "b" side by side twice
    rounds = [{"a": 1.0}, {"a": 5.0, "b": 4.0}, {"a": 6.0, "b": 4.5}]
    assert rank_rounds(rounds) == ["b", "a"]
    # the geometric mean: one slow round of the whole machine weighs no more than a fast one
    assert rank_rounds([{"a": 1.0, "b": 1.1}, {"a": 100.0, "b": 90.0}]) == ["b", "a"]
    # a candidate that failed in the last round is out; an empty last round leaves the one before
    assert rank_rounds([{"a": 1.0, "b": 2.0}, {"b": 2.0}]) == ["b"]
    assert rank_rounds([{"a": 2.0, "b": 1.0}, {}]) == ["b", "a"]
    # ties are broken by key, so the order never depends on dict order
    assert rank_rounds([{"y": 1.0, "x": 1.0}]) == ["x", "y"]


def _misranked_log(path: Path) -> None:
    """The quick-start case: A's selection and two re-timings came in batches whose reference
    ran 3x slow (its normalised estimate is a third of what it ran at), B joined later; in the
    two rounds they shared, B ran 4.4 ms and A 5.7 ms."""
    _write(path, [
        (A, 3.0e-3, 10.0, BASE, ""),  # selection timings
        (B, 4.5e-3, 11.0, BASE, ""),
        (C, 9.0e-3, 12.0, BASE, ""),
        (A, 5.7e-3, 20.0, 3 * BASE, "s1/0"),
        (A, 5.7e-3, 21.0, 3 * BASE, "s1/1"),
        (A, 5.7e-3, 22.0, BASE, "s1/2"),
        (B, 4.4e-3, 22.1, BASE, "s1/2"),
        (A, 5.8e-3, 23.0, BASE, "s1/3"),
        (B, 4.4e-3, 23.1, BASE, "s1/3"),
    ])


def test_the_side_by_side_winner_is_the_best_record_whatever_the_index_says(tmp_path: Path) -> None:
    log = tmp_path / "m.jsonl"
    _misranked_log(log)
    recs = load_records(str(log))
    index = SpeedIndex.from_records(recs)
    agg = {r.steps: r for r in aggregate(recs, index)}
    # by the index alone A would win: (1.9 + 1.9 + 5.7 + 5.8) / 4 ms against B's 4.4
    assert index.cost(agg[A]) < index.cost(agg[B])
    assert side_by_side(recs) == ([agg[B].key, agg[A].key], 23.1)
    best = best_record(str(log), _task())
    assert best.steps == B and best.mean == pytest.approx(4.4e-3)
    assert [r.steps for r in ranked(recs, index)] == [B, A, C]
    assert tuning.records.apply_best(str(log))[0] is not None


def test_a_candidate_first_measured_after_the_retiming_competes_by_its_normalised_cost(tmp_path: Path) -> None:
    # a later run stopped before its own re-timing: its candidates were never side by side
    # with B, so they are compared with B's normalised cost
    log = tmp_path / "m.jsonl"
    _misranked_log(log)
    _write(log, [(D, 4.0e-3, 30.0, BASE, "")])
    assert best_record(str(log), _task()).steps == D
    slower = tmp_path / "s.jsonl"
    _misranked_log(slower)
    _write(slower, [(D, 4.9e-3, 30.0, BASE, "")])
    recs = load_records(str(slower))
    assert [r.steps for r in ranked(recs)] == [B, A, D, C]
    # one measured before the re-timing is behind its candidates, whatever its cost: the
    # re-timing chose its candidates from those
    early = tmp_path / "e.jsonl"
    _misranked_log(early)
    _write(early, [(D, 1.0e-3, 15.0, BASE, "")])
    assert [r.steps for r in ranked(load_records(str(early)))][:2] == [B, A]


def test_the_latest_retiming_session_decides(tmp_path: Path) -> None:
    log = tmp_path / "m.jsonl"
    _misranked_log(log)
    # a resumed run re-timed A and C side by side later; B was not in its top: A leads now
    _write(log, [(C, 8.0e-3, 40.0, BASE, "s2/0"), (A, 5.6e-3, 40.1, BASE, "s2/0"),
                 (C, 8.1e-3, 41.0, BASE, "s2/1"), (A, 5.6e-3, 41.1, BASE, "s2/1")])
    sbs = side_by_side(load_records(str(log)))
    assert sbs is not None and sbs[1] == 41.1
    assert best_record(str(log), _task()).steps == A


def test_a_round_field_is_written_only_when_set_and_checked_when_read() -> None:
    task = _task()
    res = MeasureResult((1e-3,), OK, machine=local_machine())
    assert "round" not in record_to_json(MeasureInput(task, A), res)
    d = record_to_json(MeasureInput(task, A), MeasureResult((1e-3,), OK, round="ab12/3"))
    assert d["round"] == "ab12/3" and record_from_json(d).round == "ab12/3"
    for bad in (3, "no-number", "a/b", "x y/1"):
        with pytest.raises(ValueError, match="round"):
            record_from_json({**d, "round": bad})


class _Drifting:
    """A runner whose raw costs are each candidate's true speed (a fixed function of its
    key), while the reference kernel it reports swings by up to 3x from batch to batch -- an
    index that does not follow the candidates. Nothing is run: only the ranking is tested."""

    capacity = 1
    exclusive = False

    def __init__(self) -> None:
        self.batch = 0

    def _ref(self) -> float:
        return BASE * (1.0, 3.0, 0.5, 2.0)[self.batch % 4]

    def _speed(self, key: str) -> float:
        return 1e-3 * (1.0 + (int(key.encode().hex()[-6:], 16) % 1000) / 1000)

    def run(self, inputs, builds, callback=None):  # type: ignore[no-untyped-def]
        self.batch += 1
        ref = self._ref()
        out = []
        for inp in inputs:
            speed = self._speed(inp.key)
            res = MeasureResult((speed, speed), OK, machine=local_machine(), ref_s=ref, ref_kind="parallel")
            if callback is not None:
                callback(inp, res)
            out.append(res)
        return out

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass


class _NoBuild:
    def build(self, inputs):  # type: ignore[no-untyped-def]
        from tuning.measure import BuildResult

        return [BuildResult(None, "f") for _ in inputs]

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_tune_exports_the_truly_fastest_of_its_final_rounds(tmp_path: Path) -> None:
    task = tuning.SearchTask(wl.matmul, (64, 64, 64))
    log = str(tmp_path / "d.jsonl")
    (res,) = tuning.tune([task], trials=16, log=log, seed=0, batch_size=4, builder=_NoBuild(), runner=_Drifting(),
                         cost_model="random", progress=False, remeasure=4)
    recs = load_records(log, task)
    final = side_by_side(recs)
    assert final is not None and len(final[0]) == 4
    # every candidate of the last round was timed in at least two shared rounds
    by_round: dict[str, set[str]] = {}
    for r in recs:
        if r.round:
            by_round.setdefault(r.round, set()).add(r.key)
    assert sum(set(final[0]) <= keys for keys in by_round.values()) >= 2
    raw = {r.key: r.mean for r in recs if r.round}
    best = best_record(log, task)
    # the costs are the truth here: the winner is the fastest of the final candidates by raw
    # cost, and the reported figure is its raw cost (no index applied)
    assert best.key == min(final[0], key=lambda k: raw[k])
    assert res.best_cost == pytest.approx(raw[best.key], rel=1e-9)
    assert math.isfinite(res.best_normalised_cost)


def test_show_log_prints_the_side_by_side_winner(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tuning.cli import main

    log = tmp_path / "m.jsonl"
    _misranked_log(log)
    assert main(["show-log", str(log)]) == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith("matmul"))
    cells = row.split()
    assert cells[7:9] == ["4.400", "4.400"], row  # best ms and raw ms: B's, not A's
    assert "winner of the final re-timing" in out


class _CountingBuilder:
    """The local builder, counting how often each candidate is built."""

    def __init__(self) -> None:
        from tuning.measure import LocalBuilder

        self.inner = LocalBuilder(n_workers=1)
        self.built: dict[str, int] = {}

    def build(self, inputs):  # type: ignore[no-untyped-def]
        for inp in inputs:
            self.built[inp.key] = self.built.get(inp.key, 0) + 1
        return self.inner.build(inputs)

    def reset(self) -> None:
        self.inner.reset()

    def close(self) -> None:
        self.inner.close()


def test_the_final_rounds_time_the_builds_made_while_tuning(tmp_path: Path) -> None:
    from tuning.measure import LocalRunner

    task = tuning.SearchTask(wl.matmul, (32, 32, 32))
    log = str(tmp_path / "b.jsonl")
    builder, runner = _CountingBuilder(), LocalRunner(timeout=10.0, min_repeat_ms=1.0, warmup_ms=0)
    try:
        (res,) = tuning.tune([task], trials=12, log=log, seed=0, batch_size=4, builder=builder, runner=runner,
                             search=tuning.SearchOptions(population=16, generations=1, fresh_pool=16),
                             progress=False, remeasure=3)
    finally:
        builder.close()
        runner.close()
    recs = load_records(log, task)
    rounds = {r.round for r in recs if r.round}
    retimed = {r.key for r in recs if r.round}
    assert len(rounds) >= 2 and len(retimed) >= 3 and math.isfinite(res.best_cost)
    # every candidate was compiled once: the re-timing rounds ran the kept machine code
    assert len(builder.built) == 12 and set(builder.built.values()) == {1}
    assert retimed <= set(builder.built)
    # and every re-timing is a real measurement of a correct kernel
    assert all(r.valid for r in recs if r.round)


class _Bursty(_Drifting):
    """Each candidate's raw cost is its true speed (a function of its key), but every third
    timing of a candidate comes in a neighbour's burst, 5x slow; the reference is steady."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def _ref(self) -> float:
        return BASE

    def _speed(self, key: str) -> float:
        n = self.calls[key] = self.calls.get(key, 0) + 1
        return super()._speed(key) * (5.0 if n % 3 == 0 else 1.0)


def test_the_best_cost_is_the_median_of_its_retimings_with_or_without_a_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a log `tune` judges the winner from its own rounds; with one, from the log
    (`aggregate`): both take the median of its re-timings, so a burst in one of three moves
    neither, and the two figures are the same."""
    monkeypatch.setattr("tuning.remeasure.RETIMINGS", 3)  # three shared rounds: a median of 3
    task = tuning.SearchTask(wl.matmul, (64, 64, 64))
    kw = dict(trials=16, seed=0, batch_size=4, builder=_NoBuild(), cost_model="random", progress=False,
              remeasure=4)
    log = str(tmp_path / "b.jsonl")
    (logged,) = tuning.tune([task], log=log, runner=_Bursty(), **kw)  # type: ignore[arg-type]
    (bare,) = tuning.tune([task], log=None, runner=_Bursty(), **kw)  # type: ignore[arg-type]
    best = best_record(log, task)
    mine = sorted((r for r in load_records(log, task) if r.key == best.key), key=lambda r: r.timestamp)
    retimed = sorted(r.mean for r in mine[1:])
    assert len(retimed) >= 3 and max(retimed) > 4 * min(retimed)  # a burst among them
    n = len(retimed)
    median = (retimed[(n - 1) // 2] + retimed[n // 2]) / 2
    assert logged.best_cost == pytest.approx(median, rel=1e-9)
    assert bare.best_cost == pytest.approx(logged.best_cost, rel=1e-9)


def test_the_progress_bar_never_shows_a_best_faster_than_any_timing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every other batch's reference runs 2.5x slow here while the candidates do not:
    normalised alone, those batches' candidates showed 2.5x faster than they ever ran."""
    import re

    task = tuning.SearchTask(wl.matmul, (64, 64, 64))
    runner, log = _SlowReference(), str(tmp_path / "bar.jsonl")
    tuning.tune([task], trials=16, log=log, seed=0, batch_size=4,
                builder=_NoBuild(), runner=runner, cost_model="random", progress=True, remeasure=0)
    shown = [float(g) for g in re.findall(r"best=([0-9.]+) GFLOP/s", capsys.readouterr().err)]
    fastest = task.flop_ct / min(runner._speed(r.key) for r in load_records(log) if r.valid) / 1e9
    assert shown and max(shown) <= fastest * (1 + 1e-3)


class _SlowReference(_Drifting):
    """`_Drifting` whose reference runs 2.5x slow in every other batch, never fast."""

    def _ref(self) -> float:
        return BASE * (2.5 if self.batch % 2 == 0 else 1.0)

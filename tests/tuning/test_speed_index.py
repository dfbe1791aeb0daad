"""The machine-speed index: timed with every batch, logged, and used to compare candidates
measured at different times (best record, the tuner, the cost model's labels, show-log)."""

from __future__ import annotations

import json
import math
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import tuning_workloads as wl

import tuning
from tuning.cli import main
from tuning.cost_model import XGBModel, _labels, label_costs
from tuning.distributed import MeasuringActor
from tuning.machine import local_machine
from tuning.measure import LocalRunner, MeasureErrorNo, MeasureInput, MeasureResult, RunOptions, measure_batch
from tuning.records import RecordWriter, _speed_index, aggregate, best_record, load_records
from tuning.speed import (
    KINDS,
    LEGACY_PARALLEL,
    MAX_DRIFT,
    NOISE_BAND,
    PARALLEL,
    REFERENCE_SWEEPS,
    SERIAL,
    UNSTEADY,
    SettledReference,
    SpeedIndex,
    _reference_kernel,
    drift_factor,
    kind_of,
    reference_job,
)
from tuning.steps import AnnotationStep, SplitStep

STEPS = [(SplitStep("C", 1, (f,)), AnnotationStep("C", 2, "vectorize")) for f in (2, 4, 8, 16)]


def test_every_valid_local_measurement_carries_the_index_and_it_round_trips(
        pools: tuple[tuning.LocalBuilder, LocalRunner], tmp_path: Path) -> None:
    builder, runner = pools
    task = tuning.SearchTask(wl.matmul, (16, 8, 16))
    ins = [MeasureInput(task, STEPS[0]), MeasureInput(task, STEPS[1]), MeasureInput(task, (SplitStep("C", 9, (2,)),)),
           MeasureInput(task, (AnnotationStep("C", 0, "parallel"),))]
    results, _, _ = measure_batch(builder, runner, ins)
    assert [r.error for r in results] == [MeasureErrorNo.NO_ERROR] * 2 + [MeasureErrorNo.SCHEDULE_ERROR,
                                                                         MeasureErrorNo.NO_ERROR]
    # one index per batch and kind: the same reference time on every valid result of a kind
    assert results[0].ref_s is not None and results[0].ref_s > 0 and results[1].ref_s == results[0].ref_s
    assert results[0].ref_kind == results[1].ref_kind == SERIAL
    assert results[3].ref_kind == PARALLEL and results[3].ref_s is not None and results[3].ref_s > 0
    assert results[2].ref_s is None  # none on a failure
    log = tmp_path / "i.jsonl"
    with RecordWriter(str(log)) as w:
        for inp, res in zip(ins, results):
            w.write(inp, res)
    recs = load_records(str(log))
    assert [(r.ref_s, r.ref_kind) for r in recs] == [(r.ref_s, r.ref_kind) for r in results]
    assert recs[0].ref_spread == pytest.approx(results[0].ref_spread, abs=1e-4) and recs[0].ref_spread >= 1.0
    assert recs[0].result().ref_s == results[0].ref_s


def test_the_reference_job_and_the_cluster_actor(tmp_path: Path) -> None:
    t = reference_job(RunOptions(min_repeat_ms=2.0))
    assert set(t) == {PARALLEL, SERIAL} and all(0 < v < 1.0 and spread >= 1.0 for v, spread in t.values())
    jobs = (LocalRunner.prepare_job, LocalRunner.run_job, LocalRunner.machine_job)
    # an actor given the reference job times it; the three-job form (no index) still works
    ref = MeasuringActor((*jobs, LocalRunner.reference_job), workdir=str(tmp_path)).reference(
        RunOptions(min_repeat_ms=2.0))
    assert set(ref) == {PARALLEL, SERIAL}
    assert MeasuringActor(jobs, workdir=str(tmp_path)).reference(RunOptions()) == {}


def test_a_candidate_is_indexed_by_the_reference_of_its_kind() -> None:
    assert kind_of(STEPS[0]) == SERIAL
    assert kind_of((*STEPS[0], AnnotationStep("C", 0, "parallel"))) == PARALLEL
    m = local_machine()
    ok = MeasureErrorNo.NO_ERROR
    index = SpeedIndex({f"{m.id}/{PARALLEL}": 1e-4, f"{m.id}/{SERIAL}": 2e-4})
    # the parallel reference ran 2x slower in this batch, the serial one at its usual speed
    par = MeasureResult((5e-3,), ok, machine=m, ref_s=2e-4, ref_kind=PARALLEL)
    ser = MeasureResult((1e-3,), ok, machine=m, ref_s=2e-4, ref_kind=SERIAL)
    assert index.cost(par) == pytest.approx(2.5e-3) and index.cost(ser) == pytest.approx(1e-3)
    # another tenant took a core: the parallel reference 50x slower. That is no steady
    # slow-down, and a candidate timed then is not believed more than MAX_DRIFT faster
    stalled = MeasureResult((5e-3,), ok, machine=m, ref_s=5e-3, ref_kind=PARALLEL)
    assert index.cost(stalled) == pytest.approx(5e-3 / MAX_DRIFT)
    assert index.cost(MeasureResult((5e-3,), ok, machine=m, ref_s=1e-6, ref_kind=PARALLEL)) == pytest.approx(
        5e-3 * MAX_DRIFT)
    # an index whose repeats disagreed (the speed moved while it was timed) is kept, not used
    unsteady = MeasureResult((5e-3,), ok, machine=m, ref_s=2e-4, ref_kind=PARALLEL, ref_spread=2.0)
    assert index.cost(unsteady) == 5e-3
    assert SpeedIndex.from_records([unsteady]).baselines == {}


def test_a_reference_within_its_noise_band_compares_costs_raw() -> None:
    """A reference a few percent off its baseline is its own noise (a 0.05 ms parallel
    kernel), not the machine's drift: costs then compare raw; beyond the band they are
    normalised in full."""
    assert drift_factor(1e-4, 1.05e-4) == 1.0 and drift_factor(1e-4, 0.95e-4) == 1.0
    assert drift_factor(1e-4, 1e-4 * (NOISE_BAND - 0.01)) == 1.0
    assert drift_factor(1e-4, 1e-4 * (NOISE_BAND + 0.02)) == pytest.approx(1 / (NOISE_BAND + 0.02))
    assert drift_factor(1e-4, 2e-4) == pytest.approx(0.5) and drift_factor(2e-4, 1e-4) == pytest.approx(2.0)
    assert drift_factor(1e-4, 1e-2) == pytest.approx(1 / MAX_DRIFT) and drift_factor(1e-2, 1e-4) == MAX_DRIFT
    m = local_machine()
    index = SpeedIndex({f"{m.id}/{PARALLEL}": 1e-4})
    noisy = MeasureResult((5e-3,), MeasureErrorNo.NO_ERROR, machine=m, ref_s=1.06e-4, ref_kind=PARALLEL)
    assert index.cost(noisy) == 5e-3 and index.normalise(noisy) is noisy


def test_the_reference_kernel_works_in_128_kib_and_sums_its_product_each_sweep() -> None:
    """Its arrays take 128 KiB, which a process cannot place badly in L2 (320 KiB ran ±10%
    from one process to the next); each kind computes the product once per sweep."""
    funcs, arrays = _reference_kernel()
    assert sum(a.nbytes for a in arrays) <= 128 * 1024
    a, b, c = arrays
    for kind in KINDS:
        c[...] = np.nan
        funcs[kind](a, b, c)
        np.testing.assert_allclose(c, REFERENCE_SWEEPS * (a.astype(np.float64) @ b), rtol=1e-4, atol=1e-4)


def test_records_timed_beside_the_first_reference_keep_baselines_of_their_own(tmp_path: Path) -> None:
    """Records of the first reference kernel (``ref_kind`` "parallel", or no kind at all) are
    normalised by that kernel's times only, never by the new kernel's shorter ones."""
    task = tuning.SearchTask(wl.matmul, (16, 8, 16))
    log = tmp_path / "mixed.jsonl"
    _synthetic_log(log, task, [2.0e-3, 3.0e-3, 1.5e-3, 2.5e-3], ref=4.5e-5)
    lines = log.read_text().splitlines()
    rec_idx = [k for k, ln in enumerate(lines) if "kind" not in json.loads(ln)]
    for k, legacy in zip(rec_idx[:2], ({"ref_kind": "parallel"}, {})):
        d = json.loads(lines[k])
        d.pop("ref_kind")
        d.update(legacy, ref_s=5.5e-5)  # the first kernel: 0.055 ms where the new one takes 0.045
        lines[k] = json.dumps(d)
    log.write_text("\n".join(lines) + "\n")
    recs = load_records(str(log))
    assert [r.ref_kind for r in recs] == [LEGACY_PARALLEL, LEGACY_PARALLEL, PARALLEL, PARALLEL]
    m = local_machine().id
    index = SpeedIndex.from_records(recs)
    assert index.baselines == {f"{m}/{LEGACY_PARALLEL}": pytest.approx(5.5e-5),
                               f"{m}/{PARALLEL}": pytest.approx(4.5e-5)}
    assert [index.cost(r) for r in recs] == pytest.approx([2.0e-3, 3.0e-3, 1.5e-3, 2.5e-3])
    assert best_record(str(log), task).steps == STEPS[2]
    with pytest.raises(ValueError, match="ref_kind is one of parallel2, serial2, parallel, serial"):
        _speed_index({"ref_s": 1e-4, "ref_kind": "parallel3"})


def _synthetic_log(path: Path, task: tuning.SearchTask, true_costs: list[float], ref: float = 1e-4) -> None:
    """Records of ``true_costs`` (one candidate each), all measured at the same speed."""
    machine = local_machine()
    with RecordWriter(str(path)) as w:
        for k, (steps, c) in enumerate(zip(STEPS, true_costs)):
            w.write(MeasureInput(task, steps), MeasureResult((c, c), MeasureErrorNo.NO_ERROR,
                                                             timestamp=1000.0 + k, machine=machine, ref_s=ref))


def _slow_down_second_half(path: Path) -> None:
    """Edit the log as if its second half was measured while the machine ran at half speed:
    costs and reference times doubled."""
    lines = path.read_text().splitlines()
    rec_idx = [k for k, ln in enumerate(lines) if "kind" not in json.loads(ln)]
    for k in rec_idx[len(rec_idx) // 2:]:
        d = json.loads(lines[k])
        d["costs"] = [2 * c for c in d["costs"]]
        d["ref_s"] = 2 * d["ref_s"]
        lines[k] = json.dumps(d)
    path.write_text("\n".join(lines) + "\n")


def test_a_log_measured_partly_at_half_speed_ranks_by_normalised_cost(tmp_path: Path, capsys) -> None:
    task = tuning.SearchTask(wl.matmul, (16, 8, 16))
    log = tmp_path / "half.jsonl"
    # truly: candidate 2 is the fastest (1.5 ms); it was measured at half speed (3 ms raw), as
    # was candidate 3; candidate 0 (2 ms) looks fastest by raw cost
    _synthetic_log(log, task, [2.0e-3, 3.0e-3, 1.5e-3, 2.5e-3])
    _slow_down_second_half(log)
    recs = load_records(str(log))
    assert [r.mean for r in recs] == pytest.approx([2.0e-3, 3.0e-3, 3.0e-3, 5.0e-3])
    index = SpeedIndex.from_records(recs)
    # the median of 1, 1, 2, 2 (records without a kind are indexed by the parallel kernel)
    assert index.baselines == {f"{local_machine().id}/{PARALLEL}": pytest.approx(1.5e-4)}
    order = sorted(recs, key=index.cost)
    assert [r.steps for r in order] == [STEPS[2], STEPS[0], STEPS[3], STEPS[1]]
    # the raw costs stay as measured; the normalised one is the log's baseline speed
    assert index.cost(recs[2]) == pytest.approx(1.5e-3 * 1.5)
    best = best_record(str(log), task)
    assert best.steps == STEPS[2] and best.mean == pytest.approx(3.0e-3)
    # the tuner, resuming from the log (nothing to measure), takes the same best
    (res,) = tuning.tune([task], trials=4, log=str(log), progress=False, remeasure=0)
    assert res.new_trials == 0 and res.best_normalised_cost == pytest.approx(index.cost(recs[2]))
    assert res.best_cost == pytest.approx(3.0e-3)  # that candidate's raw mean
    # show-log's best is the normalised one, the raw mean beside it
    assert main(["show-log", str(log)]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("matmul(16, 8, 16) "))
    assert "2.250" in row and "3.000" in row


def test_a_candidate_timed_at_two_speeds_is_judged_on_its_normalised_timings(tmp_path: Path) -> None:
    task = tuning.SearchTask(wl.matmul, (16, 8, 16))
    log = tmp_path / "again.jsonl"
    _synthetic_log(log, task, [2.0e-3, 2.2e-3])
    # candidate 0 re-timed (remeasure) at half speed: raw 4 ms, but the same 2 ms at baseline
    machine = local_machine()
    with RecordWriter(str(log)) as w:
        w.write(MeasureInput(task, STEPS[0]), MeasureResult((4.0e-3,), MeasureErrorNo.NO_ERROR, timestamp=2000.0,
                                                            machine=machine, ref_s=2e-4))
    recs = load_records(str(log))
    index = SpeedIndex.from_records(recs)
    agg = {r.steps: r for r in aggregate(recs, index)}
    # judged on its re-timing (the first timing selected it: tests/tuning/test_honest_best.py)
    assert agg[STEPS[0]].costs == (4.0e-3,)
    # normalised by its own index (baseline: median 1e-4)
    assert index.cost(agg[STEPS[0]]) == pytest.approx(2.0e-3)
    assert best_record(str(log), task).steps == STEPS[0]


def test_an_old_record_without_the_index_loads_and_ranks_by_raw_cost(tmp_path: Path) -> None:
    task = tuning.SearchTask(wl.matmul, (16, 8, 16))
    log = tmp_path / "old.jsonl"
    _synthetic_log(log, task, [2.0e-3, 3.0e-3, 1.5e-3, 2.5e-3])
    _slow_down_second_half(log)
    lines = [json.loads(ln) for ln in log.read_text().splitlines()]
    for d in lines:
        d.pop("ref_s", None)
    log.write_text("".join(json.dumps(d) + "\n" for d in lines))
    recs = load_records(str(log))
    assert all(r.ref_s is None for r in recs) and len(recs) == 4
    assert SpeedIndex.from_records(recs).baselines == {}
    # unknown index: compared as measured, so the raw fastest wins
    assert best_record(str(log), task).steps == STEPS[0]
    # a bad index is an unreadable record, not a silent wrong ranking
    bad = dict(lines[-1], ref_s=-1.0)
    with open(log, "a") as f:
        f.write(json.dumps(bad) + "\n")
    with pytest.warns(RuntimeWarning, match="ref_s"):
        assert len(load_records(str(log))) == 4


def test_the_cost_model_learns_normalised_costs() -> None:
    m = local_machine()
    ok = MeasureErrorNo.NO_ERROR
    results = [MeasureResult((2e-3,), ok, machine=m, ref_s=1e-4),
               MeasureResult((3e-3,), ok, machine=m, ref_s=2e-4),  # half speed: truly 1.5 ms
               MeasureResult((1e-3,), ok, machine=m),  # no index: raw
               MeasureResult((), MeasureErrorNo.RUN_CRASH, machine=m, ref_s=1e-4)]
    speed = SpeedIndex()
    costs = label_costs(results, speed)
    assert costs == pytest.approx([2e-3, 1.5e-3, 1e-3, math.inf])
    labels = _labels(np.asarray(costs[:2]), "regression")
    assert labels[1] == 0.0 and labels[0] < 0  # the half-speed one is the task's best
    # the model's training data is made of them
    task = tuning.SearchTask(wl.matmul, (16, 8, 16))
    model = XGBModel(seed=0)
    model._add([MeasureInput(task, s) for s in STEPS], results, "")
    assert model._cost[task.workload_key] == pytest.approx([2e-3, 1.5e-3, 1e-3, math.inf])
    # a result the tuner already normalised (ref_s: its baseline) is not scaled twice
    tuner_speed = SpeedIndex({f"{m.id}/{PARALLEL}": 3e-4})
    again = label_costs([tuner_speed.normalise(r) for r in results[:2]], SpeedIndex({f"{m.id}/{PARALLEL}": 1e-4}))
    assert again == pytest.approx([2e-3, 1.5e-3])


def test_show_log_retime_prints_logged_normalised_and_fresh_times(tmp_path: Path, capsys) -> None:
    log = tmp_path / "t.jsonl"
    assert main(["tune", "matmul", "--args", "16", "16", "16", "--trials", "3", "--remeasure", "0",
                 "--log", str(log)]) == 0
    capsys.readouterr()
    assert main(["show-log", str(log), "--retime", "2", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    k = next(i for i, ln in enumerate(lines) if ln.strip().startswith("rank"))
    assert "logged ms" in lines[k] and "normalised ms" in lines[k] and "fresh ms" in lines[k]
    rows = [ln.split() for ln in lines[k + 1:k + 3]]
    assert [r[0] for r in rows] == ["1", "2"]
    assert all(float(x) > 0 for r in rows for x in r[1:5])
    assert "reference now ms" in lines[k]
    with pytest.raises(SystemExit):
        main(["show-log", str(log), "--retime", "0"])


class _FakeMachine:
    """A reference that answers from a script of times (seconds per kind), with a clock that
    each measurement advances by ``step`` seconds."""

    def __init__(self, script: list[dict[str, float]], step: float = 0.2) -> None:
        self.script = list(script)
        self.now = 0.0
        self.step = step
        self.slept: list[float] = []

    def measure(self) -> dict[str, tuple[float, float]]:
        self.now += self.step
        t = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        return {k: (v, 1.05) for k, v in t.items()}

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s

    def settled(self, **kw: float) -> SettledReference:
        return SettledReference(self.measure, sleep=self.sleep, clock=lambda: self.now, **kw)  # type: ignore[arg-type]


def test_an_index_taken_in_a_short_slow_spell_is_timed_again_until_it_passes() -> None:
    usual = {PARALLEL: 1e-4, SERIAL: 2e-4}
    spell = {PARALLEL: 1.6e-4, SERIAL: 2e-4}
    m = _FakeMachine([usual] * 5 + [spell, spell, {PARALLEL: 1.03e-4, SERIAL: 2e-4}, usual])
    ref = m.settled()
    for _ in range(5):
        assert ref.take()[PARALLEL][0] == 1e-4
    assert ref.attempts == 5 and ref.settled == 0 and not m.slept
    # the batch after them meets a spell of two timings: it waits it out, and its index is
    # the machine's usual state, the one its candidates are then timed in
    assert ref.take()[PARALLEL] == (1.03e-4, 1.05)
    assert ref.attempts == 8 and ref.settled == 1 and len(m.slept) == 2
    assert ref.typical(PARALLEL) == 1e-4
    assert ref.take()[PARALLEL][0] == 1e-4 and ref.attempts == 9


def test_a_budget_bounds_the_wait() -> None:
    m = _FakeMachine([{PARALLEL: 1e-4}] * 3 + [{PARALLEL: 2e-4}])
    ref = m.settled(settle_s=1.0)
    for _ in range(3):
        ref.take()
    n = ref.attempts
    assert ref.take(budget_s=0.0)[PARALLEL][0] == 2e-4 and ref.attempts == n + 1 and not m.slept
    n = ref.attempts
    ref.take(budget_s=0.5)
    assert 1 < ref.attempts - n <= 3


def test_a_machine_that_stays_slow_keeps_its_slow_index_and_soon_stops_waiting() -> None:
    m = _FakeMachine([{PARALLEL: 1e-4}] * 3 + [{PARALLEL: 2e-4}])
    ref = m.settled(settle_s=1.0, history=5)
    for _ in range(3):
        ref.take([PARALLEL])
    t0 = m.now
    assert ref.take([PARALLEL])[PARALLEL][0] == 2e-4  # the drift the index is for stands
    assert m.now - t0 <= 1.0 + 0.2 + 0.05  # within the settling time (and one last timing)
    waits = []
    for _ in range(4):
        n = ref.attempts
        ref.take([PARALLEL])
        waits.append(ref.attempts - n)
    # once the slow index is the typical one (the median of the last 5), batches stop waiting
    assert waits[-1] == 1 and waits[0] > 1
    assert ref.typical(PARALLEL) == 2e-4


def test_only_the_kinds_a_batch_needs_are_judged_and_an_unsteady_or_missing_one_is_slow() -> None:
    usual = {PARALLEL: 1e-4, SERIAL: 2e-4}
    m = _FakeMachine([usual] * 3 + [{PARALLEL: 1e-4, SERIAL: 5e-4}, usual])
    ref = m.settled()
    for _ in range(3):
        ref.take()
    assert ref.take([PARALLEL])[SERIAL][0] == 5e-4 and ref.settled == 0  # serial not asked for
    assert ref.take([SERIAL])[SERIAL][0] == 2e-4 and ref.settled == 0
    # a missing index (the measuring process timed out) and an unsteady one are waited on too
    answers = iter([{}, {PARALLEL: (1e-4, UNSTEADY + 0.5)}, {PARALLEL: (1e-4, 1.01)}])
    ref2 = SettledReference(lambda: next(answers), sleep=lambda s: None)
    ref2.recent[PARALLEL] = deque([1e-4])
    assert ref2.take([PARALLEL]) == {PARALLEL: (1e-4, 1.01)} and ref2.attempts == 3
    assert list(ref2.recent[PARALLEL]) == [1e-4, 1e-4]  # the unsteady one is not remembered


def test_the_local_runner_indexes_a_batch_by_its_settled_reference(
        pools: tuple[tuning.LocalBuilder, LocalRunner]) -> None:
    builder, runner = pools
    task = tuning.SearchTask(wl.matmul, (16, 8, 16))
    ins = [MeasureInput(task, STEPS[0]), MeasureInput(task, (AnnotationStep("C", 0, "parallel"),))]
    n = runner.settled.attempts
    results, _, _ = measure_batch(builder, runner, ins)
    assert runner.settled.attempts > n  # the real reference, through the settling
    # it waits at most SETTLE_SHARE of the previous batch's measuring time: these batches are
    # short, so a spell is not waited out (a test's batches would otherwise take twice as long)
    assert runner._last_batch_s < 1.0
    kept = runner.settled
    usual = {PARALLEL: 1e-4, SERIAL: 2e-4}
    spell = [{PARALLEL: 3e-4, SERIAL: 2e-4}, {PARALLEL: 1.02e-4, SERIAL: 2e-4}]
    got = []
    try:
        for last_batch_s in (runner._last_batch_s, 20.0):  # a short batch before, then a long one
            m = _FakeMachine([usual] * 3 + spell)
            runner.settled = m.settled()
            for _ in range(3):
                runner.settled.take()
            runner._last_batch_s = last_batch_s
            results, _, _ = measure_batch(builder, runner, ins)
            assert [r.error for r in results] == [MeasureErrorNo.NO_ERROR] * 2
            assert (results[0].ref_kind, results[0].ref_s) == (SERIAL, 2e-4)
            got.append((results[1].ref_kind, results[1].ref_s))
    finally:
        runner.settled = kept
    assert got == [(PARALLEL, 3e-4), (PARALLEL, 1.02e-4)]  # the spell waited out after the long batch
    assert 0 < runner._last_batch_s < 20.0  # and the runner notes each batch's time

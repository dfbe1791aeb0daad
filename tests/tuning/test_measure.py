"""Measurement survives candidates that crash, hang or lie, and tuning goes on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tuning_faults as faults
import tuning_workloads as wl

import tuning
from tuning.measure import LocalBuilder, LocalRunner, MeasureErrorNo, MeasureInput, measure_batch
from tuning.records import load_records
from tuning.search import EvolutionarySearch
from tuning.space import Candidate
from tuning.steps import AnnotationStep, SplitStep, steps_key

GOOD = (SplitStep("B", 0, (16,)), AnnotationStep("B", 1, "vectorize"))


@pytest.fixture(scope="module")
def pools() -> Iterator[tuple[LocalBuilder, LocalRunner]]:
    builder, runner = LocalBuilder(n_workers=2, timeout=30), LocalRunner(timeout=2.0)
    yield builder, runner
    builder.close()
    runner.close()


def test_each_fault_gets_its_error_kind(pools: tuple[LocalBuilder, LocalRunner]) -> None:
    builder, runner = pools
    task = tuning.SearchTask(wl.add_one, (1000,))
    batch = [GOOD, (faults.CrashStep("B"),), (faults.HangStep("B"),), (faults.WrongStep("B"),),
             (SplitStep("B", 3, (2,)),), GOOD[:1]]
    seen = []
    results, build_s, run_s = measure_batch(builder, runner, [MeasureInput(task, s) for s in batch],
                                            lambda i, r: seen.append(r))
    kinds = [r.error for r in results]
    assert kinds == [MeasureErrorNo.NO_ERROR, MeasureErrorNo.RUN_CRASH, MeasureErrorNo.RUN_TIMEOUT,
                     MeasureErrorNo.WRONG_ANSWER, MeasureErrorNo.SCHEDULE_ERROR,
                     MeasureErrorNo.NO_ERROR]
    assert "SIGSEGV" in results[1].error_msg
    # the dead worker's last words: faulthandler's report and the Python stack of the call
    assert "Fatal Python error" in results[1].error_msg and "_run_job" in results[1].error_msg
    assert "max abs error 0.5" in results[3].error_msg
    assert "no leaf axis" in results[4].error_msg
    assert results[0].valid and all(c > 0 for c in results[0].costs)
    assert seen == results  # every result reported as it happened
    assert runner.worker.starts >= 3  # replaced after the crash and after the hang
    # the replacement process measures as before
    again, _, _ = measure_batch(builder, runner, [MeasureInput(task, GOOD)])
    assert again[0].valid


def test_tuning_completes_despite_faults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         pools: tuple[LocalBuilder, LocalRunner]) -> None:
    builder, runner = pools
    task = tuning.SearchTask(wl.add_one, (1000,))
    bad = [(faults.CrashStep("B"),), (faults.HangStep("B"),), (faults.WrongStep("B"),)]
    original = EvolutionarySearch.next_batch
    injected = []

    def next_batch(self: EvolutionarySearch, n: int) -> list[Candidate]:
        out = original(self, n)
        if not injected:
            injected.append(True)
            out = [Candidate(0, (), s, steps_key(s)) for s in bad] + out[: max(0, n - len(bad))]
        return out

    monkeypatch.setattr(EvolutionarySearch, "next_batch", next_batch)
    log = str(tmp_path / "faults.jsonl")
    res = tuning.tune([task], trials=8, log=log, seed=1, batch_size=4, builder=builder,
                      runner=runner, search=tuning.SearchOptions(population=16, generations=1, fresh_pool=16),
                      progress=False)[0]
    recs = load_records(log, task)
    errors = {r.error.name for r in recs}
    assert {"RUN_CRASH", "RUN_TIMEOUT", "WRONG_ANSWER", "NO_ERROR"} <= errors
    assert len({r.key for r in recs}) == res.trials == 8 and res.errors["RUN_CRASH"] == 1
    best = tuning.records.best_record(log, task)  # the faulty ones are never "best"
    assert not any(isinstance(x, (faults.CrashStep, faults.HangStep, faults.WrongStep))
                   for x in best.steps)


def test_a_dead_builder_says_why(pools: tuple[LocalBuilder, LocalRunner]) -> None:
    builder, runner = pools
    task = tuning.SearchTask(wl.add_one, (1000,))
    (res,), _, _ = measure_batch(builder, runner, [MeasureInput(task, (faults.ExitStep("B"),))])
    assert res.error == MeasureErrorNo.BUILD_CRASH
    assert res.error_msg.startswith("process exited with code 3")
    assert "ExitStep: the builder gives up here" in res.error_msg


def test_tuning_stops_when_every_candidate_fails_the_same_way(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pools: tuple[LocalBuilder, LocalRunner]) -> None:
    builder, runner = pools
    task = tuning.SearchTask(wl.add_one, (1000,))
    made = iter(range(1, 10_000))

    def next_batch(self: EvolutionarySearch, n: int) -> list[Candidate]:
        # distinct candidates (different splits), all computing the wrong function
        out = []
        for _ in range(n):
            s = (SplitStep("B", 0, (next(made),)), faults.WrongStep("B"))
            out.append(Candidate(0, (), s, steps_key(s)))
        return out

    monkeypatch.setattr(EvolutionarySearch, "next_batch", next_batch)
    log = str(tmp_path / "wrong.jsonl")
    with pytest.raises(tuning.AllCandidatesFailedError, match="all 8 candidates so far failed with "
                                                              "WRONG_ANSWER") as info:
        tuning.tune([task], trials=64, log=log, batch_size=4, builder=builder, runner=runner,
                    progress=False)
    assert info.value.error == "WRONG_ANSWER" and "max abs error 0.5" in info.value.message
    recs = load_records(log, task)  # the budget was not spent, and nothing measured was lost
    assert len(recs) == 8 and all(r.error == MeasureErrorNo.WRONG_ANSWER for r in recs)


def test_mixed_failures_do_not_stop_tuning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           pools: tuple[LocalBuilder, LocalRunner]) -> None:
    builder, runner = pools
    task = tuning.SearchTask(wl.add_one, (1000,))
    made = iter(range(1, 10_000))

    def next_batch(self: EvolutionarySearch, n: int) -> list[Candidate]:
        out = []
        for k in range(n):
            bad = faults.WrongStep("B") if k % 2 else SplitStep("B", 3, (2,))  # two kinds of error
            s = (SplitStep("B", 0, (next(made),)), bad)
            out.append(Candidate(0, (), s, steps_key(s)))
        return out

    monkeypatch.setattr(EvolutionarySearch, "next_batch", next_batch)
    log = str(tmp_path / "mixed.jsonl")
    (res,) = tuning.tune([task], trials=12, log=log, batch_size=4, builder=builder, runner=runner,
                         progress=False, remeasure=0)
    assert res.trials == 12 and set(res.errors) == {"WRONG_ANSWER", "SCHEDULE_ERROR"}


def test_results_name_the_machine_that_measured(pools: tuple[LocalBuilder, LocalRunner]) -> None:
    from tuning.machine import local_machine

    builder, runner = pools
    task = tuning.SearchTask(wl.add_one, (1000,))
    ok, bad = measure_batch(builder, runner, [MeasureInput(task, GOOD),
                                              MeasureInput(task, (SplitStep("B", 3, (2,)),))])[0]
    here = local_machine()
    # asked of the measuring process itself: the LLVM CPU and features tecomp compiles for
    assert ok.valid and ok.machine == here == runner.machine
    assert here.llvm_cpu == tc_host().cpu and here.host_id and here.features.startswith("+")
    assert bad.error == MeasureErrorNo.SCHEDULE_ERROR and bad.machine is None  # never ran


def tc_host():  # type: ignore[no-untyped-def]
    from tecomp.codegen.target import Target

    return Target.host()


def test_worker_pool_runs_jobs_and_rejects_no_workers() -> None:
    from tuning.measure import WorkerPool

    with pytest.raises(ValueError, match="WorkerPool: n_workers must be >= 1, got 0"):
        WorkerPool(n_workers=0)
    pool = WorkerPool(n_workers=2, prefix="test")
    try:
        assert pool.map(divmod, [(7, 2), (9, 4), (1, 0)])[:2] == [(3, 1), (2, 1)]
        assert "ZeroDivisionError" in pool.map(divmod, [(1, 0)])[0].message  # a _Failure, not a raise
    finally:
        pool.close()

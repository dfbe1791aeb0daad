"""Builders and runners as interfaces: any implementation plugs into `tune`, several batches
stay in flight on a runner that can take them, every record names the machine that measured
it, and logs of schema version 1 still load and resume."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import tuning_workloads as wl

import tecomp as tc
import tuning
from tuning.machine import Machine, local_machine
from tuning.measure import BuildResult, LocalBuilder, LocalRunner, MeasureInput, MeasureResult
from tuning.protocols import Builder, Runner, check_builder, check_runner
from tuning.records import load_records

SMALL = tuning.SearchOptions(population=16, generations=1, fresh_pool=16)


@pytest.fixture(scope="module")
def pools() -> Iterator[tuple[LocalBuilder, list[LocalRunner]]]:
    builder = LocalBuilder(n_workers=2)
    runners = [LocalRunner(timeout=10.0, min_repeat_ms=2.0) for _ in range(2)]
    yield builder, runners
    builder.close()
    for r in runners:
        r.close()


class BuildOnly:
    """A builder with nothing but the protocol (no ``map``, no ``n_workers``): the search's
    features must come from the tuner's own executor."""

    def __init__(self, inner: LocalBuilder) -> None:
        self.inner = inner
        self.batches = 0

    def build(self, inputs: Sequence[MeasureInput]) -> list[BuildResult]:
        self.batches += 1
        return self.inner.build(inputs)

    def reset(self) -> None:
        self.inner.reset()

    def close(self) -> None:
        pass


class TwoNodeRunner:
    """A runner of two "nodes" (two measuring processes here), named as other machines, that
    takes two batches at once: what a cluster runner looks like to the tuner. Its first two
    calls meet at a barrier, so the test fails unless the tuner really keeps two in flight."""

    capacity = 2
    exclusive = False

    def __init__(self, runners: Sequence[LocalRunner]) -> None:
        self.free = list(runners)
        self.lock = threading.Lock()
        self.meet = threading.Barrier(2, timeout=120)
        self.calls = 0
        self.busy = 0
        self.most_busy = 0
        self.nodes = [dataclasses.replace(local_machine(), host=f"node{k}", host_id=f"{k:016x}")
                      for k in range(len(runners))]

    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult],
            callback: Callable[[MeasureInput, MeasureResult], None] | None = None) -> list[MeasureResult]:
        with self.lock:
            runner = self.free.pop()
            node = self.nodes[len(self.free)]
            self.calls += 1
            first_two = self.calls <= 2
            self.busy += 1
            self.most_busy = max(self.most_busy, self.busy)
        try:
            if first_two:
                self.meet.wait()
            # results come back without the callback: the tuner reports them itself
            return [dataclasses.replace(r, machine=node) if r.machine is not None else r
                    for r in runner.run(inputs, builds)]
        finally:
            with self.lock:
                self.busy -= 1
                self.free.append(runner)

    def reset(self) -> None:
        self.meet.abort()
        for r in self.free:
            r.reset()

    def close(self) -> None:
        pass


def _check_best(log: str, task: tuning.SearchTask) -> None:
    s, args = task.apply_best(log)
    f = tc.build(s, args, name="best")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 32)).astype("float32")
    b = rng.standard_normal((32, 16)).astype("float32")
    c = np.zeros((16, 16), "float32")
    f(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


def test_the_local_pair_and_the_gpu_classes_conform(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuning.gpu_measure import STANDIN_ENV, EmulatingRunner, GpuBuilder

    monkeypatch.setenv(STANDIN_ENV, "1")
    b, r, gb, er = LocalBuilder(n_workers=1), LocalRunner(), GpuBuilder(n_workers=1), EmulatingRunner()
    try:
        assert isinstance(b, Builder) and isinstance(gb, Builder)
        assert isinstance(r, Runner) and isinstance(er, Runner)
        assert r.capacity == 1 and r.exclusive and er.capacity == 1
        assert check_runner(r) is r and check_builder(gb) is gb
    finally:
        for x in (b, r, gb, er):
            x.close()


def test_a_custom_runner_gets_batches_in_flight_and_its_machines_are_logged(
        tmp_path: Path, pools: tuple[LocalBuilder, list[LocalRunner]]) -> None:
    inner, runners = pools
    builder, runner = BuildOnly(inner), TwoNodeRunner(runners)
    task = tuning.SearchTask(wl.matmul, (16, 32, 16))
    log = str(tmp_path / "two.jsonl")
    (res,) = tuning.tune([task], trials=12, log=log, seed=0, batch_size=4, builder=builder,
                         runner=runner, search=SMALL, progress=False, remeasure=0)
    assert runner.most_busy == 2 and runner.calls == builder.batches == 3
    assert res.trials == res.new_trials == 12 and np.isfinite(res.best_cost)
    recs = load_records(log, task)
    assert len(recs) == len({r.key for r in recs}) == 12  # nothing measured twice while in flight
    measured = [r for r in recs if r.machine is not None]
    assert measured and {r.machine.host for r in measured} <= {"node0", "node1"}
    assert {r.machine for r in measured} <= set(runner.nodes)
    lines = [json.loads(ln) for ln in Path(log).read_text().splitlines()]
    machine_lines = [d for d in lines if d.get("kind") == "machine"]
    # one line per machine that measured, written before the first record naming it
    assert len(machine_lines) == len({r.machine.id for r in measured})
    for d in machine_lines:
        first_use = next(k for k, x in enumerate(lines) if x.get("machine") == d["id"] and "kind" not in x)
        assert lines.index(d) < first_use
    _check_best(log, task)


def test_a_local_run_is_deterministic_for_a_seed(tmp_path: Path,
                                                 pools: tuple[LocalBuilder, list[LocalRunner]]) -> None:
    builder, (runner, _) = pools
    task = tuning.SearchTask(wl.matmul, (16, 32, 16))
    keys = []
    for k in range(2):
        log = str(tmp_path / f"run{k}.jsonl")
        tuning.tune([task], trials=8, log=log, seed=3, batch_size=4, builder=builder, runner=runner,
                    search=SMALL, progress=False, remeasure=0)
        keys.append([r.key for r in load_records(log, task)])
    assert len(keys[0]) == 8 and keys[0] == keys[1]
    # the records say where they were measured: this machine, as the measuring process saw it
    assert all(r.machine == local_machine() for r in load_records(log, task) if r.run_s > 0)


def _to_schema_1(path: Path) -> None:
    """Rewrite a log as tecomp wrote it before machine lines: version 1, "host_cpu"."""
    out = []
    for d in map(json.loads, path.read_text().splitlines()):
        if d.get("kind") == "machine":
            continue
        d["v"] = 1
        if "kind" not in d:
            d.pop("machine", None)
            d["host_cpu"] = "znver1"
        out.append(json.dumps(d))
    path.write_text("\n".join(out) + "\n")


def test_a_schema_1_log_loads_and_resumes(tmp_path: Path, pools: tuple[LocalBuilder, list[LocalRunner]]) -> None:
    builder, (runner, _) = pools
    task = tuning.SearchTask(wl.matmul, (16, 32, 16))
    log = tmp_path / "old.jsonl"
    tuning.tune([task], trials=4, log=str(log), seed=0, batch_size=4, builder=builder, runner=runner,
                search=SMALL, progress=False, remeasure=0)
    _to_schema_1(log)
    old = load_records(str(log), task)
    assert len(old) == 4 and all(r.machine == Machine(llvm_cpu="znver1") for r in old)
    (res,) = tuning.tune([task], trials=8, log=str(log), seed=0, batch_size=4, builder=builder,
                         runner=runner, search=SMALL, progress=False, remeasure=0)
    assert res.trials == 8 and res.new_trials == 4  # the old records counted, none measured again
    recs = load_records(str(log), task)
    assert len({r.key for r in recs}) == 8
    assert [r.machine for r in recs[:4]] == [r.machine for r in old]
    new = [d for d in map(json.loads, log.read_text().splitlines()) if "kind" not in d][-1]
    assert new["v"] == 2 and "host_cpu" not in new
    _check_best(str(log), task)


class _Counting:
    capacity = 1
    exclusive = True

    def __init__(self, drop: int) -> None:
        self.drop = drop

    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult],
            callback: Callable[[MeasureInput, MeasureResult], None] | None = None) -> list[MeasureResult]:
        return [MeasureResult((1e-3,), tuning.MeasureErrorNo.NO_ERROR)] * (len(inputs) - self.drop)

    def reset(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_bad_builders_and_runners_are_named(tmp_path: Path, pools: tuple[LocalBuilder, list[LocalRunner]]) -> None:
    builder, _ = pools
    task = tuning.SearchTask(wl.matmul, (16, 32, 16))

    class NoCapacity:
        exclusive = True

        def run(self, inputs: object, builds: object, callback: object = None) -> list[MeasureResult]:
            return []

        def reset(self) -> None:
            pass

        def close(self) -> None:
            pass

    with pytest.raises(TypeError, match="runner NoCapacity is not a tuning Runner: it lacks capacity"):
        tuning.tune([task], trials=4, builder=builder, runner=NoCapacity(), progress=False)  # type: ignore[arg-type]
    zero = _Counting(0)
    zero.capacity = 0
    with pytest.raises(ValueError, match="capacity must be an int >= 1, got 0"):
        tuning.tune([task], trials=4, builder=builder, runner=zero, progress=False)
    with pytest.raises(TypeError, match="builder object is not a tuning Builder: it has no build, reset, close"):
        tuning.tune([task], trials=4, builder=object(), progress=False)  # type: ignore[arg-type]
    with pytest.raises(tuning.TuningError, match="runner _Counting returned 3 results for 4 inputs"):
        tuning.tune([task], trials=4, batch_size=4, builder=builder, runner=_Counting(1), search=SMALL,
                    progress=False, log=str(tmp_path / "short.jsonl"))


class FailingRunner:
    """Two batches in flight on one measuring process (calls serialised here); its call number
    ``fail_at`` raises ``error`` after measuring (and reporting) part of its batch."""

    capacity = 2
    exclusive = False

    def __init__(self, inner: LocalRunner, fail_at: int, error: BaseException) -> None:
        self.inner, self.fail_at, self.error = inner, fail_at, error
        self.lock = threading.Lock()
        self.calls = 0
        self.resets = 0

    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult],
            callback: Callable[[MeasureInput, MeasureResult], None] | None = None) -> list[MeasureResult]:
        with self.lock:
            self.calls += 1
            if self.calls == self.fail_at:
                self.inner.run(inputs[:1], builds[:1], callback)
                raise self.error
            return self.inner.run(inputs, builds, callback)

    def reset(self) -> None:
        self.resets += 1

    def close(self) -> None:
        pass


def test_ctrl_c_with_batches_in_flight_keeps_the_log_and_resumes(
        tmp_path: Path, pools: tuple[LocalBuilder, list[LocalRunner]]) -> None:
    builder, (inner, _) = pools
    task = tuning.SearchTask(wl.matmul, (16, 32, 16))
    log = str(tmp_path / "int.jsonl")
    runner = FailingRunner(inner, 3, KeyboardInterrupt())
    (res,) = tuning.tune([task], trials=12, log=log, seed=0, batch_size=4, builder=builder, runner=runner,
                         search=SMALL, progress=False, remeasure=0)
    assert res.interrupted and runner.resets >= 1
    kept = load_records(log, task)
    # two whole batches and what the third measured before the interrupt (no stale result
    # arrived after it): everything reported is logged, once
    assert len(kept) == res.new_trials == 9 and len({r.key for r in kept}) == 9
    (again,) = tuning.tune([task], trials=12, log=log, seed=0, batch_size=4, builder=builder,
                           runner=FailingRunner(inner, 0, KeyboardInterrupt()), search=SMALL,
                           progress=False, remeasure=0)
    assert not again.interrupted and again.trials == 12 and again.new_trials == 3
    assert len({r.key for r in load_records(log, task)}) == 12
    _check_best(log, task)


def test_a_runner_that_raises_stops_tuning_with_its_error(
        tmp_path: Path, pools: tuple[LocalBuilder, list[LocalRunner]]) -> None:
    builder, (inner, _) = pools
    task = tuning.SearchTask(wl.matmul, (16, 32, 16))
    log = str(tmp_path / "raise.jsonl")
    runner = FailingRunner(inner, 2, RuntimeError("node lost"))
    with pytest.raises(RuntimeError, match="node lost"):
        tuning.tune([task], trials=12, log=log, seed=0, batch_size=4, builder=builder, runner=runner,
                    search=SMALL, progress=False, remeasure=0)
    assert runner.resets >= 1 and len(load_records(log, task)) >= 5  # batch 1, and batch 2's first

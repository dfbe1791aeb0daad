"""Tuning through `RayRunner` on a local Ray instance (started and stopped by these tests):
its records are the local runner's, faults become error records, a lost cluster stops tuning
with a log that resumes."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest
import tuning_faults as faults
import tuning_workloads as wl
from numpy_refs import check_best_matmul

import tuning
from tecomp.codegen.target import Target
from tuning.machine import Machine, local_machine
from tuning.measure import LocalBuilder, MeasureErrorNo, MeasureInput, measure_batch
from tuning.records import load_records
from tuning.speed import PARALLEL, SERIAL, SettledReference
from tuning.steps import AnnotationStep, SplitStep

ray = pytest.importorskip("ray", reason="Ray is the [distributed] extra")

from tuning.distributed import ClusterLost, MeasuringActor, RayRunner, fits  # noqa: E402

GOOD = (SplitStep("B", 0, (16,)), AnnotationStep("B", 1, "vectorize"))


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayRunner]:
    runner = RayRunner(num_cpus=2, timeout=3.0, min_repeat_ms=5.0)
    yield runner
    runner.close()
    assert not ray.is_initialized()  # the runner started it, the runner stopped it


@pytest.fixture(scope="module")
def builder() -> Iterator[LocalBuilder]:
    b = LocalBuilder(n_workers=2, timeout=30)
    yield b
    b.close()


def test_runner_measures_on_the_cluster_and_says_where(cluster: RayRunner, builder: LocalBuilder) -> None:
    assert cluster.capacity == 1  # one node, one measuring actor holding both CPUs
    (m,) = cluster.machines()
    here = local_machine()
    assert m.host_id == here.host_id and m.llvm_cpu == here.llvm_cpu  # taken on the node
    # Ray starts workers at nice 15; the measuring actor goes back to the default where allowed
    import os

    if os.geteuid() == 0:
        assert ray.get(cluster._slots[0].handle.__ray_call__.remote(lambda a: a.nice)) == 0
    assert cluster.exclusive  # the only node is the tuner's own machine
    task = tuning.SearchTask(wl.add_one, (1000,))
    batch = [GOOD, (faults.CrashStep("B"),), (faults.HangStep("B"),), (faults.WrongStep("B"),),
             (SplitStep("B", 3, (2,)),), GOOD[:1]]
    seen: list[object] = []
    results, _, _ = measure_batch(builder, cluster, [MeasureInput(task, s) for s in batch],
                                  lambda i, r: seen.append(r))
    assert [r.error for r in results] == [
        MeasureErrorNo.NO_ERROR, MeasureErrorNo.RUN_CRASH, MeasureErrorNo.RUN_TIMEOUT,
        MeasureErrorNo.WRONG_ANSWER, MeasureErrorNo.SCHEDULE_ERROR, MeasureErrorNo.NO_ERROR]
    assert "died" in results[1].error_msg and "no result in 3 s" in results[2].error_msg
    assert "max abs error 0.5" in results[3].error_msg
    assert results[0].valid and results[5].valid and seen == results
    assert all(r.machine == m for r in results if r.error != MeasureErrorNo.SCHEDULE_ERROR)


def test_each_node_indexes_a_batch_by_its_settled_reference(cluster: RayRunner,
                                                            builder: LocalBuilder) -> None:
    """An actor's index is timed again while its node is in a short slow spell, as the local
    runner's is, within a tenth of that actor's previous batch."""
    task = tuning.SearchTask(wl.matmul, (16, 8, 16))
    ins = [MeasureInput(task, ()), MeasureInput(task, (AnnotationStep("C", 0, "parallel"),))]
    results, _, _ = measure_batch(builder, cluster, ins)
    (slot,) = cluster._slots
    assert slot.settled is not None and slot.settled.attempts >= 1  # the real reference
    assert 0 < slot.last_batch_s < 5.0
    assert [r.error for r in results] == [MeasureErrorNo.NO_ERROR] * 2
    kept = slot.settled
    got = []
    try:
        for last_batch_s in (0.0, 20.0):  # no time to wait after a short batch; after a long one
            script = [{PARALLEL: (3e-4, 1.01), SERIAL: (2e-4, 1.01)},
                      {PARALLEL: (1.02e-4, 1.01), SERIAL: (2e-4, 1.01)}]
            slot.settled = SettledReference(lambda s=script: s.pop(0) if len(s) > 1 else s[0],  # type: ignore[misc]
                                            sleep=lambda _: None)
            slot.settled.recent[PARALLEL] = deque([1e-4] * 3)  # the node's usual index
            slot.last_batch_s = last_batch_s
            results, _, _ = measure_batch(builder, cluster, ins)
            assert [r.error for r in results] == [MeasureErrorNo.NO_ERROR] * 2
            got.append(results[1].ref_s)
    finally:
        slot.settled = kept
    assert got == [3e-4, 1.02e-4]


def test_tune_through_ray_writes_local_records_and_resumes(tmp_path: Path, cluster: RayRunner,
                                                           builder: LocalBuilder) -> None:
    task = tuning.SearchTask(wl.matmul, (32, 32, 32))
    log = str(tmp_path / "ray.jsonl")
    opts = tuning.SearchOptions(population=16, generations=1, fresh_pool=16)
    (res,) = tuning.tune([task], trials=8, log=log, seed=3, batch_size=4, builder=builder,
                         runner=cluster, search=opts, progress=False, remeasure=0)
    recs = load_records(log, task)
    assert len(recs) == res.trials == 8 and any(r.valid for r in recs)
    # the same JSON-lines records as a local run, naming the node that measured
    lines = [json.loads(x) for x in Path(log).read_text().splitlines()]
    (node,) = cluster.machines()
    assert [x["machine"] for x in lines if x.get("kind") == "machine"] == [node.to_json()]
    assert all(r.machine == node for r in recs if r.valid)
    # the best schedule, built here, computes the matmul
    check_best_matmul(task, log, 32)
    # resume: the log's candidates are not measured again, the budget goes on from there
    (again,) = tuning.tune([task], trials=12, log=log, seed=3, batch_size=4, builder=builder,
                           runner=cluster, search=opts, progress=False, remeasure=0)
    recs2 = load_records(log, task)
    assert len(recs2) == 12 and len({r.key for r in recs2}) == 12


def test_a_killed_worker_is_a_crash_record_and_measuring_goes_on(cluster: RayRunner,
                                                                 builder: LocalBuilder) -> None:
    task = tuning.SearchTask(wl.add_one, (1000,))
    builds = builder.build([MeasureInput(task, (faults.HangStep("B"),)), MeasureInput(task, GOOD)])
    inputs = [MeasureInput(task, (faults.HangStep("B"),)), MeasureInput(task, GOOD)]
    # warm the actor (reference computed) so the kill lands inside the hanging measurement
    measure_batch(builder, cluster, [MeasureInput(task, GOOD)])
    slot = cluster._slots[0]
    pid = ray.get(slot.handle.pid.remote())

    def kill() -> None:
        time.sleep(1.0)
        ray.kill(slot.handle)

    t = threading.Thread(target=kill)
    t.start()
    results = cluster.run(inputs, builds)
    t.join()
    assert results[0].error == MeasureErrorNo.RUN_CRASH, results[0]
    assert results[1].valid  # on the replacement actor
    assert ray.get(cluster._slots[0].handle.pid.remote()) != pid


def test_losing_the_cluster_stops_tuning_with_a_log_that_resumes(
        tmp_path: Path, cluster: RayRunner, builder: LocalBuilder, monkeypatch: pytest.MonkeyPatch) -> None:
    # the last test of the module's cluster: it takes its only node away
    runner = cluster
    task = tuning.SearchTask(wl.add_one, (1000,))
    log = str(tmp_path / "lost.jsonl")
    opts = tuning.SearchOptions(population=16, generations=1, fresh_pool=16)
    calls = {"n": 0}
    original = runner._measure

    def flaky(inp, b, target, slot):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 6:  # the node leaves during the 6th measurement
            monkeypatch.setattr(runner, "_node_alive", lambda node_id: False)
            s = slot or runner._acquire(target)
            ray.kill(s.handle)
            return original(inp, b, target, s)
        return original(inp, b, target, slot)

    monkeypatch.setattr(runner, "_measure", flaky)
    try:
        with pytest.raises(ClusterLost, match="measuring node"):
            tuning.tune([task], trials=12, log=log, seed=5, batch_size=4, builder=builder,
                        runner=runner, search=opts, progress=False, remeasure=0)
    finally:
        monkeypatch.undo()
        runner.close()
    kept = load_records(log, task)
    assert len(kept) == 5  # every measurement that finished is in the log
    # resume on a fresh cluster: the 5 are not measured again
    runner2 = RayRunner(num_cpus=2, timeout=3.0, min_repeat_ms=5.0)
    try:
        tuning.tune([task], trials=12, log=log, seed=5, batch_size=4, builder=builder,
                    runner=runner2, search=opts, progress=False, remeasure=0)
    finally:
        runner2.close()
    recs = load_records(log, task)
    assert len(recs) == 12 and len({r.key for r in recs}) == 12


def test_cli_tunes_through_ray(tmp_path: Path) -> None:
    from tuning.cli import main

    assert not ray.is_initialized()  # the module's cluster is gone: this starts its own
    log = tmp_path / "cli.jsonl"
    assert main(["tune", "matmul", "--args", "16", "16", "16", "--trials", "4", "--batch-size", "4",
                 "--remeasure", "0", "--log", str(log), "--ray", "local"]) == 0
    assert not ray.is_initialized()  # the CLI closed the runner it made
    (task,) = tuning.load_tasks(str(log))
    recs = load_records(str(log), task)
    assert len(recs) == 4 and all(r.machine is not None for r in recs if r.valid)


def test_fits_matches_code_to_hardware() -> None:
    cpu = Machine(llvm_cpu="znver3", features="+avx,+avx2,+fma")
    assert fits(cpu, Target.parse("llvm -mcpu=znver3 -mattr=+avx2,+fma"))
    assert not fits(cpu, Target.parse("llvm -mcpu=znver4 -mattr=+avx512f"))
    gpu = Machine(gpu_name="NVIDIA H100", compute_capability="9.0")
    assert fits(gpu, Target.parse("cuda -arch=sm_80")) and fits(gpu, Target.parse("cuda -arch=sm_90"))
    assert not fits(Machine(gpu_name="A100", compute_capability="8.0"), Target.parse("cuda -arch=sm_90"))
    assert not fits(cpu, Target.parse("cuda -arch=sm_80")) and not fits(gpu, Target.parse("llvm"))


def test_the_actor_body_runs_the_local_jobs_without_ray(tmp_path: Path, builder: LocalBuilder) -> None:
    from tuning.measure import LocalRunner

    task = tuning.SearchTask(wl.add_one, (1000,))
    (b,) = builder.build([MeasureInput(task, GOOD)])
    actor = MeasuringActor((LocalRunner.prepare_job, LocalRunner.run_job, LocalRunner.machine_job),
                           str(tmp_path))
    key = actor.prepare(task)
    err, costs, msg = actor.run(key, b, tuning.measure.RunOptions())[:3]
    assert err == "NO_ERROR" and costs and all(c > 0 for c in costs)
    assert actor.machine() == local_machine()
    # the node checks the code's target itself: code for features it lacks is refused. Which
    # features those are depends on the machine (an Intel server part has AMX and AVX-512):
    # the first of these recent x86 ones it does not have
    have = {f[1:] for f in local_machine().features.split(",") if f.startswith("+")}
    lacks = [f for f in ("amx-tile", "avx512f", "amx-complex", "amx-fp8", "avx10.2-512", "sha512") if f not in have]
    if not lacks:
        pytest.skip("this CPU has every feature the test could ask for")
    alien = dataclasses.replace(b, artifact=dataclasses.replace(
        b.artifact, target=Target.parse(f"llvm -mcpu=sapphirerapids -mattr=+{lacks[0]}")))
    err, costs, msg = actor.run(key, alien, tuning.measure.RunOptions())[:3]
    assert err == "RUN_ERROR" and costs == () and "cannot run code for target" in msg


def test_without_ray_the_runner_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(tuning.TuningError, match=r"tecomp\[distributed\]"):
        RayRunner()

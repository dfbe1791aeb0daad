"""Building through `RayBuilder` on a local two-node Ray cluster (started and stopped by this
module): a head node that measures (custom resource "measure", all its CPUs held by the
`RayRunner`'s actor) and a node that builds, the topology the README asks for. Its results
are the local builder's, the code is built for the tuner's CPU whatever the node, faults
become error records, and a cluster with no CPU free for a build says so instead of hanging.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import tuning_faults as faults
import tuning_workloads as wl
from numpy_refs import check_best_matmul

import tuning
from tecomp.codegen.target import Target
from tuning.measure import LocalBuilder, MeasureErrorNo, MeasureInput, _build_job, measure_batch
from tuning.records import load_records
from tuning.space import space_for
from tuning.steps import SplitStep, State, Step

ray = pytest.importorskip("ray", reason="Ray is the [distributed] extra")

from tuning.distributed import RayRunner  # noqa: E402
from tuning.ray_builder import NoBuildCPU, RayBuilder, pin_target, pinned_build_job, target_text  # noqa: E402

HERE = Path(__file__).resolve().parent
TASK_ARGS = (32, 32, 32)


@dataclass(frozen=True)
class SleepStep(Step):
    """Stalls the process replaying it (the builder) for a minute, after writing its pid to
    ``pid_file``. Defined here: the build nodes import this module (PYTHONPATH below)."""

    KIND: ClassVar[str] = "test_build_sleep"
    pid_file: str = ""

    def apply(self, state: State) -> None:
        Path(self.pid_file).write_text(str(os.getpid()))
        time.sleep(60)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    assert not ray.is_initialized()  # ray.init is per process: the Ray test module stopped its own
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"measure": 1},
                                                      "include_dashboard": False})
    try:
        c.add_node(num_cpus=2)
        # the test helpers (fault steps, this module and the shared numpy_refs it imports)
        # must import on the build workers
        path = os.pathsep.join((str(HERE), str(HERE.parent)))
        ray.init(address=c.address, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
        c.wait_for_nodes()
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def runner(cluster: Any) -> Iterator[RayRunner]:
    r = RayRunner(node_resource="measure", timeout=5.0, min_repeat_ms=5.0)
    yield r
    r.close()


@pytest.fixture(scope="module")
def builder(cluster: Any) -> Iterator[RayBuilder]:
    b = RayBuilder(timeout=60.0)
    yield b
    b.close()
    assert ray.is_initialized()  # it joined the module's connection: closing it left that alone


@pytest.fixture(scope="module")
def local() -> Iterator[LocalBuilder]:
    b = LocalBuilder(n_workers=2, timeout=60.0)
    yield b
    b.close()


def _sampled(task: tuning.SearchTask, n: int, seed: int = 0) -> list[MeasureInput]:
    space, rng = space_for(task), np.random.default_rng(seed)
    out: dict[str, MeasureInput] = {}
    while len(out) < n:
        c = space.sample(rng)
        if c is not None:
            out.setdefault(c.key, MeasureInput.of(task, c))
    return list(out.values())


def test_results_are_the_local_builders(runner: RayRunner, builder: RayBuilder, local: LocalBuilder) -> None:
    task = tuning.SearchTask(wl.matmul, TASK_ARGS)
    alien = tuning.SearchTask(wl.matmul, TASK_ARGS, target="llvm -mcpu=not-a-cpu")
    inputs = _sampled(task, 3) + [
        MeasureInput(task, (SplitStep("C", 7, (2,)),)),  # does not replay: SCHEDULE_ERROR
        MeasureInput(alien, ()),  # LLVM knows no such CPU: BUILD_ERROR
    ]  # (a candidate that kills the builder: the next test but one)
    assert isinstance(builder, tuning.Builder)
    theirs, ours = local.build(inputs), builder.build(inputs)
    assert [r.error for r in ours] == [r.error for r in theirs] == [MeasureErrorNo.NO_ERROR] * 3 + [
        MeasureErrorNo.SCHEDULE_ERROR, MeasureErrorNo.BUILD_ERROR]
    assert ours[3].error_msg == theirs[3].error_msg and "not-a-cpu" in ours[4].error_msg
    for o, t in zip(ours[:3], theirs[:3]):
        assert o.artifact is not None and t.artifact is not None
        assert o.func_name == t.func_name and o.artifact.kernels == t.artifact.kernels
        assert o.artifact.target == t.artifact.target == Target.host()
        assert o.artifact.binary == t.artifact.binary  # the same object code, built on the other node
        assert o.info["target"] == target_text(Target.host()) and o.info["built_on"]
    assert builder.build([]) == []


def test_code_is_built_for_the_tuners_cpu_whatever_the_node(
        builder: RayBuilder, local: LocalBuilder, monkeypatch: pytest.MonkeyPatch) -> None:
    # an explicit CPU: the artifact and its info record it, and the code is that CPU's
    generic = tuning.SearchTask(wl.matmul, TASK_ARGS, target="llvm -mcpu=x86-64")
    host = tuning.SearchTask(wl.matmul, TASK_ARGS)
    (inp,) = _sampled(host, 1, seed=5)
    (g_ray,), (g_local,), (h_ray,) = (builder.build([MeasureInput(generic, inp.steps)]),
                                      local.build([MeasureInput(generic, inp.steps)]),
                                      builder.build([inp]))
    assert g_ray.artifact is not None and h_ray.artifact is not None and g_local.artifact is not None
    assert g_ray.artifact.target.cpu == "x86-64" and "-mcpu=x86-64" in g_ray.info["target"]
    assert g_ray.artifact.binary == g_local.artifact.binary != h_ray.artifact.binary
    # "llvm" is resolved here, in full: triple, CPU name and every feature
    pin = pin_target("llvm")
    assert pin == Target.host() and pin.cpu and pin.features
    assert target_text(pin) == f"llvm -mtriple={pin.triple} -mcpu={pin.cpu} -mattr={pin.features}"
    assert Target.parse(target_text(pin)) == pin

    # a node with another CPU, simulated in this process: there "llvm" means that CPU, and the
    # local job alone builds for it; the pinned job builds for the tuner's CPU all the same
    import tecomp.codegen.target as target_mod

    other = Target("llvm", pin.triple, "x86-64", "+sse2")
    task_there = pickle.loads(pickle.dumps(host))  # what the node unpickles: target "llvm"
    monkeypatch.setattr(target_mod, "_host", lambda: other)
    target_mod._parse.cache_clear()
    try:
        assert task_there.target == "llvm" and Target.parse(task_there.target) == other
        unpinned = _build_job(task_there, inp.steps, "default_function")
        pinned = pinned_build_job(_build_job, task_there, inp.steps, "default_function", pin)
    finally:
        monkeypatch.undo()
        target_mod._parse.cache_clear()
    assert unpinned.artifact is not None and unpinned.artifact.target == other
    assert pinned.artifact is not None and pinned.artifact.target == pin
    assert pinned.artifact.binary == h_ray.artifact.binary and task_there.target == "llvm"


def test_tune_builds_and_measures_on_the_cluster(tmp_path: Path, runner: RayRunner, builder: RayBuilder) -> None:
    task = tuning.SearchTask(wl.matmul, TASK_ARGS)
    log = str(tmp_path / "rb.jsonl")
    (res,) = tuning.tune([task], trials=4, log=log, seed=1, batch_size=4, builder=builder, runner=runner,
                         search=tuning.SearchOptions(population=16, generations=1, fresh_pool=16), progress=False,
                         remeasure=0)
    recs = load_records(log, task)
    assert len(recs) == res.trials == 4 and any(r.valid for r in recs)
    (node,) = runner.machines()
    assert all(r.machine == node for r in recs if r.valid)
    check_best_matmul(task, log, 32)


def _pid_from(path: Path, limit_s: float = 30.0) -> int:
    deadline = time.monotonic() + limit_s
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, "the stalled build never started"
        time.sleep(0.05)
    return int(path.read_text())


def _gone(pid: int, limit_s: float = 15.0) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_a_killed_build_worker_is_an_error_record_and_the_run_goes_on(
        tmp_path: Path, runner: RayRunner, local: LocalBuilder) -> None:
    task = tuning.SearchTask(wl.matmul, TASK_ARGS)
    pid_file = tmp_path / "pid"
    # killed from outside, and by the candidate itself (the local builder calls that a crash too)
    inputs = [MeasureInput(task, (SleepStep("C", str(pid_file)),)), MeasureInput(task, (faults.ExitStep("C"),))]
    inputs += _sampled(task, 1, seed=2)
    killer = RayBuilder(timeout=60.0, max_retries=0)  # a retry would build the stalled one again

    def kill() -> None:
        os.kill(_pid_from(pid_file), signal.SIGKILL)

    t = threading.Thread(target=kill)
    t.start()
    try:
        t0 = time.monotonic()
        results, _, _ = measure_batch(killer, runner, inputs)
    finally:
        t.join()
        killer.close()
    assert time.monotonic() - t0 < 40  # the kill ended it, not the 60 s sleep
    assert results[0].error == results[1].error == MeasureErrorNo.BUILD_CRASH
    assert "died" in results[0].error_msg and "died" in results[1].error_msg
    assert local.build(inputs[1:2])[0].error == MeasureErrorNo.BUILD_CRASH
    assert results[2].valid  # built beside them, measured on the head node


def test_a_build_past_its_timeout_is_cancelled(tmp_path: Path, cluster: Any) -> None:
    task = tuning.SearchTask(wl.matmul, TASK_ARGS)
    pid_file = tmp_path / "pid"
    inputs = [MeasureInput(task, (SleepStep("C", str(pid_file)),))] + _sampled(task, 1, seed=3)
    quick = RayBuilder(timeout=5.0)
    # the clock of a build starts at its submission, so a worker's start (imports) counts: warm
    # both of the build node's workers first, a 5 s limit is then ample for the good candidate
    assert all(r.error == MeasureErrorNo.NO_ERROR for r in quick.build(_sampled(task, 2, seed=4)))
    try:
        t0 = time.monotonic()
        out = quick.build(inputs)
        took = time.monotonic() - t0
    finally:
        quick.close()
    assert out[0].error == MeasureErrorNo.BUILD_TIMEOUT and "5 s" in out[0].error_msg
    assert out[1].error == MeasureErrorNo.NO_ERROR and took < 20
    assert _gone(_pid_from(pid_file))  # the stalled compiler's process was killed


def test_no_free_cpu_is_an_error_not_a_hang(runner: RayRunner, builder: RayBuilder) -> None:
    task = tuning.SearchTask(wl.matmul, TASK_ARGS)
    inputs = _sampled(task, 1)
    big = RayBuilder(num_cpus=3)
    with pytest.raises(NoBuildCPU, match="no alive node of the Ray cluster has 3 CPUs"):
        big.build(inputs)
    big.close()
    # the head's CPUs are the runner's; something else now holds the build node's two (a
    # placement group reserves them without starting a process)
    from ray.util.placement_group import placement_group, remove_placement_group

    hog = placement_group([{"CPU": 2}])
    try:
        ray.get(hog.ready(), timeout=60)
        t0 = time.monotonic()
        waiting = RayBuilder(cpu_wait_s=1.0)
        with pytest.raises(NoBuildCPU, match="none of the Ray cluster's 4 CPUs became free") as e:
            waiting.build(inputs)
        waiting.close()
        assert time.monotonic() - t0 < 10 and "node_resource" in str(e.value)
    finally:
        remove_placement_group(hog)
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert builder.build(inputs)[0].error == MeasureErrorNo.NO_ERROR  # free again: builds go on


def test_cli_builds_on_the_cluster_with_ray_build(tmp_path: Path, runner: RayRunner, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import tuning.cli as cli

    tune_mod = sys.modules["tuning.tune"]  # the attribute tuning.tune is the function

    # the module's runner stands in for the one --ray makes (a second would wait for the
    # head's CPUs); the CLI must not close it
    monkeypatch.setattr(cli, "_ray_runner", lambda ns, task: runner)
    monkeypatch.setattr(runner, "close", lambda: None)
    seen: dict[str, Any] = {}
    real = tune_mod.tune

    def spy(*a: Any, **kw: Any) -> Any:
        seen.update(kw)
        return real(*a, **kw)

    monkeypatch.setattr(tune_mod, "tune", spy)
    log = tmp_path / "cli.jsonl"
    assert cli.main(["tune", "matmul", "--args", "16", "16", "16", "--trials", "4", "--batch-size", "4",
                     "--remeasure", "0", "--log", str(log), "--ray", "auto", "--ray-resource", "measure",
                     "--ray-build"]) == 0
    assert isinstance(seen["builder"], RayBuilder) and seen["runner"] is runner
    assert seen["builder"]._closed and ray.is_initialized()  # closed; the connection was not its own
    (t,) = tuning.load_tasks(str(log))
    assert len(load_records(str(log), t)) == 4
    for ray_opt in ([], ["--ray", "local"]):  # needs a cluster with nodes that do not measure
        assert cli.main(["tune", "matmul", "--args", "16", "16", "16", "--ray-build", *ray_opt]) == 2
    with pytest.raises(SystemExit):
        cli.main(["tune", "--help"])
    assert "--ray-build" in capsys.readouterr().out


def test_importing_tuning_does_not_import_ray() -> None:
    code = "import sys, tuning; assert tuning.RayBuilder and 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_without_ray_the_builder_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(tuning.TuningError, match=r"tecomp\[distributed\]"):
        RayBuilder()

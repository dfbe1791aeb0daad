"""End to end: a short tune finds a correct schedule no slower than the default one; an
interrupted or killed run resumes without losing or re-measuring a record."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tuning_workloads as wl

import tecomp as tc
import tuning
from tuning.measure import LocalBuilder, LocalRunner
from tuning.records import load_records

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


@pytest.fixture(scope="module")
def pools() -> Iterator[tuple[LocalBuilder, LocalRunner]]:
    builder, runner = LocalBuilder(n_workers=2), LocalRunner(timeout=10.0, min_repeat_ms=5.0)
    yield builder, runner
    builder.close()
    runner.close()


def test_short_tune_beats_default(tmp_path: Path, pools: tuple[LocalBuilder, LocalRunner]) -> None:
    builder, runner = pools
    task = tuning.SearchTask(wl.matmul, (128, 128, 128))
    log = str(tmp_path / "mm.jsonl")
    small = tuning.SearchOptions(population=24, generations=2)
    res = tuning.tune([task], trials=16, log=log, seed=0, batch_size=8, builder=builder,
                      runner=runner, search=small, progress=False)[0]
    assert res.trials == 16 and res.new_trials == 16 and np.isfinite(res.best_cost)
    assert len(load_records(log, task)) == 16
    s, args = task.apply_best(log)
    best = tc.build(s, args, name="best")
    default = tc.build(task.create_schedule(), task.tensors, name="default")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((128, 128)).astype("float32")
    b = rng.standard_normal((128, 128)).astype("float32")
    c = np.zeros((128, 128), "float32")
    best(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-3)
    t_best = best.time_evaluator(number=5, repeat=5)(a, b, c).min
    t_default = default.time_evaluator(number=2, repeat=3)(a, b, c).min
    assert t_best <= t_default
    # running again with the same budget measures nothing new
    again = tuning.tune([task], trials=16, log=log, seed=0, builder=builder, runner=runner,
                        progress=False)[0]
    assert again.new_trials == 0 and again.best_cost == res.best_cost
    # worker processes live across batches and calls: each started once
    assert [w.starts for w in builder.pool.workers] == [1, 1] and runner.worker.starts == 1


SCRIPT = textwrap.dedent("""
    import sys
    import tuning, tuning_workloads as wl
    if __name__ == "__main__":
        task = tuning.SearchTask(wl.matmul, (32, 32, 32))
        tuning.tune([task], trials=int(sys.argv[2]), log=sys.argv[1], seed=0, batch_size=2,
                    search=tuning.SearchOptions(population=16, generations=1), progress=False)
        print("finished")
""")


def _start(log: Path, trials: int) -> subprocess.Popen[str]:
    # TMPDIR: the worker directories of a killed run stay inside the test's tmp_path
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]), TMPDIR=str(log.parent))
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(log), str(trials)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for_lines(log: Path, n: int, proc: subprocess.Popen[str], limit: float = 60.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit and proc.poll() is None:
        if log.exists() and log.read_text().count("\n") >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"no {n} records in time (rc {proc.poll()})")


@pytest.mark.filterwarnings("ignore:.*torn last line:RuntimeWarning")
def test_interrupt_and_kill_then_resume_lose_nothing(tmp_path: Path,
                                                      pools: tuple[LocalBuilder, LocalRunner]) -> None:
    log = tmp_path / "resume.jsonl"
    # Ctrl-C: a clean stop that keeps every record
    proc = _start(log, 40)
    _wait_for_lines(log, 3, proc)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "interrupted" in out and "finished" in out, out
    first = {r.key for r in load_records(str(log))}
    assert len(first) >= 3
    # kill -9 mid-run: the log keeps what was written, at worst with a torn last line
    proc = _start(log, 40)
    _wait_for_lines(log, len(first) + 3, proc)
    proc.kill()
    proc.wait(timeout=30)
    second = [r.key for r in load_records(str(log))]
    assert first <= set(second) and len(second) == len(set(second)) >= len(first) + 3
    # resume to a total budget: nothing measured twice, nothing lost
    task = tuning.SearchTask(wl.matmul, (32, 32, 32))
    builder, runner = pools
    total = len(second) + 3
    res = tuning.tune([task], trials=total, log=str(log), seed=0, batch_size=2, builder=builder,
                      runner=runner, search=tuning.SearchOptions(population=16, generations=1),
                      progress=False)[0]
    final = [r.key for r in load_records(str(log))]
    assert res.new_trials == 3 and res.trials == total
    assert set(second) <= set(final) and len(final) == len(set(final)) == total

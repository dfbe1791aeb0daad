"""Records: JSON lines appended as they come, torn last lines skipped, apply_best errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import tuning_workloads as wl

import tecomp as tc
from tuning import NoValidRecordError, SearchTask
from tuning.measure import MeasureErrorNo, MeasureInput, MeasureResult
from tuning.records import SCHEMA_VERSION, RecordWriter, best_record, load_records
from tuning.steps import AnnotationStep, SplitStep

GOOD = (SplitStep("C", 1, (8,)), AnnotationStep("C", 2, "vectorize"))
BETTER = (SplitStep("C", 1, (4,)), AnnotationStep("C", 2, "vectorize"))


def _write(path: Path, task: SearchTask, rows: list[tuple[tuple, MeasureResult]]) -> None:
    with RecordWriter(str(path)) as w:
        for steps, res in rows:
            w.write(MeasureInput(task, steps, 0, (("C/vec", 1),)), res)


def _ok(cost: float) -> MeasureResult:
    return MeasureResult((cost, cost * 1.1), MeasureErrorNo.NO_ERROR)


def test_append_load_round_trip(tmp_path: Path) -> None:
    task = SearchTask(wl.matmul, (16, 8, 16))
    log = tmp_path / "m.jsonl"
    _write(log, task, [(GOOD, _ok(2e-3))])
    _write(log, task, [(BETTER, _ok(1e-3)), ((), MeasureResult((), MeasureErrorNo.RUN_CRASH, "boom"))])
    lines = log.read_text().splitlines()
    # one task line (the computation, for readers that cannot import the workload), written
    # once even though two writers appended, then one line per measurement
    assert len(lines) == 4
    head = json.loads(lines[0])
    assert head["kind"] == "task" and head["task"]["key"] == task.workload_key
    assert head["dag"]["format"] == "tecomp-dag"
    first = json.loads(lines[1])
    assert first["v"] == SCHEMA_VERSION and first["tecomp"] == tc.__version__
    assert first["task"]["key"] == task.workload_key and first["error"] == "NO_ERROR"
    recs = load_records(str(log), task)
    assert [r.steps for r in recs] == [GOOD, BETTER, ()]
    assert recs[0].params == (("C/vec", 1),) and recs[0].costs == (2e-3, 2e-3 * 1.1)
    assert recs[2].error == MeasureErrorNo.RUN_CRASH and recs[2].error_msg == "boom"
    assert best_record(str(log), task).steps == BETTER
    other = SearchTask(wl.matmul, (16, 8, 32))
    assert load_records(str(log), other) == []
    # the record knows its task: the same key, so the log applies to it
    again = recs[0].task()
    assert again.workload_key == task.workload_key and again.args == task.args
    assert again.func is None  # rebuilt from the log's task line, not by importing matmul


def test_old_logs_without_task_lines_rebuild_by_name(tmp_path: Path) -> None:
    task = SearchTask(wl.matmul, (16, 8, 16))
    log = tmp_path / "old.jsonl"
    _write(log, task, [(GOOD, _ok(2e-3)), (BETTER, _ok(1e-3))])
    log.write_text("".join(ln + "\n" for ln in log.read_text().splitlines() if '"kind":"task"' not in ln))
    recs = load_records(str(log), task)
    assert len(recs) == 2 and recs[0].task_line is None
    again = recs[0].task()
    assert again.workload_key == task.workload_key and again.func is wl.matmul
    assert best_record(str(log), task).steps == BETTER


def test_torn_last_line_is_skipped_and_next_append_is_clean(tmp_path: Path) -> None:
    task = SearchTask(wl.matmul, (16, 8, 16))
    log = tmp_path / "torn.jsonl"
    _write(log, task, [(GOOD, _ok(2e-3))])
    with open(log, "a") as f:
        f.write(log.read_text().splitlines()[0][:57])  # a writer killed mid-line
    with pytest.warns(RuntimeWarning, match="torn last line"):
        assert len(load_records(str(log))) == 1
    _write(log, task, [(BETTER, _ok(1e-3))])
    with pytest.warns(RuntimeWarning, match="invalid JSON"):
        recs = load_records(str(log))
    assert [r.steps for r in recs] == [GOOD, BETTER]


def test_apply_best_errors_are_clear(tmp_path: Path) -> None:
    task = SearchTask(wl.matmul, (16, 8, 16))
    with pytest.raises(NoValidRecordError, match="does not exist"):
        task.apply_best(str(tmp_path / "missing.jsonl"))
    log = tmp_path / "bad.jsonl"
    _write(log, task, [(GOOD, MeasureResult((), MeasureErrorNo.WRONG_ANSWER, "off by one"))])
    with pytest.raises(NoValidRecordError, match=r"all failed \(WRONG_ANSWER\)"):
        task.apply_best(str(log))
    other = SearchTask(wl.matmul, (16, 16, 16))
    with pytest.raises(NoValidRecordError, match="none of its 1 record"):
        other.apply_best(str(log))


def test_apply_best_gives_a_buildable_schedule(tmp_path: Path) -> None:
    task = SearchTask(wl.matmul, (16, 8, 16))
    log = tmp_path / "m.jsonl"
    _write(log, task, [(GOOD, _ok(2e-3)), (BETTER, _ok(1e-3))])
    s, args = task.apply_best(str(log))
    a, b = np.ones((16, 8), "float32"), np.ones((8, 16), "float32")
    c = np.zeros((16, 16), "float32")
    tc.build(s, args)(a, b, c)
    np.testing.assert_allclose(c, a @ b)
    assert ", 1, 4)]" in str(tc.lower(s, args))  # BETTER's 4-lane vectors, not GOOD's 8


def test_model_quality_lines_do_not_disturb_measurements(tmp_path: Path) -> None:
    import warnings

    from tuning.records import load_model_quality

    task = SearchTask(wl.matmul, (16, 8, 16))
    other = SearchTask(wl.matmul, (16, 8, 32))
    log = tmp_path / "q.jsonl"
    with RecordWriter(str(log)) as w:
        w.write(MeasureInput(task, GOOD, 0, ()), _ok(2e-3))
        w.write_model_quality(task, 1, 0.75, 0.5, 1, 4)
        w.write(MeasureInput(task, BETTER, 0, ()), _ok(1e-3))
        w.write_model_quality(other, 9, float("nan"), 1.0, 2, 8)
    assert len(log.read_text().splitlines()) == 5  # a task line, two records, two grades
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # skipped silently, not as unreadable lines
        assert [r.steps for r in load_records(str(log))] == [GOOD, BETTER]
        qs = load_model_quality(str(log))
    assert [(q.task_key, q.trials, q.pairwise_acc, q.topk_recall, q.k, q.n) for q in qs[:1]] == [
        (task.workload_key, 1, 0.75, 0.5, 1, 4)]
    assert np.isnan(qs[1].pairwise_acc) and qs[1].topk_recall == 1.0  # NaN travels as null
    assert [q.trials for q in load_model_quality(str(log), other)] == [9]
    assert json.loads(log.read_text().splitlines()[2])["kind"] == "model_quality"
    assert best_record(str(log), task).steps == BETTER
    assert load_model_quality(str(tmp_path / "missing.jsonl")) == []


def test_apply_best_by_log_and_task_name(tmp_path: Path) -> None:
    import tuning

    a, b = SearchTask(wl.matmul, (16, 8, 16)), SearchTask(wl.matmul, (16, 8, 32))
    log = tmp_path / "two.jsonl"
    _write(log, a, [(GOOD, _ok(2e-3)), (BETTER, _ok(1e-3))])
    _write(log, b, [(GOOD, _ok(2e-3))])
    with pytest.raises(tuning.TuningError, match=r"holds 2 tasks; name one: 'matmul\(16, 8, 16\)'"):
        tuning.apply_best(str(log))
    with pytest.raises(tuning.TuningError, match="no task named 'conv'"):
        tuning.apply_best(str(log), "conv")
    s, args = tuning.apply_best(str(log), "matmul(16, 8, 16)")
    assert ", 1, 4)]" in str(tc.lower(s, args))  # BETTER's schedule
    assert [t.name for t in tuning.load_tasks(str(log))] == ["matmul(16, 8, 16)", "matmul(16, 8, 32)"]


def test_machines_are_logged_once_and_read_back(tmp_path: Path) -> None:
    from tuning.machine import Machine

    task = SearchTask(wl.matmul, (16, 8, 16))
    a = Machine(host="a", host_id="0" * 16, cpu_model="CPU A", llvm_cpu="znver3", features="+avx2,+fma")
    g = Machine(host="b", host_id="1" * 16, gpu_name="NVIDIA H100", compute_capability="9.0")
    log = tmp_path / "m.jsonl"
    _write(log, task, [(GOOD, dataclasses.replace(_ok(2e-3), machine=a)),
                       (BETTER, dataclasses.replace(_ok(1e-3), machine=g)),
                       ((), MeasureResult((), MeasureErrorNo.BUILD_ERROR, "no"))])  # never reached a machine
    _write(log, task, [(GOOD, dataclasses.replace(_ok(3e-3), machine=a))])  # a second writer: no new line
    lines = [json.loads(ln) for ln in log.read_text().splitlines()]
    machine_lines = [d for d in lines if d.get("kind") == "machine"]
    assert [d["id"] for d in machine_lines] == [a.id, g.id] and a.id != g.id
    assert machine_lines[0]["machine"]["features"] == "+avx2,+fma"
    recs = load_records(str(log), task)
    assert [r.machine for r in recs] == [a, g, None, a]
    assert recs[1].result().machine == g and g.kind == "cuda" and a.kind == "cpu"
    assert "NVIDIA H100 (compute capability 9.0)" in g.describe()
    assert a.describe() == "a [00000000] CPU A (znver3)"


def test_bad_machine_lines_and_versions_are_named(tmp_path: Path) -> None:
    from tuning.machine import Machine

    task = SearchTask(wl.matmul, (16, 8, 16))
    a = Machine(host="a", host_id="0" * 16, llvm_cpu="znver3")
    log = tmp_path / "m.jsonl"
    _write(log, task, [(GOOD, dataclasses.replace(_ok(2e-3), machine=a)), (BETTER, _ok(1e-3))])
    lines = [json.loads(ln) for ln in log.read_text().splitlines()]
    for d in lines:
        if d.get("kind") == "machine":
            d["machine"]["host"] = "tampered"  # its id no longer matches its fields
    lines.append({**lines[-1], "v": 3})
    log.write_text("".join(json.dumps(d) + "\n" for d in lines))
    with pytest.warns(RuntimeWarning) as seen:
        recs = load_records(str(log), task)
    msgs = [str(w.message) for w in seen]
    assert any("skipping unreadable machine line" in m and "is not the hash of its fields" in m for m in msgs)
    assert any("no machine line with that id" in m for m in msgs)  # the record that named it
    assert any("schema version 3, this tecomp reads 1, 2" in m for m in msgs)
    assert [r.steps for r in recs] == [BETTER]
    with pytest.raises(ValueError, match="unknown machine field"):
        Machine.from_json({"host": "a", "gpu": "x"})
    with pytest.raises(ValueError, match=r"machine field\(s\) \['host'\] must be strings"):
        Machine.from_json({"host": 3})
    with pytest.raises(ValueError, match="a machine is a JSON object, got list"):
        Machine.from_json([])


def test_a_schema_1_line_loads_and_the_log_takes_new_records(tmp_path: Path) -> None:
    """A record exactly as tecomp wrote it before machine lines (version 1, the tuner's LLVM
    CPU in ``host_cpu``) still loads; new records append beside it in version 2."""
    from tuning.machine import Machine, local_machine

    task = SearchTask(wl.matmul, (16, 8, 16))
    old = json.dumps({
        "v": 1, "tecomp": "0.1.0",
        "task": {"workload": task.to_json()["workload"], "args": [16, 8, 16], "target": "llvm",
                 "key": task.workload_key},
        "name": "matmul(16, 8, 16)", "host_cpu": "skylake", "sketch": 0, "params": {"C/vec": 1},
        "steps": [{"kind": "split", "stage": "C", "axis": 1, "factors": [8]},
                  {"kind": "annotate", "stage": "C", "axis": 2, "annotation": "vectorize"}],
        "costs": [0.002], "error": "NO_ERROR", "error_msg": "", "build_s": 0.1, "run_s": 0.2,
        "time": 1700000000.0}, separators=(",", ":")) + "\n"
    log = tmp_path / "v1.jsonl"
    log.write_text(old)
    (rec,) = load_records(str(log), task)
    assert rec.steps == GOOD and rec.costs == (0.002,) and rec.params == (("C/vec", 1),)
    assert rec.machine == Machine.legacy("skylake") == Machine(llvm_cpu="skylake")
    assert rec.machine.describe() == "LLVM CPU skylake" and rec.result().machine == rec.machine
    _write(log, task, [(BETTER, dataclasses.replace(_ok(1e-3), machine=local_machine()))])
    recs = load_records(str(log), task)
    assert [r.machine for r in recs] == [Machine(llvm_cpu="skylake"), local_machine()]
    assert best_record(str(log), task).steps == BETTER
    assert json.loads(log.read_text().splitlines()[-1])["v"] == SCHEMA_VERSION == 2

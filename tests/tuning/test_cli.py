"""The ``tecomp`` command line: tune -> show-log -> export -> load without the compiler."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

import tecomp as tc
from tuning.cli import main
from tuning.records import load_records
from tuning.remeasure import ROUNDS

ROOT = Path(__file__).resolve().parents[2]


def test_tune_show_export_load(tmp_path, capsys):
    log = tmp_path / "mm.jsonl"
    assert main(["tune", "matmul", "--args", "32", "48", "64", "--trials", "6", "--log", str(log)]) == 0
    # six candidates, and the best four timed side by side at the end, in two rounds or more
    # (tune's remeasure: another round while the leaders change, at most ROUNDS)
    recs = load_records(str(log))
    lines = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert len({r.key for r in recs}) == 6 and len(recs) == sum("kind" not in d for d in lines)
    # the computation itself, once, before the first record: the log is self-sufficient;
    # then the machine that measured, once, before the first record it measured
    assert [d["kind"] for d in lines if "kind" in d] == ["task", "machine"] and lines[0]["kind"] == "task"
    assert lines[1]["kind"] == "machine" and lines[2]["machine"] == lines[1]["id"]
    assert 6 + 4 * 2 <= len(recs) <= 6 + 4 * ROUNDS
    assert main(["show-log", str(log)]) == 0
    out = capsys.readouterr().out
    assert "matmul(32, 48, 64)" in out and "GFLOP/s" in out and "rank acc" in out
    # where the records were measured: this machine, as its measuring process described it
    from tuning.machine import local_machine

    here = local_machine()
    row = next(ln for ln in out.splitlines() if ln.startswith("matmul(32, 48, 64) "))
    assert row.split()[-1] == "m1"
    assert f"m1: {here.describe()}; {len(recs)} record(s)" in out
    assert here.llvm_cpu in out and f"features: {here.features}" in out
    # the best shown is the best candidate judged on its re-timings, as apply_best picks it
    from tuning import SearchTask, workloads
    from tuning.records import best_record

    best = best_record(str(log), SearchTask(workloads.matmul, (32, 48, 64)))
    assert f"{best.mean * 1e3:.3f}" in out
    assert main(["export", "--log", str(log), "-o", str(tmp_path / "out")]) == 0
    lib = tc.runtime.load_module(str(tmp_path / "out" / "kernels.so"))
    f = lib["matmul_32_48_64"]
    rng = np.random.default_rng(0)
    a, b = rng.random((32, 48), dtype=np.float32), rng.random((48, 64), dtype=np.float32)
    c = np.zeros((32, 64), np.float32)
    f(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4)
    assert lib.kernel_provenance("matmul_32_48_64")["log"] == str(log.resolve())


def test_workload_from_a_user_file(tmp_path):
    (tmp_path / "my_ops.py").write_text(textwrap.dedent("""
        import tuning
        from tecomp import te

        @tuning.register_workload
        def scale_add(n):
            A = te.placeholder((n,), "float32", name="A")
            B = te.compute((n,), lambda i: A[i] * 3.0 + 1.0, name="B")
            return [A, B]
    """))
    log = tmp_path / "s.jsonl"
    cmd = [sys.executable, "-m", "tuning.cli", "tune", f"{tmp_path / 'my_ops.py'}:scale_add",
           "--args", "1000", "--trials", "4", "--log", str(log)]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert len({r.key for r in load_records(str(log))}) == 4


def test_tune_options(tmp_path, capsys):
    """--cost-model random, --batch-size, --remeasure 0 and --warm-start reach tune()."""
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    base = ["tune", "matmul", "--args", "16", "16", "16", "--trials", "5", "--remeasure", "0"]
    assert main([*base, "--cost-model", "random", "--batch-size", "2", "--log", str(first)]) == 0
    assert len(load_records(str(first))) == 5  # no re-measurement lines
    assert main([*base, "--warm-start", str(first), "--log", str(second)]) == 0
    assert len({r.key for r in load_records(str(second))}) == 5
    assert main([*base, "--warm-start", str(tmp_path / "missing.jsonl"), "--log", str(second)]) == 2
    assert "missing.jsonl" in capsys.readouterr().err


def test_errors_are_clean(tmp_path, capsys):
    assert main(["tune", "no_such_workload", "--trials", "1", "--log", str(tmp_path / "x")]) == 2
    assert "unknown workload" in capsys.readouterr().err
    assert main(["show-log", str(tmp_path / "missing.jsonl")]) == 2
    assert main(["export", "--log", str(tmp_path / "missing.jsonl"), "-o", str(tmp_path)]) == 2


def test_a_task_that_cannot_be_rebuilt_is_skipped_with_its_reason(tmp_path, capsys):
    """show-log and export read a log whose other task fails to rebuild here (its workload
    raises): that task gets no GFLOP/s and is not exported, and the reason is printed."""
    import json

    log = tmp_path / "mixed.jsonl"
    assert main(["tune", "matmul", "--args", "16", "16", "16", "--trials", "2", "--remeasure", "0",
                 "--log", str(log)]) == 0
    # a measurement of another task, without a task line (as in a log from before task lines)
    line = next(d for d in map(json.loads, log.read_text().splitlines()) if "kind" not in d)
    line["task"]["args"] = [-1, 16, 16]  # tecomp rejects the negative dimension
    line["task"]["key"] = "0" * 24
    with open(log, "a") as f:
        f.write(json.dumps(line) + "\n")
    capsys.readouterr()
    assert main(["show-log", str(log)]) == 0
    rows = capsys.readouterr().out.splitlines()
    bad = next(r for r in rows if "matmul(-1, 16, 16)" in r)
    assert "matmul(16, 16, 16)" in "\n".join(rows) and bad.split()[6] == "-"  # no GFLOP/s
    assert main(["export", "--log", str(log), "-o", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert "skipping" in err and "matmul(-1, 16, 16)" in err.replace("'", "") and "negative" in err
    lib = tc.runtime.load_module(str(tmp_path / "out" / "kernels.so"))
    a, b, c = np.ones((16, 16), np.float32), np.ones((16, 16), np.float32), np.zeros((16, 16), np.float32)
    lib["matmul_16_16_16"](a, b, c)
    np.testing.assert_allclose(c, a @ b)


def test_show_log_names_the_cpu_of_a_schema_1_log(tmp_path, capsys):
    """A log written before machine lines (schema 1) still shows, with the CPU name it had
    and a warning that it was the tuning host's, not necessarily the measuring one's."""
    log = tmp_path / "old.jsonl"
    assert main(["tune", "matmul", "--args", "16", "16", "16", "--trials", "2", "--remeasure", "0",
                 "--log", str(log)]) == 0
    old = []
    for d in map(json.loads, log.read_text().splitlines()):
        if d.get("kind") == "machine":
            continue
        d["v"] = 1
        if "kind" not in d:
            d.pop("machine", None)
            d["host_cpu"] = "haswell"
        old.append(json.dumps(d))
    log.write_text("\n".join(old) + "\n")
    capsys.readouterr()
    assert main(["show-log", str(log)]) == 0
    out = capsys.readouterr().out
    assert "m1: LLVM CPU haswell; 2 record(s) (a schema-1 record: the CPU of the host that tuned" in out

"""Workloads tune wherever a user defines them: a script without a main guard, ``python -c``,
a REPL, a notebook cell. Workers get the computation as data and never run the user's code;
the log carries it, so a later process that cannot import the workload applies and exports it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tecomp as tc
import tuning

WORKLOAD = textwrap.dedent('''\
    import numpy as np
    import tuning
    from tecomp import te

    print("USER CODE RAN")

    @tuning.register_workload
    def scale_add(n, m):
        A = te.placeholder((n, m), "float32", name="A")
        B = te.compute((n, m), lambda i, j: A[i, j] * 2.0 + 1.0, name="B")
        return [A, B]

    ''')

TUNE = textwrap.dedent('''\
    task = tuning.SearchTask(scale_add, args=(24, 40))
    (res,) = tuning.tune([task], trials=4, batch_size=4, remeasure=0, log=LOG, progress=False,
                         search=tuning.SearchOptions(population=8, generations=1, fresh_pool=8))
    print("ERRORS", sorted(res.errors))
    s, args = task.apply_best(LOG)
    import tecomp as tc
    f = tc.build(s, args)
    a = np.arange(24 * 40, dtype="float32").reshape(24, 40)
    b = np.empty_like(a)
    f(a, b)
    print("CHECK", bool(np.array_equal(b, a * 2 + 1)))
    ''')


def _code(log: Path) -> str:
    return WORKLOAD + f"LOG = {str(log)!r}\n" + TUNE


def _check_output(out: str) -> None:
    # the workers never re-ran the user's code (a script would start tuning again in each)
    assert out.count("USER CODE RAN") == 1, out
    assert "ERRORS ['NO_ERROR']" in out, out
    assert "CHECK True" in out, out


def _check_log_elsewhere(log: Path, where: Path) -> None:
    """Apply, show and export the log in a fresh process that cannot import the workload."""
    where.mkdir()
    check = textwrap.dedent(f'''\
        import numpy as np, tecomp as tc, tuning
        s, args = tuning.apply_best({str(log)!r})
        a = np.arange(24 * 40, dtype="float32").reshape(24, 40)
        b = np.empty_like(a)
        tc.build(s, args)(a, b)
        print("ELSEWHERE", bool(np.array_equal(b, a * 2 + 1)))
        ''')
    r = subprocess.run([sys.executable, "-c", check], cwd=where, capture_output=True, text=True, timeout=300)
    assert "ELSEWHERE True" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "tuning.cli", "show-log", str(log)], cwd=where,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "scale_add(24, 40)" in r.stdout and "GFLOP/s" in r.stdout, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "tuning.cli", "export", "--log", str(log), "-o", "out"],
                       cwd=where, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lib = tc.runtime.load_module(str(where / "out" / "kernels.so"))
    a = np.ones((24, 40), np.float32)
    b = np.empty_like(a)
    lib["scale_add_24_40"](a, b)
    np.testing.assert_array_equal(b, 3.0)


def test_script_without_main_guard(tmp_path: Path) -> None:
    log = tmp_path / "script.jsonl"
    script = tmp_path / "user_script.py"
    script.write_text(_code(log))
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    _check_output(r.stdout)
    # the log names the workload by its __main__ name, and holds the computation itself
    lines = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert lines[0]["kind"] == "task" and lines[0]["task"]["workload"] == "__main__:scale_add"
    _check_log_elsewhere(log, tmp_path / "elsewhere")


def test_python_dash_c(tmp_path: Path) -> None:
    log = tmp_path / "c.jsonl"
    r = subprocess.run([sys.executable, "-c", _code(log)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    _check_output(r.stdout)


def test_repl(tmp_path: Path) -> None:
    log = tmp_path / "repl.jsonl"
    # an interactive interpreter reading its input: a compound statement ends at a blank line
    r = subprocess.run([sys.executable, "-i", "-q"], input=_code(log) + "\n", cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    _check_output(r.stdout)
    assert "Traceback" not in r.stderr, r.stderr


def test_notebook_cell(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    log = tmp_path / "nb.jsonl"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(WORKLOAD),
                nbformat.v4.new_code_cell(f"LOG = {str(log)!r}\n" + TUNE)]
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    out = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", [])
                  if o.get("output_type") == "stream")
    _check_output(out)


def test_log_of_an_unimportable_workload_rebuilds_from_its_task_line(tmp_path: Path) -> None:
    # what the log's task line buys, in-process: the name points nowhere, the data suffices
    from tuning.measure import MeasureErrorNo, MeasureInput, MeasureResult
    from tuning.records import RecordWriter, load_records, load_tasks

    ns: dict = {}
    exec(compile(WORKLOAD.replace('print("USER CODE RAN")', ""), "<cell>", "exec"), ns)
    task = tuning.SearchTask(ns["scale_add"], (8, 8))
    log = tmp_path / "t.jsonl"
    with RecordWriter(str(log)) as w:
        w.write(MeasureInput(task, ()), MeasureResult((1e-3,), MeasureErrorNo.NO_ERROR))
        w.write(MeasureInput(task, ()), MeasureResult((2e-3,), MeasureErrorNo.NO_ERROR))
    assert [json.loads(ln).get("kind") for ln in log.read_text().splitlines()] == ["task", None, None]
    tuning.task._WORKLOADS.pop(task.workload)  # as in a process that never defined it
    (again,) = load_tasks(str(log))
    assert again.workload_key == task.workload_key and again.name == "scale_add(8, 8)"
    assert len(load_records(str(log), again)) == 2
    s, args = tuning.apply_best(str(log))
    a = np.full((8, 8), 2.0, np.float32)
    b = np.empty_like(a)
    tc.build(s, args)(a, b)
    np.testing.assert_array_equal(b, 5.0)

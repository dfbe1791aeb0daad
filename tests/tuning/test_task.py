"""SearchTask: a workload key that is the same in every process, FLOP counts, clear errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tuning_workloads as wl

import tuning
from tecomp import te
from tuning import SearchTask, TuningError

HERE = Path(__file__).resolve().parent


def test_key_is_stable_across_processes() -> None:
    task = SearchTask(wl.conv2d, (1, 3, 8, 8, 4, 3, 3, 1))
    code = ("import tuning, tuning_workloads as wl; "
            "print(tuning.SearchTask(wl.conv2d, (1, 3, 8, 8, 4, 3, 3, 1)).workload_key)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent.parent), str(HERE)]),
               PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == task.workload_key
    assert SearchTask(wl.conv2d, (1, 3, 8, 8, 4, 3, 3, 2)).workload_key != task.workload_key
    assert SearchTask(wl.matmul, (8, 8, 8), target="llvm -mcpu=x86-64").workload_key != \
        SearchTask(wl.matmul, (8, 8, 8)).workload_key


def test_flop_count() -> None:
    assert SearchTask(wl.matmul, (4, 5, 6)).flop_ct == 2 * 4 * 5 * 6
    # conv: a multiply-add per reduction point; the inlined padding select is no arithmetic
    assert SearchTask(wl.conv2d, (1, 3, 8, 8, 4, 3, 3, 1)).flop_ct == 2 * 4 * 8 * 8 * 3 * 3 * 3
    # softmax: max (1 cmp), exp (sub + exp), sum (1 add), divide, per element
    assert SearchTask(wl.softmax, (2, 10)).flop_ct == 2 * 10 * 5


def _local_workload(calls: list[int]) -> object:
    def inner(n: int) -> list[te.Tensor]:
        calls.append(n)
        A = te.placeholder((n,), name="A")
        return [A, te.compute((n,), lambda i: A[i] * 2, name="B")]

    return tuning.register_workload(inner)


def test_errors() -> None:
    with pytest.raises(TuningError, match="not a registered workload"):
        SearchTask(lambda n: [], (1,))
    with pytest.raises(TuningError, match="names must be unique"):
        SearchTask(wl.same_names, (8,))
    with pytest.raises(TuningError, match="symbolic extent"):
        SearchTask(wl.symbolic, ())
    with pytest.raises(TuningError, match=r"takes the arguments \(n, k, m\); got 2: \(8, 8\)"):
        SearchTask(tuning.workloads.matmul, (8, 8))
    with pytest.raises(TuningError, match="expects a function"):
        tuning.register_workload(42)  # type: ignore[arg-type]


def test_a_task_travels_as_data_not_as_its_function() -> None:
    """Workers rebuild a task from its DAG: the function (here a local one, as a notebook cell
    or a script's __main__ would hold) is neither pickled nor called again."""
    import pickle
    import pickletools

    calls: list[int] = []
    task = SearchTask(_local_workload(calls), (12,))  # type: ignore[arg-type]
    assert calls == [12]
    blob = pickle.dumps(task)
    # no global of this module is referenced (only the workload's name, inside a string)
    strings = {arg for op, arg, _ in pickletools.genops(blob) if isinstance(arg, str)}
    assert __name__ not in strings and "inner" not in strings
    tuning.task._WORKLOADS.pop(task.workload)  # as in a worker, which never registered it
    again = pickle.loads(blob)
    assert calls == [12]
    assert again.workload_key == task.workload_key and again.name == task.name
    assert again.flop_ct == task.flop_ct and again.func is None
    assert [t.name for t in again.tensors] == ["A", "B"]


def test_interactive_workload_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A workload typed into a notebook cell lives in a __main__ without a file; nothing needs
    to import it, so it registers and builds a task like any other."""
    import types

    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))

    def cell(n):  # type: ignore[no-untyped-def]
        A = te.placeholder((n,), "float32", name="A")
        return [A, te.compute((n,), lambda i: A[i] + 1.0, name="B")]

    cell.__module__, cell.__qualname__ = "__main__", "cell"
    tuning.register_workload(cell)
    task = SearchTask(cell, (16,))
    assert task.workload == "__main__:cell" and task.dag_json()["format"] == "tecomp-dag"

"""The standard workloads compute what their names say (numpy references), and the new ones
tune: dense layers as PyTorch lays them out, with and without a ReLU epilogue, and layer
normalisation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tecomp as tc
import tuning
from tecomp import te
from tuning import workloads as wl


def _run_default(tensors: list[te.Tensor], rng: np.random.Generator) -> tuple[list[np.ndarray], np.ndarray]:
    s = te.create_schedule(tensors[-1].op)
    f = tc.build(s, tensors)
    ins = [rng.standard_normal([int(d.value) for d in t.shape]).astype("float32") for t in tensors[:-1]]
    out = np.zeros([int(d.value) for d in tensors[-1].shape], "float32")
    f(*ins, out)
    return ins, out


def _dense_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) @ w.T.astype(np.float64) + b


@pytest.mark.parametrize("shape", [(8, 16, 12), (5, 33, 7)])
def test_dense_and_dense_relu(shape: tuple[int, int, int]) -> None:
    rng = np.random.default_rng(0)
    (x, w, b), out = _run_default(wl.dense(*shape), rng)
    np.testing.assert_allclose(out, _dense_ref(x, w, b), rtol=1e-5, atol=1e-5)
    (x, w, b), out = _run_default(wl.dense_relu(*shape), rng)
    np.testing.assert_allclose(out, np.maximum(_dense_ref(x, w, b), 0.0), rtol=1e-5, atol=1e-5)
    assert (out == 0).any() and (out > 0).any()  # the epilogue really clips


@pytest.mark.parametrize("shape", [(6, 40), (3, 768)])
def test_layer_norm(shape: tuple[int, int]) -> None:
    tensors = wl.layer_norm(*shape)
    f = tc.build(te.create_schedule(tensors[-1].op), tensors)
    rng = np.random.default_rng(1)
    g, b = (rng.standard_normal(shape[1]).astype("float32") for _ in range(2))
    for offset, scale in ((0.0, 1.0), (5.0, 3.0)):  # an offset and a scale it must remove
        x = (rng.standard_normal(shape) * scale + offset).astype("float32")
        out = np.zeros(shape, "float32")
        f(x, g, b, out)
        x64 = x.astype(np.float64)
        mu = x64.mean(axis=1, keepdims=True)
        ref = (x64 - mu) / np.sqrt(x64.var(axis=1, keepdims=True) + 1e-5) * g + b
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_new_workloads_tune_and_verify(tmp_path: Path) -> None:
    tasks = [tuning.SearchTask(wl.dense_relu, (16, 32, 24)), tuning.SearchTask(wl.layer_norm, (16, 64))]
    log = str(tmp_path / "wl.jsonl")
    res = tuning.tune(tasks, trials=8, batch_size=4, log=log, progress=False, remeasure=0,
                      search=tuning.SearchOptions(population=8, generations=1, fresh_pool=8))
    assert all(r.trials >= 1 for r in res)
    rng = np.random.default_rng(2)
    for task in tasks:  # every task's best, rebuilt from the log, computes what the default does
        s, args = task.apply_best(log)
        f = tc.build(s, args)
        ins = [rng.standard_normal([int(d.value) for d in t.shape]).astype("float32") for t in args[:-1]]
        got = np.zeros([int(d.value) for d in args[-1].shape], "float32")
        f(*ins, got)
        want = np.zeros_like(got)
        tc.build(task.create_schedule(), task.tensors)(*ins, want)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

"""The one-pass sketch of row normalisations (`tuning.space_norm`): which DAGs it fires for,
that it computes every statistic inside the output's row loop with vectorised partial sums,
that sampled candidates of the new workloads (RMSNorm, group norm, inference batch norm)
match numpy, and that a short tune of them gives a verified best."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tecomp as tc
import tuning
from tecomp.ir.stmt import ForKind
from tuning import LocalBuilder, LocalRunner, SearchTask
from tuning import workloads as wl
from tuning.features import extract_features
from tuning.space import SearchSpace
from tuning.space_norm import find_row_chain, row_sketches
from tuning.steps import ComputeAtStep, RfactorStep


def _rms_ref(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return x64 / np.sqrt(np.mean(x64 * x64, axis=1, keepdims=True) + 1e-6) * g


def _group_ref(x: np.ndarray, g: np.ndarray, b: np.ndarray, groups: int) -> np.ndarray:
    n, c, h, w = x.shape
    xg = x.astype(np.float64).reshape(n, groups, -1)
    mu = xg.mean(axis=2, keepdims=True)
    var = xg.var(axis=2, keepdims=True)
    y = ((xg - mu) / np.sqrt(var + 1e-5)).reshape(n, c, h, w)
    return y * g[None, :, None, None] + b[None, :, None, None]


def _batch_ref(x: np.ndarray, mean: np.ndarray, var: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    def per_c(v: np.ndarray) -> np.ndarray:
        return v.astype(np.float64)[None, :, None, None]

    return (x - per_c(mean)) / np.sqrt(per_c(var) + 1e-5) * per_c(g) + per_c(b)


def _layer_ref(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    mu = x64.mean(axis=1, keepdims=True)
    return (x64 - mu) / np.sqrt(x64.var(axis=1, keepdims=True) + 1e-5) * g + b


def _inputs(task: SearchTask, rng: np.random.Generator) -> list[np.ndarray]:
    ins = [rng.standard_normal([int(d.value) for d in t.shape]).astype("float32")  # type: ignore[attr-defined]
           for t in task.tensors[:-1]]
    ins[0] = ins[0] * 2.0 + 3.0  # an offset and a scale the normalisation must remove
    if task.func is wl.batch_norm_infer:
        ins[2] = np.abs(ins[2]) + 0.1  # a variance
    return ins


def _reference(task: SearchTask, ins: list[np.ndarray]) -> np.ndarray:
    w = task.func
    if w is wl.rms_norm:
        return _rms_ref(*ins)
    if w is wl.group_norm:
        return _group_ref(*ins, groups=task.args[4])
    if w is wl.batch_norm_infer:
        return _batch_ref(*ins)
    if w is wl.softmax:
        e = np.exp(ins[0] - ins[0].max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)
    assert w is wl.layer_norm
    return _layer_ref(*ins)


def _space(task: SearchTask) -> SearchSpace:
    """The task's space; softmax (a chain with an elementwise row stage) gets the row sketch
    only when asked (`row_sketches`' ``with_elementwise``), so it is added here."""
    space = SearchSpace(task)
    if task.func is wl.softmax:
        assert not any("row_loop" in s.describe() for s in space.sketches)
        space.sketches = row_sketches(task, space.sketches, with_elementwise=True)
    return space


def _row_sketch(space: SearchSpace) -> int:
    rows = [k for k, s in enumerate(space.sketches) if "row_loop" in s.describe()]
    assert len(rows) == 1
    return rows[0]


@pytest.mark.parametrize("func,args,reductions,depth,group", [
    (wl.layer_norm, (8, 48), ("total", "sqdev"), 1, 1),
    (wl.rms_norm, (8, 48), ("sumsq",), 1, 1),
    (wl.group_norm, (2, 8, 4, 8, 4), ("total", "sqdev"), 2, 2),
    (wl.softmax, (8, 48), ("mx", "sm"), 1, 1),
], ids=["layer_norm", "rms_norm", "group_norm", "softmax"])
def test_rule_fires_and_attaches_statistics_in_the_row_loop(func, args, reductions, depth, group) -> None:  # type: ignore[no-untyped-def]
    task = SearchTask(func, args)
    space = _space(task)
    k = _row_sketch(space)
    assert k == len(space.sketches) - 1  # appended: the generic sketches keep their indices
    state = tuning.steps.State(task)
    chain = find_row_chain(task, state)
    assert chain is not None and set(chain.reductions) == set(reductions)
    assert (chain.depth, chain.group) == (depth, group)
    cand = space.instantiate(k, {}, np.random.default_rng(0))
    assert cand is not None
    assert sum(isinstance(s, RfactorStep) for s in cand.steps) == len(reductions)
    for name in reductions:
        for stage in (name, f"{name}.rf"):
            assert any(isinstance(s, ComputeAtStep) and s.stage == stage and s.target == "out" for s in cand.steps)
    sch, targs = task.apply_steps(cand.steps)
    if group > 1:
        # after the split of c by the group size, ``total[n, c // q]`` is one point of the row
        # loop's body: a scalar, not the (N, G) array (softmax's buffers share storage instead)
        text = str(tc.lower(sch, targs))
        assert all(f"allocate {r}: float32[1]" in text for r in reductions), text
    out = next(st for st in sch.stages if st.op.name == "out")
    row_loop = out.leaf_iter_vars[0] if depth == 1 or cand.param_dict["out/par"] == 2 else out.leaf_iter_vars[1]
    assert out.iter_var_attrs[row_loop].kind == ForKind.PARALLEL
    for st in sch.stages:
        if st.op.name in reductions or st.op.name.removesuffix(".rf") in reductions:
            # attached inside the output's (parallel) row loop: one group read once, from cache
            assert st.attach_type == "scope" and st.attach_stage is out and st.attach_ivar is row_loop
        if st.op.name.endswith(".rf"):
            assert st.iter_var_attrs[st.leaf_iter_vars[-1]].kind == ForKind.VECTORIZED  # the lanes


@pytest.mark.parametrize("func,args", [(wl.matmul, (8, 8, 8)), (wl.batch_norm_infer, (1, 4, 3, 8)),
                                       (wl.dense_relu, (4, 8, 8)), (wl.conv2d, (1, 3, 8, 8, 4, 3, 3, 1, 1))],
                         ids=["matmul", "batch_norm_infer", "dense_relu", "conv2d"])
def test_rule_does_not_fire_elsewhere(func, args) -> None:  # type: ignore[no-untyped-def]
    assert not any("row_loop" in s.describe() for s in SearchSpace(SearchTask(func, args)).sketches)


@pytest.mark.parametrize("func,args,samples", [
    (wl.rms_norm, (6, 40), 20), (wl.group_norm, (2, 8, 3, 16, 4), 20), (wl.batch_norm_infer, (2, 6, 3, 20), 20),
    (wl.layer_norm, (6, 40), 0), (wl.softmax, (6, 40), 0),
], ids=["rms_norm", "group_norm", "batch_norm_infer", "layer_norm", "softmax"])
def test_sampled_candidates_match_numpy(func, args, samples) -> None:  # type: ignore[no-untyped-def]
    """Seeded samples over all sketches (the new workloads), plus 3 of the row sketch."""
    task = SearchTask(func, args)
    space = _space(task)
    rng = np.random.default_rng(11)
    ins = _inputs(task, rng)
    want = _reference(task, ins)
    rows = [k for k, s in enumerate(space.sketches) if "row_loop" in s.describe()]
    cands = [space.sample(rng) for _ in range(samples)] + [space.instantiate(k, {}, rng) for k in rows for _ in range(3)]
    for cand in cands:
        assert cand is not None
        s, targs = task.apply_steps(cand.steps)
        got = np.full(want.shape, np.nan, np.float32)
        tc.build(s, targs)(*ins, got)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(cand.params))
        feats = extract_features(task, cand.steps)  # what the cost model sees of it
        assert feats is not None and np.isfinite(feats).all()


def test_short_tune_of_the_new_norms_is_verified(tmp_path: Path, pools: tuple[LocalBuilder, LocalRunner]) -> None:
    tasks = [SearchTask(wl.rms_norm, (16, 64)), SearchTask(wl.group_norm, (1, 16, 4, 16, 4))]
    log = str(tmp_path / "norms.jsonl")
    builder, runner = pools
    # random search (fresh samples of every sketch): the test is that a tuned best of each new
    # workload is valid, not how the model steers; xgb's fits would triple its time
    res = tuning.tune(tasks, trials=4, batch_size=4, log=log, progress=False, remeasure=0, seed=0,
                      cost_model="random", builder=builder, runner=runner)
    assert all(r.trials >= 1 for r in res)
    rng = np.random.default_rng(3)
    for task in tasks:
        s, args = task.apply_best(log)
        ins = _inputs(task, rng)
        got = np.full([int(d.value) for d in args[-1].shape], np.nan, "float32")  # type: ignore[attr-defined]
        tc.build(s, args)(*ins, got)
        np.testing.assert_allclose(got, _reference(task, ins), rtol=1e-4, atol=1e-4)

"""Cost models: the XGBoost ranker learns an order from measurements; the random one has none."""

from __future__ import annotations

import numpy as np
import pytest
import tuning_workloads as wl

from tuning import RandomModel, SearchTask, XGBModel
from tuning.measure import MeasureErrorNo, MeasureInput, MeasureResult
from tuning.space import SearchSpace


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


@pytest.mark.parametrize("objective", ["regression", "pairwise"])
def test_xgb_ranks_by_what_it_was_shown(objective: str) -> None:
    task = SearchTask(wl.matmul, (64, 64, 64))
    space = SearchSpace(task)
    rng = np.random.default_rng(0)
    cands = [c for c in (space.sample(rng) for _ in range(60)) if c is not None]
    inputs = [MeasureInput(task, c.steps, c.sketch, c.params) for c in cands]
    # a synthetic "machine": vectorized candidates are fast, wide inner tiles faster still
    def cost(c) -> float:  # type: ignore[no-untyped-def]
        p = dict(c.params)
        return 1.0 / (1 + 4 * p.get("C/vec", 0) + p["C/S1"][-1] / 16)

    results = [MeasureResult((cost(c),), MeasureErrorNo.NO_ERROR) for c in cands[:-1]]
    results.append(MeasureResult((), MeasureErrorNo.RUN_CRASH))
    model = XGBModel(seed=0, objective=objective)
    assert np.isfinite(model.predict(inputs)).all()  # untrained: random but usable
    model.update(inputs, results)
    # samples that drew the same candidate (a small GEMM's register-tile draws) count once
    distinct = len({inp.key for inp in inputs})
    assert distinct >= 30 and model.n_samples == distinct
    scores = model.predict(inputs[:-1])
    assert _spearman(scores, -np.array([cost(c) for c in cands[:-1]])) > 0.7
    # measuring the same candidates again adds nothing
    model.update(inputs, results)
    assert model.n_samples == distinct
    rand = RandomModel(seed=0).predict(inputs)
    assert rand.shape == (len(inputs),) and not np.array_equal(rand, RandomModel(seed=1).predict(inputs))


def test_labels_order_and_unknown_objective() -> None:
    from tuning.cost_model import _labels

    cost = np.array([2.0, 1.0, np.inf, 8.0])
    for objective in ("regression", "pairwise"):
        y = _labels(cost, objective)
        # higher is better, the best is the task's top, a failure ranks under every valid one
        assert list(np.argsort(-y)) == [1, 0, 3, 2]
    np.testing.assert_allclose(_labels(cost, "regression"), [-np.log(2), 0.0, -np.log(8) - 1, -np.log(8)])
    # per-task normalised: the same relative costs give the same labels at any scale
    np.testing.assert_allclose(_labels(cost * 1e-6, "regression"), _labels(cost, "regression"))
    with pytest.raises(ValueError, match="objective"):
        XGBModel(objective="rank:ndcg")


def test_ranking_metrics_on_hand_made_data() -> None:
    from scipy.stats import kendalltau

    from tuning.cost_model import pairwise_accuracy, ranking_quality, topk_recall

    costs = np.array([4.0, 1.0, 3.0, 2.0, 5.0, 0.5, 6.0, 7.0])
    perfect = -costs  # higher score = cheaper
    assert pairwise_accuracy(perfect, costs) == 1.0 and topk_recall(perfect, costs) == 1.0
    assert pairwise_accuracy(costs, costs) == 0.0 and topk_recall(costs, costs) == 0.0
    assert pairwise_accuracy(np.zeros(8), costs) == 0.5  # no opinion: a coin flip per pair
    # one swapped pair of 28: 27 right; equals (Kendall's tau + 1) / 2 without ties
    swapped = perfect.copy()
    swapped[[1, 3]] = swapped[[3, 1]]
    assert pairwise_accuracy(swapped, costs) == pytest.approx(27 / 28)
    rng = np.random.default_rng(0)
    for _ in range(5):
        s, c = rng.random(12), rng.random(12)
        tau = kendalltau(s, -c).statistic
        assert pairwise_accuracy(s, c) == pytest.approx((tau + 1) / 2)
    # top-k: k = 8 // 4 = 2, the cheapest are 5 and 1; a model that finds one of them: 0.5
    half = np.zeros(8)
    half[[5, 0]] = [2.0, 1.0]
    assert topk_recall(half, costs) == 0.5 and topk_recall(half, costs, k=1) == 1.0
    # equal costs have no order to get right
    assert np.isnan(pairwise_accuracy([1.0, 2.0], [3.0, 3.0]))
    # failures (inf) are left out; fewer than two valid: nothing to grade
    q = ranking_quality([3.0, 2.0, 9.0, 1.0], [1.0, 2.0, np.inf, 3.0])
    assert q is not None and (q.pairwise_acc, q.topk_recall, q.k, q.n) == (1.0, 1.0, 1, 3)
    assert ranking_quality([1.0, 2.0], [np.inf, 1.0]) is None


def test_pretrain_keeps_earlier_runs_apart() -> None:
    task = SearchTask(wl.matmul, (64, 64, 64))
    space = SearchSpace(task)
    rng = np.random.default_rng(1)
    cands = [c for c in (space.sample(rng) for _ in range(20)) if c is not None]
    # distinct candidates (a small GEMM's register-tile draws repeat)
    inputs = list({i.key: i for i in (MeasureInput(task, c.steps, c.sketch, c.params) for c in cands)}.values())
    assert len(inputs) >= 12
    results = [MeasureResult((float(k + 1),), MeasureErrorNo.NO_ERROR) for k in range(len(inputs))]
    model = XGBModel(seed=0, min_samples=8)
    assert not model.trained and not RandomModel().trained
    model.pretrain(inputs, results)
    assert model.trained and model.n_samples == len(inputs)
    # measured again in this run: new rows in this run's own query group, not merged
    model.update(inputs[:5], results[:5])
    assert model.n_samples == len(inputs) + 5
    assert sorted(model._cost) == sorted([task.workload_key, "warm:" + task.workload_key])

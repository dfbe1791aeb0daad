"""Cost models: the XGBoost ranker learns an order from measurements; the random one has none."""

from __future__ import annotations

import numpy as np
import tuning_workloads as wl

from tuning import RandomModel, SearchTask, XGBModel
from tuning.measure import MeasureErrorNo, MeasureInput, MeasureResult
from tuning.space import SearchSpace


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def test_xgb_ranks_by_what_it_was_shown() -> None:
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
    model = XGBModel(seed=0)
    assert np.isfinite(model.predict(inputs)).all()  # untrained: random but usable
    model.update(inputs, results)
    assert model.n_samples == len(inputs)
    scores = model.predict(inputs[:-1])
    assert _spearman(scores, -np.array([cost(c) for c in cands[:-1]])) > 0.7
    # measuring the same candidates again adds nothing
    model.update(inputs, results)
    assert model.n_samples == len(inputs)
    rand = RandomModel(seed=0).predict(inputs)
    assert rand.shape == (len(inputs),) and not np.array_equal(rand, RandomModel(seed=1).predict(inputs))

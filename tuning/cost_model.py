"""Cost models: rank candidates before measuring them.

The search asks a model to order thousands of candidates and measures only the best few, so
what matters is the *order* within a task, not the predicted seconds: `XGBModel` trains a
gradient-boosted ranker (``rank:pairwise``) on the features of measured candidates, labelled
with their throughput relative to the task's best (failures get 0), one query group per task,
and is retrained after every measured batch. `RandomModel` scores at random: the search then
degrades to random sampling, the baseline the learned model must beat.

>>> model = XGBModel(seed=0)                      # doctest: +SKIP
>>> model.update(inputs, results)                 # measured MeasureInputs and MeasureResults
>>> scores = model.predict(candidates)            # MeasureInputs; higher is better
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

import numpy as np

from .features import FeatureCache
from .measure import MeasureInput, MeasureResult


class CostModel(abc.ABC):
    """Learns from measurements, scores unmeasured candidates (higher = faster)."""

    @abc.abstractmethod
    def update(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        """Add measurements to the training data (and retrain)."""

    @abc.abstractmethod
    def predict(self, candidates: Sequence[MeasureInput]) -> np.ndarray:
        """One score per candidate; ``-inf`` for a candidate that cannot even be lowered."""


class RandomModel(CostModel):
    """Uniform random scores: measuring its picks is random search."""

    def __init__(self, seed: int = 0, features: FeatureCache | None = None) -> None:
        self.rng = np.random.default_rng(seed)
        self.features = features

    def update(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        return None

    def predict(self, candidates: Sequence[MeasureInput]) -> np.ndarray:
        scores = self.rng.random(len(candidates))
        if self.features is not None:  # still drop candidates that do not lower
            feats = self.features.of(candidates)
            scores[[f is None for f in feats]] = -np.inf
        return scores


class XGBModel(CostModel):
    """Pairwise-ranking gradient-boosted trees over `tuning.features` vectors."""

    def __init__(self, seed: int = 0, features: FeatureCache | None = None, rounds: int = 80,
                 min_samples: int = 8, n_threads: int = 1) -> None:
        self.seed = seed
        self.features = features or FeatureCache()
        self.rounds = rounds
        self.min_samples = min_samples
        self.n_threads = n_threads
        self.rng = np.random.default_rng(seed)
        # per task: feature rows and costs (inf for failures), in measurement order
        self._x: dict[str, list[np.ndarray]] = {}
        self._cost: dict[str, list[float]] = {}
        self._seen: set[tuple[str, str]] = set()
        self.booster: object | None = None

    @property
    def n_samples(self) -> int:
        return sum(len(v) for v in self._cost.values())

    def update(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        feats = self.features.of(inputs)
        for inp, f, r in zip(inputs, feats, results):
            tk = inp.task.workload_key
            if f is None or (tk, inp.key) in self._seen:
                continue
            self._seen.add((tk, inp.key))
            self._x.setdefault(tk, []).append(f)
            self._cost.setdefault(tk, []).append(r.mean if r.valid else np.inf)
        self._train()

    def _train(self) -> None:
        import xgboost as xgb

        if self.n_samples < self.min_samples:
            return
        xs, ys, groups = [], [], []
        for key, rows in self._x.items():
            cost = np.asarray(self._cost[key])
            finite = cost[np.isfinite(cost)]
            if not finite.size:
                continue
            # relative throughput in (0, 1]; failed candidates rank below every valid one
            ys.append(np.where(np.isfinite(cost), finite.min() / np.where(np.isfinite(cost), cost, 1.0), 0.0))
            xs.append(np.stack(rows))
            groups.append(len(rows))
        if not xs:
            return
        dtrain = xgb.DMatrix(np.concatenate(xs), label=np.concatenate(ys), nthread=self.n_threads)
        dtrain.set_group(groups)
        params = {
            "objective": "rank:pairwise", "eta": 0.2, "max_depth": 6, "min_child_weight": 1,
            "subsample": 0.9, "colsample_bytree": 0.9, "seed": self.seed, "verbosity": 0,
        }
        # One thread by default: the data is small (hundreds of rows), and OpenMP threads
        # that spin-wait for a core another process holds make training 10x slower.
        params["nthread"] = self.n_threads
        self.booster = xgb.train(params, dtrain, num_boost_round=self.rounds)

    def predict(self, candidates: Sequence[MeasureInput]) -> np.ndarray:
        import xgboost as xgb

        feats = self.features.of(candidates)
        scores = np.full(len(candidates), -np.inf)
        ok = [k for k, f in enumerate(feats) if f is not None]
        if not ok:
            return scores
        if self.booster is None:
            scores[ok] = self.rng.random(len(ok))  # untrained: no preference yet
            return scores
        x = np.stack([feats[k] for k in ok])  # type: ignore[misc]
        scores[ok] = self.booster.predict(xgb.DMatrix(x, nthread=self.n_threads))  # type: ignore[attr-defined]
        return scores


__all__ = ["CostModel", "RandomModel", "XGBModel"]

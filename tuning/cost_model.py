"""Cost models: rank candidates before measuring them.

The search asks a model to order thousands of candidates and measures only the best few, so
what matters is the *order* within a task, not the predicted seconds: `XGBModel` trains
gradient-boosted trees on the features of measured candidates, labelled with their throughput
relative to the task's best (by default a regression on its log; ``rank:pairwise`` with one
query group per task on request), and is retrained after every measured batch. `RandomModel`
scores at random: with ``tune(cost_model="random")`` the search is plain random sampling, the
baseline the learned model must beat.

>>> model = XGBModel(seed=0)                      # doctest: +SKIP
>>> model.update(inputs, results)                 # measured MeasureInputs and MeasureResults
>>> scores = model.predict(candidates)            # MeasureInputs; higher is better

How good the order is gets measured on data the model has not seen: `ranking_quality` compares
the scores a model gave a batch *before* it was measured with the measured costs (pairwise
ranking accuracy and top-k recall); `tuning.tune` logs it after every batch.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .features import FeatureCache
from .measure import MeasureInput, MeasureResult
from .speed import SpeedIndex


class CostModel(abc.ABC):
    """Learns from measurements, scores unmeasured candidates (higher = faster)."""

    @abc.abstractmethod
    def update(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        """Add measurements to the training data (and retrain)."""

    @abc.abstractmethod
    def predict(self, candidates: Sequence[MeasureInput]) -> np.ndarray:
        """One score per candidate; ``-inf`` for a candidate that cannot even be lowered."""

    @property
    def trained(self) -> bool:
        """Whether `predict` reflects something learnt (the tuner only grades it then)."""
        return True

    def pretrain(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        """Learn from measurements of an earlier run (``tune(warm_start=...)``).

        They may come from another machine or another load, so a model that can should keep
        them apart from this run's measurements; by default they are simply `update`d.
        """
        self.update(inputs, results)


class RandomModel(CostModel):
    """Uniform random scores: measuring its picks is random search."""

    def __init__(self, seed: int = 0, features: FeatureCache | None = None) -> None:
        self.rng = np.random.default_rng(seed)
        self.features = features

    def update(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        return None

    @property
    def trained(self) -> bool:
        return False

    def predict(self, candidates: Sequence[MeasureInput]) -> np.ndarray:
        scores = self.rng.random(len(candidates))
        if self.features is not None:  # still drop candidates that do not lower
            feats = self.features.of(candidates)
            scores[[f is None for f in feats]] = -np.inf
        return scores


OBJECTIVES = ("regression", "pairwise")


class XGBModel(CostModel):
    """Gradient-boosted trees over `tuning.features` vectors that rank candidates of a task.

    Only the order of its scores within a task is ever used. ``objective``:

    - ``"regression"`` (default): squared error on ``-log(cost / best cost of the task)``, 0
      for the task's best and negative below; failed candidates one unit under the task's
      slowest. Per-task normalised, so tasks (and warm-start logs) share one model without
      their absolute times being compared.
    - ``"pairwise"``: XGBoost's ``rank:pairwise`` with a query group per task, on relative
      throughput, each candidate paired with 32 random others of its task.

    Labels come from *normalised* costs (`label_costs`, `tuning.speed`): a candidate timed
    while the machine ran slow is not taught as a slow schedule. The model keeps its own
    per-machine baselines (the first index it sees of each machine); as labels are relative
    to the task's best, only their order and ratios matter, which any baseline preserves.

    Regression is the default because it ranked held-out candidates at least as well as
    pairwise on every workload `benchmarks/cost_model_eval.py` grades (matmul, conv2d,
    softmax). The figures, and what the cache-tier traffic features changed (held-out
    accuracy: nothing; ranking within a guided run: a little better), are in
    docs/benchmark-notes.md.
    """

    def __init__(self, seed: int = 0, features: FeatureCache | None = None, rounds: int = 80,
                 min_samples: int = 8, n_threads: int = 1, objective: str = "regression") -> None:
        if objective not in OBJECTIVES:
            raise ValueError(f"XGBModel: unknown objective {objective!r} (use one of {', '.join(OBJECTIVES)})")
        self.objective = objective
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
        self.speed = SpeedIndex()

    @property
    def n_samples(self) -> int:
        return sum(len(v) for v in self._cost.values())

    @property
    def trained(self) -> bool:
        return self.booster is not None

    def update(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        self._add(inputs, results, "")
        self._train()

    def pretrain(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        """Earlier runs' measurements, in query groups of their own: their costs are only
        compared with each other (another machine, another load), never with this run's."""
        self._add(inputs, results, "warm:")
        self._train()

    def _add(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult], group: str) -> None:
        feats = self.features.of(inputs)
        for inp, f, r in zip(inputs, feats, results):
            tk = group + inp.task.workload_key
            if f is None or (tk, inp.key) in self._seen:
                continue
            self._seen.add((tk, inp.key))
            self._x.setdefault(tk, []).append(f)
            self._cost.setdefault(tk, []).append(label_costs([r], self.speed)[0])

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
            ys.append(_labels(cost, self.objective))
            xs.append(np.stack(rows))
            groups.append(len(rows))
        if not xs:
            return
        dtrain = xgb.DMatrix(np.concatenate(xs), label=np.concatenate(ys), nthread=self.n_threads)
        rank = self.objective == "pairwise"
        if rank:
            dtrain.set_group(groups)
        params = {
            "objective": "rank:pairwise" if rank else "reg:squarederror", "eta": 0.2, "max_depth": 6,
            "min_child_weight": 1, "subsample": 0.9, "colsample_bytree": 0.9, "seed": self.seed,
            "verbosity": 0,
        }
        if rank:
            # every candidate paired with 32 random others of its task: XGBoost's default
            # ("topk") trains only on pairs with the group's 32 best, which grows worse as a
            # group grows (docs/benchmark-notes.md)
            params.update(lambdarank_pair_method="mean", lambdarank_num_pair_per_sample=32)
        # One thread by default: the data is small (hundreds of rows), and OpenMP threads
        # that spin-wait for a core another process holds make training many times slower.
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


def label_costs(results: Sequence[MeasureResult], speed: SpeedIndex) -> list[float]:
    """The costs training labels are made of: each result's normalised mean cost under
    ``speed`` (whose baselines it extends with machines it has not seen), inf for a failure;
    a result without a speed index gives its raw mean."""
    out = []
    for r in results:
        speed.observe(r)
        out.append(speed.cost(r))
    return out


def _labels(cost: np.ndarray, objective: str) -> np.ndarray:
    """Training labels of one task's costs (inf: failed), higher is better."""
    ok = np.isfinite(cost)
    best, worst = cost[ok].min(), cost[ok].max()
    safe = np.where(ok, cost, best)
    if objective == "pairwise":
        # relative throughput in (0, 1]; failed candidates rank below every valid one
        return np.where(ok, best / safe, 0.0)
    # log relative throughput: a 2x slower candidate is as far from the best whether the
    # best takes 5 us or 5 ms, and a 100x slower one does not swamp the squared error
    return np.where(ok, -np.log(safe / best), -np.log(worst / best) - 1.0)


# grading a model on held-out measurements ------------------------------------------------------


@dataclass(frozen=True)
class RankingQuality:
    """How well scores ordered candidates whose costs were measured afterwards."""

    pairwise_acc: float  # fraction of pairs put in the right order (nan: no pair to order)
    topk_recall: float  # share of the true top-k that the model also put in its top-k
    k: int
    n: int  # valid candidates graded


def pairwise_accuracy(scores: Sequence[float] | np.ndarray, costs: Sequence[float] | np.ndarray) -> float:
    """Fraction of pairs with distinct costs that ``scores`` order right (higher score = lower
    cost); a pair with equal scores counts one half, as a coin flip would. ``nan`` when no
    pair has distinct costs.

    Without ties it equals ``(tau + 1) / 2`` for Kendall's tau between scores and ``-costs``
    (`scipy.stats.kendalltau`); counted directly because tau-b rescales ties in the scores,
    which an untrained or coarse model produces.
    """
    s, c = np.asarray(scores, float), np.asarray(costs, float)
    ds = np.sign(s[:, None] - s[None, :])
    dc = np.sign(c[None, :] - c[:, None])  # +1 where row i is cheaper than column j
    upper = np.triu(np.ones_like(dc, dtype=bool), 1)
    pairs = upper & (dc != 0)
    n = int(pairs.sum())
    if n == 0:
        return math.nan
    agree = ds[pairs] * dc[pairs]  # +1 right, -1 wrong, 0 tied scores
    return float(np.mean((agree + 1.0) / 2.0))


def topk_recall(scores: Sequence[float] | np.ndarray, costs: Sequence[float] | np.ndarray,
                k: int | None = None) -> float:
    """Of the ``k`` cheapest candidates (default ``max(1, n // 4)``), the share that are also
    among the ``k`` best scored: how much of what the model would measure is worth it."""
    s, c = np.asarray(scores, float), np.asarray(costs, float)
    if not len(c):
        return math.nan
    k = max(1, len(c) // 4) if k is None else min(k, len(c))
    # stable sorts: ties keep batch order, so the number is reproducible
    true_top = set(np.argsort(c, kind="stable")[:k].tolist())
    model_top = set(np.argsort(-s, kind="stable")[:k].tolist())
    return len(true_top & model_top) / k


def ranking_quality(scores: Sequence[float] | np.ndarray, costs: Sequence[float] | np.ndarray,
                    ) -> RankingQuality | None:
    """Both metrics over the candidates with a finite cost (failures have no order among
    themselves and are what the model's features already rule out); None below two."""
    s, c = np.asarray(scores, float), np.asarray(costs, float)
    ok = np.isfinite(c) & np.isfinite(s)
    if ok.sum() < 2:
        return None
    s, c = s[ok], c[ok]
    k = max(1, len(c) // 4)
    return RankingQuality(pairwise_accuracy(s, c), topk_recall(s, c, k), k, len(c))


__all__ = ["OBJECTIVES", "CostModel", "RandomModel", "RankingQuality", "XGBModel", "label_costs", "pairwise_accuracy",
           "ranking_quality", "topk_recall"]

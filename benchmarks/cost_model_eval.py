"""How well does the cost model rank candidates it has not seen? Offline, on tuning logs.

Reads the logs `benchmarks/model_vs_random.py --log-dir DIR` leaves (``<op>-<arm>-s<seed>.jsonl``).
For each operator, seed ``s`` and training log (the xgb and the random run of seed ``s``), an
`XGBModel` of each objective learns the first ``t`` distinct candidates of the log, in
measurement order -- what the tuner's model knew after ``t`` trials -- and then ranks every
valid candidate of the random-search log of the next seed: a fresh sample of the space that
no training run chose. Printed per operator and ``t``, averaged over seeds and training logs:
pairwise ranking accuracy, top-k recall (k = a quarter of the test set) and ``best of top 8``,
the best cost in the whole test set over the best among the 8 candidates the model ranks
first (1.0: the model would have measured the best one).

    python benchmarks/model_vs_random.py --log-dir logs/mvr
    python benchmarks/cost_model_eval.py logs/mvr [--ops matmul conv2d softmax] [--train 32 64 112]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tuning import SearchTask, XGBModel  # noqa: E402
from tuning.cost_model import OBJECTIVES, pairwise_accuracy, topk_recall  # noqa: E402
from tuning.features import FeatureCache  # noqa: E402
from tuning.measure import MeasureInput, MeasureResult  # noqa: E402
from tuning.records import load_records  # noqa: E402


def load(path: str) -> tuple[list[MeasureInput], list[MeasureResult]]:
    """The first measurement of every candidate of a one-task log, in log order."""
    seen: set[str] = set()
    ins: list[MeasureInput] = []
    res: list[MeasureResult] = []
    task: SearchTask | None = None
    for r in load_records(path):
        if r.key in seen:  # a re-measurement at the end of tuning
            continue
        seen.add(r.key)
        if task is None:
            task = r.task()
        ins.append(MeasureInput.of(task, r))
        res.append(r.result())
    return ins, res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log_dir")
    ap.add_argument("--ops", nargs="+", default=["matmul", "conv2d", "softmax"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--train", type=int, nargs="+", default=[32, 64, 112])
    args = ap.parse_args()
    features = FeatureCache()  # one cache: every model of an operator sees the same rows
    for op in args.ops:
        logs = {(arm, s): load(os.path.join(args.log_dir, f"{op}-{arm}-s{s}.jsonl"))
                for arm in ("xgb", "random") for s in args.seeds}
        for t in args.train:
            scores: dict[str, list[tuple[float, float, float]]] = {o: [] for o in OBJECTIVES}
            for k, s in enumerate(args.seeds):
                test_in, test_res = logs["random", args.seeds[(k + 1) % len(args.seeds)]]
                ok = [j for j, r in enumerate(test_res) if r.valid]
                test_in = [test_in[j] for j in ok]
                cost = np.array([test_res[j].mean for j in ok])
                for arm in ("xgb", "random"):
                    train_in, train_res = logs[arm, s]
                    for objective in OBJECTIVES:
                        model = XGBModel(seed=0, features=features, objective=objective)
                        model.update(train_in[:t], train_res[:t])
                        pred = model.predict(test_in)
                        top8 = np.argsort(-pred, kind="stable")[:8]
                        scores[objective].append((pairwise_accuracy(pred, cost),
                                                  topk_recall(pred, cost), cost.min() / cost[top8].min()))
            cells = [f"{o}: acc {np.mean([q[0] for q in v]):.3f}, top-k {np.mean([q[1] for q in v]):.2f}, "
                     f"best of top 8 {np.mean([q[2] for q in v]):.2f}" for o, v in scores.items()]
            print(f"{op:8s} t={t:4d}  " + "   ".join(cells), flush=True)


if __name__ == "__main__":
    main()

"""Does the cost model earn its keep? XGBoost-guided search vs random search at equal trials.

For each operator and seed, the same trial budget is spent from an empty log by each arm:
``xgb``, the XGBoost ranker steering the evolutionary search (``cost_model="xgb"``);
``random``, random search: fresh random candidates of the same space (``cost_model="random"``);
and, with ``--arms ... evo-random``, an ablation: the evolutionary search driven by random
scores (a `RandomModel`), i.e. what mutating the best measured candidates gains without a model.
Printed: the best GFLOP/s of each run, per-operator and overall geometric means of the ratio of
best times of xgb to every other arm. Runs are interleaved (xgb, random, xgb, ...) so
machine-load drift hits all arms alike.

    python benchmarks/model_vs_random.py [--ops matmul conv2d softmax] [--trials 128] [--seeds 0 1 2]
                                         [--arms xgb random evo-random]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tune_ops import OPS  # noqa: E402

import tuning  # noqa: E402
from tuning.cost_model import RandomModel  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", nargs="+", default=["matmul", "conv2d", "softmax"], choices=sorted(OPS))
    ap.add_argument("--trials", type=int, default=128)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", nargs="+", default=["xgb", "random"], choices=["xgb", "random", "evo-random"])
    ap.add_argument("--log-dir", default=None, help="keep the logs here (default: a temporary folder)")
    args = ap.parse_args()
    if "xgb" not in args.arms or len(args.arms) < 2:
        ap.error("--arms: xgb and at least one baseline")
    baselines = [a for a in args.arms if a != "xgb"]
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="model-vs-random-")
    os.makedirs(log_dir, exist_ok=True)
    ratios: dict[str, dict[str, list[float]]] = {b: {} for b in baselines}
    for name in args.ops:
        op = OPS[name]
        task = tuning.SearchTask(op.workload, op.args, target="llvm")
        for seed in args.seeds:
            best: dict[str, float] = {}
            for model in args.arms:
                log = os.path.join(log_dir, f"{name}-{model}-s{seed}.jsonl")
                t0 = time.perf_counter()
                cm: str | RandomModel = RandomModel(seed=seed) if model == "evo-random" else model
                res = tuning.tune([task], trials=args.trials, log=log, seed=seed, cost_model=cm,
                                  progress=False)[0]
                best[model] = res.best_cost
                print(f"{name} seed {seed} {model:6s}: best {res.best_gflops:7.1f} GFLOP/s "
                      f"({res.best_cost * 1e3:.3f} ms) after {res.trials} trials, "
                      f"{time.perf_counter() - t0:.0f} s, load {os.getloadavg()[0]:.1f}", flush=True)
            for b in baselines:
                r = best[b] / best["xgb"]
                ratios[b].setdefault(name, []).append(r)
                print(f"  -> xgb/{b} speed ratio {r:.3f}", flush=True)
    geo: dict[str, float] = {}
    for b in baselines:
        print()
        every: list[float] = []
        for name, rs in ratios[b].items():
            g = math.exp(sum(math.log(r) for r in rs) / len(rs))
            every += rs
            print(f"{name:10s} geometric mean xgb/{b}: {g:.3f}  (seeds: {', '.join(f'{r:.3f}' for r in rs)})")
        geo[b] = math.exp(sum(math.log(r) for r in every) / len(every))
        print(f"overall geometric mean xgb/{b} at {args.trials} trials: {geo[b]:.3f}")
    print("JSON " + json.dumps({"trials": args.trials, "ratios": ratios, "geomean": geo}))


if __name__ == "__main__":
    main()

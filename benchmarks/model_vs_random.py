"""Does the cost model earn its keep? XGBoost-guided search vs random search at equal trials.

For each operator and seed, the same trial budget is spent from an empty log by each arm:
``xgb``, the XGBoost ranker steering the evolutionary search (``cost_model="xgb"``);
``random``, random search: fresh random candidates of the same space (``cost_model="random"``);
and, with ``--arms ... evo-random``, an ablation: the evolutionary search driven by random
scores (a `RandomModel`), i.e. what mutating the best measured candidates gains without a model.
Printed: the best GFLOP/s of each run, per-operator and overall geometric means of the ratio of
best times of xgb to every other arm. Runs are interleaved (xgb, random, xgb, ...) so
machine-load drift hits all arms alike.

Each arm's best is what its log claims (the mean of at least two timings, see
``tune(remeasure=...)``), but the arms ran minutes apart, and this machine drifts by 5-25% over
minutes. So the best schedule of every arm is also re-timed side by side at the end: a fresh
process builds them all and times them in turn, call after call (``--retime-rounds`` calls
each, median kept), so a burst of load hits every arm alike; and that is done in
``--retime-processes`` processes (median kept), because separate processes disagree by up to
20-30% on some schedules (a matmul best: 7.45 ms in three processes one minute, 5.0-5.9 ms in
nine others later). The ratio of those re-timings is printed as well (``--no-retime`` to skip).
Both figures move by several percent from one run to the next on this shared machine.
Each best is also printed as a fraction of this machine's peak (benchmarks/peak.py, cached; see
benchmarks/tune_ops.py for which operators count as memory-bound).

    python benchmarks/model_vs_random.py [--ops matmul conv2d softmax] [--trials 128] [--seeds 0 1 2]
                                         [--arms xgb random evo-random]
                                         [--retime-rounds 9] [--retime-processes 3] [--no-retime]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from peak import measure as measure_peak  # noqa: E402
from tune_ops import OPS, of_peak, retime_logs  # noqa: E402

import tuning  # noqa: E402
from tuning.cost_model import RandomModel  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", nargs="+", default=["matmul", "conv2d", "softmax"], choices=sorted(OPS))
    ap.add_argument("--trials", type=int, default=128)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", nargs="+", default=["xgb", "random"], choices=["xgb", "random", "evo-random"])
    ap.add_argument("--log-dir", default=None, help="keep the logs here (default: a temporary folder)")
    ap.add_argument("--no-retime", dest="retime", action="store_false",
                    help="compare the claimed bests only (no side-by-side re-timing)")
    ap.add_argument("--retime-rounds", type=int, default=9,
                    help="timed calls of each arm's best per re-timing process (median kept)")
    ap.add_argument("--retime-processes", type=int, default=3,
                    help="fresh processes that re-time every arm's best side by side (median kept)")
    args = ap.parse_args()
    if "xgb" not in args.arms or len(args.arms) < 2:
        ap.error("--arms: xgb and at least one baseline")
    baselines = [a for a in args.arms if a != "xgb"]
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="model-vs-random-")
    os.makedirs(log_dir, exist_ok=True)
    pk = measure_peak(quick=True)  # before tuning: a fresh measurement must not compete with it
    print(pk.line(), flush=True)
    ratios: dict[str, dict[str, list[float]]] = {b: {} for b in baselines}
    retimed: dict[str, dict[str, list[float]]] = {b: {} for b in baselines}
    for name in args.ops:
        op = OPS[name]
        task = tuning.SearchTask(op.workload, op.args, target="llvm")
        for seed in args.seeds:
            best: dict[str, float] = {}
            logs: dict[str, str] = {}
            for model in args.arms:
                log = logs[model] = os.path.join(log_dir, f"{name}-{model}-s{seed}.jsonl")
                t0 = time.perf_counter()
                cm: str | RandomModel = RandomModel(seed=seed) if model == "evo-random" else model
                res = tuning.tune([task], trials=args.trials, log=log, seed=seed, cost_model=cm,
                                  progress=False)[0]
                best[model] = res.best_cost
                frac = f", {of_peak(name, task, res.best_cost, pk)[0]}" if math.isfinite(res.best_cost) else ""
                print(f"{name} seed {seed} {model:6s}: best {res.best_gflops:7.1f} GFLOP/s "
                      f"({res.best_cost * 1e3:.3f} ms{frac}) after {res.trials} trials, "
                      f"{time.perf_counter() - t0:.0f} s, load {os.getloadavg()[0]:.1f}", flush=True)
            again: dict[str, float] = {}
            if args.retime and all(math.isfinite(c) for c in best.values()):  # a best to build in every arm
                try:
                    runs = [retime_side_by_side(task, logs, args.retime_rounds) for _ in range(args.retime_processes)]
                    again = {m: statistics.median(r[m] for r in runs) for m in args.arms}
                except subprocess.CalledProcessError as e:  # report it, keep the claimed ratio
                    print(f"  re-timing failed, left out: {e.stderr.strip().splitlines()[-1:]}", flush=True)
            for b in baselines:
                r = best[b] / best["xgb"]
                ratios[b].setdefault(name, []).append(r)
                line = f"  -> xgb/{b} speed ratio {r:.3f}"
                if again:
                    mx, mb = again["xgb"], again[b]
                    retimed[b].setdefault(name, []).append(mb / mx)
                    line += (f"; re-timed side by side {mb / mx:.3f} "
                             f"(xgb {mx * 1e3:.3f} ms, {b} {mb * 1e3:.3f} ms)")
                print(line, flush=True)
    out: dict[str, object] = {"trials": args.trials}
    for label, table in (("claimed", ratios), ("re-timed", retimed)):
        if label == "re-timed" and not args.retime:
            continue
        geo: dict[str, float] = {}
        for b in baselines:
            print()
            every: list[float] = []
            for name, rs in table[b].items():
                every += rs
                print(f"{name:10s} geometric mean xgb/{b} ({label}): {_geomean(rs):.3f}  "
                      f"(seeds: {', '.join(f'{r:.3f}' for r in rs)})")
            geo[b] = _geomean(every)
            print(f"overall geometric mean xgb/{b} at {args.trials} trials ({label}): {geo[b]:.3f}")
        out[label] = {"ratios": table, "geomean": geo}
    print("JSON " + json.dumps(out))


def retime_side_by_side(task: tuning.SearchTask, logs: dict[str, str], rounds: int) -> dict[str, float]:
    """Median seconds per call of each log's best schedule, timed in turn in one fresh process."""
    return {arm: t for arm, (_, t) in retime_logs(task, logs, 3, 3, rounds, "median", warmup=True).items()}


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


if __name__ == "__main__":
    main()

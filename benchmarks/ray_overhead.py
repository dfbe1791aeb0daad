"""What tuning through Ray costs, and where a cluster's throughput comes from: building and
measuring the same candidates locally and through Ray on this machine, plus the tuner's own
search time per batch, in one run.

    python benchmarks/ray_overhead.py [--candidates 48] [--shape 256] [--rounds 2]

It samples one set of matmul candidates (seeded) and then

* builds all of them with `LocalBuilder` (one process per core) and with `tuning.RayBuilder`
  on a local Ray instance of all the cores (one task per candidate), alternating the order
  over ``--rounds``: wall seconds per candidate of each, and Ray's overhead;
* measures all of them with `LocalRunner` and with `tuning.RayRunner` (its own local Ray
  instance: the measuring actor holds every core), alternating likewise;
* times what the tuner itself does per batch of 8 and of 64: the cost model learning the
  batch's results, then the evolutionary search proposing the next batch (scored by it).

From those figures it prints the throughput model of a cluster of N measuring nodes and B
build CPUs (docs/design.md, "Measuring on a cluster"). Needs Ray (`pip install
"tecomp[distributed]"`). Figures move with the machine's load: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np

import tuning
from tuning.measure import BuildResult, LocalBuilder, LocalRunner, MeasureInput, MeasureResult, WorkerPool
from tuning.space import Candidate, space_for


def _candidates(task: tuning.SearchTask, n: int, seed: int) -> tuple[list[Candidate], list[MeasureInput]]:
    space = space_for(task)
    rng = np.random.default_rng(seed)
    out: dict[str, Candidate] = {}
    tries = 0
    while len(out) < n and tries < 50 * n:
        tries += 1
        c = space.sample(rng)
        if c is not None and c.key not in out:
            out[c.key] = c
    cands = list(out.values())
    return cands, [MeasureInput.of(task, c) for c in cands]


def _time_runner(runner: Any, inputs: list[MeasureInput], builds: list[BuildResult]) -> tuple[float, list[MeasureResult]]:
    t0 = time.perf_counter()
    res = runner.run(inputs, builds)
    return time.perf_counter() - t0, res


def _alternate(rounds: int, named: list[tuple[str, Any]], fn: Any, n: int, what: str) -> dict[str, float]:
    """Median wall seconds per candidate of ``fn(obj)`` for each named object, the order
    alternating between rounds (so a drift in the machine's speed hits both alike)."""
    per: dict[str, list[float]] = {name: [] for name, _ in named}
    for r in range(rounds):
        order = named if r % 2 == 0 else named[::-1]
        for name, obj in order:
            t0 = time.perf_counter()
            ok = fn(obj)
            wall = time.perf_counter() - t0
            per[name].append(wall / n)
            print(f"  {what} round {r}: {name:5s} {wall:6.2f} s for {n} ({ok} ok): "
                  f"{wall / n * 1e3:6.1f} ms/candidate")
    return {name: statistics.median(v) for name, v in per.items()}


def _search_per_batch(task: tuning.SearchTask, cands: list[Candidate], inputs: list[MeasureInput],
                      results: list[MeasureResult], sizes: tuple[int, ...]) -> dict[int, tuple[float, float]]:
    """Seconds the tuner spends per batch of each size: (model learning the batch's results,
    the search proposing the next batch), as `tune` does them between measurements."""
    from tuning.features import FeatureCache
    from tuning.search import EvolutionarySearch

    pool = WorkerPool(prefix="features")  # as tune: the search's own processes
    try:
        out = {}
        for n in sizes:
            model = tuning.XGBModel(seed=0, features=FeatureCache(pool.map, pool.n_workers))
            # the model has seen every measured candidate but the last batch, then learns it
            model.update(inputs[:-n] if len(inputs) > n else inputs[: len(inputs) // 2],
                         results[:-n] if len(inputs) > n else results[: len(inputs) // 2])
            t0 = time.perf_counter()
            model.update(inputs, results)
            learn = time.perf_counter() - t0
            search = EvolutionarySearch(task, model, np.random.default_rng(0))
            search.update(cands, results)
            search.next_batch(8)  # features of the elites cached, as after a first batch
            t0 = time.perf_counter()
            batch = search.next_batch(n)
            model.predict([MeasureInput.of(task, c) for c in batch])  # tune scores each batch
            out[n] = (learn, time.perf_counter() - t0)
        return out
    finally:
        pool.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", type=int, default=48)
    ap.add_argument("--shape", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    try:
        import ray  # noqa: F401
    except ImportError:
        print("Ray is not installed: pip install 'tecomp[distributed]'")
        return
    from tuning.distributed import RayRunner
    from tuning.ray_builder import RayBuilder
    from tuning.workloads import matmul

    n = a.shape
    cores = os.cpu_count() or 1
    task = tuning.SearchTask(matmul, (n, n, n), target="llvm")
    cands, inputs = _candidates(task, a.candidates, a.seed)
    print(f"matmul {n}^3, {len(inputs)} candidates, {cores} cores; load average "
          f"{os.getloadavg()[0]:.1f} at the start")

    # building ---------------------------------------------------------------------------------
    local_b = LocalBuilder()
    t0 = time.perf_counter()
    ray_b = RayBuilder()  # a local Ray instance of every core, stopped by close
    b_start = time.perf_counter() - t0
    # warm both (processes started, tecomp imported) outside the timings
    warm = inputs[:cores]
    local_b.build(warm)
    ray_b.build(warm)
    kept: dict[str, list[BuildResult]] = {}

    def build(b: Any) -> int:
        res = b.build(inputs)
        if b is local_b:
            kept["builds"] = res  # what both runners measure below
        return sum(r.artifact is not None for r in res)

    bt = _alternate(a.rounds, [("local", local_b), ("ray", ray_b)], build, len(inputs), "build")
    ray_b.close()
    local_b.close()
    builds = kept["builds"]
    # one build per core at a time, both: the cost of one build on one CPU
    b_cpu = bt["local"] * cores

    # measuring --------------------------------------------------------------------------------
    local = LocalRunner()
    t0 = time.perf_counter()
    ray_runner = RayRunner(num_cpus=None)
    r_start = time.perf_counter() - t0
    local.run(inputs[:1], builds[:1])
    ray_runner.run(inputs[:1], builds[:1])
    measured: dict[str, list[MeasureResult]] = {}

    def measure(r: Any) -> int:
        _, res = _time_runner(r, inputs, builds)
        measured["res"] = res
        return sum(x.valid for x in res)

    mt = _alternate(a.rounds, [("local", local), ("ray", ray_runner)], measure, len(inputs), "measure")
    local.close()
    ray_runner.close()

    # the tuner's own work per batch -----------------------------------------------------------
    sizes = (8, 64)  # tune's default batch, and a large one: the search costs per batch
    search = _search_per_batch(task, cands, inputs, measured["res"], sizes)

    # report -------------------------------------------------------------------------------------
    lo, ry = bt["local"], bt["ray"]
    print(f"\nRay instance start: {b_start:.1f} s (builder), {r_start:.1f} s (runner): once per run")
    print(f"building, per candidate (wall, {cores} at a time): local {lo * 1e3:.1f} ms, Ray "
          f"{ry * 1e3:.1f} ms -> Ray adds {(ry - lo) * 1e3:.1f} ms ({(ry - lo) / lo * 100:+.0f}%); "
          f"one build on one CPU: b = {b_cpu:.2f} s")
    m_lo, m = mt["local"], mt["ray"]
    print(f"measuring, per candidate: local {m_lo * 1e3:.1f} ms, Ray {m * 1e3:.1f} ms -> Ray adds "
          f"{(m - m_lo) * 1e3:.1f} ms ({(m - m_lo) / m_lo * 100:+.0f}%); m = {m:.3f} s")
    for size, (learn, prop) in search.items():
        s = learn + prop
        print(f"the tuner per batch of {size}: model learns {learn:.2f} s + search proposes {prop:.2f} s "
              f"= s = {s:.2f} s -> at most {60 * size / s:.0f} candidates/min")
    # candidates/min ~ min(60 N / m, 60 min(B, batch) / b, 60 batch / s): N nodes measure in
    # parallel; B build CPUs compile in parallel, but the tuner builds one batch at a time (a
    # builder need not be thread-safe), so at most `batch` of them are busy; and the tuner
    # learns and proposes one batch at a time
    print("\ncandidates/min ~ min(60 N/m, 60 min(B, batch)/b, 60 batch/s) with the figures above "
          "(B = 16 build CPUs per measuring node):")
    for size, (learn, prop) in search.items():
        s = learn + prop
        print(f"  batch {size}:")
        for nodes in (1, 2, 4, 8, 16, 32, 64):
            b_cpus = 16 * nodes
            rates = {"measuring": 60 * nodes / m, "building": 60 * min(b_cpus, size) / b_cpu,
                     "the tuner's search": 60 * size / s}
            limit = min(rates, key=lambda k: rates[k])
            print(f"    N={nodes:3d}, B={b_cpus:4d}: {rates[limit]:7.0f} candidates/min  (limit: {limit})")


if __name__ == "__main__":
    main()

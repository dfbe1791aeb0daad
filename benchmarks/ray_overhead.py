"""What measuring through Ray costs: candidates per minute with the local runner and with
`tuning.RayRunner` on a local Ray instance, measured in the same run on the same candidates,
and the overhead Ray adds per candidate.

    python benchmarks/ray_overhead.py [--candidates 48] [--shape 256]

It builds one batch of matmul candidates once (sampled from the search space, seeded), then
measures all of them with each runner, alternating runner order over ``--rounds``. It prints
per-candidate wall time of each, the difference (Ray's overhead), and from those figures
how throughput scales to N measuring nodes and where the tuner's own per-candidate cost
(building + search, measured here too) becomes the limit. Needs Ray (`pip install
"tecomp[distributed]"`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import tuning
from tuning.measure import LocalBuilder, LocalRunner, MeasureInput
from tuning.space import space_for


def _candidates(task: tuning.SearchTask, n: int, seed: int) -> list[MeasureInput]:
    space = space_for(task)
    rng = np.random.default_rng(seed)
    out: dict[str, MeasureInput] = {}
    tries = 0
    while len(out) < n and tries < 50 * n:
        tries += 1
        c = space.sample(rng)
        if c is not None and c.key not in out:
            out[c.key] = MeasureInput.of(task, c)
    return list(out.values())


def _time_runner(runner: object, inputs: list[MeasureInput], builds: list) -> tuple[float, int]:
    t0 = time.perf_counter()
    res = runner.run(inputs, builds)  # type: ignore[attr-defined]
    return time.perf_counter() - t0, sum(r.valid for r in res)


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
    from tuning.workloads import matmul

    n = a.shape
    task = tuning.SearchTask(matmul, (n, n, n), target="llvm")
    inputs = _candidates(task, a.candidates, a.seed)
    builder = LocalBuilder()
    t0 = time.perf_counter()
    builds = builder.build(inputs)
    build_s = (time.perf_counter() - t0) / len(inputs)
    builder.close()
    print(f"matmul {n}^3, {len(inputs)} candidates; building: {build_s * 1e3:.1f} ms/candidate "
          f"(2 build processes)")

    local = LocalRunner()
    t0 = time.perf_counter()
    ray_runner = RayRunner(num_cpus=None)
    start_s = time.perf_counter() - t0
    # warm both (reference outputs computed, processes started) outside the timings
    local.run(inputs[:1], builds[:1])
    ray_runner.run(inputs[:1], builds[:1])
    per: dict[str, list[float]] = {"local": [], "ray": []}
    for r in range(a.rounds):
        order = [("local", local), ("ray", ray_runner)]
        if r % 2:
            order.reverse()
        for name, runner in order:
            wall, ok = _time_runner(runner, inputs, builds)
            per[name].append(wall / len(inputs))
            print(f"  round {r}: {name:5s} {wall:6.2f} s for {len(inputs)} ({ok} valid): "
                  f"{wall / len(inputs) * 1e3:6.1f} ms/candidate")
    local.close()
    ray_runner.close()
    lo, ry = statistics.median(per["local"]), statistics.median(per["ray"])
    over = ry - lo
    print(f"\nRay instance start: {start_s:.1f} s (once per tuning run)")
    print(f"per candidate: local {lo * 1e3:.1f} ms, Ray {ry * 1e3:.1f} ms -> Ray adds "
          f"{over * 1e3:.1f} ms ({over / lo * 100:+.0f}%)")
    print(f"candidates per minute: local {60 / lo:.0f}, Ray (one node) {60 / ry:.0f}")
    # on paper: N nodes measure in parallel; the tuner builds (here) and searches serially
    tuner_s = build_s
    print("\nN measuring nodes (each measuring like this one; the tuner builds on its own "
          f"machine at {tuner_s * 1e3:.1f} ms/candidate):")
    for nodes in (1, 2, 4, 8, 16, 32):
        measured = nodes / ry
        limit = 1 / tuner_s
        print(f"  {nodes:3d} nodes: {60 * min(measured, limit):7.0f} candidates/min"
              f"{'  <- the tuner is the limit' if measured > limit else ''}")


if __name__ == "__main__":
    main()

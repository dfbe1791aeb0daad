"""The tuning loop: search, build, run, log, learn -- with a progress bar, resumable.

``trials`` is the number of distinct candidates measured per task *including those already in
the log*: re-running an interrupted ``tune(...)`` with the same arguments finishes the job
instead of starting over, and nothing in the log is measured again. Records are appended as
each measurement completes, so Ctrl-C (a clean stop) or even ``kill -9`` loses at most the
candidates in flight.

>>> tuning.tune([task], trials=200, log="matmul.jsonl", seed=0)     # doctest: +SKIP
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .cost_model import CostModel, RandomModel, XGBModel
from .features import FeatureCache
from .measure import LocalBuilder, LocalRunner, MeasureInput, MeasureResult, measure_batch
from .records import RecordWriter, load_records
from .search import EvolutionarySearch, SearchOptions
from .space import Candidate, SearchSpace
from .task import SearchTask, TuningError


@dataclass
class TuneResult:
    """What one task's tuning did: its best cost, the errors met, where the time went."""

    task: SearchTask
    trials: int = 0  # distinct candidates measured, log included
    new_trials: int = 0  # measured by this call
    best_cost: float = math.inf  # seconds per call
    errors: dict[str, int] = field(default_factory=dict)
    search_s: float = 0.0
    build_s: float = 0.0
    run_s: float = 0.0
    model_s: float = 0.0
    wall_s: float = 0.0
    interrupted: bool = False

    @property
    def best_gflops(self) -> float:
        if not math.isfinite(self.best_cost) or not self.task.flop_ct:
            return 0.0
        return self.task.flop_ct / self.best_cost / 1e9


def _progress(total: int, initial: int, desc: str, enabled: bool):  # type: ignore[no-untyped-def]
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="trial", disable=not enabled,
                dynamic_ncols=True, file=sys.stderr)


def tune(tasks: Sequence[SearchTask], trials: int = 200, log: str | None = None, seed: int = 0,
         batch_size: int = 16, cost_model: str | CostModel = "xgb",
         builder: LocalBuilder | None = None, runner: LocalRunner | None = None,
         search: SearchOptions | None = None, progress: bool = True) -> list[TuneResult]:
    """Search schedules for each task, measuring ``trials`` candidates per task.

    ``log`` (JSON lines) receives every measurement and is where a re-run resumes from;
    ``cost_model`` is ``"xgb"``, ``"random"`` or a `CostModel`; ``builder``/``runner``
    default to `LocalBuilder()` / `LocalRunner()` (closed at the end when created here).
    Tasks are tuned one after another. Returns one `TuneResult` per task.
    """
    if isinstance(tasks, SearchTask):
        tasks = [tasks]
    if trials < 0 or batch_size < 1:
        raise TuningError("tune: trials must be >= 0 and batch_size >= 1")
    own_builder, own_runner = builder is None, runner is None
    builder = builder or LocalBuilder()
    runner = runner or LocalRunner()
    features = FeatureCache(builder.map, builder.n_workers)
    writer = RecordWriter(log) if log else None
    results: list[TuneResult] = []
    try:
        for k, task in enumerate(tasks):
            res = _tune_task(task, trials, log, writer, np.random.default_rng([seed, k]),
                             batch_size, cost_model, features, builder, runner, search, progress)
            results.append(res)
            if res.interrupted:
                break
    except KeyboardInterrupt:  # outside a task's loop (resuming, building its space)
        print("tuning interrupted" + (f"; every record so far is in {log}" if log else ""),
              file=sys.stderr)
        builder.reset()
        runner.reset()
    finally:
        if writer is not None:
            writer.close()
        if own_builder:
            builder.close()
        if own_runner:
            runner.close()
    return results


def _make_model(cost_model: str | CostModel, seed: int, features: FeatureCache) -> CostModel:
    if isinstance(cost_model, CostModel):
        return cost_model
    if cost_model == "xgb":
        return XGBModel(seed=seed, features=features)
    if cost_model == "random":
        return RandomModel(seed=seed, features=features)
    raise TuningError(f"tune: unknown cost_model {cost_model!r} (use 'xgb', 'random' or a CostModel)")


def _tune_task(task: SearchTask, trials: int, log: str | None, writer: RecordWriter | None,
               rng: np.random.Generator, batch_size: int, cost_model: str | CostModel,
               features: FeatureCache, builder: LocalBuilder, runner: LocalRunner,
               options: SearchOptions | None, progress: bool) -> TuneResult:
    t_start = time.perf_counter()
    out = TuneResult(task)
    model = _make_model(cost_model, int(rng.integers(2**31)), features)
    space = SearchSpace(task)
    search = EvolutionarySearch(task, model, rng, options, space)
    # resume: everything in the log counts, trains the model and seeds the search
    old = load_records(log, task) if log else []
    seen: dict[str, float] = {}
    inputs: list[MeasureInput] = []
    old_results: list[MeasureResult] = []
    for r in old:
        if r.key in seen:
            continue
        seen[r.key] = r.mean
        cand = None
        if r.sketch is not None and 0 <= r.sketch < len(space.sketches):
            c = space.instantiate(r.sketch, dict(r.params))
            cand = c if c is not None and c.key == r.key else None
        search.mark_measured(r.key, r.mean, cand)
        inputs.append(MeasureInput(task, r.steps, r.sketch, r.params))
        old_results.append(r.result())
        out.errors[r.error.name] = out.errors.get(r.error.name, 0) + 1
    out.trials = len(seen)
    out.best_cost = min(seen.values(), default=math.inf)
    if inputs:
        t0 = time.perf_counter()
        model.update(inputs, old_results)
        out.model_s += time.perf_counter() - t0
    bar = _progress(trials, min(out.trials, trials), task.name, progress)

    def on_result(inp: MeasureInput, res: MeasureResult) -> None:
        # called as each measurement completes: log first, so a kill loses nothing
        if writer is not None:
            writer.write(inp, res)
        out.trials += 1
        out.new_trials += 1
        out.errors[res.error.name] = out.errors.get(res.error.name, 0) + 1
        if res.valid:
            out.best_cost = min(out.best_cost, res.mean)
        bad = sum(v for e, v in out.errors.items() if e != "NO_ERROR")
        bar.set_postfix(best=f"{out.best_gflops:.1f} GFLOP/s", errors=bad, refresh=False)
        bar.update(1)

    empty = 0
    try:
        while out.trials < trials:
            t0 = time.perf_counter()
            batch: list[Candidate] = search.next_batch(min(batch_size, trials - out.trials))
            out.search_s += time.perf_counter() - t0
            if not batch:
                empty += 1
                if empty >= 3:  # the space is exhausted
                    break
                continue
            empty = 0
            ins = [MeasureInput(task, c.steps, c.sketch, c.params) for c in batch]
            res, tb, tr = measure_batch(builder, runner, ins, on_result)
            out.build_s += tb
            out.run_s += tr
            t0 = time.perf_counter()
            search.update(batch, res)
            model.update(ins, res)
            out.model_s += time.perf_counter() - t0
    except KeyboardInterrupt:
        out.interrupted = True
        # results of the jobs in flight would otherwise be read as answers to the next jobs
        builder.reset()
        runner.reset()
        bar.write(f"tuning of {task.name} interrupted: {out.new_trials} new record(s) kept"
                  + (f" in {log}" if log else ""))
    finally:
        bar.close()
        out.wall_s = time.perf_counter() - t_start
    return out


__all__ = ["TuneResult", "tune"]

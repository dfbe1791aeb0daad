"""The tuning loop: search, build, run, log, learn -- for one task or many, resumable.

Budget. With one task, ``trials`` is the number of distinct candidates measured for it
*including those already in the log*. With several, the budget is ``trials * len(tasks)``
candidates in all (log included), spent in rounds of ``batch_size``: every task first gets one
round (warm-up), then rounds up to a floor (half of the budget shared out evenly:
`tuning.scheduler.floor_rounds`), then each round goes to the task whose next round promises
the largest drop
of the weighted latency ``sum_i weights[i] * best_cost_i`` (`GradientTaskScheduler`; a weight
is e.g. how often the kernel runs in a network), so one task may end with more than
``trials`` and another with fewer. Re-running an interrupted ``tune(...)`` with the same
arguments finishes the job instead of starting over, and nothing in the log is measured
again (every record of these tasks in the log counts, and the scheduler's history is rebuilt
from it). Records are appended as each measurement completes, so Ctrl-C (a clean stop) or
even ``kill -9`` loses at most the candidates in flight.

One cost model serves all tasks (as in Ansor): features mean the same in every task, and
`XGBModel` ranks within one query group per task, so the other tasks' measurements teach it
what a good loop nest looks like without their costs being compared. ``warm_start`` logs
pre-train it (their records of the tasks tuned here also seed the searches' elites). Each
batch is scored by the model before it is measured, which makes the batch held-out data for
the model that chose it: pairwise ranking accuracy and top-k recall are written to the log as
``"model_quality"`` lines (`tuning.records.load_model_quality`) and averaged on `TuneResult`.
`tune_report` tells the throughput and where the time went.

Costs are compared through the machine-speed index (`tuning.speed`): every result the
search, the cost model, the scheduler and ``remeasure`` see is normalised by the reference
time measured with it (to the machine's baseline: the median of the log's reference times
when the run resumes, else the first one the run sees); the log keeps the raw costs with the
index beside them. The final re-timing (`tuning.remeasure`) times the best few side by side
in the same rounds, and ranks them by those raw costs, which need no index. The returned
`TuneResult.best_cost` is the raw cost of its winner (the median of its re-timings, without the
timing that selected it), as `tuning.records.best_record` finds it in the log.

Measurement goes through the `tuning.protocols.Builder`/`Runner` interfaces (any
implementation; `LocalBuilder`/`LocalRunner` by default). A runner that is ``exclusive``
(it measures on this machine, as the local one) gets one batch at a time, and the tuner
searches, builds and measures in turn: the run is deterministic for a given ``seed``
(same candidates, same order, same records but for their timings). A runner that measures
elsewhere gets ``capacity`` batches in flight at once, each built and run in a thread of
its own while the tuner searches the next: every machine stays busy, but which batches the
model has learnt from when it proposes the next one depends on when measurements finish,
so such a run is not reproducible candidate for candidate (the log is still complete and
resumable). Either way every result is logged the moment it exists. Feature extraction for
the search has its own worker processes (`WorkerPool`), apart from the builder's.

>>> tuning.tune([task], trials=200, log="matmul.jsonl", seed=0)     # doctest: +SKIP
>>> tuning.tune([conv1, conv2, dense], trials=100, log="net.jsonl",  # doctest: +SKIP
...             weights=[4, 2, 1], warm_start=["other_net.jsonl"])
"""

from __future__ import annotations

import math
import os
import re
import sys
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .cost_model import CostModel, RandomModel, RankingQuality, XGBModel, ranking_quality
from .features import FeatureCache
from .measure import BuildResult, LocalBuilder, LocalRunner, MeasureInput, MeasureResult, WorkerPool
from .protocols import Builder, ResultCallback, Runner, check_builder, check_runner
from .records import Record, RecordWriter, load_records, middle, rank_rounds, ranked
from .remeasure import remeasure as remeasure_best
from .scheduler import GradientTaskScheduler, check_weights, floor_rounds
from .search import EvolutionarySearch, RandomSearch, SearchOptions, estimate
from .space import Candidate
from .speed import SpeedIndex
from .task import SearchTask, TuningError


class AllCandidatesFailedError(TuningError):
    """Every candidate of a task's first batches failed in the same way: tuning stopped.

    Such a failure is almost never the candidates' fault (a broken install, a workload the
    compiler cannot lower, a kernel that cannot run here) and would fail the whole budget.
    The log keeps the failed records; ``error`` and ``message`` are the error kind and one
    example message.
    """

    def __init__(self, msg: str, error: str, message: str) -> None:
        super().__init__(msg)
        self.error = error
        self.message = message


def _signature(res: MeasureResult) -> tuple[str, str]:
    """What two failures must share to count as "the same error": the kind and the last line
    of the message with its numbers blanked (candidates differ in sizes, not in the cause)."""
    lines = [ln for ln in res.error_msg.strip().splitlines() if ln.strip()]
    last = re.sub(r"\d+", "#", lines[-1].strip()) if lines else ""
    return res.error.name, last[:200]


def _gflops(task: SearchTask, cost: float) -> float:
    """GFLOP/s of ``task`` at ``cost`` seconds per call (0.0 when either is unknown)."""
    if not math.isfinite(cost) or not task.flop_ct:
        return 0.0
    return task.flop_ct / cost / 1e9


@dataclass
class TuneResult:
    """What one task's tuning did: its best cost, the errors met, where the time went.

    Times are wall seconds: each round's search, model training (and grading), build and run
    phases go to the task of that round; what no round owns (resuming, warm start, the
    scheduler) is shared out evenly among the tasks, so the tasks' ``wall_s`` add up to the
    call's wall time.
    """

    task: SearchTask
    trials: int = 0  # distinct candidates measured, log included
    new_trials: int = 0  # measured by this call
    # seconds per call of the best candidate: while tuning, the lowest normalised cost
    # (`tuning.speed`; what the scheduler weighs); when `tune` returns, the raw median of the
    # re-timings of the final re-timing's winner (`tuning.records.aggregate`;
    # the side-by-side ranking: `tuning.records.ranked`) -- the candidate and the figure
    # `tuning.records.best_record` gives for the log -- with its normalised cost in
    # ``best_normalised_cost``
    best_cost: float = math.inf
    best_normalised_cost: float = math.inf
    errors: dict[str, int] = field(default_factory=dict)
    search_s: float = 0.0
    build_s: float = 0.0
    run_s: float = 0.0
    model_s: float = 0.0
    wall_s: float = 0.0
    interrupted: bool = False
    weight: float = 1.0
    # the cost model graded on each batch of this task before learning from it
    model_quality: list[RankingQuality] = field(default_factory=list, repr=False)

    @property
    def best_gflops(self) -> float:
        return _gflops(self.task, self.best_cost)

    @property
    def model_pairwise_acc(self) -> float:
        """Mean pairwise ranking accuracy over the graded batches (nan: none graded)."""
        vals = [q.pairwise_acc for q in self.model_quality if math.isfinite(q.pairwise_acc)]
        return float(np.mean(vals)) if vals else math.nan

    @property
    def model_topk_recall(self) -> float:
        """Mean top-k recall over the graded batches (nan: none graded)."""
        vals = [q.topk_recall for q in self.model_quality if math.isfinite(q.topk_recall)]
        return float(np.mean(vals)) if vals else math.nan

    def summary(self) -> str:
        """`tune_report` of this task alone."""
        return tune_report([self])


def _pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.0f}%" if whole > 0 else "-"


def _fmt(x: float, spec: str) -> str:
    return format(x, spec) if math.isfinite(x) else "-"


def tune_report(results: Sequence[TuneResult]) -> str:
    """Throughput and where the time went, as text (``tune`` prints it when ``progress``).

    Trials per minute count the candidates built and measured by this call over its wall
    time. The time shares are of that wall time: *search* is the Python search (sampling,
    evolution, features, the model's predictions), *model* its training and grading,
    *build* and *run* the wall time of the compile and measure phases (in turn with an
    exclusive runner; with batches in flight they are summed over the batches and overlap
    the search and each other), *other* the rest (resuming, warm start, logging, the
    scheduler).
    """
    wall = sum(r.wall_s for r in results)
    new = sum(r.new_trials for r in results)
    rate = new / (wall / 60.0) if wall > 0 else 0.0
    parts = [("search", sum(r.search_s for r in results)), ("model", sum(r.model_s for r in results)),
             ("build", sum(r.build_s for r in results)), ("run", sum(r.run_s for r in results))]
    other = max(0.0, wall - sum(v for _, v in parts))
    lines = [f"tuned {len(results)} task(s): {new} new trial(s) in {wall:.1f} s = {rate:.1f} trials/min",
             "time: " + ", ".join(f"{name} {_pct(v, wall)}" for name, v in [*parts, ("other", other)])]
    rows = [("task", "weight", "trials", "new", "best ms", "GFLOP/s", "rank acc", "top-k", "errors")]
    for r in results:
        errs = ", ".join(f"{k}={v}" for k, v in sorted(r.errors.items()) if k != "NO_ERROR") or "-"
        rows.append((r.task.name, f"{r.weight:g}", str(r.trials), str(r.new_trials),
                     _fmt(r.best_cost * 1e3, ".4f"), f"{r.best_gflops:.1f}",
                     _fmt(r.model_pairwise_acc, ".2f"), _fmt(r.model_topk_recall, ".2f"), errs))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def _progress(total: int, initial: int, desc: str, enabled: bool):  # type: ignore[no-untyped-def]
    try:  # a notebook widget bar needs ipywidgets; without it tqdm.auto only warns
        import ipywidgets  # noqa: F401
        from tqdm.auto import tqdm
    except ImportError:
        from tqdm.std import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="trial", disable=not enabled,
                dynamic_ncols=True, file=sys.stderr)


def tune(tasks: Sequence[SearchTask], trials: int = 200, log: str | None = None, seed: int = 0,
         batch_size: int = 8, cost_model: str | CostModel = "xgb",
         builder: Builder | None = None, runner: Runner | None = None,
         search: SearchOptions | None = None, progress: bool = True,
         weights: Sequence[float] | None = None,
         warm_start: Sequence[str] | str | None = None, remeasure: int = 4) -> list[TuneResult]:
    """Search schedules for ``tasks``: ``trials`` candidates per task, shared out by need.

    ``batch_size`` candidates are measured per round, and the model learns after each: 8
    rather than 16 gives it twice the rounds, which found better schedules for the same
    trials at a modest cost in trials per minute (docs/benchmark-notes.md).
    ``log`` (JSON lines) receives every measurement and is where a re-run resumes from;
    ``cost_model`` is ``"xgb"``, ``"random"`` (random search: fresh samples of the space,
    no evolution -- the baseline) or a `CostModel` (one model for all tasks, steering the
    evolutionary search);
    ``builder``/``runner``: any `tuning.protocols.Builder` / `Runner` (module docstring for
    how a runner's ``capacity`` and ``exclusive`` shape the loop); default `LocalBuilder()` /
    `LocalRunner()` (closed at the end when created here). With several tasks the budget
    is ``trials * len(tasks)`` in all, given out by a gradient task scheduler that
    minimises ``sum(weights[i] * best_cost[i])``, after half of it was shared out evenly
    (`tuning.scheduler.TASK_FLOOR`: no task is starved)
    (``weights``: one float >= 0 per task, default 1.0). ``warm_start``: logs of earlier runs
    (any tasks) that pre-train the cost model; they are read, never written, and their
    records are not trials of this run. ``remeasure``: when the budget is spent, the best
    ``remeasure`` candidates of each task are timed again side by side, all of them in each
    round, until the same ones lead after two shared rounds (logged like any measurement,
    not counted as trials; a candidate timed once that overtakes them joins the next round,
    within a few rounds: `tuning.remeasure`); the winner is the fastest over the shared rounds
    by raw cost, and a re-timed candidate's cost is the median of its re-timings, without the
    timing that selected it -- the fastest of hundreds of noisy timings is the luckiest. Returns one `TuneResult`
    per task, in order.

    When a task's first two batches (8 candidates at least) all fail with the same error and
    none of its candidates ever succeeded, the cause is not the candidates (a workload that
    cannot be compiled or run here): tuning stops with `AllCandidatesFailedError`, which
    carries that error, instead of spending the budget on it; the log keeps the records.
    """
    if isinstance(tasks, SearchTask):
        tasks = [tasks]
    tasks = list(tasks)
    if not tasks:
        return []
    t_call = time.perf_counter()
    if trials < 0 or batch_size < 1:
        raise TuningError("tune: trials must be >= 0 and batch_size >= 1")
    w = check_weights(weights, len(tasks))
    seen: dict[str, SearchTask] = {}
    for t in tasks:
        if t.workload_key in seen:
            raise TuningError(f"tune: {t.name} and {seen[t.workload_key].name} are the same task "
                              f"(key {t.workload_key}); give it once, with the summed weight")
        seen[t.workload_key] = t
    warm = [warm_start] if isinstance(warm_start, str) else list(warm_start or [])
    for p in warm:
        if not os.path.exists(p):
            raise TuningError(f"tune: warm_start log {p!r} does not exist")
    if not isinstance(cost_model, CostModel) and cost_model not in ("xgb", "random"):
        raise TuningError(f"tune: unknown cost_model {cost_model!r} (use 'xgb', 'random' or a CostModel)")
    if builder is not None:
        check_builder(builder)
    if runner is not None:
        check_runner(runner)
    own_builder, own_runner = builder is None, runner is None
    # the measurers of the tasks' target kind; a cuda task on a machine without a GPU stops
    # here, before anything is searched or logged
    builder, runner = _measurers(tasks, builder, runner)
    # the search's own executor: a builder may live on other machines, features are here
    feature_pool = WorkerPool(prefix="features")
    features = FeatureCache(feature_pool.map, feature_pool.n_workers)
    writer = RecordWriter(log) if log else None
    # one random stream per task; each stream's first draw seeds a model, as when every task
    # had a model of its own, so a single task's search replays as it always did
    rngs = [np.random.default_rng([seed, k]) for k in range(len(tasks))]
    model_seeds = [int(rng.integers(2**31)) for rng in rngs]
    model = _make_model(cost_model, model_seeds[0], features)
    tuner = _Tuner(model, builder, runner, writer, log, seed, batch_size, search,
                   random_search=cost_model == "random")
    try:
        tuner.start(tasks, w, rngs, trials, warm, progress)
        tuner.loop()
        tuner.remeasure(remeasure)
    except KeyboardInterrupt:  # a clean stop: every record so far is in the log
        tuner.interrupt()
    finally:
        tuner.finish()
        if writer is not None:
            writer.close()
        if own_builder:
            builder.close()
        if own_runner:
            runner.close()
        feature_pool.close()
        # set-up, the final ranking and closing the pools belong to no round either
        tuner.share_rest(t_call)
    results = [run.result for run in tuner.runs]
    if progress and results:
        print(tune_report(results), file=sys.stderr)
    return results


def _measurers(tasks: Sequence[SearchTask], builder: Builder | None,
               runner: Runner | None) -> tuple[Builder, Runner]:
    """The builder and runner for ``tasks`` (the given ones, or the defaults of their target
    kind: `GpuBuilder`/`GpuRunner` for cuda); TuningError when they do not fit."""
    from tecomp.codegen.target import Target

    kinds = {Target.parse(t.target).kind for t in tasks}
    if len(kinds) > 1:
        raise TuningError(f"tune: the tasks mix target kinds {sorted(kinds)}; tune each kind in a call "
                          "of its own (candidates are measured on one device)")
    if kinds != {"cuda"}:
        return builder or LocalBuilder(), runner or LocalRunner()
    from .gpu_measure import GpuBuilder, GpuRunner

    if runner is None:
        runner = GpuRunner()  # raises at once without a GPU
    elif type(runner) is LocalRunner:
        raise TuningError("tune: cuda tasks are measured on a GPU; pass a tuning.gpu_measure.GpuRunner "
                          "(or no runner), not a LocalRunner (which runs CPU code)")
    if builder is None:
        builder = GpuBuilder()
    elif type(builder) is LocalBuilder:
        raise TuningError("tune: cuda tasks are built by a tuning.gpu_measure.GpuBuilder (PTX and the "
                          "launch filter), not a LocalBuilder")
    return builder, runner


def _make_model(cost_model: str | CostModel, seed: int, features: FeatureCache) -> CostModel:
    if isinstance(cost_model, CostModel):
        return cost_model
    if cost_model == "xgb":
        return XGBModel(seed=seed, features=features)
    if cost_model == "random":
        return RandomModel(seed=seed, features=features)
    raise TuningError(f"tune: unknown cost_model {cost_model!r} (use 'xgb', 'random' or a CostModel)")


KEEP_BUILDS = 8  # per task: the builds of its fastest candidates, kept for the final re-timing


class _Builds:
    """The builds of a task's fastest candidates so far (by normalised cost), at most ``keep``.

    The final re-timing (`tuning.remeasure`) times the best few again, in up to five rounds;
    building them anew for each round took about two thirds of its time, and that re-timing
    was 88 of the 635 s of a 576-trial MobileNet-V2 run (38 s with the builds kept). A build
    is a deterministic function of the candidate's steps: the same machine code is timed."""

    def __init__(self, keep: int = KEEP_BUILDS) -> None:
        self.keep = keep
        self._by_key: dict[str, tuple[float, BuildResult]] = {}

    def get(self, key: str) -> BuildResult | None:
        hit = self._by_key.get(key)
        return None if hit is None else hit[1]

    def offer(self, key: str, cost: float, build: BuildResult) -> None:
        """Keep ``build`` if its candidate (timed at ``cost``) is among the fastest so far."""
        if not math.isfinite(cost) or build.artifact is None:
            return
        old = self._by_key.get(key)
        self._by_key[key] = (cost if old is None else min(cost, old[0]), build)
        if len(self._by_key) > self.keep:
            del self._by_key[max(self._by_key, key=lambda k: self._by_key[k][0])]


class _TaskRun:
    """One task within a `tune` call: its search and its result so far."""

    def __init__(self, task: SearchTask, weight: float, rng: np.random.Generator, model: CostModel,
                 options: SearchOptions | None, random_search: bool = False) -> None:
        self.task = task
        self.result = TuneResult(task, weight=weight)
        space = task.make_space()
        self.space = space
        kind = RandomSearch if random_search else EvolutionarySearch
        self.search = kind(task, model, rng, options, space)
        # failures of this call's candidates while none has succeeded (for the early stop)
        self.failures: list[MeasureResult] = []
        # steps key -> the raw costs of each valid timing, in order (without a log to read)
        self.raw: dict[str, list[tuple[float, ...]]] = {}
        # the final re-timing's rounds: per round, each valid candidate's raw mean
        # (`tuning.records.rank_rounds`; without a log to read)
        self.rounds: list[dict[str, float]] = []
        # steps key -> (raw, normalised) mean of each confirmation timing of the re-timing's
        # winner, which its estimate rests on (`tuning.remeasure`; without a log to read)
        self.confirm: dict[str, list[tuple[float, float]]] = {}
        self.builds = _Builds()  # what the final re-timing need not build again
        # what the progress bar shows as this task's best: per timing the slower of its raw
        # and its normalised cost. The normalised one alone is what the scheduler weighs, but a
        # batch whose reference ran slow but whose candidates did not shows it faster than it
        # can be (161.6 GFLOP/s for a 94 GFLOP/s kernel, above the peak); the raw one alone
        # would count a fast moment of the machine
        self.shown_best = math.inf

    def candidate(self, rec: Record) -> Candidate | None:
        """The search's candidate for a logged record, when the space can re-create it."""
        if rec.sketch is None or not 0 <= rec.sketch < len(self.space.sketches):
            return None
        c = self.space.instantiate(rec.sketch, dict(rec.params))
        return c if c is not None and c.key == rec.key else None


@dataclass
class _Batch:
    """A batch of one task on its way through measurement."""

    i: int  # the task's index
    cands: list[Candidate]
    ins: list[MeasureInput]
    scores: np.ndarray | None  # the model's, before measuring (None: not trained yet)
    seq: int  # submission order


class _Tuner:
    """The state of one `tune` call: tasks, the shared model, the scheduler, the bar."""

    def __init__(self, model: CostModel, builder: Builder, runner: Runner,
                 writer: RecordWriter | None, log: str | None, seed: int, batch_size: int,
                 options: SearchOptions | None, random_search: bool = False) -> None:
        self.model, self.builder, self.runner = model, builder, runner
        self.random_search = random_search
        self.writer, self.log, self.seed = writer, log, seed
        self.batch_size, self.options = batch_size, options
        self.runs: list[_TaskRun] = []
        self.budget = 0
        self.done = 0  # distinct candidates of these tasks measured, log included
        self.shared_model_s = 0.0  # training no round owns (resume, warm start)
        self.sched: GradientTaskScheduler | None = None
        self.bar: Any = None  # tqdm
        # results arrive on measuring threads when batches are in flight concurrently
        self._lock = threading.Lock()
        self._build_lock = threading.Lock()  # a builder need not be thread-safe
        self.outstanding = 0  # candidates submitted whose result has not come back
        self.stopping = False  # after an error or Ctrl-C: late results are not logged
        # the machines' baselines every cost is normalised to (`tuning.speed`); set from the
        # log on resume, extended by the first index of a machine the run meets
        self.speed = SpeedIndex()

    def _norm(self, res: MeasureResult) -> MeasureResult:
        """``res`` with its costs normalised by its speed index (what everything but the log
        sees); the caller holds ``_lock`` where measuring threads may run."""
        self.speed.observe(res)
        return self.speed.normalise(res)

    # setting up ---------------------------------------------------------------------------------
    def start(self, tasks: Sequence[SearchTask], weights: Sequence[float],
              rngs: Sequence[np.random.Generator], trials: int, warm: Sequence[str], progress: bool) -> None:
        # the scheduler's own stream: the task streams are [seed, k]
        self.sched = GradientTaskScheduler(weights, np.random.default_rng([self.seed, len(tasks), 1]),
                                           min_rounds=floor_rounds(trials, self.batch_size, len(tasks)))
        self.budget = trials * len(tasks)
        for task, w, rng in zip(tasks, weights, rngs):
            t0 = time.perf_counter()
            self.runs.append(_TaskRun(task, w, rng, self.model, self.options, self.random_search))
            self.runs[-1].result.wall_s += time.perf_counter() - t0
        self._resume()
        if warm:
            self._warm_start(warm)
        self.done = sum(run.result.trials for run in self.runs)
        desc = tasks[0].name if len(tasks) == 1 else f"{len(tasks)} tasks"
        self.bar = _progress(self.budget, min(self.done, self.budget), desc, progress)
        self._postfix()

    def _resume(self) -> None:
        """Everything of these tasks in the log counts, trains the model, seeds the searches
        and replays the scheduler's history (one round per ``batch_size`` records)."""
        assert self.sched is not None
        by_key: dict[str, list[Record]] = {}
        logged = load_records(self.log) if self.log else []
        self.speed = SpeedIndex.from_records(logged)
        for r in logged:
            by_key.setdefault(r.task_key, []).append(r)
        inputs: list[MeasureInput] = []
        results: list[MeasureResult] = []
        for i, run in enumerate(self.runs):
            t0 = time.perf_counter()
            out = run.result
            seen: dict[str, float] = {}
            for r in by_key.get(run.task.workload_key, []):
                res = self._norm(r.result())
                if r.valid:
                    run.raw.setdefault(r.key, []).append(r.costs)
                if r.key in seen:  # a re-measurement: from now on judged on its re-timings
                    run.search.add_timing(r.key, res.mean)
                    continue
                seen[r.key] = res.mean
                run.search.mark_measured(r.key, res.mean, run.candidate(r))
                inputs.append(MeasureInput.of(run.task, r))
                results.append(res)
                out.errors[r.error.name] = out.errors.get(r.error.name, 0) + 1
            out.trials = len(seen)
            out.best_cost = run.search.best_cost()
            best = np.minimum.accumulate(list(seen.values())) if seen else np.zeros(0)
            for end in range(self.batch_size, len(best) + self.batch_size, self.batch_size):
                self.sched.observe(i, float(best[min(end, len(best)) - 1]))
            out.wall_s += time.perf_counter() - t0
        if inputs:
            t0 = time.perf_counter()
            self.model.update(inputs, results)
            self.shared_model_s += time.perf_counter() - t0

    def _warm_start(self, paths: Sequence[str]) -> None:
        """Pre-train the model on earlier logs; their best candidates of our tasks seed elites."""
        mine = {run.task.workload_key: run for run in self.runs}
        others: dict[str, SearchTask | None] = {}
        inputs: list[MeasureInput] = []
        results: list[MeasureResult] = []
        same: dict[str, list[Record]] = {}
        for p in paths:
            for r in load_records(p):
                run = mine.get(r.task_key)
                if run is not None:
                    task: SearchTask | None = run.task
                    same.setdefault(r.task_key, []).append(r)
                else:
                    if r.task_key not in others:
                        others[r.task_key] = _task_of(r, p)
                    task = others[r.task_key]
                if task is not None:
                    inputs.append(MeasureInput.of(task, r))
                    results.append(self._norm(r.result()))
        if inputs:
            t0 = time.perf_counter()
            self.model.pretrain(inputs, results)
            self.shared_model_s += time.perf_counter() - t0
        for key, recs in same.items():
            run = mine[key]
            n_elites = run.search.options.elites
            added = 0
            # instantiate only as many as can be elites: re-creating a candidate costs a schedule
            fresh = [r for r in recs if r.valid and r.key not in run.search.measured]
            for r in sorted(fresh, key=self.speed.cost)[: 4 * n_elites]:
                c = run.candidate(r)
                if c is not None:
                    run.search.add_elite(c, self.speed.cost(r))
                    added += 1
                    if added >= n_elites:
                        break

    # the loop -----------------------------------------------------------------------------------
    def loop(self) -> None:
        assert self.sched is not None
        if not self.runner.exclusive:
            self._loop_concurrent(self.runner.capacity)
            return
        while self.done < self.budget:
            i = self.sched.next_task()
            if i is None:  # every search space is exhausted
                break
            t_round = time.perf_counter()
            try:
                b = self._propose(i, min(self.batch_size, self.budget - self.done))
                if b is not None:
                    run = self.runs[i]
                    self._learn(b, *self._measure(b.ins, self._on_result(run), run.builds))
            finally:
                self.runs[i].result.wall_s += time.perf_counter() - t_round

    def _loop_concurrent(self, capacity: int) -> None:
        """Keep ``capacity`` batches in flight: each is built and run on a thread of its own
        while this thread searches the next; a finished batch is learnt from at once (in
        submission order when several finish together)."""
        assert self.sched is not None
        inflight: dict[Future[tuple[list[MeasureResult], float, float]], _Batch] = {}
        pool = ThreadPoolExecutor(capacity, thread_name_prefix="tecomp-measure")
        exhausted, seq = False, 0
        try:
            while True:
                while not exhausted and len(inflight) < capacity:
                    left = self.budget - self.done - self.outstanding
                    if left <= 0:
                        break
                    i = self.sched.next_task()
                    if i is None:
                        exhausted = True
                        break
                    t0 = time.perf_counter()
                    b = self._propose(i, min(self.batch_size, left), seq)
                    self.runs[i].result.wall_s += time.perf_counter() - t0
                    if b is None:
                        continue
                    seq += 1
                    self.runs[i].search.pending.update(c.key for c in b.cands)
                    with self._lock:
                        self.outstanding += len(b.ins)
                    run = self.runs[i]
                    inflight[pool.submit(self._measure, b.ins, self._on_result(run), run.builds)] = b
                if not inflight:
                    break
                finished, _ = wait(inflight, return_when=FIRST_COMPLETED)
                for f in sorted(finished, key=lambda f: inflight[f].seq):
                    b = inflight.pop(f)
                    res, tb, tr = f.result()  # a runner that raised stops tuning here
                    t0 = time.perf_counter()
                    self._learn(b, res, tb, tr)
                    self.runs[b.i].result.wall_s += time.perf_counter() - t0
        except BaseException:
            # abandon what is in flight (Ctrl-C, a hopeless task, a runner that raised):
            # nothing that finishes from now on is logged as if tuning went on
            self.stopping = True
            self.runner.reset()
            self.builder.reset()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def _propose(self, i: int, n: int, seq: int = 0) -> _Batch | None:
        """The next batch of task ``i``, scored by the model (None: its space is exhausted,
        and the task is retired)."""
        assert self.sched is not None
        run = self.runs[i]
        out = run.result
        batch: list[Candidate] = []
        for _ in range(3):  # an empty batch now and then is luck; three in a row, exhaustion
            t0 = time.perf_counter()
            batch = run.search.next_batch(n)
            out.search_s += time.perf_counter() - t0
            if batch:
                break
        if not batch:
            self.sched.retire(i)
            return None
        ins = [MeasureInput.of(run.task, c) for c in batch]
        scores = None
        if self.model.trained:
            # scored before measuring: the batch is held-out data for this model (the
            # features are cached from the search, so this is cheap)
            t0 = time.perf_counter()
            scores = self.model.predict(ins)
            out.model_s += time.perf_counter() - t0
        return _Batch(i, batch, ins, scores, seq)

    def _measure(self, ins: Sequence[MeasureInput], callback: ResultCallback,
                 builds: _Builds) -> tuple[list[MeasureResult], float, float]:
        """Build then run ``ins``; also the wall seconds of each phase. Every result goes
        through ``callback`` exactly once, also from a runner that never calls it. A candidate
        held in ``builds`` (its task's `_Builds`) is not built again, and the builds of the
        fastest are kept there."""
        reported: set[str] = set()

        def report(inp: MeasureInput, res: MeasureResult) -> None:
            if inp.key not in reported:
                reported.add(inp.key)
                callback(inp, res)

        t0 = time.perf_counter()
        with self._lock:
            kept = [builds.get(inp.key) for inp in ins]
        todo = [inp for inp, b in zip(ins, kept) if b is None]
        made: list[BuildResult] = []
        if todo:
            with self._build_lock:
                made = list(self.builder.build(todo))
            if len(made) != len(todo):
                raise TuningError(f"builder {type(self.builder).__name__} returned {len(made)} results "
                                  f"for {len(todo)} inputs")
        fresh = iter(made)
        built = [b if b is not None else next(fresh) for b in kept]
        t1 = time.perf_counter()
        results = self.runner.run(ins, built, report)
        if len(results) != len(ins):
            raise TuningError(f"runner {type(self.runner).__name__} returned {len(results)} results "
                              f"for {len(ins)} inputs")
        for inp, res in zip(ins, results):
            report(inp, res)
        with self._lock:  # measuring threads share the speed index and the task's builds
            for inp, b, res in zip(ins, built, results):
                if res.valid:
                    builds.offer(inp.key, self.speed.cost(res), b)
        return list(results), t1 - t0, time.perf_counter() - t1

    def _learn(self, b: _Batch, res: Sequence[MeasureResult], build_s: float, run_s: float) -> None:
        """What a measured batch teaches: the search, the model (graded first), the scheduler."""
        assert self.sched is not None
        with self._lock:  # measuring threads may be extending the baselines
            res = [self._norm(r) for r in res]
        run = self.runs[b.i]
        out = run.result
        out.build_s += build_s
        out.run_s += run_s
        t0 = time.perf_counter()
        run.search.update(b.cands, res)
        self.model.update(b.ins, res)
        if b.scores is not None:
            self._grade(run, b.scores, res)
        out.model_s += time.perf_counter() - t0
        self.sched.observe(b.i, out.best_cost)
        self._stop_if_hopeless(run)

    def _stop_if_hopeless(self, run: _TaskRun) -> None:
        """Raise `AllCandidatesFailedError` when the task's first two batches (8 candidates at
        least) all failed with the same error and nothing of it ever succeeded."""
        fails = run.failures
        need = max(2 * self.batch_size, 8)
        if math.isfinite(run.result.best_cost) or len(fails) < need or len(fails) != run.result.new_trials:
            return
        sigs = {_signature(r) for r in fails}
        if len(sigs) != 1:
            return
        kind = fails[0].error.name
        example = fails[0].error_msg.strip()
        where = f"; the log {self.log} keeps their records" if self.log else ""
        raise AllCandidatesFailedError(
            f"tuning {run.task.name} stopped: all {len(fails)} candidates so far failed with {kind}"
            f"{where}. The first one said:\n{example}", kind, example)

    def remeasure(self, k: int) -> None:
        """Re-time the best ``k`` candidates of every task (`tuning.remeasure`)."""
        remeasure_best(self, k)

    def _grade(self, run: _TaskRun, scores: np.ndarray, res: Sequence[MeasureResult]) -> None:
        q = ranking_quality(scores, [r.mean if r.valid else math.inf for r in res])
        if q is None:
            return
        run.result.model_quality.append(q)
        with self._lock:  # measuring threads may be writing records
            if self.writer is not None:
                self.writer.write_model_quality(run.task, run.result.trials, q.pairwise_acc,
                                                q.topk_recall, q.k, q.n)

    def _on_result(self, run: _TaskRun) -> Callable[[MeasureInput, MeasureResult], None]:
        out = run.result

        def on_result(inp: MeasureInput, res: MeasureResult) -> None:
            # called as each measurement completes (on a measuring thread when batches are
            # in flight concurrently): log first, so a kill loses nothing
            with self._lock:
                if self.stopping:
                    return
                if self.writer is not None:
                    self.writer.write(inp, res)
                out.trials += 1
                out.new_trials += 1
                self.done += 1
                self.outstanding = max(0, self.outstanding - 1)
                out.errors[res.error.name] = out.errors.get(res.error.name, 0) + 1
                if res.valid:
                    norm = self._norm(res).mean
                    out.best_cost = min(out.best_cost, norm)
                    run.shown_best = min(run.shown_best, max(norm, res.mean))
                    run.raw.setdefault(inp.key, []).append(res.costs)
                elif not math.isfinite(out.best_cost):
                    run.failures.append(res)
                self._postfix()
                if self.bar is not None:
                    self.bar.update(1)

        return on_result

    def _postfix(self) -> None:
        if self.bar is None:
            return
        post: dict[str, object] = {}
        # a task resumed from its log shows the log's best until this call times one
        best = [r.shown_best if math.isfinite(r.shown_best) else r.result.best_cost for r in self.runs]
        if len(self.runs) == 1:
            post["best"] = f"{_gflops(self.runs[0].task, best[0]):.1f} GFLOP/s"
        # what one pass over the weighted tasks costs (the objective the scheduler minimises,
        # each task at its `_TaskRun.shown_best`)
        lat = sum(r.result.weight * b for r, b in zip(self.runs, best) if r.result.weight > 0)
        post["latency"] = f"{lat * 1e3:.4g} ms" if math.isfinite(lat) else "-"
        post["errors"] = sum(v for r in self.runs for e, v in r.result.errors.items() if e != "NO_ERROR")
        self.bar.set_postfix(post, refresh=False)

    # ending -------------------------------------------------------------------------------------
    def interrupt(self) -> None:
        for run in self.runs:
            run.result.interrupted = True
        # results of the jobs in flight would otherwise be read as answers to the next jobs
        self.builder.reset()
        self.runner.reset()
        new = sum(run.result.new_trials for run in self.runs)
        msg = (f"tuning interrupted: {new} new record(s) kept" + (f" in {self.log}" if self.log else ""))
        if self.bar is not None:
            self.bar.write(msg)
        else:
            print(msg, file=sys.stderr)

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if not self.runs:
            return
        n = len(self.runs)
        for run in self.runs:
            run.result.model_s += self.shared_model_s / n
        self._final_best()

    def share_rest(self, t_call: float) -> None:
        """Share out what no round owns, from the call's first line to its last, so the
        tasks' wall times add up to the call's."""
        if not self.runs:
            return
        rest = time.perf_counter() - t_call - sum(run.result.wall_s for run in self.runs)
        for run in self.runs:
            run.result.wall_s += max(0.0, rest) / len(self.runs)

    def _final_best(self) -> None:
        """Each result's best and its raw mean: the winner of the final side-by-side
        re-timing (`tuning.remeasure`), or without one the lowest normalised cost -- as
        `best_record` picks it from the log (`tuning.records.ranked`), or without a log from
        the run's rounds and search; either way a candidate timed more than once is judged
        without the timing that selected it (`tuning.records.aggregate`)."""
        every = load_records(self.log) if self.log else []
        index = SpeedIndex.from_records(every)
        for run in self.runs:
            out = run.result
            mine = [r for r in every if r.task_key == run.task.workload_key and r.valid]
            if mine:
                best = ranked(mine, index)[0]
                out.best_cost, out.best_normalised_cost = best.mean, index.cost(best)
            elif not self.log and any(run.raw.values()):
                measured = run.search.measured
                final = rank_rounds(run.rounds)
                key = final[0] if final else min((k for k, v in run.raw.items() if v),
                                                 key=lambda k: measured.get(k, math.inf))
                confirmed = run.confirm.get(key)
                if confirmed:
                    # judged on them alone: the middle one (or two) by normalised cost, as
                    # `aggregate` reads a log (`middle_timings`)
                    mid = middle(confirmed, key=lambda t: t[1])
                    out.best_cost = float(np.mean([raw for raw, _ in mid]))
                    out.best_normalised_cost = float(np.mean([norm for _, norm in mid]))
                    continue
                out.best_normalised_cost = measured.get(key, math.inf)
                # the median of its re-timings' raw means, as `estimate` judges it while tuning
                # and `aggregate` reads it from a log
                out.best_cost = estimate([float(np.mean(t)) for t in run.raw[key]])


def _task_of(rec: Record, path: str) -> SearchTask | None:
    """The task of a warm-start record of another task; None (with a warning) if it cannot
    be rebuilt here."""
    task, why = rec.task_or_why()
    if task is None:
        warnings.warn(f"warm_start {path}: skipping the records of {rec.workload}{tuple(rec.args)} ({why})",
                      RuntimeWarning, stacklevel=4)
    return task


__all__ = ["AllCandidatesFailedError", "TuneResult", "tune", "tune_report"]

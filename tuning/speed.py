"""The machine-speed index: a fixed reference kernel timed with every batch of measurements.

A shared machine drifts: the same compiled kernel, timed 45 minutes apart on one of these
2-core VMs, took 0.15 ms and then 0.28-0.40 ms (short parallel kernels suffer most: their
threads wait for a core another tenant holds). A candidate's cost alone cannot tell a slow
schedule from a slow moment, so the measuring process also times a *reference kernel* -- a
small fp32 matmul with a fixed schedule, of the order of the candidates' run time -- once per
batch, the way it times candidates (`reference_job`), and every result carries that time as
``ref_s`` (`tuning.measure.MeasureResult`, `tuning.records.Record`). A batch whose index
spikes above what the runner has seen lately waits for the spike to pass and times it again
(`SettledReference`): a spell of a fraction of a second slows candidates by factors of their
own, so an index taken in it would mislead more than it corrects.

The reference comes in two kinds, and a candidate carries the one of its own kind
(``ref_kind``, `kind_of`): the kernel with its rows in parallel for candidates with a parallel
loop (or of unknown form: a template), the same kernel on one thread for the others. They
drift apart: while another tenant keeps one core busy, a parallel kernel here waits a
scheduler time slice for its second thread (0.12 ms became ~8 ms on the 2-core VM this was
written on) and a one-thread kernel runs at its usual speed; normalising a one-thread
candidate by the parallel index would make it look 60x faster than it is.

Candidates measured at different times are then compared through their *normalised cost*,
``mean cost x baseline / ref_s``, where the baseline is a reference time of the same machine
and kind (`SpeedIndex`: for a log, the median of that machine's reference times of that
kind in it; for a tuning run, the log's median when it resumes, else the first reference
time it sees), the ratio kept within `MAX_DRIFT` and taken as 1 within `NOISE_BAND` (a
reference a few percent off its baseline is the reference's own noise: the raw costs of
longer kernels are steadier than that, `drift_factor`). A result
without an index (an old record, a GPU measurement: no GPU reference kernel exists yet, so
`tuning.gpu_measure`'s runners leave ``ref_s`` empty) is compared by its raw cost. Raw costs
are never rewritten in a log; the normalised cost is computed where it is used.

`retime` re-times the best records of a log now, side by side in one fresh measuring
process (``tecomp show-log LOG --retime N``), so a user can see whether a log's claims hold.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from .machine import Machine
    from .measure import BuildResult, RunOptions
    from .records import Record
    from .task import SearchTask

# the reference kernel: C[N, M] = A[N, K] @ B[K, M] summed REFERENCE_SWEEPS times over its
# reduction, fp32 (rows in parallel for the parallel kind). ~0.045 ms (parallel) and ~0.09 ms
# (serial) on a 2-core AVX2 VM, the range of the short parallel candidates that drift most.
# Its arrays take 128 KiB: a process draws where their pages fall, and the 320 KiB of the
# first reference (128x256x128 in one sweep) ran 0.050-0.060 ms (serial 0.093-0.114) from one
# process to the next on a 2-core Zen 3 VM, by how they met in its 512 KiB L2, against
# 0.0448-0.0456 (serial 0.087-0.090) for this one: a process that drew an edge shifted every
# cost it normalised by ~10% (docs/benchmark-notes.md)
REFERENCE_SHAPE = (128, 64, 128)
REFERENCE_SWEEPS = 4
# timings per reference measurement; the median is the index (one slow repeat is noise)
REFERENCE_REPEAT = 5
# repeats of one reference measurement further apart than this (max / min, its ``spread``):
# the machine's speed changed while it was timed, so it indexes nothing (it is logged, and
# the batch is compared by raw cost)
UNSTEADY = 1.5
# the most a normalisation scales a cost by, either way. The index models a machine that runs
# everything k times slower (the 2-2.6x drift); a larger ratio is mostly another
# tenant taking a core, which costs a parallel kernel a scheduler time slice per call -- an
# additive stall that a 0.1 ms reference feels 50x and a 10 ms candidate 2x -- and scaling
# by it in full would turn a candidate timed in that moment into a false best
MAX_DRIFT = 3.0
# a reference time within this ratio of the baseline (either way) is the reference's own
# noise, not the machine's drift: costs are then compared raw. Measured on a quiet 2-core Zen 3
# (2026-11-25, with the first, 320 KiB reference; the 128 KiB one varies less between
# processes): the parallel reference of one 10-minute tuning run ranged 0.0567-0.0594 ms
# (10th-90th percentile) and single measurements in later fresh processes 0.0543-0.0601 ms,
# while those processes re-timed 23 logged convolutions (0.6-1.7 ms) within 1-3% of their raw
# logged times; normalising by each fresh reference put 7 of them 5-8% off their claims.
NOISE_BAND = 1.1
# the kinds of reference (module docstring), as records name them. A kind names one kernel:
# records timed beside the first reference (``ref_kind`` "parallel"/"serial", tecomp before
# the 128 KiB kernel) keep their kinds, so their baselines stay apart from the new kernel's
PARALLEL, SERIAL = "parallel2", "serial2"
KINDS = (PARALLEL, SERIAL)
LEGACY_PARALLEL, LEGACY_SERIAL = "parallel", "serial"
RECORD_KINDS = (*KINDS, LEGACY_PARALLEL, LEGACY_SERIAL)  # what a record's ref_kind may be

_REFERENCE: dict[str, Any] = {}  # per measuring process: the compiled kernels and their arrays


def drift_factor(baseline: float, ref_s: float) -> float:
    """What a cost timed beside reference time ``ref_s`` is multiplied by to be in the units
    of the machine at ``baseline``: ``baseline / ref_s``, 1.0 within `NOISE_BAND` (the
    reference's own noise), kept within [1 / `MAX_DRIFT`, `MAX_DRIFT`]."""
    f = baseline / ref_s
    if 1.0 / NOISE_BAND <= f <= NOISE_BAND:
        return 1.0
    return min(MAX_DRIFT, max(1.0 / MAX_DRIFT, f))


def kind_of(steps: Sequence[Any]) -> str:
    """The reference kind that indexes a candidate of these steps: `PARALLEL` when one of
    them parallelises a loop or when they are a template's configuration (whose schedule is
    code: it may), `SERIAL` otherwise."""
    from .steps import AnnotationStep

    for st in steps:
        if isinstance(st, AnnotationStep):
            if st.annotation == "parallel":
                return PARALLEL
        elif type(st).__name__ == "TemplateConfigStep":
            return PARALLEL
    return SERIAL


def _reference_kernel() -> tuple[dict[str, Any], list[Any]]:
    """The reference kernels (by kind) and their arrays, built once per process (a fixed
    schedule, host target: they measure the machine, not a candidate)."""
    if "f" not in _REFERENCE:
        import numpy as np

        import tecomp as tc
        from tecomp import te

        from .measure import aligned_empty

        n, k, m = REFERENCE_SHAPE
        A = te.placeholder((n, k), "float32", name="A")
        B = te.placeholder((k, m), "float32", name="B")
        t = te.reduce_axis((0, REFERENCE_SWEEPS), name="t")
        r = te.reduce_axis((0, k), name="r")
        C = te.compute((n, m), lambda i, j: te.sum(A[i, r] * B[r, j], axis=[t, r]), name="C")
        funcs = {}
        for kind in KINDS:
            s = te.create_schedule(C.op)
            i, j = s[C].leaf_iter_vars[:2]  # the spatial axes (the reduction follows)
            io, ii = s[C].split(i, factor=4)
            jo, ji = s[C].split(j, factor=16)
            s[C].reorder(io, jo, t, r, ii, ji)
            if kind == PARALLEL:
                s[C].parallel(io)
            s[C].unroll(ii)
            s[C].vectorize(ji)
            funcs[kind] = tc.build(s, [A, B, C], target="llvm", name="speed_reference")["speed_reference"]
        rng = np.random.default_rng(0)
        arrays = [aligned_empty((n, k), "float32"), aligned_empty((k, m), "float32"),
                  aligned_empty((n, m), "float32")]
        arrays[0][...] = rng.uniform(-1.0, 1.0, (n, k))
        arrays[1][...] = rng.uniform(-1.0, 1.0, (k, m))
        _REFERENCE["f"], _REFERENCE["arrays"] = funcs, arrays
    return _REFERENCE["f"], _REFERENCE["arrays"]


def _calibrated(f: Any, arrays: Sequence[Any], opts: RunOptions) -> Any:
    """A one-repeat timer for ``f`` with calls per repeat chosen as `tuning.measure`'s run
    job chooses them for a candidate (from one call's time, at least ``min_repeat_ms``)."""
    t0 = time.perf_counter()
    f(*arrays)
    first = time.perf_counter() - t0
    number = max(opts.number, math.ceil(opts.min_repeat_ms / 1e3 / max(first, 1e-9)))
    return f.time_evaluator(number=number, repeat=1, min_repeat_ms=0, warmup=0)


def reference_job(opts: RunOptions) -> dict[str, tuple[float, float]]:
    """Seconds per call of each kind of reference kernel now, with the spread of its repeats
    (runs in the measuring process, once per batch)."""
    funcs, arrays = _reference_kernel()
    # the parallel kind last: the batch's first candidate follows work on every core, not a
    # one-thread kernel that left the other core idle (each is warmed, `tuning.measure.warm_up`)
    return {kind: _time_reference(funcs[kind], arrays, opts) for kind in (SERIAL, PARALLEL)}


def _time_reference(f: Any, arrays: Sequence[Any], opts: RunOptions) -> tuple[float, float]:
    """The median of `REFERENCE_REPEAT` repeats of ``f`` timed as candidates are, and their
    spread (max / min)."""
    from .measure import _flush_cache, warm_up

    ev = _calibrated(f, arrays, opts)
    warm_up(ev, arrays, opts, 0.0)  # a reference call is far shorter than the warm-up
    flush: list[Any] = []
    times: list[float] = []
    t0 = time.perf_counter()
    # on a machine so loaded that the repeats crawl, fewer of them (as a slow candidate gets):
    # the index must not cost the batch more than a candidate does
    while len(times) < REFERENCE_REPEAT and (not times or time.perf_counter() - t0 < opts.budget_s):
        if opts.flush_cache:
            _flush_cache(flush)
        times.append(float(ev(*arrays).results[0]))
    return statistics.median(times), max(times) / min(times)


# one index per batch, timed out of the machine's short slow spells ----------------------------

# a batch's reference more than this above the runner's recent typical one (the median of its
# last `SETTLE_HISTORY` batches of that kind) is timed again, for at most `SETTLE_S`
SETTLE_RATIO = NOISE_BAND
SETTLE_S = 1.0
SETTLE_PAUSE_S = 0.05  # between attempts: long enough for a neighbour's burst to pass
SETTLE_HISTORY = 15
# and at most this share of the previous batch's measuring time: a tuning batch on a 2-core VM
# takes 10-20 s, where a second of waiting costs little, while the small batches of a test or a
# cheap task would double
SETTLE_SHARE = 0.1


class SettledReference:
    """The machine-speed index of each batch, timed again while the machine is in a short
    slow spell (one per runner; the measuring itself is ``measure``, a call of the measuring
    process's `reference_job`).

    Why. On 2-core VMs shared with other tenants the parallel reference runs in two states: on
    a Zen 4 VM about one batch in ten (sometimes a few in a row) timed it 1.5-1.9x slower than
    the rest, and a 2-core Zen 3 VM 1.4-1.6x in about one in five. Those spells last a fraction
    of a second to a few seconds, and the candidates timed in them slow down by factors of their
    own (1.2x to 1.85x for the same spell), so a cost divided by an index taken in one is
    mostly wrong -- too fast when the index slowed more (a false best, an optimistic claim in
    the log), too slow when it slowed less. A batch whose index is `SETTLE_RATIO` above what
    this runner has seen lately therefore waits for the spell to pass: the index is timed again
    after `SETTLE_PAUSE_S`, for up to `SETTLE_S`, and the batch's candidates follow the last
    attempt, in the machine's usual state. A machine that stays slow (the drift the index is
    for) keeps its slow index: after `SETTLE_S` the last attempt stands, and after a few such
    batches it is the typical one. Only the kinds ``take`` is asked for are judged. A runner
    waits at most `SETTLE_SHARE` of its previous batch's measuring time.
    """

    def __init__(self, measure: Callable[[], dict[str, tuple[float, float]]], settle_s: float = SETTLE_S,
                 pause_s: float = SETTLE_PAUSE_S, history: int = SETTLE_HISTORY,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.measure = measure
        self.settle_s = settle_s
        self.pause_s = pause_s
        self.recent: dict[str, deque[float]] = {}
        self._history = history
        self._sleep = sleep
        self._clock = clock
        self.attempts = 0  # reference measurements made (a counter for tests and benchmarks)
        self.settled = 0  # batches whose first index was timed again

    def typical(self, kind: str) -> float | None:
        """The median index of ``kind`` over the recent batches (None before any)."""
        seen = self.recent.get(kind)
        return statistics.median(seen) if seen else None

    def _slow(self, refs: dict[str, tuple[float, float]], kinds: Iterable[str]) -> bool:
        for kind in kinds:
            usual = self.typical(kind)
            got = refs.get(kind)
            # a missing or unsteady index (`UNSTEADY`) is a slow moment too: it indexes nothing
            if usual is not None and (got is None or got[0] > SETTLE_RATIO * usual or got[1] > UNSTEADY):
                return True
        return False

    def take(self, kinds: Iterable[str] = KINDS, budget_s: float | None = None) -> dict[str, tuple[float, float]]:
        """The index for the batch about to be measured, by kind (as ``measure`` gives it;
        empty when it failed), waiting at most ``budget_s`` (and ``settle_s``) for a slow
        spell to pass."""
        kinds = tuple(kinds)
        settle_s = self.settle_s if budget_s is None else min(self.settle_s, budget_s)
        t0 = self._clock()
        refs = self.measure()
        self.attempts += 1
        if self._slow(refs, kinds):
            self.settled += 1
            while self._clock() - t0 < settle_s:
                self._sleep(self.pause_s)
                refs = self.measure()
                self.attempts += 1
                if not self._slow(refs, kinds):
                    break
        for kind, (t, spread) in refs.items():
            if spread <= UNSTEADY:
                self.recent.setdefault(kind, deque(maxlen=self._history)).append(t)
        return refs


# comparing through the index -----------------------------------------------------------------


class Indexed(Protocol):
    """What a `MeasureResult` and a `Record` share for normalisation."""

    @property
    def costs(self) -> tuple[float, ...]: ...
    @property
    def ref_s(self) -> float | None: ...
    @property
    def ref_kind(self) -> str: ...
    @property
    def ref_spread(self) -> float | None: ...
    @property
    def machine(self) -> Machine | None: ...
    @property
    def valid(self) -> bool: ...
    @property
    def mean(self) -> float: ...


T = TypeVar("T", bound=Indexed)


def _machine_key(res: Indexed) -> str:
    """Where a baseline applies: the machine and the kind of reference."""
    return f"{res.machine.id if res.machine is not None else ''}/{res.ref_kind or PARALLEL}"


def _usable(res: Indexed) -> bool:
    """Whether ``res`` has an index that can normalise: a time, measured while the machine's
    speed held (spread within `UNSTEADY`; an aggregate's combined index has none)."""
    ref, spread = res.ref_s, res.ref_spread
    return (ref is not None and math.isfinite(ref) and ref > 0
            and (spread is None or spread <= UNSTEADY))


class SpeedIndex:
    """Reference times per measuring machine and kind (``baselines``: ``"machine id/kind"``,
    the id "" when unknown, to seconds) and the normalised costs they give.

    ``cost(res) = res.mean * baseline / res.ref_s`` (the ratio bounded by `MAX_DRIFT`) for a
    valid result with an index on a machine with a baseline; its raw mean otherwise (inf when
    it failed). Normalised costs are in the units of the machine at its baseline speed, so
    only their order and ratios are meant to be compared.
    """

    def __init__(self, baselines: dict[str, float] | None = None) -> None:
        self.baselines: dict[str, float] = dict(baselines or {})

    @classmethod
    def from_records(cls, records: Iterable[Indexed]) -> SpeedIndex:
        """The median reference time of each machine and kind over ``records`` (a log's)."""
        refs: dict[str, list[float]] = {}
        for r in records:
            if _usable(r):
                refs.setdefault(_machine_key(r), []).append(float(r.ref_s))  # type: ignore[arg-type]
        return cls({k: statistics.median(v) for k, v in refs.items()})

    def observe(self, res: Indexed) -> None:
        """Adopt ``res``'s reference time as its machine's baseline if it has none yet (a
        baseline never changes after: costs normalised earlier must stay comparable)."""
        if _usable(res):
            self.baselines.setdefault(_machine_key(res), float(res.ref_s))  # type: ignore[arg-type]

    def factor(self, res: Indexed) -> float:
        """What ``res``'s raw costs are multiplied by (1.0: compared raw): `drift_factor`
        of its machine's baseline and its reference time."""
        base = self.baselines.get(_machine_key(res))
        if base is None or not _usable(res):
            return 1.0
        return drift_factor(base, float(res.ref_s))  # type: ignore[arg-type]

    def cost(self, res: Indexed) -> float:
        """The normalised mean cost of ``res`` (inf when it failed)."""
        return res.mean * self.factor(res) if res.valid else math.inf

    def normalise(self, res: T) -> T:
        """``res`` with normalised costs and its machine's baseline as ``ref_s`` (so that
        normalising it again gives what normalising the raw result would, up to the
        `MAX_DRIFT` bound); unchanged when it has no index."""
        f = self.factor(res)
        if f == 1.0 or not res.costs:
            return res
        base = self.baselines[_machine_key(res)]
        return dataclasses.replace(res, costs=tuple(c * f for c in res.costs), ref_s=base)  # type: ignore[type-var]


def combined_ref(records: Sequence[Indexed], index: SpeedIndex) -> float | None:
    """The reference time of the union of ``records``' timings (one candidate measured several
    times): the ``r`` with ``mean(all costs) * baseline / r`` equal to the mean of every
    timing normalised by its own record's index. None when none of them has an index."""
    if not any(_usable(r) for r in records):
        return None
    raw = [c for r in records for c in r.costs]
    norm = [c * index.factor(r) for r in records for c in r.costs]
    base = index.baselines.get(_machine_key(records[-1]))
    if base is None or not norm or sum(norm) <= 0:
        return None
    return base * (sum(raw) / len(raw)) / (sum(norm) / len(norm))


# re-timing a log's claims now ------------------------------------------------------------------


@dataclass(frozen=True)
class Retimed:
    """One record of a log re-timed now (`retime`)."""

    record: Record
    logged_s: float  # its mean raw cost in the log (`tuning.records.aggregate`: re-timings if any)
    normalised_s: float  # its normalised cost in the log
    fresh_s: float  # the median of its fresh rounds (inf: it failed now: ``error``)
    # ``fresh_s`` normalised as the log's records are (the log's baseline of this machine and
    # kind / the reference time now); ``fresh_s`` when the log has no such baseline
    fresh_normalised_s: float
    kind: str  # the kind of reference that indexes it (`kind_of`)
    ref_now_s: float  # the median reference time of that kind in this re-timing
    error: str = ""


def retime_job(task: SearchTask, builds: Sequence[BuildResult], kinds: Sequence[str], opts: RunOptions,
               rounds: int, cache_dir: str) -> tuple[list[list[float]], dict[str, list[float]], list[str]]:
    """Time ``builds`` of ``task`` side by side on the same arrays (runs in a fresh measuring
    process): ``rounds`` rounds, each timing every kernel once (one calibrated repeat) right
    after the reference kernel of its kind (``kinds``). Returns the per-kernel times, the
    reference times by kind and per-kernel errors ("" when it ran)."""
    from tecomp.codegen.backend import backend_for

    from .measure import _PREPARED, _prepare_job, kernel_args

    key = _prepare_job(task, cache_dir)
    arrays = _PREPARED[key]["arrays"]
    ref_funcs, ref_arrays = _reference_kernel()
    ref_evs = {kind: _calibrated(ref_funcs[kind], ref_arrays, opts) for kind in set(kinds)}
    timers: list[Any] = []
    errors: list[str] = []
    for b in builds:
        try:
            if b.artifact is None:
                raise RuntimeError(b.error_msg or b.error.name)
            mod = backend_for(b.artifact.target).load(b.artifact)
            args = kernel_args(mod, b, arrays)
            timers.append((_calibrated(mod[b.func_name], args, opts), args))
            errors.append("")
        except Exception as e:  # noqa: BLE001 - a candidate that cannot run now is reported
            timers.append(None)
            errors.append(f"{type(e).__name__}: {e}")
    times: list[list[float]] = [[] for _ in builds]
    refs: dict[str, list[float]] = {kind: [] for kind in ref_evs}
    for _ in range(rounds):
        for k, timer in enumerate(timers):
            refs[kinds[k]].append(float(ref_evs[kinds[k]](*ref_arrays).results[0]))
            if timer is not None:
                times[k].append(float(timer[0](*timer[1]).results[0]))
    return times, refs, errors


def retime(log: str, n: int, rounds: int = 7, opts: RunOptions | None = None,
           ) -> list[tuple[SearchTask, list[Retimed]]]:
    """Re-time the best ``n`` records (by normalised cost) of every CPU task of ``log`` now.

    Per task: one fresh measuring process times them in ``rounds`` interleaved rounds on the
    same arrays, each right after the reference kernel of its kind. Returns, per task, its
    re-timed records in the log's order of normalised cost. Tasks that cannot be rebuilt
    here or are not for a CPU are skipped with a warning.
    """
    import os
    import shutil
    import tempfile
    import warnings

    from tecomp.codegen.target import Target

    from .machine import local_machine
    from .measure import MeasureErrorNo, RunOptions, _build_job, _Died, _Failure, _Worker
    from .records import iter_records, ranked
    from .task import TuningError

    if n < 1 or rounds < 1:
        raise TuningError(f"retime: n and rounds must be >= 1, got {n} and {rounds}")
    opts = opts or RunOptions()
    every = list(iter_records(log))
    index = SpeedIndex.from_records(every)
    here = local_machine().id
    by_task: dict[str, list[Record]] = {}
    for r in every:
        by_task.setdefault(r.task_key, []).append(r)
    out: list[tuple[SearchTask, list[Retimed]]] = []
    for recs in by_task.values():
        best = ranked(recs, index)[:n]  # in the order export picks from
        if not best:
            continue
        task, why = best[0].task_or_why()
        if task is None:
            warnings.warn(f"retime: skipping {best[0].workload}{tuple(best[0].args)}: {why}",
                          RuntimeWarning, stacklevel=2)
            continue
        if Target.parse(task.target).kind != "llvm":
            warnings.warn(f"retime: skipping {task.name}: only CPU (llvm) tasks are re-timed "
                          "(there is no GPU reference kernel)", RuntimeWarning, stacklevel=2)
            continue
        builds = [_build_job(task, r.steps, "default_function") for r in best]
        kinds = [kind_of(r.steps) for r in best]
        workdir = tempfile.mkdtemp(prefix="tecomp-retime-")
        worker = _Worker(os.path.join(workdir, "retime.log"))
        try:
            worker.submit(retime_job, task, builds, kinds, opts, rounds, workdir)
            res = worker.receive(None)
        except _Died as e:
            raise TuningError(f"retime: the measuring process died re-timing {task.name}: {e}") from None
        finally:
            worker.stop()
            shutil.rmtree(workdir, ignore_errors=True)
        if isinstance(res, _Failure):
            raise TuningError(f"retime: re-timing {task.name} failed: {res.message}")
        times, refs, errors = res
        rows = []
        for r, b, kind, t, err in zip(best, builds, kinds, times, errors):
            if b.error != MeasureErrorNo.NO_ERROR:
                err = err or b.error.name
            fresh = statistics.median(t) if t else math.inf
            ref_now = statistics.median(refs[kind]) if refs.get(kind) else math.nan
            base = index.baselines.get(f"{here}/{kind}")
            scale = drift_factor(base, ref_now) if base is not None and ref_now > 0 else 1.0
            rows.append(Retimed(r, r.mean, index.cost(r), fresh, fresh * scale, kind, ref_now, err))
        out.append((task, rows))
    return out


__all__ = ["KINDS", "LEGACY_PARALLEL", "LEGACY_SERIAL", "MAX_DRIFT", "NOISE_BAND", "PARALLEL",
           "RECORD_KINDS", "REFERENCE_REPEAT", "REFERENCE_SHAPE", "REFERENCE_SWEEPS", "SERIAL",
           "SETTLE_RATIO", "SETTLE_S", "SETTLE_SHARE", "UNSTEADY", "Retimed", "SettledReference", "SpeedIndex",
           "combined_ref", "drift_factor", "kind_of", "reference_job", "retime", "retime_job"]

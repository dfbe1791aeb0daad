"""Building and measuring candidates in worker processes that may crash, hang or lie.

`LocalBuilder` compiles a batch in parallel worker processes: steps are replayed, lowered and
compiled to an object file (bytes), so the compiler's work is done once and travels cheaply.
`LocalRunner` loads each object into an MCJIT engine in a separate measuring process, runs it
once against the output of the task's *default* schedule (computed once per task in that
process and cached on disk, so no numpy model of the workload is needed), then times it.
They are the default implementations of `tuning.protocols.Builder` and `Runner`, which is all
the tuner knows of them; every result names the machine that measured it, as the measuring
process reports it (`LocalRunner.machine`, `tuning.machine`). `WorkerPool` is the executor
under the builder, and separately under the search's feature extraction.

Every failure becomes a `MeasureErrorNo` instead of an exception: a segfault or ``abort`` in a
kernel kills only the measuring process (RUN_CRASH), a kernel that never returns is killed at
the deadline (RUN_TIMEOUT), a compiler that hangs likewise (BUILD_TIMEOUT). The dead process
is replaced and the batch goes on. Workers are started with ``spawn`` (forking a process whose
libgomp threads exist is unsafe) and stay alive across batches, so start-up is paid once.
"""

from __future__ import annotations

import dataclasses
import enum
import faulthandler
import functools
import math
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from tecomp.codegen.backend import Artifact

from .machine import Machine, cpu_machine_job
from .protocols import Builder, Runner
from .speed import SETTLE_SHARE, SettledReference, kind_of, reference_job
from .steps import Step, steps_key
from .task import SearchTask


class MeasureErrorNo(enum.Enum):
    """Why a candidate has no valid cost (stored by name in records)."""

    NO_ERROR = 0
    SCHEDULE_ERROR = 1  # the steps do not replay onto the task's schedule
    BUILD_ERROR = 2  # lowering or code generation raised
    BUILD_TIMEOUT = 3
    BUILD_CRASH = 4  # the compiling process died
    RUN_ERROR = 5  # the kernel returned an error or could not be loaded
    RUN_TIMEOUT = 6
    RUN_CRASH = 7  # the measuring process died (segfault, abort)
    WRONG_ANSWER = 8  # output differs from the default schedule's
    UNKNOWN_ERROR = 9
    # a GPU kernel that cannot launch on its target (threads per block, shared memory,
    # registers x threads) or spills: filtered after the build, never run (tuning.gpu_measure)
    RESOURCE_LIMIT = 10


class HasSteps(Protocol):
    """What a candidate and a record share: a schedule's steps and where they came from."""

    @property
    def steps(self) -> Sequence[Step]: ...
    @property
    def sketch(self) -> int | None: ...
    @property
    def params(self) -> Sequence[tuple[str, Any]]: ...


@dataclass(frozen=True)
class MeasureInput:
    """One candidate to measure (or to score): the task and the steps of its schedule, plus
    the sketch and knob values it came from (logged so a resumed search can continue)."""

    task: SearchTask
    steps: tuple[Step, ...]
    sketch: int | None = None
    params: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, task: SearchTask, c: HasSteps) -> MeasureInput:
        """The input for a search candidate or a logged record ``c`` of ``task``."""
        return cls(task, tuple(c.steps), c.sketch, tuple(c.params))

    @functools.cached_property
    def key(self) -> str:
        return steps_key(self.steps)


@dataclass(frozen=True)
class BuildResult:
    """A compiled candidate (``artifact``, with its machine code) or why there is none."""

    artifact: Artifact | None
    func_name: str
    error: MeasureErrorNo = MeasureErrorNo.NO_ERROR
    error_msg: str = ""
    time_s: float = 0.0
    # what the builder learnt about the candidate (GPU: launch extents, ptxas resources)
    info: dict[str, Any] = field(default_factory=dict, compare=False)


class Timed:
    """``valid`` and ``mean`` of a measurement, one definition for `MeasureResult` and
    `tuning.records.Record` (a failed one has no mean: inf, whatever costs it carries)."""

    costs: tuple[float, ...]
    error: MeasureErrorNo

    @property
    def valid(self) -> bool:
        return self.error == MeasureErrorNo.NO_ERROR and bool(self.costs)

    @property
    def mean(self) -> float:
        return sum(self.costs) / len(self.costs) if self.valid else math.inf


@dataclass(frozen=True)
class MeasureResult(Timed):
    """Seconds per call, one entry per repeat; empty when ``error`` is not NO_ERROR."""

    costs: tuple[float, ...]
    error: MeasureErrorNo
    error_msg: str = ""
    build_s: float = 0.0
    run_s: float = 0.0
    timestamp: float = field(default_factory=time.time)
    # how ``costs`` were obtained: "" for a real measurement on the target, or a label such
    # as `tuning.gpu_measure.STANDIN_TIMING` for the CI stand-in (never a real measurement)
    timing: str = ""
    # where it was measured, as the measuring process saw it (None: it never reached a
    # runner, e.g. a build error, or an old record that did not say)
    machine: Machine | None = None
    # the machine-speed index: seconds per call of `tuning.speed`'s reference kernel of the
    # candidate's kind (``ref_kind``: one of `tuning.speed.KINDS`, `tuning.speed.kind_of`), timed by
    # the same process in the same batch (None: unknown -- no CPU runner measured it, a GPU
    # runner, or an old record). ``costs`` stay raw; `tuning.speed.SpeedIndex` normalises
    ref_s: float | None = None
    ref_kind: str = ""
    # max / min of the reference's repeats: above `tuning.speed.UNSTEADY` the index is kept
    # but not used (the machine's speed moved while it was timed)
    ref_spread: float | None = None
    # the side-by-side round of a final re-timing (`tuning.remeasure`, "SESSION/N"): results of
    # one round were timed one after another in one batch, so their raw costs compare without
    # the index; "" for every other measurement
    round: str = ""
    # a confirmation timing of a final re-timing's winner (`tuning.remeasure`), taken after
    # the rounds that chose it: the winner's estimate rests on these alone
    # (`tuning.records.aggregate`), as the rounds that made it the fastest are its luckiest
    confirm: bool = False


def valid_refs(out: Any) -> dict[str, tuple[float, float]]:
    """The ``(seconds, spread)`` by kind of a reference job's answer that can index anything
    (a job that failed, or an absurd time, gives none)."""
    if not isinstance(out, dict):
        return {}
    good = {}
    for k, v in out.items():
        if isinstance(k, str) and isinstance(v, tuple) and len(v) == 2 and all(isinstance(x, float) for x in v):
            if math.isfinite(v[0]) and v[0] > 0 and math.isfinite(v[1]) and v[1] >= 1.0:
                good[k] = (v[0], v[1])
    return good


# worker processes -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Failure:
    """A job that raised inside the worker (the worker itself is fine)."""

    message: str


def _worker_main(conn: mpc.Connection, log_path: str) -> None:
    # Ctrl-C belongs to the tuning process, which stops workers itself; C-level output of
    # kernels and LLVM goes to a log file so it cannot break the progress bar.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # a segfault or abort in a kernel or in LLVM then leaves the Python stack in the log,
    # which the parent puts in the record's error message
    faulthandler.enable()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        fn, args = msg
        try:
            out = fn(*args)
        except BaseException:  # noqa: BLE001 - report everything, keep serving
            out = _Failure(traceback.format_exc(limit=6))
        conn.send(out)


class _Died(Exception):
    pass


def _start_without_main(proc: Any) -> None:
    """Start a spawn-context process that does not import the parent's ``__main__``.

    ``spawn`` normally re-imports the parent's main script (as ``__mp_main__``) in the child so
    that functions defined there can be unpickled. For a tuning script without an
    ``if __name__ == "__main__":`` guard that runs the whole script again -- tuning included --
    inside every worker. Workers never need it (workloads travel as data, templates by value),
    so the child is shown a main module without a file or spec while it is started, which is
    what ``multiprocessing`` sees for ``python -c`` and skips.
    """
    # one swap at a time: two threads starting workers (a build thread and the search's
    # feature pool) would otherwise restore each other's stand-in as the real __main__
    with _MAIN_LOCK:
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            proc.start()
        finally:
            if main is not None:
                sys.modules["__main__"] = main


_MAIN_LOCK = threading.Lock()


class _Worker:
    """One long-lived worker process; replaced after it dies or is killed at a deadline.

    Used by one thread at a time, except `stop`, which another thread may call to abandon the
    job (``reset`` after Ctrl-C): starting and stopping hold a lock, so a process started
    concurrently is either stopped too or kept, never orphaned, and the thread waiting for the
    job sees `_Died`.
    """

    def __init__(self, log_path: str) -> None:
        self.log_path = log_path
        self._lock = threading.RLock()
        self.proc: Any = None
        self.conn: mpc.Connection | None = None
        self.starts = 0
        self.memo: set[str] = set()  # per-process state the parent knows about (prepared tasks)
        self.log_mark = 0  # size of the log when the current job was sent: its output follows

    def ensure(self) -> None:
        with self._lock:
            if self.proc is not None and self.proc.is_alive():
                return
            self.stop(kill=True)
            ctx = mp.get_context("spawn")
            parent, child = ctx.Pipe(duplex=True)
            self.proc = ctx.Process(target=_worker_main, args=(child, self.log_path), daemon=True)
            _start_without_main(self.proc)
            child.close()
            self.conn = parent
            self.memo = set()
            self.starts += 1

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            self.ensure()
            assert self.conn is not None
            try:
                self.log_mark = os.path.getsize(self.log_path)
            except OSError:
                self.log_mark = 0
            self.conn.send((fn, args))

    def receive(self, timeout: float | None) -> Any:
        """The job's result; raises TimeoutError (worker killed) or _Died (worker gone)."""
        conn = self.conn
        if conn is None:
            raise _Died("the worker was stopped (reset) before it answered")
        try:
            ready = conn.poll(timeout)
        except (OSError, ValueError):  # closed by `stop` on another thread
            raise _Died("the worker was stopped (reset) before it answered") from None
        if not ready:
            self.stop(kill=True)
            raise TimeoutError
        try:
            return conn.recv()
        except (EOFError, OSError, ValueError):
            code = self.proc.exitcode if self.proc is not None else None
            if code is None and self.proc is not None:
                self.proc.join(1.0)
                code = self.proc.exitcode
            self.stop(kill=True)
            raise _Died(_describe_exit(code, self.log_path, self.log_mark)) from None

    def stop(self, kill: bool = False) -> None:
        with self._lock:
            if self.proc is None:
                return
            if not kill and self.conn is not None and self.proc.is_alive():
                try:
                    self.conn.send(None)
                    self.proc.join(2.0)
                except (OSError, ValueError):
                    pass
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(2.0)
            if self.conn is not None:
                self.conn.close()
            self.proc, self.conn = None, None


def _describe_exit(code: int | None, log_path: str, start: int = 0, max_lines: int = 12) -> str:
    """Why a worker died: the signal or exit code, then the last lines it wrote (from byte
    ``start`` of its log: the current job's output) -- the Python traceback of an exception
    that escaped, or faulthandler's stack of a segfault or abort."""
    if code is not None and code < 0:
        try:
            what = signal.Signals(-code).name
        except ValueError:
            what = f"signal {-code}"
        msg = f"process killed by {what}"
    else:
        msg = f"process exited with code {code}"
    try:
        with open(log_path, "rb") as f:
            size = os.path.getsize(log_path)
            f.seek(max(start, size - 4000))
            text = f.read().decode(errors="replace")
        lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()][-max_lines:]
        if lines:
            msg += ":\n" + "\n".join(ln[:300] for ln in lines)
    except OSError:
        pass
    return msg


class WorkerPool:
    """``n_workers`` long-lived worker processes (default: one per core) that run jobs in
    parallel, each job isolated: the executor of `LocalBuilder` and, separately, of the
    search's feature extraction (`tuning.features.FeatureCache`), so that a builder that
    lives elsewhere (another machine) leaves feature extraction here.

    Workers start on their first job and write their C-level output to logs under
    ``workdir`` (a temporary directory, removed by `close`, when none is given).
    """

    def __init__(self, n_workers: int | None = None, timeout: float = 60.0, workdir: str | None = None,
                 prefix: str = "worker") -> None:
        n = (os.cpu_count() or 1) if n_workers is None else n_workers
        if n < 1:
            raise ValueError(f"WorkerPool: n_workers must be >= 1, got {n_workers}")
        self.timeout = timeout
        self._own_dir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix=f"tecomp-{prefix}-")
        self.workers = [_Worker(os.path.join(self.workdir, f"{prefix}{k}.log")) for k in range(n)]

    @property
    def n_workers(self) -> int:
        return len(self.workers)

    def map(self, fn: Callable[..., Any], jobs: Sequence[tuple[Any, ...]],
            timeout: float | None = None) -> list[Any]:
        """``[fn(*args) for args in jobs]`` on the workers; a job that fails, crashes or runs
        past ``timeout`` gives a `_Failure`, `_Died` or `TimeoutError` instance instead."""
        limit = self.timeout if timeout is None else timeout
        results: list[Any] = [None] * len(jobs)
        todo = list(range(len(jobs)))[::-1]
        running: dict[int, tuple[int, float]] = {}  # worker index -> (job index, deadline)
        workers = self.workers
        while todo or running:
            for w_idx, w in enumerate(workers):
                if w_idx not in running and todo:
                    i = todo.pop()
                    w.submit(fn, *jobs[i])
                    running[w_idx] = (i, time.monotonic() + limit)
            # a worker stopped from another thread (reset) has no connection: answered at once
            conns = {k: workers[k].conn for k in running}
            live = [c for c in conns.values() if c is not None]
            wait_for = max(0.0, min(d for _, d in running.values()) - time.monotonic())
            try:
                ready = set(mpc.wait(live, timeout=0.0 if len(live) < len(conns) else wait_for))
            except (OSError, ValueError):  # closed under us by a reset
                ready = set(live)
            now = time.monotonic()
            for k, c in conns.items():
                i, deadline = running[k]
                if c is None or c in ready or now >= deadline:
                    running.pop(k)
                    try:
                        results[i] = workers[k].receive(0.0)
                    except (TimeoutError, _Died) as e:
                        results[i] = e
        return results

    def reset(self) -> None:
        """Kill the workers (and whatever they were doing); they restart on the next job."""
        for w in self.workers:
            w.stop(kill=True)

    def close(self) -> None:
        for w in self.workers:
            w.stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)


# building -------------------------------------------------------------------------------------


def _build_job(task: SearchTask, steps: tuple[Step, ...], name: str) -> BuildResult:
    """Replay, lower and compile to an object file (runs in a builder process)."""
    t0 = time.perf_counter()
    try:
        sch, args = task.apply_steps(steps)
    except Exception as e:  # noqa: BLE001 - any failure to replay is this candidate's fault
        return BuildResult(None, name, error=MeasureErrorNo.SCHEDULE_ERROR,
                           error_msg=f"{type(e).__name__}: {e}"[:2000], time_s=time.perf_counter() - t0)
    info: dict[str, Any] = {}
    try:
        from tecomp.codegen.backend import backend_for
        from tecomp.codegen.target import Target
        from tecomp.lowering import lower

        funcs = []
        if task.prepack:
            sch, args, packs, info = _prepacked(sch, args, steps, name)
            funcs += [lower(ps, pa, name=pn) for ps, pa, pn in packs]
        funcs.insert(0, lower(sch, args, name=name))
        tgt = Target.parse(task.target)
        backend = backend_for(tgt)
        art = backend.compile(backend.codegen(funcs, tgt, name=name))
    except Exception as e:  # noqa: BLE001
        return BuildResult(None, name, error=MeasureErrorNo.BUILD_ERROR,
                           error_msg=f"{type(e).__name__}: {e}"[:2000], time_s=time.perf_counter() - t0)
    return BuildResult(art, name, time_s=time.perf_counter() - t0, info=info)


def _prepacked(sch: Any, args: list[Any], steps: Sequence[Step], name: str,
               ) -> tuple[Any, list[Any], list[tuple[Any, list[Any], str]], dict[str, Any]]:
    """A prepack task's candidate (`SearchTask.prepack`): its layout copies of inputs hoisted
    out (`tuning.prepack.prepack_schedule`), the kernel's arguments, the pre-transforms as
    ``(schedule, args, name)``, and the ``info`` that tells the run job how to call them:
    ``"prepack"``, per pre-transform its function, the index of its plain input among the
    task's tensors and its output's shape and dtype; ``"kernel_args"``, per kernel argument
    ``["t", k]`` (the task's tensor ``k``) or ``["p", j]`` (pre-transform ``j``'s output)."""
    from .prepack import layout_copies, prepack_schedule

    stages = layout_copies(steps)
    if not stages:
        return sch, args, [], {}
    pp = prepack_schedule(sch, args, stages)
    where = {id(t.op): k for k, t in enumerate(args)}
    packs, about = [], []
    for h in pp.packs:
        fname = pp.pack_name(name, h)
        packs.append((h.schedule, list(h.args), fname))
        about.append({"func": fname, "src": where[id(h.source.op)],
                      "shape": [int(d.value) for d in h.packed.shape],  # type: ignore[attr-defined]
                      "dtype": h.packed.dtype})
    made = {id(h.packed.op): j for j, h in enumerate(pp.packs)}
    kernel_args = [["p", made[id(a.op)]] if id(a.op) in made else ["t", where[id(a.op)]] for a in pp.args]
    return pp.schedule, pp.args, packs, {"prepack": about, "kernel_args": kernel_args}


class LocalBuilder:
    """Compiles candidates on ``n_workers`` processes of this machine (default: one per core);
    the default `tuning.protocols.Builder`."""

    def __init__(self, n_workers: int | None = None, timeout: float = 60.0,
                 workdir: str | None = None) -> None:
        self.timeout = timeout
        self.pool = WorkerPool(n_workers, timeout, workdir, prefix="builder")
        self.workdir = self.pool.workdir

    @property
    def n_workers(self) -> int:
        return self.pool.n_workers

    def map(self, fn: Callable[..., Any], jobs: Sequence[tuple[Any, ...]],
            timeout: float | None = None) -> list[Any]:
        """`WorkerPool.map` on the build workers."""
        return self.pool.map(fn, jobs, timeout)

    def build(self, inputs: Sequence[MeasureInput]) -> list[BuildResult]:
        return self._collect(self.map(_build_job, [(inp.task, inp.steps, "default_function") for inp in inputs]))

    def _collect(self, outs: Sequence[Any]) -> list[BuildResult]:
        """Build results from `map`'s answers (a failed job becomes its error)."""
        results = []
        for out in outs:
            if isinstance(out, TimeoutError):
                results.append(BuildResult(None, "", error=MeasureErrorNo.BUILD_TIMEOUT,
                                           error_msg=f"build did not finish in {self.timeout:g} s",
                                           time_s=self.timeout))
            elif isinstance(out, _Died):
                results.append(BuildResult(None, "", error=MeasureErrorNo.BUILD_CRASH, error_msg=str(out)))
            elif isinstance(out, _Failure):
                results.append(BuildResult(None, "", error=MeasureErrorNo.UNKNOWN_ERROR,
                                           error_msg=out.message))
            else:
                results.append(out)
        return results

    def reset(self) -> None:
        """Kill the workers (and whatever they were doing); they restart on the next call."""
        self.pool.reset()

    def close(self) -> None:
        self.pool.close()


# running ----------------------------------------------------------------------------------------

_PREPARED: dict[str, dict[str, Any]] = {}  # per measuring process: task key -> data


ALIGN = 64
# Where the tuner places every array it measures on: this many bytes past an ALIGN-byte
# boundary. numpy promises 16-byte alignment and no more; a large array from malloc's mmap
# starts 16 bytes past a page, and a heap one anywhere on 16 bytes. A vectorized kernel can run
# up to ~1.7x faster on 64-byte aligned data than 16 bytes off it (every other 32-byte access
# splits a cache line), so a time measured on aligned arrays is a claim that users' ordinary
# arrays do not keep, and a search on aligned arrays prefers kernels that lose the most off
# them. 16 past 64 is the slowest placement numpy allows for AVX2 and AVX-512 vectors alike
# (48 splits as often), so no numpy array's offset makes a kernel slower than its log says
# (where the arrays lie within their pages still moves some kernels by 10-25%: cache sets).
MEASURE_OFFSET = 16


def aligned_empty(shape: tuple[int, ...], dtype: str, align: int = ALIGN, offset: int = 0) -> np.ndarray:
    """An uninitialised array whose data starts ``offset`` bytes past an ``align``-byte boundary.

    With ``offset=0`` (aligned) a kernel's time does not depend on where the allocator put its
    inputs; the tuner measures at ``offset=MEASURE_OFFSET``, as ordinary numpy arrays lie
    (`measure_empty`).
    """
    dt = np.dtype(dtype)
    if offset % dt.itemsize or not 0 <= offset < align:
        raise ValueError(f"offset {offset} must be a multiple of the item size of {dtype} below {align}")
    n = int(np.prod(shape)) if shape else 1
    raw = np.empty(n * dt.itemsize + 2 * align, np.uint8)
    off = (-raw.ctypes.data) % align + offset
    return raw[off:off + n * dt.itemsize].view(dt).reshape(shape)


def measure_empty(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """An uninitialised array placed as the tuner measures on: `MEASURE_OFFSET` bytes past a
    64-byte boundary (or aligned to its item size when that is larger than the offset)."""
    item = np.dtype(dtype).itemsize
    return aligned_empty(shape, dtype, offset=MEASURE_OFFSET if MEASURE_OFFSET % item == 0 else 0)


def _random_array(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> np.ndarray:
    vals: np.ndarray
    if dtype.startswith(("float", "bfloat")):
        vals = rng.uniform(-1.0, 1.0, shape)
    elif dtype == "bool":
        vals = rng.integers(0, 2, shape)
    elif dtype.startswith("uint"):
        vals = rng.integers(0, 8, shape)
    else:
        vals = rng.integers(-8, 8, shape)
    out = measure_empty(shape, dtype)
    out[...] = vals
    return out


def _prepare_job(task: SearchTask, cache_dir: str) -> str:
    """Inputs and the default schedule's outputs of ``task``, kept in this process.

    The reference is computed once per task and saved, so a measuring process that replaces
    a crashed one loads it instead of running the (slow) default schedule again.
    """
    import tecomp as tc

    from .reference import reference_schedule

    rng = np.random.default_rng(0)
    arrays: list[np.ndarray] = []
    outputs: list[int] = []
    for k, t in enumerate(task.tensors):
        shape = tuple(int(d.value) for d in t.shape)  # type: ignore[attr-defined]
        if t.op in task.outputs:
            outputs.append(k)
            arrays.append(measure_empty(shape, t.dtype))
        else:
            arrays.append(_random_array(shape, t.dtype, rng))
    path = os.path.join(cache_dir, f"ref-{task.workload_key}.npz")
    if os.path.exists(path):
        with np.load(path) as z:
            refs = [z[f"o{k}"] for k in outputs]
    else:
        # a GPU task's default schedule binds no thread (it cannot build for cuda): its
        # reference is the same computation on this CPU
        ref_target = "llvm" if task.target.startswith("cuda") else task.target
        mod = tc.build(reference_schedule(task), task.tensors, target=ref_target, name="reference")
        mod(*arrays)
        refs = [arrays[k].copy() for k in outputs]
        np.savez(path + ".tmp.npz", **{f"o{k}": r for k, r in zip(outputs, refs)})
        os.replace(path + ".tmp.npz", path)
    _PREPARED[task.workload_key] = {"arrays": arrays, "outputs": outputs, "refs": refs}
    return task.workload_key


@dataclass(frozen=True)
class RunOptions:
    number: int = 3
    repeat: int = 3
    min_repeat_ms: float = 20.0
    flush_cache: bool = False
    check: bool = True
    rtol: float = 1e-3
    budget_s: float = 1.0  # slow candidates are timed with fewer calls to fit in this
    warmup_ms: float = 50.0  # untimed calls before the repeats (`warm_up`)

    def __post_init__(self) -> None:
        if self.warmup_ms < 0:
            raise ValueError(f"warmup_ms must be >= 0, got {self.warmup_ms}")


def _flush_cache(buf: list[np.ndarray]) -> None:
    if not buf:
        buf.append(np.zeros(64 << 20 >> 3))  # 64 MB: more than the last-level cache here
    buf[0] += 1.0


def warm_up(ev: Any, args: Sequence[Any], opts: RunOptions, first: float) -> None:
    """Run the calibrated timer ``ev`` untimed for ``opts.warmup_ms`` before a kernel whose one
    call took ``first`` seconds is timed (a call longer than that warms itself).

    A kernel timed at once runs slowly at first: on a 2-core Zen 3 VM, MobileNet's dw 3x3
    32@112 (0.103 ms) took 0.119 ms over its first three 20 ms repeats after 1 s idle, after
    0.5 s of another one-thread process, or as the first candidate of a batch, and 0.103 ms
    from about 60 ms on. Timed cold, the log claimed 9% more than the kernel takes
    (`benchmarks/suite.py`'s log/now 1.09x). Skipping the warm-up for a candidate timed right
    after another (within 25 ms) brought that back: 1.08x and 1.09x for the two layers it
    had fixed."""
    if first >= opts.warmup_ms / 1e3:
        return
    t_end = time.perf_counter() + opts.warmup_ms / 1e3
    while time.perf_counter() < t_end:
        ev(*args)


def kernel_args(mod: Any, build: BuildResult, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The arguments of ``build``'s kernel (in the loaded module ``mod``) for the task's
    ``arrays``: those arrays, or for a prepack task's candidate (`_prepacked`) the packed
    weights in their place -- its pre-transforms run here, once, outside any timing, as a
    user runs them once per weight (`SearchTask.prepack`)."""
    if not build.info.get("prepack"):
        return list(arrays)
    packed = []
    for p in build.info["prepack"]:
        out = measure_empty(tuple(p["shape"]), p["dtype"])
        mod[p["func"]](arrays[p["src"]], out)
        packed.append(out)
    return [arrays[k] if kind == "t" else packed[k] for kind, k in build.info["kernel_args"]]


def _run_job(key: str, build: BuildResult, opts: RunOptions) -> tuple[str, tuple[float, ...], str]:
    """Load, check and time one compiled candidate (runs in the measuring process)."""
    from tecomp.codegen.backend import backend_for

    data = _PREPARED[key]
    assert build.artifact is not None
    try:
        # the code is compiled already: loading links it
        mod = backend_for(build.artifact.target).load(build.artifact)
        f = mod[build.func_name]
    except Exception as e:  # noqa: BLE001
        return "RUN_ERROR", (), f"cannot load the kernel: {e}"
    arrays: list[np.ndarray] = data["arrays"]
    for k in data["outputs"]:
        arrays[k].fill(np.nan if arrays[k].dtype.kind == "f" else 0x5A)
    try:
        args = kernel_args(mod, build, arrays)
    except Exception as e:  # noqa: BLE001
        return "RUN_ERROR", (), f"pre-transform: {type(e).__name__}: {e}"
    t0 = time.perf_counter()
    try:
        f(*args)
    except Exception as e:  # noqa: BLE001
        return "RUN_ERROR", (), f"{type(e).__name__}: {e}"
    first = time.perf_counter() - t0
    if opts.check:
        for k, ref in zip(data["outputs"], data["refs"]):
            out = arrays[k]
            if out.dtype.kind == "f":
                scale = float(np.sqrt(np.mean(np.square(ref, dtype=np.float64)))) if ref.size else 0.0
                ok = np.allclose(out, ref, rtol=opts.rtol, atol=opts.rtol * max(scale, 1e-30))
            else:
                ok = bool(np.array_equal(out, ref))
            if not ok:
                diff = np.abs(out.astype(np.float64) - ref)
                err = float(np.nanmax(diff)) if out.size and not np.isnan(diff).all() else float("nan")
                nans = int(np.isnan(out).sum()) if out.dtype.kind == "f" else 0
                return "WRONG_ANSWER", (), (f"output {k} differs from the default schedule's "
                                            f"(max abs error {err:.3g}, {nans} NaN left)")
    if first >= opts.budget_s:
        # too slow to be interesting: the checked call is its measurement
        return "NO_ERROR", (first,), ""
    # calls per repeat from the first call's time (one calibration, not one per repeat), cut
    # down so that a slow candidate costs about ``budget_s`` of timing
    number = max(opts.number, math.ceil(opts.min_repeat_ms / 1e3 / max(first, 1e-9)))
    repeat = opts.repeat
    if first * number * repeat > opts.budget_s:
        number = max(1, int(opts.budget_s / (first * repeat)))
        repeat = max(1, min(repeat, int(opts.budget_s / (first * number))))
    ev = f.time_evaluator(number=number, repeat=1, min_repeat_ms=0, warmup=0)
    flush: list[np.ndarray] = []
    costs = []
    try:
        warm_up(ev, args, opts, first)
        for _ in range(repeat):
            if opts.flush_cache:
                _flush_cache(flush)
            costs.append(ev(*args).results[0])
    except Exception as e:  # noqa: BLE001
        return "RUN_ERROR", (), f"{type(e).__name__}: {e}"
    return "NO_ERROR", tuple(costs), ""


class LocalRunner:
    """Measures compiled candidates one at a time in an isolated, long-lived process on this
    machine; the default `tuning.protocols.Runner` (``capacity`` 1, ``exclusive``: the tuner
    neither builds nor searches while it measures, which would perturb the timings).

    ``timeout`` bounds one candidate (load, check, timing); ``number``/``repeat``/
    ``min_repeat_ms`` are as in ``time_evaluator``; ``flush_cache`` overwrites 64 MB before
    each repeat; ``check`` compares the first call's outputs with the default schedule's
    (``rtol``, relative to the outputs' RMS). A candidate whose first call takes longer than
    ``budget_s`` is not timed again: it is far from the best and further calls only cost.
    A candidate whose first call is shorter than ``warmup_ms`` runs untimed that long before
    its repeats (`warm_up`; 0: timed at once).
    """

    # the jobs run in the measuring process (module-level functions: they are pickled by
    # name); a runner for another kind of device overrides them
    prepare_job: Callable[..., str] = staticmethod(_prepare_job)
    run_job: Callable[..., tuple[Any, ...]] = staticmethod(_run_job)
    # what the measuring process reports as its identity (`tuning.machine`)
    machine_job: Callable[[], Machine] = staticmethod(cpu_machine_job)
    # times the machine-speed index once per batch (`tuning.speed`); None: the runner has no
    # reference kernel for its device, and its results carry no index
    reference_job: Callable[[RunOptions], dict[str, tuple[float, float]]] | None = staticmethod(reference_job)
    capacity = 1  # batches measured at once: one process, one candidate at a time
    exclusive = True  # it measures on the tuner's own machine

    def __init__(self, timeout: float = 10.0, number: int = 3, repeat: int = 3,
                 min_repeat_ms: float = 20.0, flush_cache: bool = False, check: bool = True,
                 rtol: float = 1e-3, budget_s: float = 1.0, ref_timeout: float = 600.0,
                 workdir: str | None = None, warmup_ms: float = RunOptions.warmup_ms) -> None:
        self.timeout = timeout
        self.ref_timeout = ref_timeout
        self.options = RunOptions(number, repeat, min_repeat_ms, flush_cache, check, rtol,
                                  budget_s=min(budget_s, timeout / 3), warmup_ms=warmup_ms)
        self._own_dir = workdir is None
        self.workdir = workdir or tempfile.mkdtemp(prefix="tecomp-run-")
        self.worker = _Worker(os.path.join(self.workdir, "runner.log"))
        self._machine: Machine | None = None
        # one index per batch, timed again while the machine is in a short slow spell
        self.settled = SettledReference(self._time_reference)
        self._last_batch_s = 0.0  # the previous batch's measuring time: what settling may cost

    @property
    def machine(self) -> Machine:
        """The identity of the machine that measures, asked of the measuring process itself
        (once: a replacement process runs on the same machine)."""
        if self._machine is None:
            self.worker.submit(self.machine_job)
            try:
                out = self.worker.receive(self.ref_timeout)
            except (TimeoutError, _Died) as e:
                raise RuntimeError(f"the measuring process could not say which machine it is: {e}") from None
            if isinstance(out, _Failure):
                raise RuntimeError(f"the measuring process could not say which machine it is: {out.message}")
            self._machine = out
        return self._machine

    def _prepare(self, task: SearchTask) -> str | None:
        """Make the measuring process ready for ``task``; an error message if it cannot."""
        w = self.worker
        if task.workload_key in w.memo and w.proc is not None and w.proc.is_alive():
            return None
        w.submit(self.prepare_job, task, self.workdir)
        try:
            out = w.receive(self.ref_timeout)
        except TimeoutError:
            return f"the default schedule did not finish in {self.ref_timeout:g} s"
        except _Died as e:
            return f"the default schedule crashed: {e}"
        if isinstance(out, _Failure):
            return f"the default schedule failed: {out.message}"
        w.memo.add(task.workload_key)
        return None

    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult],
            callback: Callable[[MeasureInput, MeasureResult], None] | None = None) -> list[MeasureResult]:
        """Measure each built candidate; ``callback`` sees every result as soon as it exists
        (the tuner logs it there, so a kill loses nothing already measured)."""
        out: list[MeasureResult] = []
        kinds = {kind_of(inp.steps) for inp, b in zip(inputs, builds) if b.artifact is not None}
        refs = self._reference(kinds) if kinds else {}
        t0 = time.perf_counter()
        for inp, b in zip(inputs, builds):
            res = self._run_one(inp, b)
            kind = kind_of(inp.steps)
            if res.machine is not None and kind in refs:
                res = dataclasses.replace(res, ref_s=refs[kind][0], ref_kind=kind, ref_spread=refs[kind][1])
            out.append(res)
            if callback is not None:
                callback(inp, res)
        if kinds:
            self._last_batch_s = time.perf_counter() - t0
        return out

    def _reference(self, kinds: set[str]) -> dict[str, tuple[float, float]]:
        """The machine-speed index now, by kind (`tuning.speed.reference_job` in the measuring
        process), once per batch, timed again while the ``kinds`` the batch needs are in a
        short slow spell (`tuning.speed.SettledReference`, for at most `SETTLE_SHARE` of the
        previous batch's measuring time); empty when this runner has none or
        it failed (the batch's results are then compared by their raw costs, and nothing else
        is lost)."""
        if self.reference_job is None:
            return {}
        self.machine  # noqa: B018 - started (and identified) before anything is timed
        return self.settled.take(sorted(kinds), budget_s=SETTLE_SHARE * self._last_batch_s)

    def _time_reference(self) -> dict[str, tuple[float, float]]:
        """One timing of the index in the measuring process (`_reference`'s attempts)."""
        assert self.reference_job is not None
        self.worker.submit(self.reference_job, self.options)
        try:
            out = self.worker.receive(self.timeout)
        except (TimeoutError, _Died):
            return {}
        return valid_refs(out)

    def _run_one(self, inp: MeasureInput, b: BuildResult) -> MeasureResult:
        if b.error != MeasureErrorNo.NO_ERROR or b.artifact is None:
            return MeasureResult((), b.error, b.error_msg, build_s=b.time_s)
        machine = self.machine
        problem = self._prepare(inp.task)
        if problem is not None:
            return MeasureResult((), MeasureErrorNo.UNKNOWN_ERROR, problem, build_s=b.time_s, machine=machine)
        t0 = time.perf_counter()
        self.worker.submit(self.run_job, inp.task.workload_key, b, self.options)
        timing = ""
        try:
            res = self.worker.receive(self.timeout)
            if isinstance(res, _Failure):
                err, costs, msg = MeasureErrorNo.UNKNOWN_ERROR, (), res.message
            else:
                err, costs, msg = MeasureErrorNo[res[0]], res[1], res[2]
                timing = res[3] if len(res) > 3 else ""
        except TimeoutError:
            err, costs, msg = MeasureErrorNo.RUN_TIMEOUT, (), f"no result in {self.timeout:g} s"
        except _Died as e:
            err, costs, msg = MeasureErrorNo.RUN_CRASH, (), str(e)
        return MeasureResult(costs, err, msg, build_s=b.time_s, run_s=time.perf_counter() - t0,
                             timing=timing if err == MeasureErrorNo.NO_ERROR else "", machine=machine)

    def reset(self) -> None:
        """Kill the measuring process; a new one starts (and reloads references) when needed."""
        self.worker.stop(kill=True)

    def close(self) -> None:
        self.worker.stop()
        if self._own_dir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def measure_batch(builder: Builder, runner: Runner, inputs: Sequence[MeasureInput],
                  callback: Callable[[MeasureInput, MeasureResult], None] | None = None,
                  ) -> tuple[list[MeasureResult], float, float]:
    """Build then run ``inputs``; also returns wall seconds spent building and running.

    The two phases do not overlap: compiling on every core while a kernel is timed would
    perturb its time.
    """
    t0 = time.perf_counter()
    builds = builder.build(inputs)
    t1 = time.perf_counter()
    results = runner.run(inputs, builds, callback)
    return results, t1 - t0, time.perf_counter() - t1


__all__ = ["ALIGN", "BuildResult", "LocalBuilder", "MEASURE_OFFSET", "aligned_empty", "measure_empty", "LocalRunner",
           "MeasureErrorNo", "MeasureInput", "MeasureResult", "RunOptions", "WorkerPool", "measure_batch"]

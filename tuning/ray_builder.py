"""Building on a Ray cluster: `RayBuilder`, a `tuning.protocols.Builder` whose compilations
run as Ray tasks on whichever nodes have a CPU free.

Each candidate is one Ray task running the local builder's own job function
(``tuning.measure._build_job``, or ``tuning.gpu_measure.gpu_build_job`` for cuda), so a
result built on the cluster is the `BuildResult` a `LocalBuilder` returns for it: the same
artifact (object code or PTX: bytes, which come back through Ray's object store) or the same
error. One task per candidate, not chunks: a compilation (~1 s here) dwarfs Ray's per-task
cost (milliseconds), and a crash or a timeout then costs exactly one candidate.

Target pinning: ``"llvm"`` means *the host CPU*, which on another node is that node's CPU.
The target of every task is resolved here, on the tuner's machine (`pin_target`: triple, CPU
name and the full feature list), and the node builds for that `Target` object as it is, never
re-resolving anything against its own CPU; ``info["target"]`` of a result spells out what it
was built for (`target_text`) and ``info["built_on"]`` the node's host name. The measuring
node then runs it only if its CPU has those features (`tuning.distributed.fits`).

CPUs: each task asks Ray for ``num_cpus`` (default 1). A `tuning.RayRunner` measuring actor
holds *every* CPU of its node, so builds need CPUs no measuring actor holds: nodes started for
building (``ray start --address=HEAD:6379 --num-cpus=N``, without the custom resource that
``RayRunner(node_resource=...)`` picks measuring nodes by), or the CPUs of GPU nodes (a cuda
measuring actor holds one CPU per GPU). A build never waits forever: before each batch the
builder checks that some node could ever run a task of ``num_cpus`` and that that many CPUs
are free now (Ray's available resources); when none frees up within ``cpu_wait_s`` it raises
`NoBuildCPU` (a `TuningError`: `tune` stops, the log resumes) naming how many CPUs the
cluster has and who holds them, rather than fall back to building on the tuner's machine
behind the user's back (drop ``--ray-build`` / pass no builder for that).

Faults, as `LocalBuilder` reports them: a task whose worker process dies (a compiler crash,
the OOM killer, ``kill``) is BUILD_CRASH once Ray's ``max_retries`` re-runs (default 1: a
node that leaves mid-build costs no candidate) died too; one that runs past ``timeout``
seconds (counted from its submission; at most as many tasks are submitted at once as CPUs
were free, so none waits in Ray's queue for long) is cancelled, its worker killed, and it is
BUILD_TIMEOUT; a job that raised outside the build's own error handling is UNKNOWN_ERROR.

Ray is imported only when a `RayBuilder` is created; tecomp must be installed on the nodes
(the computation travels as data, `SearchTask` pickling, so the user's module need not be).
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from tecomp.codegen.target import Target

from .distributed import INSTALL_HINT, connect
from .measure import BuildResult, MeasureErrorNo, MeasureInput, _build_job
from .task import SearchTask, TuningError


class NoBuildCPU(TuningError):
    """No CPU of the Ray cluster is free for a build task (they are all held, e.g. by the
    measuring actors of a `tuning.RayRunner`, or no node has ``num_cpus`` of them)."""


def pin_target(target: str | Target) -> Target:
    """``target`` resolved on this machine: ``"llvm"`` becomes this CPU's triple, name and
    features, so that code built from it on any node is code for this CPU."""
    return Target.parse(target)


def target_text(t: Target) -> str:
    """``t`` spelled out in full (``str(Target)`` abbreviates the host's target to "llvm",
    which would mean another CPU on another node)."""
    if t.kind != "llvm":
        return str(t)
    parts = ["llvm", f"-mtriple={t.triple}"]
    if t.cpu:
        parts.append(f"-mcpu={t.cpu}")
    if t.features:
        parts.append(f"-mattr={t.features}")
    return " ".join(parts)


def pinned_build_job(job: Callable[..., BuildResult], task: SearchTask, steps: tuple[Any, ...],
                     name: str, target: Target, *extra: Any) -> BuildResult:
    """Run the local builder's ``job`` with ``task`` built for ``target`` exactly (the body of a
    build task, on a node).

    The jobs read ``Target.parse(task.target)``, which passes a `Target` through: the task's
    target string is swapped for the pinned object for the duration of the job, so nothing on
    the node resolves the target against the node's own CPU. ``task`` is this task's own
    unpickled copy; the swap is undone all the same."""
    saved = task.target
    task.__dict__["target"] = target
    try:
        out = job(task, steps, name, *extra)
    finally:
        task.__dict__["target"] = saved
    return dataclasses.replace(out, info={**out.info, "target": target_text(target),
                                          "built_on": socket.gethostname()})


class RayBuilder:
    """Builds candidates as Ray tasks (module docstring).

    ``address``: as for `tuning.RayRunner` (``"ray://head:10001"``, ``"auto"``, or None: a
    local Ray instance of ``local_cpus`` CPUs started for this builder); a process that is
    connected already (e.g. by a `RayRunner` made first) keeps its connection, and whichever
    of the two started Ray stops it in `close`, so close that one last. ``timeout``: seconds
    per candidate. ``num_cpus``: CPUs one build task holds (Ray's resource request).
    ``cpu_wait_s``: how long a batch waits for a free CPU before `NoBuildCPU`.
    ``max_retries``: Ray's re-runs of a task whose worker died. ``allow_spills``: as for
    `tuning.gpu_measure.GpuBuilder` (cuda tasks).
    """

    def __init__(self, address: str | None = None, *, timeout: float = 60.0, num_cpus: float = 1.0,
                 cpu_wait_s: float = 30.0, max_retries: int = 1, allow_spills: bool = False,
                 runtime_env: dict[str, Any] | None = None, local_cpus: int | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise TuningError(f"RayBuilder needs Ray: {INSTALL_HINT}") from None
        if num_cpus <= 0:
            raise ValueError(f"RayBuilder: num_cpus must be > 0, got {num_cpus}")
        self._ray = ray
        self.address = address
        self.timeout, self.num_cpus, self.cpu_wait_s = timeout, num_cpus, cpu_wait_s
        self.allow_spills = allow_spills
        self._own_ray = connect(ray, address, runtime_env, local_cpus, "RayBuilder")
        self._task = ray.remote(pinned_build_job).options(num_cpus=num_cpus, max_retries=max_retries)
        self._lock = threading.Lock()
        self._inflight: set[Any] = set()  # refs of running tasks, for `reset` from another thread
        self._closed = False

    # resources --------------------------------------------------------------------------------

    def _cluster_cpus(self) -> list[float]:
        return [float(n.get("Resources", {}).get("CPU", 0)) for n in self._ray.nodes() if n.get("Alive")]

    def free_slots(self) -> int:
        """How many build tasks can start now (free CPUs // ``num_cpus``, at least 1), waiting up
        to ``cpu_wait_s`` for one; `NoBuildCPU` when none frees up or none ever could."""
        nodes = self._cluster_cpus()
        if not any(c >= self.num_cpus for c in nodes):
            raise NoBuildCPU(f"RayBuilder: no alive node of the Ray cluster has {self.num_cpus:g} CPUs "
                             f"for a build task (nodes' CPUs: {sorted(nodes) or 'no node'})")
        deadline = time.monotonic() + self.cpu_wait_s
        while True:
            free = float(self._ray.available_resources().get("CPU", 0.0))
            if free >= self.num_cpus:
                return max(1, int(free // self.num_cpus))
            if time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        raise NoBuildCPU(
            f"RayBuilder: none of the Ray cluster's {sum(nodes):g} CPUs became free for a build task "
            f"in {self.cpu_wait_s:g} s. A RayRunner's measuring actor holds every CPU of its node, so "
            "builds need nodes that do not measure: start them without the runner's custom resource "
            "(ray start --address=HEAD:6379 --num-cpus=N, and RayRunner(node_resource=...) / "
            "--ray-resource for the measuring ones), or build on this machine (no --ray-build / no "
            "RayBuilder)")

    # building ---------------------------------------------------------------------------------

    def _job(self, target: Target) -> tuple[Callable[..., BuildResult], tuple[Any, ...]]:
        if target.kind == "cuda":
            from .gpu_measure import gpu_build_job  # only for cuda tasks: PTX and ptxas checks

            return gpu_build_job, (self.allow_spills,)
        return _build_job, ()

    def build(self, inputs: Sequence[MeasureInput]) -> list[BuildResult]:
        """One result per input, in order (module docstring for faults and waiting)."""
        if self._closed:
            raise TuningError("RayBuilder: closed")
        if not inputs:
            return []
        ray = self._ray
        slots = self.free_slots()
        shipped: dict[int, tuple[Any, Target]] = {}  # id(task) -> (object ref, pinned target)
        calls: list[tuple[Any, ...]] = []
        for inp in inputs:
            if id(inp.task) not in shipped:
                # one copy of the task per batch in the object store, however many candidates
                shipped[id(inp.task)] = (ray.put(inp.task), pin_target(inp.task.target))
            ref, target = shipped[id(inp.task)]
            job, extra = self._job(target)
            calls.append((job, ref, inp.steps, "default_function", target, *extra))
        results: list[BuildResult | None] = [None] * len(inputs)
        todo = list(range(len(inputs)))[::-1]
        running: dict[Any, tuple[int, float]] = {}  # ref -> (input index, deadline)
        try:
            while todo or running:
                while todo and len(running) < slots:
                    i = todo.pop()
                    ref = self._task.remote(*calls[i])
                    running[ref] = (i, time.monotonic() + self.timeout)
                    with self._lock:
                        self._inflight.add(ref)
                wait_s = max(0.0, min(d for _, d in running.values()) - time.monotonic())
                ready, _ = ray.wait(list(running), num_returns=1, timeout=wait_s)
                if ready:  # and whatever else finished meanwhile
                    ready, _ = ray.wait(list(running), num_returns=len(running), timeout=0)
                now = time.monotonic()
                for ref in list(running):
                    i, deadline = running[ref]
                    if ref in ready:
                        results[i] = self._outcome(ref)
                    elif now >= deadline:
                        ray.cancel(ref, force=True)  # kills the worker: a hung compiler stops
                        results[i] = BuildResult(None, "", error=MeasureErrorNo.BUILD_TIMEOUT,
                                                 error_msg=f"build did not finish in {self.timeout:g} s",
                                                 time_s=self.timeout)
                    else:
                        continue
                    del running[ref]
                    with self._lock:
                        self._inflight.discard(ref)
        finally:
            for ref in running:  # an exception (Ctrl-C) left these: nobody will read them
                ray.cancel(ref, force=True)
            with self._lock:
                self._inflight.difference_update(running)
        return [r for r in results if r is not None]

    def _outcome(self, ref: Any) -> BuildResult:
        """A finished task's result, or the error that ended it (as `LocalBuilder` names it)."""
        exc = self._ray.exceptions
        try:
            out = self._ray.get(ref)
        except exc.RayTaskError as e:  # the job raised past its own error handling
            cause = e.cause if e.cause is not None else e
            return BuildResult(None, "", error=MeasureErrorNo.UNKNOWN_ERROR,
                               error_msg=f"{type(cause).__name__}: {cause}"[:2000])
        except exc.TaskCancelledError:
            return BuildResult(None, "", error=MeasureErrorNo.BUILD_CRASH,
                               error_msg="the build task was cancelled (reset) before it answered")
        except exc.RayError as e:  # the worker (or its node) died: a crash of this candidate
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            return BuildResult(None, "", error=MeasureErrorNo.BUILD_CRASH,
                               error_msg=f"the build process died: {type(e).__name__}: {first}"[:2000])
        if not isinstance(out, BuildResult):
            return BuildResult(None, "", error=MeasureErrorNo.UNKNOWN_ERROR,
                               error_msg=f"a build task returned {type(out).__name__}, not a BuildResult")
        return out

    # lifecycle --------------------------------------------------------------------------------

    def reset(self) -> None:
        """Cancel the builds in flight (their workers are killed; the tuner reads none of them)."""
        with self._lock:
            refs, self._inflight = list(self._inflight), set()
        for ref in refs:
            try:
                self._ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - finished or gone already
                pass

    def close(self) -> None:
        if self._closed:
            return
        self.reset()
        self._closed = True
        if self._own_ray:
            self._ray.shutdown()
            self._own_ray = False


__all__ = ["NoBuildCPU", "RayBuilder", "pin_target", "pinned_build_job", "target_text"]

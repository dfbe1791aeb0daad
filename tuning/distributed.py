"""Measuring on a Ray cluster: `RayRunner`, a `tuning.protocols.Runner` whose measurements run
on other machines.

One measuring *actor* lives on each node whose hardware fits (for ``llvm``: every CPU of the
node, so two measurements never share cores; for ``cuda``: one per GPU). An actor is a
long-lived process, like `LocalRunner`'s worker: it computes a task's reference outputs once
and keeps them, and it runs the same job functions (``prepare_job``/``run_job``/
``machine_job``/``reference_job`` of the local runner class for the target: the last times
the machine-speed index of `tuning.speed` once per batch, settled out of the node's short slow
spells as the local runner's is, `tuning.speed.SettledReference`), so a record measured on the
cluster means what a local one means. The runner's ``capacity`` is its number of actors: the
tuner keeps that many batches in flight, one per actor.

Workers receive the computation as data (`SearchTask` pickles to its DAG), so the user's
module need not exist on the nodes; tecomp itself must be installed there (``pip install
tecomp`` on each node, or Ray's ``runtime_env={"pip": ["tecomp"]}``). Ray is imported only
when a `RayRunner` is created (the ``[distributed]`` extra).

Hardware matching: at start, every actor says which machine it runs on (taken on the node),
and a candidate is measured only by an actor whose machine can run its code (a CPU node with
every feature the object code was compiled for; a GPU of at least the PTX's compute
capability). Each result carries that machine.

Faults: a candidate that kills its actor (a crash in the kernel) is a RUN_CRASH record and
the actor is restarted on its node; one that outlives ``timeout`` is a RUN_TIMEOUT and its
actor is killed and restarted. When a node leaves, its actor is dropped and the candidate is
measured again on another actor; when no actor is left, `run` raises `ClusterLost`, which
stops tuning with everything measured so far in the log (which resumes).
"""

from __future__ import annotations

import dataclasses
import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tecomp.codegen.target import Target

from .machine import Machine, local_machine
from .measure import BuildResult, LocalRunner, MeasureErrorNo, MeasureInput, MeasureResult, RunOptions, valid_refs
from .speed import SETTLE_SHARE, SettledReference, kind_of
from .task import TuningError

INSTALL_HINT = "pip install 'tecomp[distributed]' (or pip install ray)"


class ClusterLost(TuningError):
    """No measuring actor is left: the Ray cluster (or every fitting node) is gone."""


class MeasuringActor:
    """The body of a Ray actor on one node: the local runner's jobs, in one process.

    Plain Python (wrapped by ``ray.remote`` when a runner starts), so it can be tested
    without Ray and pickled by reference to this module on the nodes."""

    def __init__(self, jobs: tuple[Callable[..., Any], ...], workdir: str | None = None) -> None:
        # (prepare, run, machine[, reference]): the reference job (the machine-speed index,
        # `tuning.speed`) is absent or None for a runner without one
        self.prepare_job, self.run_job, self.machine_job = jobs[:3]
        self.reference_job: Callable[..., dict[str, tuple[float, float]]] | None = jobs[3] if len(jobs) > 3 else None
        # shared by the actors of a node and their replacements: a reference is computed once
        # per node (files are keyed by the task's hash and written atomically)
        self.workdir = workdir or os.path.join(tempfile.gettempdir(), f"tecomp-ray-{os.getuid()}")
        os.makedirs(self.workdir, exist_ok=True)
        self.prepared: set[str] = set()
        self._machine: Machine | None = None
        # Ray starts its worker processes at nice 15: timed there, a kernel yields to any other
        # work on the node (measured here: 4-5x slower kernels beside a nice-10 job). A
        # measurement runs at the default priority where the node allows it (root or
        # CAP_SYS_NICE); `nice` says what it got.
        try:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
        except OSError:
            pass
        self.nice = os.getpriority(os.PRIO_PROCESS, 0)

    def machine(self) -> Machine:
        if self._machine is None:
            self._machine = self.machine_job()
        return self._machine

    def pid(self) -> int:
        return os.getpid()

    def prepare(self, task: Any) -> str:
        key = task.workload_key
        if key not in self.prepared:
            self.prepare_job(task, self.workdir)
            self.prepared.add(key)
        return str(key)

    def reference(self, opts: RunOptions) -> dict[str, tuple[float, float]]:
        """The machine-speed index of this node now, by kind (empty: this runner kind has
        none)."""
        return {} if self.reference_job is None else dict(self.reference_job(opts))

    def run(self, key: str, build: BuildResult, opts: RunOptions) -> tuple[Any, ...]:
        # checked again here, on the node: the runner matched the node when it started, but
        # running code for features this CPU lacks would die of SIGILL, not fail cleanly
        if build.artifact is not None and not fits(self.machine(), build.artifact.target):
            return ("RUN_ERROR", (), f"this node ({self.machine().describe()}) cannot run code "
                                     f"for target {build.artifact.target}")
        return tuple(self.run_job(key, build, opts))


def fits(machine: Machine, target: Target) -> bool:
    """Whether code compiled for ``target`` can run on ``machine``."""
    if target.kind == "cuda":
        if not machine.gpu_name:
            return False
        try:
            have = tuple(int(x) for x in machine.compute_capability.split("."))
            arch = target.cpu.removeprefix("sm_")
            need = (int(arch[:-1]), int(arch[-1]))
        except ValueError:
            return False
        return have >= need
    if machine.gpu_name:
        return False
    feats = {f[1:] for f in machine.features.split(",") if f.startswith("+")}
    return target.feature_set <= feats


def connect(ray: Any, address: str | None, runtime_env: dict[str, Any] | None,
            num_cpus: int | None, who: str) -> bool:
    """Connect this process to Ray unless it is already (then that connection is used as is);
    True when this call started it, so its caller shuts it down. ``address`` None: a new local
    instance with ``num_cpus`` of this machine. Shared by `RayRunner` and
    `tuning.ray_builder.RayBuilder`: Ray allows one connection per process."""
    if ray.is_initialized():
        return False
    kw: dict[str, Any] = {"ignore_reinit_error": True, "log_to_driver": False,
                          "include_dashboard": False}
    if runtime_env is not None:
        kw["runtime_env"] = runtime_env
    if address is None:
        kw["num_cpus"] = num_cpus
    try:
        ray.init(address=address, **kw)
    except Exception as e:  # noqa: BLE001 - Ray raises many kinds for a bad address
        hint = ""
        if address and address.startswith("ray://") and not os.environ.get("RAY_AUTH_TOKEN"):
            hint = (" (a cluster of Ray >= 2.59 wants its token: export RAY_AUTH_MODE=token "
                    "RAY_AUTH_TOKEN=<`ray get-auth-token` on the head>)")
        raise TuningError(f"{who}: cannot connect to Ray at {address or 'a new local instance'}: "
                          f"{type(e).__name__}: {e}{hint}") from None
    return True


@dataclass
class _Slot:
    """One measuring actor and what the runner knows about it."""

    node_id: str
    handle: Any
    machine: Machine
    prepared: set[str] = field(default_factory=set)
    # the node's index, timed again while it is in a short slow spell (as `LocalRunner`'s):
    # kept across restarts of the actor, since the node and so its typical speed are the same
    settled: SettledReference | None = None
    last_batch_s: float = 0.0  # its previous batch's measuring time: what settling may cost


class RayRunner:
    """Measures candidates on the nodes of a Ray cluster (module docstring).

    ``address``: ``"ray://head:10001"`` (Ray Client), ``"auto"`` (the cluster this machine is
    part of), or None: a local Ray instance started for this runner (``num_cpus`` of this
    machine) and stopped by `close`. If Ray is already initialised in this process, that
    connection is used as is. ``runtime_env`` is passed to ``ray.init`` (e.g.
    ``{"pip": ["tecomp"]}``). ``node_resource``: only nodes started with this custom resource
    (``ray start --resources='{"tecomp": 1}'``) measure. ``jobs_from``: the local runner class
    whose measuring jobs the actors run (`LocalRunner` for CPU targets, default; the GPU runner
    for cuda, which also gives each actor one GPU). ``start_timeout`` bounds the start of a
    node's measuring process (it waits for the node's CPUs: a second runner on the same
    cluster cannot start until the first is closed). The timing options are `LocalRunner`'s.
    """

    def __init__(self, address: str | None = None, *, timeout: float = 10.0, number: int = 3,
                 repeat: int = 3, min_repeat_ms: float = 20.0, flush_cache: bool = False,
                 check: bool = True, rtol: float = 1e-3, budget_s: float = 1.0,
                 ref_timeout: float = 600.0, start_timeout: float = 120.0,
                 runtime_env: dict[str, Any] | None = None,
                 node_resource: str | None = None, num_cpus: int | None = None,
                 jobs_from: type[LocalRunner] = LocalRunner, max_retries: int = 2,
                 warmup_ms: float = RunOptions.warmup_ms) -> None:
        try:
            import ray
        except ImportError:
            raise TuningError(f"RayRunner needs Ray: {INSTALL_HINT}") from None
        self._ray = ray
        self.address = address
        self.timeout, self.ref_timeout, self.max_retries = timeout, ref_timeout, max_retries
        self.start_timeout = start_timeout
        self.options = RunOptions(number, repeat, min_repeat_ms, flush_cache, check, rtol,
                                  budget_s=min(budget_s, timeout / 3), warmup_ms=warmup_ms)
        self.node_resource = node_resource
        self._jobs = (jobs_from.prepare_job, jobs_from.run_job, jobs_from.machine_job,
                      jobs_from.reference_job)
        self._gpu = jobs_from.machine_job is not LocalRunner.machine_job
        self._own_ray = connect(ray, address, runtime_env, num_cpus, "RayRunner")
        self._lock = threading.Lock()
        self._free: queue.Queue[_Slot] = queue.Queue()
        self._slots: list[_Slot] = []
        self._closed = False
        self._start_actors()
        self.capacity = max(1, len(self._slots))
        here = local_machine().host_id
        # measuring on the tuner's own machine only: nothing may run beside a measurement
        self.exclusive = all(s.machine.host_id == here for s in self._slots)

    # actors -----------------------------------------------------------------------------------

    def _actor_class(self) -> Any:
        return self._ray.remote(MeasuringActor)

    def _spawn(self, node_id: str, cpus: float) -> Any:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        opts: dict[str, Any] = {
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False),
            "max_restarts": 0, "max_concurrency": 1,
        }
        if self._gpu:
            opts.update(num_cpus=1, num_gpus=1)
        else:
            opts.update(num_cpus=cpus)  # every CPU of the node: measurements never share cores
        return self._actor_class().options(**opts).remote(self._jobs)

    def _nodes(self) -> list[dict[str, Any]]:
        out = []
        for n in self._ray.nodes():
            res = n.get("Resources", {})
            if not n.get("Alive") or res.get("CPU", 0) < 1:
                continue
            if self.node_resource is not None and res.get(self.node_resource, 0) <= 0:
                continue
            if self._gpu and res.get("GPU", 0) < 1:
                continue
            out.append(n)
        return out

    def _start_actors(self) -> None:
        pending = []
        for n in self._nodes():
            node_id, res = n["NodeID"], n["Resources"]
            count = int(res.get("GPU", 0)) if self._gpu else 1
            for _ in range(count):
                h = self._spawn(node_id, res["CPU"])
                pending.append((node_id, h, h.machine.remote()))
        problems = []
        for node_id, h, ref in pending:
            try:
                m = self._ray.get(ref, timeout=self.start_timeout)
            except self._ray.exceptions.GetTimeoutError:
                problems.append(f"node {node_id[:8]}: no measuring process started in "
                                f"{self.start_timeout:g} s (are its CPUs held by another measurement, "
                                "e.g. a second RayRunner on this cluster?)")
                self._ray.kill(h)
                continue
            except Exception as e:  # noqa: BLE001
                problems.append(f"node {node_id[:8]}: {type(e).__name__}: {e}")
                self._ray.kill(h)
                continue
            slot = _Slot(node_id, h, m)
            self._slots.append(slot)
            self._free.put(slot)
        if not self._slots:
            why = "; ".join(problems) or "no alive node offers the resources a measurement needs"
            self._shutdown()
            raise ClusterLost(f"RayRunner: no node can measure ({why})")

    def machines(self) -> list[Machine]:
        """The machines of the measuring actors, one per actor."""
        return [s.machine for s in self._slots]

    def _node_alive(self, node_id: str) -> bool:
        try:
            return any(n["NodeID"] == node_id and n.get("Alive") for n in self._ray.nodes())
        except Exception:  # noqa: BLE001 - the cluster itself is gone
            return False

    def _restart(self, slot: _Slot) -> bool:
        """Replace ``slot``'s actor on its node; False (and the slot dropped) when the node is
        gone."""
        try:
            self._ray.kill(slot.handle)
        except Exception:  # noqa: BLE001 - already dead
            pass
        if self._node_alive(slot.node_id):
            node = next(n for n in self._nodes() if n["NodeID"] == slot.node_id)
            try:
                h = self._spawn(slot.node_id, node["Resources"]["CPU"])
                self._ray.get(h.machine.remote(), timeout=self.start_timeout)
            except Exception:  # noqa: BLE001
                pass
            else:
                slot.handle, slot.prepared = h, set()
                return True
        with self._lock:
            if slot in self._slots:
                self._slots.remove(slot)
        return False

    # measuring --------------------------------------------------------------------------------

    def _acquire(self, target: Target | None) -> _Slot:
        """A free actor whose machine fits ``target`` (waits while they are busy)."""
        while True:
            with self._lock:
                if self._closed:
                    raise ClusterLost("RayRunner: closed")
                fitting = [s for s in self._slots if target is None or fits(s.machine, target)]
                if not fitting:
                    have = ", ".join(sorted({s.machine.describe() for s in self._slots})) or "none"
                    raise ClusterLost(f"RayRunner: no measuring node fits target {target} "
                                      f"(nodes: {have})")
            try:
                slot = self._free.get(timeout=1.0)
            except queue.Empty:
                continue
            if slot not in self._slots:
                continue  # dropped while queued
            if target is None or fits(slot.machine, target):
                return slot
            self._free.put(slot)
            time.sleep(0.01)

    def run(self, inputs: Sequence[MeasureInput], builds: Sequence[BuildResult],
            callback: Callable[[MeasureInput, MeasureResult], None] | None = None) -> list[MeasureResult]:
        """Measure the batch on one free actor that fits its code; ``callback`` sees each
        result as soon as it exists."""
        target = next((b.artifact.target for b in builds if b.artifact is not None), None)
        kinds = sorted({kind_of(inp.steps) for inp, b in zip(inputs, builds) if b.artifact is not None})
        out: list[MeasureResult] = []
        slot: _Slot | None = None
        refs: dict[int, dict[str, tuple[float, float]]] = {}  # the speed index of each actor, once per batch
        started: dict[int, float] = {}  # when each actor's share of the batch began, after its index
        try:
            for inp, b in zip(inputs, builds, strict=True):
                if b.error != MeasureErrorNo.NO_ERROR or b.artifact is None:
                    res = MeasureResult((), b.error, b.error_msg, build_s=b.time_s)
                else:
                    res, slot = self._measure(inp, b, target, slot)
                    if slot is not None and res.machine is slot.machine:
                        if id(slot) not in refs:
                            # after the batch's first candidate: only then is its actor known
                            refs[id(slot)] = self._reference(slot, kinds)
                            started[id(slot)] = time.perf_counter()
                        kind = kind_of(inp.steps)
                        if kind in refs[id(slot)]:
                            ref, spread = refs[id(slot)][kind]
                            res = dataclasses.replace(res, ref_s=ref, ref_kind=kind, ref_spread=spread)
                out.append(res)
                if callback is not None:
                    callback(inp, res)
        finally:
            now = time.perf_counter()
            for s in self._slots:
                if id(s) in started:
                    s.last_batch_s = now - started[id(s)]
            if slot is not None and slot in self._slots:
                self._free.put(slot)
        return out

    def _measure(self, inp: MeasureInput, b: BuildResult, target: Target | None,
                 slot: _Slot | None) -> tuple[MeasureResult, _Slot | None]:
        """One candidate, retried on another actor when its node leaves."""
        ray = self._ray
        for _attempt in range(self.max_retries + 1):
            if slot is None:
                slot = self._acquire(target)
            t0 = time.perf_counter()
            key = inp.task.workload_key
            try:
                if key not in slot.prepared:
                    ray.get(slot.handle.prepare.remote(inp.task), timeout=self.ref_timeout)
                    slot.prepared.add(key)
                t0 = time.perf_counter()
                res = ray.get(slot.handle.run.remote(key, b, self.options), timeout=self.timeout)
            except ray.exceptions.GetTimeoutError:
                what = "the default schedule" if key not in slot.prepared else "the candidate"
                limit = self.ref_timeout if key not in slot.prepared else self.timeout
                if not self._restart(slot):
                    slot = None
                return (MeasureResult((), MeasureErrorNo.RUN_TIMEOUT,
                                      f"{what}: no result in {limit:g} s on {self._where(slot, b)}",
                                      build_s=b.time_s, run_s=time.perf_counter() - t0,
                                      machine=slot.machine if slot else None), slot)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
                machine = slot.machine
                if not self._restart(slot):
                    # the node left (its slot is dropped): measure the candidate again elsewhere
                    slot = None
                    continue
                return (MeasureResult((), MeasureErrorNo.RUN_CRASH,
                                      f"the measuring process on {machine.describe()} died: "
                                      f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                                      build_s=b.time_s, run_s=time.perf_counter() - t0,
                                      machine=machine), slot)
            except ray.exceptions.RayTaskError as e:
                return (MeasureResult((), MeasureErrorNo.UNKNOWN_ERROR,
                                      f"{type(e.cause).__name__ if e.cause else 'error'}: {e.cause or e}",
                                      build_s=b.time_s, run_s=time.perf_counter() - t0,
                                      machine=slot.machine), slot)
            err = MeasureErrorNo[res[0]]
            timing = res[3] if len(res) > 3 and err == MeasureErrorNo.NO_ERROR else ""
            return (MeasureResult(tuple(res[1]), err, res[2], build_s=b.time_s,
                                  run_s=time.perf_counter() - t0, timing=timing,
                                  machine=slot.machine), slot)
        raise ClusterLost(f"RayRunner: {inp.task.name}: every measuring node left while measuring "
                          f"a candidate ({self.max_retries + 1} tries)")

    def _reference(self, slot: _Slot, kinds: Sequence[str]) -> dict[str, tuple[float, float]]:
        """The machine-speed index on ``slot``'s node now, by kind, timed again while the
        ``kinds`` the batch needs are in a short slow spell of that node
        (`tuning.speed.SettledReference`, for at most `SETTLE_SHARE` of the actor's previous
        batch); empty when there is none or it failed (its results are then compared by raw
        cost; no candidate is at fault)."""
        if self._jobs[3] is None:
            return {}
        if slot.settled is None:
            slot.settled = SettledReference(lambda: self._time_reference(slot))
        return slot.settled.take(kinds, budget_s=SETTLE_SHARE * slot.last_batch_s)

    def _time_reference(self, slot: _Slot) -> dict[str, tuple[float, float]]:
        """One timing of the index by ``slot``'s actor (`_reference`'s attempts)."""
        try:
            out = self._ray.get(slot.handle.reference.remote(self.options), timeout=self.timeout)
        except Exception:  # noqa: BLE001 - any failure only loses the index
            return {}
        return valid_refs(out)

    @staticmethod
    def _where(slot: _Slot | None, b: BuildResult) -> str:
        return slot.machine.describe() if slot is not None else "a node that left"

    # lifecycle --------------------------------------------------------------------------------

    def reset(self) -> None:
        """Abandon what is in flight: every actor is replaced (its answer must not be read as
        the next job's)."""
        for slot in list(self._slots):
            self._restart(slot)
        with self._lock:
            self._free = queue.Queue()
            for s in self._slots:
                self._free.put(s)

    def _shutdown(self) -> None:
        for s in self._slots:
            try:
                self._ray.kill(s.handle)
            except Exception:  # noqa: BLE001
                pass
        self._slots = []
        if self._own_ray:
            self._ray.shutdown()
            self._own_ray = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._shutdown()


__all__ = ["ClusterLost", "MeasuringActor", "RayRunner", "connect", "fits"]

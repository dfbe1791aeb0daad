"""Building, filtering and measuring GPU (cuda) candidates.

`GpuBuilder` replays, lowers and generates PTX in worker processes like `LocalBuilder`, and
filters what cannot launch before anything runs, as a `MeasureErrorNo.RESOURCE_LIMIT` record
that says why (not a silent drop):

* before lowering, from the target's limits (`tecomp.codegen.target.GPULimits`) and the
  schedule's inferred bounds: threads per block (and per dimension), shared memory (up to the
  arch's opt-in maximum, ``max_dynamic_smem``: 163 KB on sm_80, 227 KB on sm_90; above the
  static 48 KB codegen makes it dynamic shared memory, `tecomp.codegen.gpu_shared`);
* after codegen, from ptxas's report (when ptxas is installed): registers x threads per block
  against the register file (allocated per warp, in units of 256), static shared memory plus
  the launch's dynamic shared memory, and spills
  (``allow_spills=False`` by default: a spilling kernel is slow and hides its tile's cost).

`GpuRunner` measures on the GPU in an isolated, long-lived worker process (a faulting kernel
kills the worker, not the tuner; a hung one is killed at the deadline): each candidate's
first call is checked against the default schedule computed on the CPU, then timed with CUDA
events (`GpuFunction.time_evaluator`). Without a GPU it refuses to start, with the reason.

`EmulatingRunner` is the CI stand-in for machines without a GPU: it runs every candidate in
the emulator (`GpuFunction.emulate`, with its race detector) against the same reference,
and takes the candidate's "time" from `standin_cost`, a deterministic function of its launch
and ptxas resources. Its records carry ``"timing": "stand-in (test only)"``. It refuses to
start, and `RecordWriter` refuses to write such records, unless `STANDIN_ENV` is set (the
tests set it): a stand-in time is never a measurement.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .machine import gpu_machine_job
from .measure import (
    _PREPARED,
    BuildResult,
    LocalBuilder,
    LocalRunner,
    MeasureErrorNo,
    MeasureInput,
    RunOptions,
    _prepare_job,
)
from .steps import Step
from .task import SearchTask, TuningError

STANDIN_TIMING = "stand-in (test only)"
STANDIN_ENV = "TECOMP_TUNING_TEST_STANDIN"
# the register file of one block is allocated per warp, in units of this many registers
REGISTER_ALLOC_UNIT = 256


def check_standin_allowed(what: str) -> None:
    """Raise unless the test flag `STANDIN_ENV` is set."""
    if os.environ.get(STANDIN_ENV, "") != "1":
        raise TuningError(f"{what}: stand-in timings are for tecomp's own tests only (set "
                          f"{STANDIN_ENV}=1 in a test); they are not measurements. Tune cuda "
                          "tasks on a machine with a GPU (GpuRunner)")


def require_gpu() -> str:
    """The device description; TuningError with the reason when no kernel can run here."""
    from tecomp.runtime.cuda import cuda_available

    ok, why = cuda_available()
    if not ok:
        raise TuningError(f"tuning a cuda task needs an NVIDIA GPU, and none can be used here: {why}. "
                          "Candidates are timed on the device; run the tuning on a machine with a "
                          "GPU and the 'cuda' extra installed")
    return why


# the launch check ---------------------------------------------------------------------------


def launch_problems(sch: Any, args: Sequence[Any], target: Any) -> list[str]:
    """Why the kernels of ``sch`` cannot launch on ``target`` (empty: they can), read from
    the schedule's inferred bounds, per kernel (a root stage and what is computed in it)."""
    from tecomp.ir import dtype as dt
    from tecomp.ir.expr import IntImm
    from tecomp.lowering.schedule_ops import Lowering

    lw = Lowering(sch, list(args), "launch_check", target)
    lim = target.gpu

    def root(st: Any) -> Any:
        while st.attach_type == "scope" and st.attach_stage is not None:
            st = st.attach_stage
        return st

    kernels: dict[str, list[Any]] = {}
    for st in lw.stages:
        kernels.setdefault(root(st).op.name, []).append(st)
    out: list[str] = []
    for name, stages in kernels.items():
        ext: dict[str, int] = {}
        smem = 0
        for st in stages:
            b = lw.bounds[st]
            for leaf in st.leaf_iter_vars:
                a = st.iter_var_attrs.get(leaf)
                tag = a.bind_thread.thread_tag if a is not None and a.bind_thread is not None else ""
                e = b.ext.get(leaf)
                if tag.startswith("threadIdx") and isinstance(e, IntImm):
                    ext[tag] = max(ext.get(tag, 1), e.value)
            dims = [d.value for d in b.buf_ext if isinstance(d, IntImm)]
            if lw.scopes.get(st) == "shared" and len(dims) == len(b.buf_ext):
                item = np.dtype(dt.to_numpy(st.op.output(0).dtype)).itemsize
                smem += _shared_elements(st, dims) * _slots(st, stages) * item
        threads = math.prod(ext.values())
        for k, axis in enumerate("xyz"):
            n = ext.get(f"threadIdx.{axis}", 1)
            if n > lim.max_block_dims[k]:
                out.append(f"kernel of {name}: threadIdx.{axis} extent {n} exceeds {lim.arch}'s "
                           f"limit of {lim.max_block_dims[k]}")
        if threads > lim.max_threads_per_block:
            out.append(f"kernel of {name}: {threads} threads per block exceed {lim.arch}'s limit "
                       f"of {lim.max_threads_per_block}")
        if smem > lim.max_dynamic_smem:
            out.append(f"kernel of {name}: {smem} bytes of shared memory exceed the "
                       f"{lim.max_dynamic_smem} bytes a block may use on {lim.arch} "
                       f"({lim.static_smem} static, the rest as dynamic shared memory by opt-in)")
    return out


def _shared_elements(st: Any, dims: list[int]) -> int:
    """Elements of one tile of shared stage ``st`` of extents ``dims``, its rows padded as
    ``storage_align`` pads them (the stride of a dimension rounded up to ``k * factor +
    offset``, as lowering lays the buffer out)."""
    align = st.storage_align_ or {}
    acc = 1  # the stride of dimension d, then the elements of dimensions d..
    for d in range(len(dims) - 1, -1, -1):
        if d in align:
            factor, offset = align[d]
            acc = max(-(-(acc - offset) // factor) * factor + offset, acc)
        acc *= dims[d]
    return acc


def _slots(st: Any, stages: Sequence[Any]) -> int:
    """Tiles of ``st`` that are live at once: a ``pipeline(depth)`` ring holds ``depth`` (the
    stages pipelined at one loop share the deepest ring asked for there, as
    passes/inject_software_pipeline.py makes them), ``double_buffer`` two, otherwise one."""
    depth = getattr(st, "pipeline_depth_", 0)
    if depth:
        at = (st.attach_stage, st.attach_ivar)
        return max(getattr(o, "pipeline_depth_", 0) for o in stages
                   if getattr(o, "pipeline_depth_", 0) and (o.attach_stage, o.attach_ivar) == at)
    return 2 if st.double_buffer_ else 1


def _launch_of(art: Any) -> dict[str, dict[str, int]]:
    """Per kernel name: threads per block, blocks (constant launch extents) and the dynamic
    shared memory its launch passes (a kernel above the static 48 KB; ptxas reports only the
    static part)."""
    from tecomp.codegen.gpu_shared import dynamic_shared_bytes
    from tecomp.ir.expr import IntImm

    out: dict[str, dict[str, int]] = {}
    for f in art.funcs:
        for k in f.attrs.get("kernels") or [f]:
            launch = k.attrs.get("launch") or {}
            vals = {t: e.value for t, e in launch.items() if isinstance(e, IntImm)}
            out[k.name] = {
                "threads": math.prod(v for t, v in vals.items() if t.startswith("threadIdx")),
                "blocks": math.prod(v for t, v in vals.items() if t.startswith("blockIdx")),
                "dynamic_shared_bytes": dynamic_shared_bytes(k, art.target),
            }
    return out


# local memory a thread may address (CUDA's limit since compute capability 2.0); a kernel
# declaring more is refused by cuLaunchKernel with CUDA_ERROR_INVALID_VALUE (an H100 run met
# a candidate whose 512x16 per-thread tile made an 8 MiB local depot)
MAX_LOCAL_BYTES = 512 * 1024


def ptxas_problems(kernels: dict[str, dict[str, Any]], target: Any, allow_spills: bool) -> list[str]:
    """Why kernels with these ptxas resources and launches cannot launch (or are refused)."""
    lim = target.gpu
    out = []
    for name, k in kernels.items():
        regs, threads = k.get("registers", 0), k.get("threads", 1)
        warps = -(-threads // lim.warp_size)
        per_warp = -(-regs * lim.warp_size // REGISTER_ALLOC_UNIT) * REGISTER_ALLOC_UNIT
        if warps * per_warp > lim.registers_per_sm:
            out.append(f"{name}: {regs} registers x {threads} threads ({warps * per_warp} allocated) "
                       f"exceed the {lim.registers_per_sm} registers a block may use on {lim.arch}")
        static, dynamic = k.get("shared_bytes", 0), k.get("dynamic_shared_bytes", 0)
        if static > lim.static_smem:
            out.append(f"{name}: {static} bytes of static shared memory exceed {lim.static_smem} on {lim.arch}")
        elif static + dynamic > lim.max_dynamic_smem:
            out.append(f"{name}: {static + dynamic} bytes of shared memory ({static} static, {dynamic} "
                       f"dynamic) exceed the {lim.max_dynamic_smem} a block may use on {lim.arch}")
        if k.get("stack_frame", 0) > MAX_LOCAL_BYTES:
            out.append(f"{name}: {k['stack_frame']} bytes of local memory per thread (a register "
                       f"tile ptxas could not keep in registers) exceed the {MAX_LOCAL_BYTES} a "
                       "thread may have")
        if not allow_spills and (k.get("spill_stores", 0) or k.get("spill_loads", 0)):
            out.append(f"{name}: ptxas spills registers ({k.get('spill_stores', 0)} bytes stored, "
                       f"{k.get('spill_loads', 0)} loaded) at {regs} registers per thread")
    return out


def gpu_build_job(task: SearchTask, steps: tuple[Step, ...], name: str,
                  allow_spills: bool = False) -> BuildResult:
    """Replay, check the launch, lower, generate PTX and check ptxas's report (runs in a
    builder process)."""
    t0 = time.perf_counter()
    try:
        sch, args = task.apply_steps(steps)
    except Exception as e:  # noqa: BLE001 - any failure to replay is this candidate's fault
        return BuildResult(None, name, error=MeasureErrorNo.SCHEDULE_ERROR,
                           error_msg=f"{type(e).__name__}: {e}"[:2000], time_s=time.perf_counter() - t0)
    from tecomp.codegen.backend import backend_for
    from tecomp.codegen.target import Target
    from tecomp.errors import TecompError
    from tecomp.lowering import lower

    tgt = Target.parse(task.target)
    try:
        problems = launch_problems(sch, args, tgt)
    except TecompError:
        problems = []  # lowering below reports it, with its own message
    if problems:
        return BuildResult(None, name, error=MeasureErrorNo.RESOURCE_LIMIT,
                           error_msg="cannot launch: " + "; ".join(problems),
                           time_s=time.perf_counter() - t0)
    try:
        func = lower(sch, args, name=name, target=tgt)
        backend = backend_for(tgt)
        art = backend.compile(backend.codegen([func], tgt, name=name))
    except Exception as e:  # noqa: BLE001
        return BuildResult(None, name, error=MeasureErrorNo.BUILD_ERROR,
                           error_msg=f"{type(e).__name__}: {e}"[:2000], time_s=time.perf_counter() - t0)
    kernels: dict[str, dict[str, Any]] = _launch_of(art)
    info: dict[str, Any] = {"kernels": kernels}
    from tecomp.codegen.ptxas import PtxasMissing, ptxas_resources

    try:
        report = ptxas_resources(art.binary.decode() if art.binary else "", tgt.cpu)
    except PtxasMissing as e:
        info["ptxas"] = f"not checked: {e}"
    except TecompError as e:
        return BuildResult(None, name, error=MeasureErrorNo.BUILD_ERROR, error_msg=f"ptxas: {e}"[:2000],
                           time_s=time.perf_counter() - t0)
    else:
        for kname, r in report.items():
            kernels.setdefault(kname, {"threads": 1, "blocks": 1}).update(
                registers=r.registers, shared_bytes=r.shared_bytes, spill_stores=r.spill_stores,
                spill_loads=r.spill_loads, stack_frame=r.stack_frame)
        problems = ptxas_problems(kernels, tgt, allow_spills)
        if problems:
            return BuildResult(None, name, error=MeasureErrorNo.RESOURCE_LIMIT,
                               error_msg="ptxas: " + "; ".join(problems), time_s=time.perf_counter() - t0,
                               info=info)
    return BuildResult(art, name, time_s=time.perf_counter() - t0, info=info)


class GpuBuilder(LocalBuilder):
    """`LocalBuilder` for cuda tasks: PTX instead of object code, and the launch filter
    (module docstring). ``allow_spills``: keep candidates that ptxas makes spill."""

    def __init__(self, n_workers: int | None = None, timeout: float = 60.0,
                 workdir: str | None = None, allow_spills: bool = False) -> None:
        super().__init__(n_workers, timeout, workdir)
        self.allow_spills = allow_spills

    def build(self, inputs: Sequence[MeasureInput]) -> list[BuildResult]:
        return self._collect(self.map(gpu_build_job, [(inp.task, inp.steps, "default_function", self.allow_spills)
                                                      for inp in inputs]))


# running ------------------------------------------------------------------------------------


def _check(data: dict[str, Any], arrays: list[np.ndarray], rtol: float) -> str | None:
    """Why the outputs in ``arrays`` differ from the reference (None: they agree)."""
    for k, ref in zip(data["outputs"], data["refs"]):
        out = arrays[k]
        if out.dtype.kind == "f":
            scale = float(np.sqrt(np.mean(np.square(ref, dtype=np.float64)))) if ref.size else 0.0
            ok = np.allclose(out, ref, rtol=rtol, atol=rtol * max(scale, 1e-30))
        else:
            ok = bool(np.array_equal(out, ref))
        if not ok:
            diff = np.abs(out.astype(np.float64) - ref)
            err = float(np.nanmax(diff)) if out.size and not np.isnan(diff).all() else float("nan")
            return f"output {k} differs from the default schedule's (max abs error {err:.3g})"
    return None


def _load(build: BuildResult) -> Any:
    from tecomp.codegen.backend import backend_for

    assert build.artifact is not None
    return backend_for(build.artifact.target).load(build.artifact)[build.func_name]


def _fresh(data: dict[str, Any]) -> list[np.ndarray]:
    arrays: list[np.ndarray] = data["arrays"]
    for k in data["outputs"]:
        arrays[k].fill(np.nan if arrays[k].dtype.kind == "f" else 0x5A)
    return arrays


def gpu_run_job(key: str, build: BuildResult, opts: RunOptions) -> tuple[str, tuple[float, ...], str]:
    """Check then time one candidate on the GPU (runs in the measuring process)."""
    data = _PREPARED[key]
    try:
        f = _load(build)
    except Exception as e:  # noqa: BLE001
        return "RUN_ERROR", (), f"cannot load the kernel: {e}"
    arrays = _fresh(data)
    try:
        f(*arrays)
    except Exception as e:  # noqa: BLE001
        return "RUN_ERROR", (), f"{type(e).__name__}: {e}"
    if opts.check:
        why = _check(data, arrays, opts.rtol)
        if why is not None:
            return "WRONG_ANSWER", (), why
    try:
        # CUDA events around ``number`` launches per repeat; device copies stay out of it
        res = f.time_evaluator(number=opts.number, repeat=opts.repeat,
                               min_repeat_ms=opts.min_repeat_ms)(*arrays)
    except Exception as e:  # noqa: BLE001
        return "RUN_ERROR", (), f"{type(e).__name__}: {e}"
    return "NO_ERROR", tuple(float(x) for x in res.results), ""


class GpuRunner(LocalRunner):
    """Measures cuda candidates on the GPU in an isolated process (module docstring);
    raises `TuningError` at once when this machine has no usable GPU."""

    prepare_job = staticmethod(_prepare_job)
    run_job = staticmethod(gpu_run_job)
    machine_job = staticmethod(gpu_machine_job)  # records name the GPU that measured
    # no GPU reference kernel yet (`tuning.speed`): GPU results carry no speed index and are
    # compared by their raw costs (a CPU kernel's time says nothing of the GPU's)
    reference_job = None

    def __init__(self, timeout: float = 10.0, number: int = 10, repeat: int = 3,
                 min_repeat_ms: float = 10.0, check: bool = True, rtol: float = 1e-3,
                 ref_timeout: float = 600.0, workdir: str | None = None) -> None:
        self.device = require_gpu()
        super().__init__(timeout=timeout, number=number, repeat=repeat, min_repeat_ms=min_repeat_ms,
                         check=check, rtol=rtol, ref_timeout=ref_timeout, workdir=workdir)


def standin_cost(info: dict[str, Any], flop_ct: float, sm_count: int = 108) -> float:
    """A deterministic pseudo-time (seconds) from a candidate's launches and ptxas resources:
    FOR TESTS ONLY. It rewards filling the machine (blocks x threads up to the SMs' thread
    slots) and punishes registers; it is not a model of any GPU."""
    total = 1e-6
    kernels = info.get("kernels") or {}
    for k in kernels.values():
        threads, blocks = max(k.get("threads", 1), 1), max(k.get("blocks", 1), 1)
        fill = min(1.0, threads * blocks / (sm_count * 2048.0))
        total += 2e-6 + 1e-9 * k.get("registers", 32) * threads / 32.0 + 1e-12 * flop_ct / max(fill, 1e-4)
    return total / max(len(kernels), 1)


def emulate_run_job(key: str, build: BuildResult, opts: RunOptions) -> tuple[str, tuple[float, ...], str, str]:
    """Emulate one candidate, check it, and give it the stand-in time (test only)."""
    data = _PREPARED[key]
    try:
        f = _load(build)
    except Exception as e:  # noqa: BLE001
        return "RUN_ERROR", (), f"cannot load the kernel: {e}", ""
    arrays = _fresh(data)
    try:
        f.emulate(*arrays)  # the race detector raises on a race
    except Exception as e:  # noqa: BLE001
        return "RUN_ERROR", (), f"{type(e).__name__}: {e}"[:2000], ""
    why = _check(data, arrays, opts.rtol)
    if why is not None:
        return "WRONG_ANSWER", (), why, ""
    return "NO_ERROR", (standin_cost(build.info, data.get("flop_ct", 0.0)),), "", STANDIN_TIMING


def _prepare_emulated(task: SearchTask, cache_dir: str) -> str:
    key = _prepare_job(task, cache_dir)
    _PREPARED[key]["flop_ct"] = task.flop_ct
    return key


class EmulatingRunner(LocalRunner):
    """TEST STAND-IN for `GpuRunner` on machines without a GPU: emulates every candidate
    against the reference and times it with `standin_cost`; its results are labelled
    `STANDIN_TIMING`. Refuses to start unless `STANDIN_ENV` is set."""

    prepare_job = staticmethod(_prepare_emulated)
    run_job = staticmethod(emulate_run_job)
    reference_job = None  # its "times" are a stand-in: there is no machine speed to index

    def __init__(self, timeout: float = 60.0, rtol: float = 1e-3, workdir: str | None = None) -> None:
        check_standin_allowed("EmulatingRunner")
        super().__init__(timeout=timeout, rtol=rtol, workdir=workdir)


__all__ = ["STANDIN_ENV", "STANDIN_TIMING", "EmulatingRunner", "GpuBuilder", "GpuRunner",
           "check_standin_allowed", "gpu_build_job", "launch_problems", "ptxas_problems",
           "require_gpu", "standin_cost"]

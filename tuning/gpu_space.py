"""The search space of cuda tasks: Ansor's GPU sketch rules on tecomp's schedule primitives.

Chosen by `tuning.space.space_for` for a task whose target kind is ``"cuda"``; it reuses the
CPU space's machinery (knobs, tile sampling and mutation, crossover) and replaces the rules:

* every injective stage that is not an output is inlined (a GPU recomputes an exp faster
  than it spills it to global memory, and each root stage would be a kernel of its own);
* an output that is, by its expression, a GEMM, a batch matmul or an NHWC conv2d with
  fp16/bf16 inputs and fp32 accumulation gets the tensor-core sketch first, on sm_80+ and
  where its shapes are whole mma tiles (`tuning.gpu_tensor_core`), then the SIMT ones;
* a reduction with data reuse (GEMM, conv) gets the multi-level tiling "SSSRRSRS": per
  spatial axis block / virtual thread / thread / two register levels, per reduce axis three
  levels; blocks and threads are two-dimensional as in TVM's GPU recipes (the last axis, a
  GEMM's N, on ``blockIdx.x`` / ``threadIdx.x``, the others fused on ``.y``: the M tile),
  or all on ``.x`` for a one-axis stage or more leading blocks than ``blockIdx.y`` counts;
  the virtual threads are bound to ``vthread``; the register tile is computed in a
  ``"local"`` stage (cache_write, or the reduction itself under its elementwise consumer),
  and in one sketch of two the reduction's inputs are staged in shared memory at the outer
  reduce loop, fetched cooperatively (fused, split by the block's ``threadIdx.y`` and
  ``threadIdx.x`` extents, an optional vector width);
* a reduction without reuse (a row sum, softmax's max and sum) either reduces across the
  threads of a block (its reduce axis split and bound to ``threadIdx.x``, one thread
  storing: tecomp lowers it to warp shuffles / shared memory), or gives each thread whole
  rows; when every such reduction is read only by one injective stage at its leading axes
  (a row softmax), a first sketch computes them all at that stage's row, a block per row:
  max, exp-sum and normalisation in one kernel (benchmarks/gpu_softmax.py's schedule);
* any other stage is fused, split into blocks of threads (with a few serial points per
  thread) and bound.

Knobs: tile sizes, threads per block, vector width of the cooperative fetch, points per
thread, ``auto_unroll_max_step``, and the tensor-core sketches' own. Fresh samples respect
the target's thread limit (a few redraws); candidates that still exceed a limit (by
mutation, or given explicitly) are built and then filtered with a recorded reason
(`tuning.gpu_measure`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tecomp.codegen.target import Target
from tecomp.lowering.inline import effective_bodies
from tecomp.te.tensor import ComputeOp, IterVar

from .gpu_tensor_core import (
    TC_MIN_ARCH,
    TensorCoreStep,
    schedule_tensor_core_gemm,
    tc_build,
    tc_config_problems,
    tc_conv_operands,
    tc_gemm_operands,
    tc_shared_bytes,
    tensor_core_gemm_schedule,
)
from .space import (
    MAX_SKETCHES,
    SearchSpace,
    Sketch,
    StagePlan,
    _Builder,
    _extent,
    _fusible_consumer,
    _has_reuse,
    _Mutate,
    _scan,
    register_space,
)
from .steps import (
    AnnotationStep,
    BindStep,
    CacheReadStep,
    CacheWriteStep,
    ComputeAtStep,
    ComputeInlineStep,
    FuseStep,
    PragmaStep,
    SplitStep,
    State,
    StorePredicateStep,
)
from .task import SearchTask

GPU_UNROLL_CHOICES = (0, 16, 64, 512, 1024)
THREAD_CHOICES = (32, 64, 128, 256, 512, 1024)
CROSS_THREAD_CHOICES = (32, 64, 128, 256, 512)
POINTS_PER_THREAD = (1, 2, 4)
FETCH_VECTOR = (1, 2, 4)  # float4 is a thread's widest load
SPATIAL_GPU_LEVELS = 4  # vthread, thread, register x 2 (the block level is implied)
REDUCE_GPU_LEVELS = 2  # two inner levels (the outermost, where shared tiles load, implied)
MAX_VTHREAD = 8  # Ansor's max_vthread_extent
MAX_REGISTER_TILE = 64  # accumulators per thread a fresh sample may take (more spills)
MIN_THREADS = 32  # a fresh sample fills at least a warp when the tile allows
REDRAWS = 24  # fresh draws of a tiling before a sample gives up and keeps the last one
CROSS_THREAD_MIN_REDUCE = 32  # a reduction shorter than a warp is not worth sharing
BLOCK_THREADS_KNOB = "block/threads"


@dataclass(frozen=True)
class GpuSketch(Sketch):
    def describe(self) -> str:
        parts = []
        for p in self.plans:
            if p.kind == "tile":
                how = "+cache_write" if p.cache_write else f"+under {p.consumer}" if p.consumer else ""
                shared = f"+shared({','.join(p.pack)})" if p.pack else ""
                parts.append(f"{p.stage}:SSSRRSRS{how}{shared}")
            elif p.kind == "cross_thread" and p.consumer:
                parts.append(f"{p.stage}:cross_thread@{p.consumer}")
            elif p.kind != "simple":
                parts.append(f"{p.stage}:{p.kind}")
        return ", ".join(parts) or "simple"


def _row_consumer(reductions: Sequence[Any], live: Sequence[Any], bodies: Mapping[Any, list[Any]]) -> str | None:
    """The one stage under whose rows every reduction of ``reductions`` (all without reuse,
    say a softmax's max and sum) can be computed, so that they and it make one kernel (a
    block per row: benchmarks/gpu_softmax.py's one-kernel schedule): an injective stage that
    reads each of them, directly or through another of them, at its own leading axes, with
    more axes to spread over the block's threads. None when there is none."""
    names = {st.op.name for st in reductions}
    rows = {len(st.op.axis) for st in reductions}
    if len(rows) != 1 or not next(iter(rows)):
        return None
    (r,) = rows
    found: str | None = None
    for other in live:
        op = other.op
        if op.name in names:
            continue
        loads = [ld for ld in _scan(bodies[other]).loads if ld.producer.op.name in names]
        if not loads:
            continue
        if found is not None or op.reduce_axis or len(op.axis) <= r:
            return None
        lead = [a.var for a in op.axis[:r]]
        if any(len(ld.indices) != r or any(i is not v for i, v in zip(ld.indices, lead)) for ld in loads):
            return None
        found = op.name
    if found is None:
        return None
    # a reduction read by nothing but the consumer and the other reductions
    for st in reductions:
        readers = {o.op.name for o in live
                   if any(ld.producer.op.name == st.op.name for ld in _scan(bodies[o]).loads)}
        if not readers <= names | {found}:
            return None
    return found


def generate_gpu_sketches(task: SearchTask) -> list[Sketch]:
    """The GPU sketches of ``task`` (at least one), the most promising structure first."""
    state = State(task)
    sch = state.sch
    outputs = {op.name for op in task.outputs}
    inline = [st.op.name for st in sch.stages
              if isinstance(st.op, ComputeOp) and not st.op.reduce_axis and st.op.name not in outputs]
    for name in inline:
        state.apply(ComputeInlineStep(name))
    bodies = effective_bodies(sch)
    live = [st for st in sch.stages if isinstance(st.op, ComputeOp) and st.attach_type != "inline"]
    options: list[list[StagePlan]] = [[StagePlan(name, "inline")] for name in inline]
    tc_ok = Target.parse(task.target).gpu.compute_capability >= (TC_MIN_ARCH // 10, 0)
    for st in live:
        op = st.op
        assert isinstance(op, ComputeOp)
        if not op.reduce_axis or op.num_outputs != 1:
            continue
        if tc_ok and op.name in outputs and (tc_gemm_operands(op) is not None
                                             or tc_conv_operands(op) is not None):
            # the tensor-core sketch first, then the SIMT tilings of the same GEMM
            tc_opts = [StagePlan(op.name, "tensor_core")]
        else:
            tc_opts = []
        if _has_reuse(op, bodies[st]):
            fused = _fusible_consumer(st, live, bodies)
            consumer = fused if fused is not None and op.name not in outputs else None
            # the reduction's direct inputs: placeholders or inlined stages (a shared stage
            # then computes the inlined body, e.g. the zero padding of a conv)
            shared = tuple(dict.fromkeys(t.op.name for t in op.input_tensors))
            opts = [StagePlan(op.name, "tile", cache_write=consumer is None, consumer=consumer, pack=p)
                    for p in (shared, ())]
            options.append(tc_opts + opts)
        else:
            red = math.prod(_extent(r) for r in op.reduce_axis)
            if red >= CROSS_THREAD_MIN_REDUCE:
                spatial = math.prod(_extent(a) for a in op.axis)
                opts = [StagePlan(op.name, "cross_thread"), StagePlan(op.name, "simple")]
                if spatial >= 64 * red:  # many short rows: whole rows per thread come first
                    opts.reverse()
                options.append(opts)
    sketches: list[Sketch] = [GpuSketch(tuple(combo)) for combo in itertools.product(*options)]
    # every cross-thread reduction under the rows of its one consumer: one kernel, and the
    # reductions' results never round-trip through global memory (first: the most promising)
    shared_rows = [st for st in live if any(p.kind == "cross_thread" and p.stage == st.op.name
                                            for opts in options for p in opts)]
    if shared_rows and len(shared_rows) == sum(1 for st in live if isinstance(st.op, ComputeOp)
                                               and st.op.reduce_axis):
        consumer = _row_consumer(shared_rows, live, bodies)
        if consumer is not None:
            plans = [opts[0] for opts in options if opts[0].kind == "inline"]
            plans += [StagePlan(st.op.name, "cross_thread", consumer=consumer) for st in shared_rows]
            sketches.insert(0, GpuSketch((*plans, StagePlan(consumer, "rows"))))
    return sketches[:MAX_SKETCHES]


class _GpuBuilder(_Builder):
    """Applies a GPU sketch to a fresh State (knobs as in `_Builder`)."""

    # a GPU thread's "register" is one 16-byte load: no width is favoured for it
    register_vector_prior = 1.0

    def __init__(self, task: SearchTask, sketch: Sketch, params: Mapping[str, Any],
                 rng: np.random.Generator | None) -> None:
        # a private copy: a tiling redraw forgets the knobs it drew (see _tiles)
        super().__init__(task, sketch, dict(params), rng)
        self.own: dict[str, Any] = self.params  # type: ignore[assignment]
        self.limits = Target.parse(task.target).gpu

    def build(self) -> None:
        tiles: dict[str, tuple[str, StagePlan]] = {}  # outer stage -> (register stage, plan)
        done: set[str] = set()
        for p in self.sketch.plans:
            if p.kind == "inline":
                self.apply(ComputeInlineStep(p.stage))
        for p in self.sketch.plans:
            if p.kind == "tensor_core":
                before = {st.op.name for st in self.state.sch.stages}
                tc_build(self, p.stage)
                # the step schedules the stages it creates (shared, fragments) as well
                done.update({st.op.name for st in self.state.sch.stages} - before, {p.stage})
        for p in self.sketch.plans:
            if p.kind != "tile":
                continue
            if p.consumer is not None:
                compute, outer = p.stage, p.consumer
            else:
                self.apply(CacheWriteStep(p.stage, "local"))
                compute, outer = f"{p.stage}.local", p.stage
            tiles[outer] = (compute, p)
            done.add(compute)
        plans = {p.stage: p for p in self.sketch.plans}
        kinds = {p.stage: p.kind for p in self.sketch.plans}
        # tecomp's cross-thread lowering checks a reduction's threads against the widest
        # threadIdx loop of the whole schedule, not of its own kernel (reported upstream): so
        # in a sketch with one, every kernel's block takes the same thread count, one knob
        self.block_threads: int | None = None
        if "cross_thread" in kinds.values():
            red = min(math.prod(_extent(r) for r in self._op(p.stage).reduce_axis)
                      for p in self.sketch.plans if p.kind == "cross_thread")
            opts = [t for t in CROSS_THREAD_CHOICES if t <= max(red, CROSS_THREAD_CHOICES[0])]
            self.block_threads = self.choice(BLOCK_THREADS_KNOB, tuple(opts))
        for stage in reversed(list(self.state.sch.stages)):
            name = stage.op.name
            if not isinstance(stage.op, ComputeOp) or stage.attach_type == "inline" or name in done:
                continue
            if name in tiles:
                compute, plan = tiles[name]
                self._tile(compute, name, plan)
            elif kinds.get(name) == "cross_thread":
                self._cross_thread(name, plans[name].consumer)
            elif kinds.get(name) == "rows":
                self._rows(name, max(len(self._op(p.stage).axis) for p in self.sketch.plans
                                     if p.kind == "cross_thread" and p.consumer == name))
            else:
                self._simple(name)
            done.add(name)

    def _op(self, name: str) -> ComputeOp:
        op = self.state.stage(name).op
        assert isinstance(op, ComputeOp)
        return op

    # multi-level tiling -----------------------------------------------------------------------
    def _tiles(self, key: str, spatial: Sequence[IterVar], reduce: Sequence[IterVar],
               ) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
        """Spatial (vthread, thread, reg, reg) and reduce (mid, inner) factors. A fresh draw
        is redrawn until the block has 32..max threads, at most MAX_VTHREAD virtual threads
        and a register tile of at most MAX_REGISTER_TILE; knob values that were given are
        kept as they are, limits or not (the builder filters those with a reason)."""
        keys = [f"{key}/S{d}" for d in range(len(spatial))]
        given = {k for k in keys if k in self.params and not isinstance(self.params[k], _Mutate)}
        exts = [_extent(a) for a in spatial]
        s_tiles: list[tuple[int, ...]] = []
        for attempt in range(REDRAWS):
            s_tiles = [self.tile(k, e, SPATIAL_GPU_LEVELS, max_inner=e) for k, e in zip(keys, exts)]
            threads = math.prod(f[1] for f in s_tiles)
            vthreads = math.prod(f[0] for f in s_tiles)
            regs = math.prod(f[2] * f[3] for f in s_tiles)
            enough = threads >= min(MIN_THREADS, math.prod(exts))
            if given.issuperset(keys) or attempt == REDRAWS - 1 or (
                    threads <= self.limits.max_threads_per_block and enough
                    and vthreads <= MAX_VTHREAD and regs <= MAX_REGISTER_TILE):
                break
            for k in keys:  # redraw the knobs that were not given
                if k not in given:
                    self.own.pop(k, None)
                    self.used.pop(k, None)
        r_tiles = [self.tile(f"{key}/R{d}", _extent(r), REDUCE_GPU_LEVELS) for d, r in enumerate(reduce)]
        return s_tiles, r_tiles

    def _tile(self, compute: str, outer: str, plan: StagePlan) -> None:
        key = plan.stage
        cop = self.state.stage(compute).op
        yop = self.state.stage(outer).op
        assert isinstance(cop, ComputeOp) and isinstance(yop, ComputeOp)
        n = len(yop.axis)
        s_tiles, r_tiles = self._tiles(key, cop.axis, cop.reduce_axis)
        threads = math.prod(f[1] for f in s_tiles)
        shared: list[str] = []
        for t in plan.pack:
            name = f"{t}.shared"
            if not self.state.has_stage(name):
                self.apply(CacheReadStep(t, "shared", (compute,)))
                shared.append(name)
        # outer stage: S0 (block) S1 (vthread) S2 (thread) | register tile
        parts = self._split_all(outer, yop.axis, [(f[0], f[1], f[2] * f[3]) for f in s_tiles])
        self._reorder(outer, [p[lvl] for lvl in range(4) for p in parts])
        exts = [_extent(a) for a in yop.axis]
        lead_blocks = math.prod(-(-e // math.prod(f)) for e, f in zip(exts[:-1], s_tiles))
        if n > 1 and lead_blocks <= self.limits.max_grid_dims[1]:
            # 2-D blocks and grid as TVM's GPU recipes: the last axis (a GEMM's N, the
            # contiguous one) on x, the others fused on y (the M tile); threads of a warp then
            # run along the last axis, so their loads and stores coalesce
            if n > 2:
                self.apply(FuseStep(outer, tuple(range(n - 1))))
            self.apply(BindStep(outer, 0, "blockIdx.y"))
            self.apply(BindStep(outer, 1, "blockIdx.x"))
            for d in range(n):
                self.apply(BindStep(outer, 2 + d, "vthread"))
            if n > 2:
                self.apply(FuseStep(outer, tuple(range(n + 2, 2 * n + 1))))
            self.apply(BindStep(outer, n + 2, "threadIdx.y"))
            self.apply(BindStep(outer, n + 3, "threadIdx.x"))
            at = n + 3
            thread_dims = (math.prod(f[1] for f in s_tiles[:-1]), s_tiles[-1][1])
        else:  # one axis, or more blocks on the leading axes than blockIdx.y can count
            if n > 1:
                self.apply(FuseStep(outer, tuple(range(n))))
            self.apply(BindStep(outer, 0, "blockIdx.x"))
            for d in range(n):
                self.apply(BindStep(outer, 1 + d, "vthread"))
            if n > 1:
                self.apply(FuseStep(outer, tuple(range(n + 1, 2 * n + 1))))
            self.apply(BindStep(outer, n + 1, "threadIdx.x"))
            at = n + 1
            thread_dims = (1, threads)
        self.apply(ComputeAtStep(compute, outer, at))
        # register stage: R0 R1 S3 R2 S4
        sp = self._split_all(compute, cop.axis, [(f[3],) for f in s_tiles])
        rp = self._split_all(compute, cop.reduce_axis, r_tiles)
        order = ([p[0] for p in rp] + [p[1] for p in rp] + [p[0] for p in sp] + [p[2] for p in rp]
                 + [p[1] for p in sp])
        self._reorder(compute, order)
        if rp:
            at = self.state.index(compute, rp[-1][0])
            for name in shared:
                self._cooperative_fetch(name, compute, at, thread_dims, key)
        u = self.choice(f"{key}/unroll", GPU_UNROLL_CHOICES)
        if u:
            self.apply(PragmaStep(compute, 0, "auto_unroll_max_step", u))

    def _cooperative_fetch(self, name: str, compute: str, at: int, threads: tuple[int, int], key: str) -> None:
        """Compute the shared stage at the outer reduce loop; every thread of the block loads
        a share of it: its axes fused, split by the block's ``(threadIdx.y, threadIdx.x)``
        extents (and a vector width), x innermost so a warp reads consecutive elements."""
        self.apply(ComputeAtStep(name, compute, at))
        leaves = self.state.leaves(name)
        if len(leaves) > 1:
            self.apply(FuseStep(name, tuple(range(len(leaves)))))
        vec = self.choice(f"{key}/fetch_vec_{name.split('.')[0]}", FETCH_VECTOR)
        ty, tx = threads
        factors = ((ty,) if ty > 1 else ()) + (tx,) + ((vec,) if vec > 1 else ())
        self.apply(SplitStep(name, 0, factors))
        if ty > 1:
            self.apply(BindStep(name, 1, "threadIdx.y"))
        self.apply(BindStep(name, len(factors) - (vec > 1), "threadIdx.x"))
        if vec > 1:
            self.apply(AnnotationStep(name, len(factors), "vectorize"))

    # reductions without reuse, everything else ----------------------------------------------
    def _cross_thread(self, name: str, consumer: str | None = None) -> None:
        """The reduce axes split by the block's threads (bound to threadIdx.x, one thread
        storing); the rows bound to blockIdx.x, or, with a ``consumer``, computed at its row
        loop (`_rows`): the reduction then runs inside the consumer's kernel."""
        op = self._op(name)
        n, m = len(op.axis), len(op.reduce_axis)
        if consumer is not None:
            self.apply(ComputeAtStep(name, consumer, 0))
            lead = n  # the row axes have extent 1 under the consumer's row
        else:
            if n > 1:
                self.apply(FuseStep(name, tuple(range(n))))
            if n:
                self.apply(BindStep(name, 0, "blockIdx.x"))
            lead = 1 if n else 0
        if m > 1:
            self.apply(FuseStep(name, tuple(range(lead, lead + m))))
        assert self.block_threads is not None
        t = self.block_threads
        self.apply(SplitStep(name, lead, (t,)))
        self.apply(BindStep(name, lead + 1, "threadIdx.x"))
        self.apply(StorePredicateStep(name, "threadIdx.x"))
        u = self.choice(f"{name}/unroll", GPU_UNROLL_CHOICES)
        if u:
            self.apply(PragmaStep(name, lead, "auto_unroll_max_step", u))

    def _rows(self, name: str, rows: int) -> None:
        """A block per row (the first ``rows`` axes fused, bound to blockIdx.x) whose threads
        take the rest of the row: consecutive threads, consecutive points (coalesced)."""
        op = self._op(name)
        n = len(op.axis)
        if rows > 1:
            self.apply(FuseStep(name, tuple(range(rows))))
        if n - rows > 1:
            self.apply(FuseStep(name, tuple(range(1, 1 + n - rows))))
        self.apply(BindStep(name, 0, "blockIdx.x"))
        assert self.block_threads is not None
        self.apply(SplitStep(name, 1, (self.block_threads,)))
        self.apply(BindStep(name, 2, "threadIdx.x"))

    def _simple(self, name: str) -> None:
        op = self.state.stage(name).op
        assert isinstance(op, ComputeOp)
        n = len(op.axis)
        total = math.prod(_extent(a) for a in op.axis)
        if n > 1:
            self.apply(FuseStep(name, tuple(range(n))))
        # at least one warp where there is a warp of work; more threads than points idle
        opts = [t for t in THREAD_CHOICES if t <= max(total, THREAD_CHOICES[0])]
        t = self.block_threads or self.choice(f"{name}/threads", tuple(opts))
        per = self.choice(f"{name}/per_thread", tuple(p for p in POINTS_PER_THREAD if p * t <= max(total, t)))
        if per > 1:
            # block / point / thread: the threads of a warp touch consecutive points
            self.apply(SplitStep(name, 0, (per, t)))
            self.apply(BindStep(name, 0, "blockIdx.x"))
            self.apply(BindStep(name, 2, "threadIdx.x"))
        else:
            self.apply(SplitStep(name, 0, (t,)))
            self.apply(BindStep(name, 0, "blockIdx.x"))
            self.apply(BindStep(name, 1, "threadIdx.x"))
        if op.reduce_axis:
            u = self.choice(f"{name}/unroll", GPU_UNROLL_CHOICES)
            if u:
                self.apply(PragmaStep(name, len(self.state.leaves(name)) - len(op.reduce_axis),
                                      "auto_unroll_max_step", u))


@register_space
class GpuSearchSpace(SearchSpace):
    """The search space of a cuda task (module docstring)."""

    kind = "cuda"

    def make_sketches(self, task: SearchTask) -> Sequence[Sketch]:
        return generate_gpu_sketches(task)

    def builder(self, sketch: Sketch, params: Mapping[str, Any],
                rng: np.random.Generator | None) -> _Builder:
        return _GpuBuilder(self.task, sketch, params, rng)


# the tensor-core names, re-exported: benchmarks and tests import them from here
__all__ = ["GpuSearchSpace", "GpuSketch", "TensorCoreStep", "generate_gpu_sketches", "schedule_tensor_core_gemm",
           "tc_config_problems", "tc_gemm_operands", "tc_shared_bytes", "tensor_core_gemm_schedule"]

"""The search space of cuda tasks: Ansor's GPU sketch rules on tecomp's schedule primitives.

Chosen by `tuning.space.space_for` for a task whose target kind is ``"cuda"``; it reuses the
CPU space's machinery (knobs, tile sampling and mutation, crossover) and replaces the rules:

* every injective stage that is not an output is inlined (a GPU recomputes an exp faster
  than it spills it to global memory, and each root stage would be a kernel of its own);
* a reduction with data reuse (GEMM, conv) gets the multi-level tiling "SSSRRSRS": per
  spatial axis block / virtual thread / thread / two register levels, per reduce axis three
  levels; the blocks' loops are fused and bound to ``blockIdx.x``, the threads' to
  ``threadIdx.x``, the virtual threads bound to ``vthread``; the register tile is computed
  in a ``"local"`` stage (cache_write, or the reduction itself under its elementwise
  consumer), and in one sketch of two the reduction's inputs are staged in shared memory at
  the outer reduce loop, fetched cooperatively (fused, split by the block's threads, bound to
  ``threadIdx.x``, an optional vector width);
* a reduction without reuse (a row sum, softmax's max and sum) either reduces across the
  threads of a block (its reduce axis split and bound to ``threadIdx.x``, one thread
  storing: tecomp lowers it to warp shuffles / shared memory), or gives each thread whole
  rows;
* any other stage is fused, split into blocks of threads (with a few serial points per
  thread) and bound.

Knobs: tile sizes, threads per block, vector width of the cooperative fetch, points per
thread, ``auto_unroll_max_step``. Fresh samples respect the target's thread limit (a few
redraws); candidates that still exceed a limit (by mutation, or given explicitly) are built
and then filtered with a recorded reason (`tuning.gpu_measure`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from tecomp.codegen.target import Target
from tecomp.lowering.inline import effective_bodies
from tecomp.te.tensor import ComputeOp, IterVar

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
    Step,
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
            elif p.kind != "simple":
                parts.append(f"{p.stage}:{p.kind}")
        return ", ".join(parts) or "simple"


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
        if tc_ok and op.name in outputs and tc_gemm_operands(op) is not None:
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
    return sketches[:MAX_SKETCHES]


class _GpuBuilder(_Builder):
    """Applies a GPU sketch to a fresh State (knobs as in `_Builder`)."""

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
                _tc_build(self, p.stage)
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
                self._cross_thread(name)
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
        if n > 1:
            self.apply(FuseStep(outer, tuple(range(n))))
        self.apply(BindStep(outer, 0, "blockIdx.x"))
        for d in range(n):
            self.apply(BindStep(outer, 1 + d, "vthread"))
        if n > 1:
            self.apply(FuseStep(outer, tuple(range(n + 1, 2 * n + 1))))
        self.apply(BindStep(outer, n + 1, "threadIdx.x"))
        self.apply(ComputeAtStep(compute, outer, n + 1))
        # register stage: R0 R1 S3 R2 S4
        sp = self._split_all(compute, cop.axis, [(f[3],) for f in s_tiles])
        rp = self._split_all(compute, cop.reduce_axis, r_tiles)
        order = ([p[0] for p in rp] + [p[1] for p in rp] + [p[0] for p in sp] + [p[2] for p in rp]
                 + [p[1] for p in sp])
        self._reorder(compute, order)
        if rp:
            at = self.state.index(compute, rp[-1][0])
            for name in shared:
                self._cooperative_fetch(name, compute, at, threads, key)
        u = self.choice(f"{key}/unroll", GPU_UNROLL_CHOICES)
        if u:
            self.apply(PragmaStep(compute, 0, "auto_unroll_max_step", u))

    def _cooperative_fetch(self, name: str, compute: str, at: int, threads: int, key: str) -> None:
        """Compute the shared stage at the outer reduce loop; every thread of the block loads
        a share of it: its axes fused, split by the thread count (and a vector width)."""
        self.apply(ComputeAtStep(name, compute, at))
        leaves = self.state.leaves(name)
        if len(leaves) > 1:
            self.apply(FuseStep(name, tuple(range(len(leaves)))))
        vec = self.choice(f"{key}/fetch_vec_{name.split('.')[0]}", FETCH_VECTOR)
        factors = (threads, vec) if vec > 1 else (threads,)
        self.apply(SplitStep(name, 0, factors))
        self.apply(BindStep(name, 1, "threadIdx.x"))
        if vec > 1:
            self.apply(AnnotationStep(name, 2, "vectorize"))

    # reductions without reuse, everything else ----------------------------------------------
    def _cross_thread(self, name: str) -> None:
        op = self.state.stage(name).op
        assert isinstance(op, ComputeOp)
        n, m = len(op.axis), len(op.reduce_axis)
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


__all__ = ["GpuSearchSpace", "GpuSketch", "TensorCoreStep", "generate_gpu_sketches", "schedule_tensor_core_gemm",
           "tc_gemm_operands", "tc_shared_bytes", "tensor_core_gemm_schedule"]


# tensor cores ---------------------------------------------------------------------------------
#
# The schedule lives here (not in tecomp: tecomp never imports tuning) so that the benchmark
# (benchmarks/gpu_gemm.py) and the tuner's tensor-core sketch build the very same kernel.

TC_DTYPES = ("float16", "bfloat16")
TC_BLOCKS = (16, 32, 64, 128, 256)  # per spatial dimension of the block tile
TC_WARPS = (1, 2, 4)  # per spatial dimension (threadIdx.y, threadIdx.z)
TC_KSTEPS = (16, 32, 64)
TC_DEPTHS = (1, 2, 3, 4)  # 1: loaded synchronously (no pipeline); 2-4: cp.async ring
TC_PADS = (0, 8)  # elements appended to each shared row (storage_align): 16 bytes
TC_MIN_ARCH = 80
TC_VEC = 8  # elements per thread and copy: 16 bytes of fp16/bf16
TC_KNOBS = ("block_m", "block_n", "warps_m", "warps_n", "kstep", "depth", "pad")


def tc_shared_bytes(block: tuple[int, int], kstep: int, depth: int, pad: int, itemsize: int = 2) -> int:
    """Shared memory of the A and B tiles: ``max(depth, 1)`` slots of ``block_m x (kstep +
    pad)`` and ``kstep x (block_n + pad)`` elements (what codegen declares, rows padded)."""
    bm, bn = block
    return max(depth, 1) * (bm * (kstep + pad) + kstep * (bn + pad)) * itemsize


def tc_config_problems(m: int, n: int, k: int, block: tuple[int, int], warps: tuple[int, int],
                       kstep: int, depth: int, pad: int, smem_limit: int = 48 * 1024) -> list[str]:
    """Why this configuration does not fit a ``m x n x k`` GEMM (empty: it does): the tiles
    divide the problem exactly (no tails: tensorized tiles cannot be guarded), each warp's
    tile is whole 16x16 fragments, every thread copies whole 16-byte vectors of each shared
    tile, and the ring fits the static shared memory."""
    bm, bn = block
    wy, wz = warps
    out = []
    if m % bm or n % bn or k % kstep:
        out.append(f"tiles {bm}x{bn}x{kstep} do not divide {m}x{n}x{k}")
    if bm % (16 * wy) or bn % (16 * wz) or kstep % 16:
        out.append(f"warp tiles {bm}/{wy} x {bn}/{wz} (k {kstep}) are not multiples of 16")
    threads = 32 * wy * wz
    for rows, cols in ((bm, kstep), (kstep, bn)):
        if (rows * cols) % (TC_VEC * threads) or cols % TC_VEC:
            out.append(f"a {rows}x{cols} shared tile is not whole 16-byte copies for {threads} threads")
    if depth not in TC_DEPTHS or pad not in TC_PADS:
        out.append(f"depth {depth} / pad {pad} not in {TC_DEPTHS} / {TC_PADS}")
    smem = tc_shared_bytes(block, kstep, depth, pad)
    if smem > smem_limit:
        out.append(f"{smem} bytes of shared memory exceed the {smem_limit} bytes a block may declare")
    return out


def schedule_tensor_core_gemm(s: Any, C: Any, block: tuple[int, int] = (128, 128),
                              warps: tuple[int, int] = (2, 2), kstep: int = 32, depth: int = 1,
                              pad: int = 0) -> None:
    """Schedule ``C[i, j] = sum_k float32(A[i, k]) * float32(B[k, j])`` (A, B float16 or
    bfloat16 placeholders) in ``s`` on tensor cores (mma.sync.m16n8k16 + ldmatrix, sm_80+).

    A ``block`` tile of C per thread block, ``warps`` warps (threadIdx.y, threadIdx.z) each
    owning a ``block / warps`` tile held in accumulator fragments; per ``kstep`` slice of k,
    the block's tiles of A and B are staged in shared memory by all threads (16 bytes per
    thread and copy), then each warp loads its A (ldmatrix.x4) and B (ldmatrix.x4.trans)
    fragments 16 deep and issues one mma.m16n8k16 per 16x8 tile of its C tile; the fragments
    are stored to C directly. threadIdx.x is the lane (32), as the intrinsics require.

    ``depth`` 2-4 software-pipelines the shared tiles (``pipeline(depth)``: a ring of
    ``depth`` slots filled by 16-byte ``cp.async.cg``, ``depth - 1`` tiles in flight while the
    warps compute; 1 loads synchronously). ``pad`` (0 or a multiple of 8) pads every shared
    row by that many elements (``storage_align``): ldmatrix's 8 row addresses then fall in
    different banks (rows of 64 or 256 bytes would put 2-8 of them in the same bank)."""
    from tecomp import te
    from tecomp.te import intrin_cuda as tci

    A, B = C.op.input_tensors
    dtype = A.dtype
    AS = s.cache_read(A, "shared", [C])
    BS = s.cache_read(B, "shared", [C])
    AF = s.cache_read(AS, tci.MATRIX_A, [C])
    BF = s.cache_read(BS, tci.MATRIX_B, [C])
    CF = s.cache_write(C, tci.ACCUMULATOR)
    bm, bn = block
    wy, wz = warps
    wm, wn = bm // wy, bn // wz
    # the output stage: blocks, warps, then 16x8 tiles stored from the fragments
    i, j = s[C].op.axis
    bi, i = s[C].split(i, factor=bm)
    bj, j = s[C].split(j, factor=bn)
    wi, i = s[C].split(i, factor=wm)
    wj, j = s[C].split(j, factor=wn)
    mi, i16 = s[C].split(i, factor=16)
    nj, j8 = s[C].split(j, factor=8)
    s[C].reorder(bi, bj, wi, wj, mi, nj, i16, j8)
    s[C].bind(bi, te.thread_axis("blockIdx.y"))
    s[C].bind(bj, te.thread_axis("blockIdx.x"))
    s[C].bind(wi, te.thread_axis("threadIdx.y"))
    s[C].bind(wj, te.thread_axis("threadIdx.z"))
    s[C].unroll(mi)
    s[C].unroll(nj)
    s[C].tensorize(i16, tci.store_c())
    # the warp's accumulators
    s[CF].compute_at(s[C], wj)
    ci, cj = s[CF].op.axis
    (ck,) = s[CF].op.reduce_axis
    ko, ck = s[CF].split(ck, factor=kstep)
    ki, k16 = s[CF].split(ck, factor=16)
    cmi, ci16 = s[CF].split(ci, factor=16)
    cnj, cj8 = s[CF].split(cj, factor=8)
    s[CF].reorder(ko, ki, cmi, cnj, ci16, cj8, k16)
    s[CF].unroll(ki)
    s[CF].unroll(cmi)
    s[CF].unroll(cnj)
    s[CF].tensorize(ci16, tci.mma_sync(dtype))
    # fragments, 16 deep in k
    s[AF].compute_at(s[CF], ki)
    s[BF].compute_at(s[CF], ki)
    ai, ak = s[AF].op.axis
    ami, ai16 = s[AF].split(ai, factor=16)
    s[AF].reorder(ami, ai16, ak)
    s[AF].unroll(ami)
    s[AF].tensorize(ai16, tci.ldmatrix_a(dtype))
    bk, bjj = s[BF].op.axis
    bnj, bj16 = s[BF].split(bjj, factor=16)
    s[BF].reorder(bnj, bk, bj16)
    s[BF].unroll(bnj)
    s[BF].tensorize(bk, tci.ldmatrix_b(dtype, n=16))
    # shared tiles: 8 elements (16 bytes) per thread and copy
    for X, row_len in ((AS, kstep), (BS, bn)):
        s[X].compute_at(s[CF], ko)
        row, col = s[X].op.axis
        if pad:  # rows of row_len + pad elements (row_len is the tile's, not the tensor's)
            s[X].storage_align(row, row_len, pad)
        col, vec = s[X].split(col, factor=TC_VEC)  # split before fusing: the 8 stay contiguous
        fo = s[X].fuse(row, col)
        fo, tx = s[X].split(fo, factor=32)
        fo, ty = s[X].split(fo, factor=wy)
        fo, tz = s[X].split(fo, factor=wz)
        s[X].reorder(fo, tz, ty, tx, vec)
        s[X].bind(tx, te.thread_axis("threadIdx.x"))
        s[X].bind(ty, te.thread_axis("threadIdx.y"))
        s[X].bind(tz, te.thread_axis("threadIdx.z"))
        s[X].vectorize(vec)
        if depth > 1:
            s[X].pipeline(depth)


def tensor_core_gemm_schedule(m: int, n: int, k: int, dtype: str = "float16",
                              block: tuple[int, int] = (128, 128), warps: tuple[int, int] = (2, 2),
                              kstep: int = 32, depth: int = 1, pad: int = 0) -> tuple[Any, list]:
    """``C[m, n] = sum_k float32(A[m, k]) * float32(B[k, n])`` scheduled by
    `schedule_tensor_core_gemm` (its knobs); returns ``(schedule, [A, B, C])``."""
    from tecomp import te

    A = te.placeholder((m, k), dtype, name="A")
    B = te.placeholder((k, n), dtype, name="B")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r].astype("float32") * B[r, j].astype("float32"),
                                               axis=r), name="C")
    s = te.create_schedule(C.op)
    schedule_tensor_core_gemm(s, C, block, warps, kstep, depth, pad)
    return s, [A, B, C]


def tc_gemm_operands(op: Any) -> tuple[Any, Any, int, int, int] | None:
    """``(A, B, m, n, k)`` when ``op`` is ``C[i, j] = sum_k float32(A[i, k]) * float32(B[k, j])``
    with A and B float16 or bfloat16 placeholders of one dtype and m, n, k multiples of 16
    (exactly: the tensor-core sketch does not pad); else None."""
    from tecomp.ir.expr import Cast, Mul, ProducerLoad, Reduce, Var
    from tecomp.te.tensor import PlaceholderOp

    if not isinstance(op, ComputeOp) or len(op.axis) != 2 or len(op.reduce_axis) != 1:
        return None
    if op.num_outputs != 1 or op.output(0).dtype != "float32" or len(op.body) != 1:
        return None
    red = op.body[0]
    if not (isinstance(red, Reduce) and getattr(red.combiner, "name", "") == "sum" and len(red.source) == 1):
        return None
    mul = red.source[0]
    if not isinstance(mul, Mul):
        return None
    loads = []
    for e in (mul.a, mul.b):
        if not (isinstance(e, Cast) and e.dtype == "float32" and isinstance(e.value, ProducerLoad)):
            return None
        loads.append(e.value)
    la, lb = loads
    i, j = (a.var for a in op.axis)
    r = op.reduce_axis[0].var

    def is_var(e: Any, v: Any) -> bool:
        return isinstance(e, Var) and e is v

    A, B = la.producer, lb.producer
    if not (len(la.indices) == 2 and is_var(la.indices[0], i) and is_var(la.indices[1], r)
            and len(lb.indices) == 2 and is_var(lb.indices[0], r) and is_var(lb.indices[1], j)):
        return None
    if not (isinstance(A.op, PlaceholderOp) and isinstance(B.op, PlaceholderOp)):
        return None
    if A.dtype != B.dtype or A.dtype not in TC_DTYPES or list(op.input_tensors) != [A, B]:
        return None
    m, n, k = _extent(op.axis[0]), _extent(op.axis[1]), _extent(op.reduce_axis[0])
    if m % 16 or n % 16 or k % 16:
        return None
    return A, B, m, n, k


@dataclass(frozen=True)
class TensorCoreStep(Step):
    """Schedule stage ``stage`` (a GEMM `tc_gemm_operands` accepts) on tensor cores with
    `schedule_tensor_core_gemm`: one step, since the schedule's tensorize, storage_align and
    pipeline have no step of their own; its fields are the knobs."""

    KIND: ClassVar[str] = "tensor_core"
    block_m: int
    block_n: int
    warps_m: int
    warps_n: int
    kstep: int
    depth: int
    pad: int

    def apply(self, state: State) -> None:
        C = state.stage(self.stage).op.output(0)
        schedule_tensor_core_gemm(state.sch, C, (self.block_m, self.block_n), (self.warps_m, self.warps_n),
                                  self.kstep, self.depth, self.pad)


def _tc_threads_fit(bm: int, bn: int, wy: int, wz: int, kstep: int) -> bool:
    threads = 32 * wy * wz
    return (bm * kstep) % (TC_VEC * threads) == 0 and (kstep * bn) % (TC_VEC * threads) == 0


def _tc_build(b: _GpuBuilder, name: str) -> None:
    """The knobs of a tensor-core sketch, each drawn from the values that fit the ones drawn
    before it (a mutated or given value that no longer fits is redrawn), then the step."""
    ops = tc_gemm_operands(b._op(name))
    assert ops is not None
    _, _, m, n, k = ops
    limit = b.limits.static_smem
    bm = b.choice(f"{name}/tc_block_m", tuple(x for x in TC_BLOCKS if m % x == 0))
    bn = b.choice(f"{name}/tc_block_n", tuple(x for x in TC_BLOCKS if n % x == 0))
    wy = b.choice(f"{name}/tc_warps_m", tuple(w for w in TC_WARPS if bm % (16 * w) == 0))

    def ksteps(wz: int) -> tuple[int, ...]:
        return tuple(x for x in TC_KSTEPS if k % x == 0 and _tc_threads_fit(bm, bn, wy, wz, x)
                     and tc_shared_bytes((bm, bn), x, 1, 0) <= limit)

    wz = b.choice(f"{name}/tc_warps_n", tuple(w for w in TC_WARPS if bn % (16 * w) == 0 and ksteps(w)) or (1,))
    kstep = b.choice(f"{name}/tc_kstep", ksteps(wz) or (16,))
    depth = b.choice(f"{name}/tc_depth", tuple(d for d in TC_DEPTHS
                                               if tc_shared_bytes((bm, bn), kstep, d, 0) <= limit) or (1,))
    pad = b.choice(f"{name}/tc_pad", tuple(p for p in TC_PADS
                                           if tc_shared_bytes((bm, bn), kstep, depth, p) <= limit) or (0,))
    b.apply(TensorCoreStep(name, bm, bn, wy, wz, kstep, depth, pad))

"""Features of a candidate for the cost model, read off its lowered loop nest.

The nest is taken before the pass pipeline (``lower(..., passes=False)``): loops still carry
their vectorize/unroll/parallel kinds and pragmas, buffers are still multi-dimensional, and it
costs a few milliseconds instead of the ~100 ms of the full pipeline -- the search scores
thousands of candidates per batch.

Each innermost store gets a fixed-length vector (`STORE_FEATURES`): arithmetic counts by kind
times executions, loop structure, annotations and their extents, guards, local allocations,
for the five heaviest buffers it touches: bytes, unique bytes, cache lines, innermost stride,
and reuse (count, distance in iterations and bytes), and for each tier of `CAPACITIES` the
data its loop nest moves into it (`_traffic`). A program's vector concatenates its six
heaviest stores and a few totals. Counts are ``log2(1 + x)``: the model compares orders of
magnitude, and trees split the same on any monotone transform.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tecomp.arith.simplify import simplify
from tecomp.codegen.target import GPULimits
from tecomp.ir.buffer import Buffer
from tecomp.ir.expr import (
    Add,
    BinaryOp,
    BufferLoad,
    Call,
    Cast,
    CmpOp,
    Div,
    Expr,
    FloorDiv,
    FloorMod,
    IntImm,
    Max,
    Min,
    Mul,
    Select,
    Sub,
    Var,
)
from tecomp.ir.functor import ExprVisitor, StmtVisitor
from tecomp.ir.stmt import (
    ASYNC_PIPELINE_SCOPE,
    DOUBLE_BUFFER_SCOPE,
    Allocate,
    AttrStmt,
    BufferStore,
    For,
    ForKind,
    IfThenElse,
    Stmt,
    thread_tag,
)
from tecomp.passes.flatten import flat_size

from .steps import Step
from .task import SearchTask

if TYPE_CHECKING:
    from .measure import MeasureInput

N_BUFFERS = 5
# Six, not three: softmax has seven stores of about the same weight (the reductions' inits
# and updates, exp, the division), and with three the vectorization and unrolling of the
# stages left out were invisible: different candidates of a guided run got identical feature
# vectors (docs/benchmark-notes.md).
N_STORES = 6
CACHE_LINE = 64
OPS = ("f_addsub", "f_mul", "f_div", "f_minmax", "f_cmp", "f_math", "select", "int_ops", "cast")
LOOP = ("log_exec", "n_loops", "inner_extent", "outer_extent")
VEC = ("vec_len", "vec_prod", "n_vec", "inner_is_vec")
UNROLL = ("unroll_prod", "n_unroll", "auto_unroll")
PAR = ("par_prod", "n_par", "par_depth", "par_per_core", "outside_par")
MISC = ("n_guards", "is_update", "alloc_bytes", "n_allocs")
ACCESS = ("read", "write", "local", "bytes", "unique_bytes", "lines", "stride", "stride0",
          "stride1", "reuse_ct", "reuse_iter", "reuse_bytes",
          # GPU (0 on a CPU): a shared-memory buffer; the element stride between neighbouring
          # threadIdx.x lanes (0: a broadcast, 1: coalesced), and whether a warp's access
          # spans more 32-byte sectors than it needs
          "shared", "lane_stride", "lane_uncoalesced")
# GPU thread structure of a store (0 on a CPU): threads per block and blocks over its loops,
# virtual threads, and the fraction of each warp the block fills (warp size of the target)
GPU_STORE = ("threads", "blocks", "vthreads", "warp_fill")
# Capacities (bytes) of a register file and the three cache levels, the tiers at which the
# traffic of a loop nest is estimated. Only their order of magnitude matters (the model
# compares logs): these are this class of x86 core (32 zmm registers, 48 KiB L1d, 1 MiB L2,
# 32 MiB shared L3).
CAPACITIES = (2 << 10, 48 << 10, 1 << 20, 32 << 20)
TRAFFIC = tuple(f"c{k}.{a}" for k in range(len(CAPACITIES)) for a in ("traffic", "working_set", "fit_depth",
                                                                         "intensity"))
STORE_FEATURES: tuple[str, ...] = (OPS + LOOP + VEC + UNROLL + PAR + MISC
                                   + tuple(f"b{k}.{a}" for k in range(N_BUFFERS) for a in ACCESS) + TRAFFIC
                                   + GPU_STORE)
# per program, GPU only (0 on a CPU): the largest block's threads, the grid, shared and local
# bytes per block (and shared as a fraction of what a block may use, the opt-in maximum), blocks per SM by
# shared memory, waves of blocks over the target's SMs, kernels launched
GPU_PROGRAM = ("gpu.threads", "gpu.blocks", "gpu.shared_bytes", "gpu.shared_frac", "gpu.local_bytes",
               "gpu.blocks_per_sm_smem", "gpu.waves", "gpu.kernels")
PROGRAM_FEATURES: tuple[str, ...] = (tuple(f"s{k}.{f}" for k in range(N_STORES) for f in STORE_FEATURES)
                                     + ("n_stores", "log_total_exec", "total_alloc") + GPU_PROGRAM)
N_FEATURES = len(PROGRAM_FEATURES)
_CORES = os.cpu_count() or 1


def _l(x: float) -> float:
    return math.log2(1.0 + max(x, 0.0))


def _const(e: Expr) -> int:
    if isinstance(e, IntImm):
        return e.value
    s = simplify(e)
    return s.value if isinstance(s, IntImm) else 1


class _OpCounter(ExprVisitor):
    def __init__(self) -> None:
        self.c = dict.fromkeys(OPS, 0)
        self.loads: list[BufferLoad] = []

    def visit_BinaryOp(self, e: BinaryOp) -> None:
        if e.dtype.startswith(("float", "bfloat")):
            if isinstance(e, (Add, Sub)):
                self.c["f_addsub"] += 1
            elif isinstance(e, Mul):
                self.c["f_mul"] += 1
            elif isinstance(e, (Div, FloorDiv, FloorMod)):
                self.c["f_div"] += 1
            elif isinstance(e, (Min, Max)):
                self.c["f_minmax"] += 1
        else:
            self.c["int_ops"] += 1
        super().visit_BinaryOp(e)

    def visit_CmpOp(self, e: CmpOp) -> None:  # type: ignore[override]
        self.c["f_cmp" if e.a.dtype.startswith("float") else "int_ops"] += 1
        self.visit(e.a)
        self.visit(e.b)

    def visit_Call(self, e: Call) -> None:
        self.c["f_math"] += 1
        super().visit_Call(e)

    def visit_Select(self, e: Select) -> None:
        self.c["select"] += 1
        super().visit_Select(e)

    def visit_Cast(self, e: Cast) -> None:
        self.c["cast"] += 1
        super().visit_Cast(e)

    def visit_BufferLoad(self, e: BufferLoad) -> None:
        self.loads.append(e)
        super().visit_BufferLoad(e)


def _affine(e: Expr, loop_vars: set[Var]) -> dict[Var, float]:
    """Coefficients of the loop variables in an index (approximate for div/mod/min/max)."""
    if isinstance(e, Var):
        return {e: 1.0} if e in loop_vars else {}
    if isinstance(e, (Add, Sub)):
        a, b = _affine(e.a, loop_vars), _affine(e.b, loop_vars)
        sign = 1.0 if isinstance(e, Add) else -1.0
        for v, c in b.items():
            a[v] = a.get(v, 0.0) + sign * c
        return a
    if isinstance(e, Mul):
        if isinstance(e.b, IntImm):
            return {v: c * e.b.value for v, c in _affine(e.a, loop_vars).items()}
        if isinstance(e.a, IntImm):
            return {v: c * e.a.value for v, c in _affine(e.b, loop_vars).items()}
    if isinstance(e, FloorDiv) and isinstance(e.b, IntImm) and e.b.value:
        return {v: c / e.b.value for v, c in _affine(e.a, loop_vars).items()}
    if isinstance(e, Cast):
        return _affine(e.value, loop_vars)
    if isinstance(e, IntImm):
        return {}
    out: dict[Var, float] = {}

    class _V(ExprVisitor):
        def visit_Var(self, x: Var) -> None:
            if x in loop_vars:
                out[x] = 1.0

    _V().visit(e)
    return out


@dataclass
class _Loop:
    var: Var
    extent: int
    kind: ForKind
    auto_unroll: int
    tag: str = ""  # the thread tag of a GPU thread-bound loop


@dataclass
class _Access:
    buffer: Buffer
    indices: list[tuple[Expr, ...]] = field(default_factory=list)
    read: bool = False
    write: bool = False


def _strides(buf: Buffer) -> list[int]:
    if buf.strides:
        return [_const(s) for s in buf.strides]
    out, acc = [], 1
    for d in reversed(buf.shape):
        out.append(acc)
        acc *= max(_const(d), 1)
    return out[::-1]


def _footprint(coefs: list[dict[Var, float]], shape: list[int], loops: Sequence[_Loop]) -> list[float]:
    spans = []
    for d, cd in enumerate(coefs):
        span = 1.0 + sum(abs(cd.get(lp.var, 0.0)) * (lp.extent - 1) for lp in loops)
        spans.append(min(span, float(max(shape[d], 1))))
    return spans


class _Rings(StmtVisitor):
    """How many copies of each shared buffer the GPU passes will make: the features see the
    nest before them, where a double-buffered stage (2) or a cp.async pipeline of depth d (d)
    is one buffer marked by an attribute."""

    def __init__(self) -> None:
        self.copies: dict[int, int] = {}

    def visit_AttrStmt(self, s: AttrStmt) -> None:
        if s.key == DOUBLE_BUFFER_SCOPE:
            self.copies[id(s.value)] = 2
        elif s.key == ASYNC_PIPELINE_SCOPE:
            var, depth = s.value
            self.copies[id(var)] = max(int(depth), 1)
        self.visit_stmt(s.body)


def _ring_copies(body: Stmt) -> dict[int, int]:
    r = _Rings()
    r.visit_stmt(body)
    return r.copies


class _Extractor(StmtVisitor):
    def __init__(self, hw: GPULimits | None = None) -> None:
        self.hw = hw
        self.capacities = CAPACITIES if hw is None else gpu_capacities(hw)
        self.max_threads = 1
        self.max_blocks = 1
        self.shared = 0  # shared bytes allocated (the most at once)
        self.local = 0
        self._shared_now: list[int] = []
        self._local_now: list[int] = []
        self.loops: list[_Loop] = []
        self.guards = 0
        self.allocs: list[int] = []
        self.max_alloc = 0
        self.stores: list[tuple[float, list[float]]] = []
        self.rings: dict[int, int] = {}  # id(buffer var) -> copies (`_Rings`)

    def visit_For(self, s: For) -> None:
        au = int(s.annotation("auto_unroll_max_step", 0) or 0)
        self.loops.append(_Loop(s.var, max(_const(s.extent), 1), s.kind, au, thread_tag(s) or ""))
        self.visit_stmt(s.body)
        self.loops.pop()

    def visit_IfThenElse(self, s: IfThenElse) -> None:
        self.guards += 1
        self.visit_stmt(s.then_case)
        if s.else_case is not None:
            self.visit_stmt(s.else_case)
        self.guards -= 1

    def visit_Allocate(self, s: Allocate) -> None:
        b = s.buffer
        size = math.prod(max(_const(d), 1) for d in b.shape)
        if b.strides:  # storage_align'ed rows: the padded size the buffer is flattened to
            size = max(size, _const(flat_size(b)))
        size *= b.itemsize
        if b.scope == "shared":  # a double buffer or a pipeline's ring: what will be allocated
            size *= self.rings.get(id(b.data), 1)
        self.allocs.append(size)
        self.max_alloc = max(self.max_alloc, sum(self.allocs))
        scoped = self._shared_now if b.scope == "shared" else self._local_now if b.scope == "local" else None
        if scoped is not None:
            scoped.append(size)
            self.shared = max(self.shared, sum(self._shared_now))
            self.local = max(self.local, sum(self._local_now))
        self.visit_stmt(s.body)
        self.allocs.pop()
        if scoped is not None:
            scoped.pop()

    def visit_BufferStore(self, s: BufferStore) -> None:
        self.stores.append(self._store(s))

    def _store(self, s: BufferStore) -> tuple[float, list[float]]:
        loops = self.loops
        execs = float(math.prod(lp.extent for lp in loops))
        oc = _OpCounter()
        oc.visit(s.value)
        for i in s.indices:
            oc.visit(i)
        f: list[float] = [_l(oc.c[k] * execs) for k in OPS]
        f += [_l(execs), float(len(loops)), _l(loops[-1].extent if loops else 1),
              _l(loops[0].extent if loops else 1)]
        vec = [lp for lp in loops if lp.kind == ForKind.VECTORIZED]
        f += [_l(vec[-1].extent if vec else 0), _l(math.prod(lp.extent for lp in vec)), float(len(vec)),
              float(bool(loops) and loops[-1].kind == ForKind.VECTORIZED)]
        unr = [lp for lp in loops if lp.kind == ForKind.UNROLLED]
        f += [_l(math.prod(lp.extent for lp in unr)), float(len(unr)),
              _l(max((lp.auto_unroll for lp in loops), default=0))]
        par_idx = [k for k, lp in enumerate(loops) if lp.kind == ForKind.PARALLEL]
        par_prod = math.prod(loops[k].extent for k in par_idx)
        outside = math.prod(lp.extent for lp in loops[:par_idx[0]]) if par_idx else 0
        f += [_l(par_prod if par_idx else 0), float(len(par_idx)), float(par_idx[0] if par_idx else -1),
              _l(par_prod / _CORES if par_idx else 0), _l(outside)]
        # accesses, one entry per buffer
        acc: dict[int, _Access] = {}
        w = acc.setdefault(id(s.buffer), _Access(s.buffer))
        w.write = True
        w.indices.append(tuple(s.indices))
        is_update = False
        for ld in oc.loads:
            a = acc.setdefault(id(ld.buffer), _Access(ld.buffer))
            a.read = True
            a.indices.append(tuple(ld.indices))
            if ld.buffer is s.buffer:
                is_update = True
        f += [float(self.guards), float(is_update), _l(sum(self.allocs)), float(len(self.allocs))]
        loop_vars = {lp.var for lp in loops}
        # per buffer: its shape and the loop coefficients of its (first) index, which both the
        # access features and the traffic estimate read
        geo = [(a, [max(_const(d), 1) for d in a.buffer.shape], [_affine(i, loop_vars) for i in a.indices[0]])
               for a in acc.values()]
        rows = [self._access(a, shape, coefs, loops, execs) for a, shape, coefs in geo]
        rows.sort(key=lambda r: -r[3])
        for k in range(N_BUFFERS):
            f += rows[k] if k < len(rows) else [0.0] * len(ACCESS)
        fl_ops = sum(oc.c[k] for k in OPS if k != "int_ops")
        f += _traffic([(a.buffer.itemsize, shape, coefs) for a, shape, coefs in geo], loops, execs * fl_ops,
                      self.capacities)
        f += self._gpu_store(loops)
        return execs * (1 + fl_ops), f

    def _gpu_store(self, loops: Sequence[_Loop]) -> list[float]:
        if self.hw is None:
            return [0.0] * len(GPU_STORE)
        threads = math.prod(lp.extent for lp in loops if lp.tag.startswith("threadIdx"))
        blocks = math.prod(lp.extent for lp in loops if lp.tag.startswith("blockIdx"))
        vthreads = math.prod(lp.extent for lp in loops if lp.tag == "vthread")
        self.max_threads = max(self.max_threads, threads)
        self.max_blocks = max(self.max_blocks, blocks)
        warp = self.hw.warp_size
        return [_l(threads), _l(blocks), _l(vthreads), threads / (math.ceil(threads / warp) * warp)]

    def _access(self, a: _Access, shape: list[int], coefs: list[dict[Var, float]], loops: list[_Loop],
                execs: float) -> list[float]:
        buf = a.buffer
        item = buf.itemsize
        strides = _strides(buf)
        flat = {lp.var: sum(cd.get(lp.var, 0.0) * st for cd, st in zip(coefs, strides)) for lp in loops}
        spans = _footprint(coefs, shape, loops)
        unique = math.prod(spans) * item
        lines = math.prod(spans[:-1]) * math.ceil(spans[-1] * item / CACHE_LINE) if spans else 1.0
        inner = abs(flat.get(loops[-1].var, 0.0)) if loops else 0.0
        reuse_ct = reuse_iter = reuse_bytes = 0.0
        for k in range(len(loops) - 1, -1, -1):
            if flat.get(loops[k].var, 0.0) == 0.0:
                inside = loops[k + 1:]
                reuse_ct = float(loops[k].extent)
                reuse_iter = float(math.prod(lp.extent for lp in inside))
                reuse_bytes = math.prod(_footprint(coefs, shape, inside)) * item
                break
        gpu = [0.0, 0.0, 0.0]
        if self.hw is not None:
            lane = next((lp for lp in reversed(loops) if lp.tag == "threadIdx.x"), None)
            stride = abs(flat.get(lane.var, 0.0)) if lane is not None else 0.0
            # 32-byte sectors a warp touches vs the fewest its bytes need
            span = (min(lane.extent, self.hw.warp_size) - 1) * stride * item + item if lane else item
            need = math.ceil(min(lane.extent if lane else 1, self.hw.warp_size) * item / 32)
            gpu = [float(buf.scope == "shared"), _l(stride), float(math.ceil(span / 32) > need)]
        return [float(a.read), float(a.write), float(buf.scope != "global"),
                _l(execs * item * len(a.indices)), _l(unique), _l(lines), _l(inner),
                float(inner == 0.0), float(inner == 1.0), _l(reuse_ct), _l(reuse_iter), _l(reuse_bytes), *gpu]


def _traffic(buffers: Sequence[tuple[int, list[int], list[dict[Var, float]]]], loops: Sequence[_Loop],
             flops: float, capacities: Sequence[int] = CAPACITIES) -> list[float]:
    """Estimated data movement into each tier of `CAPACITIES`.

    The working set inside loop ``k`` is the footprint of every buffer over the loops from
    ``k`` inwards. For a tier of capacity C, the outermost loop whose working set fits is where
    the data of that tier is (re)loaded: once per iteration of the loops outside it. So the
    traffic is (their trip count) x (that working set) -- the quantity every tile factor moves,
    also the ones above the innermost loop (a reduction split, a middle tile level), which the
    access features above cannot see: they look at the innermost loop and the whole nest only.
    Per tier: the traffic, the working set, how deep the fitting loop is, flops per byte moved.
    ``buffers``: (item size, shape, index coefficients) of each buffer the store touches.
    """
    n = len(loops)
    # per buffer and dimension: `_footprint`'s span over loops[k:], grown one loop at a time
    # from the inside out (calling it for every k would cost a factor of the nest's depth)
    ws = [0.0] * (n + 1)  # ws[k]: bytes touched by one execution of loops[k:]
    spans = [[1.0] * len(shape) for _, shape, _ in buffers]
    for k in range(n, -1, -1):
        if k < n:
            lp = loops[k]
            for sp, (_, _, coefs) in zip(spans, buffers):
                for d, cd in enumerate(coefs):
                    sp[d] += abs(cd.get(lp.var, 0.0)) * (lp.extent - 1)
        ws[k] = sum(item * math.prod(min(s_, float(sh)) for s_, sh in zip(sp, shape))
                    for sp, (item, shape, _) in zip(spans, buffers))
    outer = [1.0] * (n + 1)  # trip count of loops[:k]
    for k in range(1, n + 1):
        outer[k] = outer[k - 1] * loops[k - 1].extent
    out: list[float] = []
    for cap in capacities:
        k = n
        while k > 0 and ws[k - 1] <= cap:
            k -= 1
        moved = outer[k] * ws[k]
        out += [_l(moved), _l(ws[k]), float(n - k), _l(flops / max(moved, 1.0))]
    return out


def gpu_capacities(hw: GPULimits) -> tuple[int, ...]:
    """The memory tiers of a GPU for `_traffic`, as seen from one block: its registers
    (64 KiB), its shared memory (what a block may use, static and opt-in dynamic), L2
    (~40 MiB), device memory."""
    return (64 << 10, hw.max_dynamic_smem, 40 << 20, 1 << 40)


def program_features(func_body: object, hw: GPULimits | None = None,
                     kernels: Sequence[object] | None = None) -> np.ndarray:
    """The program vector of a lowered (pre-pass) PrimFunc body; for a cuda target ``hw``
    gives its limits, and ``kernels`` the bodies of each kernel (several root stages)."""
    ex = _Extractor(hw)
    for body in kernels or [func_body]:
        if hw is not None:
            ex.rings.update(_ring_copies(body))  # type: ignore[arg-type]
        ex.visit_stmt(body)  # type: ignore[arg-type]
    stores = sorted(ex.stores, key=lambda t: -t[0])
    out: list[float] = []
    n_f = len(STORE_FEATURES)
    for k in range(N_STORES):
        out += stores[k][1] if k < len(stores) else [0.0] * n_f
    total = sum(w for w, _ in stores)
    out += [float(len(stores)), _l(total), _l(ex.max_alloc)]
    if hw is None:
        out += [0.0] * len(GPU_PROGRAM)
    else:
        per_sm = hw.max_dynamic_smem // max(ex.shared, 1) if ex.shared else 32
        waves = ex.max_blocks / (hw.sm_count * max(min(per_sm, 32), 1))
        # shared as a fraction of the opt-in maximum per block (static + dynamic): <= 1 if it launches
        out += [_l(ex.max_threads), _l(ex.max_blocks), _l(ex.shared), ex.shared / hw.max_dynamic_smem,
                _l(ex.local), _l(per_sm), _l(waves), float(len(kernels or [func_body]))]
    return np.asarray(out, dtype=np.float32)


def extract_features(task: SearchTask, steps: Sequence[Step]) -> np.ndarray | None:
    """Features of ``steps`` applied to ``task``, or None when they do not lower."""
    from tecomp.codegen.target import Target
    from tecomp.errors import TecompError
    from tecomp.lowering import lower

    tgt = Target.parse(task.target)
    try:
        sch, args = task.apply_steps(steps)
        func = lower(sch, args, name="features", passes=False, target=tgt if tgt.is_gpu else None)
    except TecompError:
        return None
    if not tgt.is_gpu:
        return program_features(func.body)
    kernels = [k.body for k in func.attrs.get("kernels") or [func]]
    return program_features(func.body, tgt.gpu, kernels)


def features_job(task: SearchTask, steps_list: Sequence[Sequence[Step]]) -> list[np.ndarray | None]:
    """`extract_features` of several candidates (one job for a worker process)."""
    return [extract_features(task, steps) for steps in steps_list]


Mapper = Callable[[Callable[..., Any], Sequence[tuple[Any, ...]]], list[Any]]


class FeatureCache:
    """Features by (task, steps), computed once; in parallel when given a ``mapper``.

    ``mapper(fn, jobs)`` runs ``fn(*job)`` for each job, e.g. `tuning.measure.WorkerPool.map`
    (`tune` gives the search a pool of its own, apart from the builder's): lowering is what
    the search spends its time on.
    """

    def __init__(self, mapper: Mapper | None = None, n_workers: int = 1,
                 max_entries: int = 500_000) -> None:
        self.mapper = mapper
        self.n_workers = max(1, n_workers)
        self.max_entries = max_entries
        self._cache: dict[tuple[str, str], np.ndarray | None] = {}

    def of(self, inputs: Sequence[MeasureInput]) -> list[np.ndarray | None]:
        """Features of each input (None where its steps do not lower)."""
        out: list[np.ndarray | None] = [None] * len(inputs)
        by_task: dict[str, list[int]] = {}
        for k, inp in enumerate(inputs):
            by_task.setdefault(inp.task.workload_key, []).append(k)
        for idx in by_task.values():
            task = inputs[idx[0]].task
            feats = self.get(task, [inputs[k].steps for k in idx], [inputs[k].key for k in idx])
            for k, f in zip(idx, feats):
                out[k] = f
        return out

    def get(self, task: SearchTask, steps_list: Sequence[Sequence[Step]],
            keys: Sequence[str]) -> list[np.ndarray | None]:
        tk = task.workload_key
        todo: dict[str, int] = {}  # each missing candidate once
        for k, key in enumerate(keys):
            if (tk, key) not in self._cache and key not in todo:
                todo[key] = k
        if len(self._cache) + len(todo) > self.max_entries:
            self._cache.clear()
        pending = list(todo.values())
        if self.mapper is not None and len(pending) >= 8 and self.n_workers > 1:
            n_chunks = self.n_workers * 2
            chunks = [pending[c::n_chunks] for c in range(n_chunks) if pending[c::n_chunks]]
            outs = self.mapper(features_job, [(task, [steps_list[k] for k in ch]) for ch in chunks])
            for ch, res in zip(chunks, outs):
                if not isinstance(res, list):  # the worker failed: do these here
                    res = [extract_features(task, steps_list[k]) for k in ch]
                for k, f in zip(ch, res):
                    self._cache[(tk, keys[k])] = f
        else:
            for k in pending:
                self._cache[(tk, keys[k])] = extract_features(task, steps_list[k])
        return [self._cache[(tk, key)] for key in keys]


__all__ = ["CAPACITIES", "N_FEATURES", "PROGRAM_FEATURES", "STORE_FEATURES", "TRAFFIC", "FeatureCache", "extract_features",
           "features_job", "program_features"]

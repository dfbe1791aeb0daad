"""SIMT execution of GPU kernel IR with numpy: the compiler behind `gpu_emulator.emulate`.

One block runs at a time, all its threads in lockstep as numpy vectors (one lane per thread).
Each expression is classified when compiled: *uniform* (the same for every thread of the
block: loop counters, blockIdx, dims; represented exactly as `interp` does, by its own
closures) or *varying* (an array whose first axis is the lane: ``[T]`` for a scalar dtype,
``[T, lanes]`` for a vector one). Varying values follow interp's vector semantics lane by lane,
so the results match the reference interpreter bit for bit.

Control flow that depends on the thread runs masked: `BlockState.mask` is ``None`` (every
thread active) or a bool array over the lanes; thread loops narrower than the launch, ``if``
on a varying condition (both sides, with complementary masks), serial loops with per-thread
trip counts (run until the last active lane is done) and varying Selects narrow it. Stores
write only active lanes; loads and integer divisions check only active lanes (values of
inactive lanes are never observable, so they are not zeroed, except where a vector
predicate says a lane reads as 0).

A varying expression always yields the varying representation, also where it passes on the
value of a uniform operand (a Select on a block-uniform condition taking its uniform side:
`SimtCompiler.as_varying`), since consumers of a varying value index it by lane.

Warp shuffles (``Call(dtype, "shfl_xor_sync", (mask, value, lane_mask, width))``, CUDA's
``__shfl_xor_sync``) permute the lanes of a varying value by thread id: lane = linear thread
id % 32, whatever array position the seed gave the thread. Every lane the member mask names
must be active in each warp that executes one (`ShuffleDivergenceError` otherwise).

Values are never changed in place once made (stores build new arrays), so a loaded value can
be shared freely, e.g. ``local`` memory is a list of per-element ``[T]`` arrays and a load of
a constant index returns the list entry without a copy, and pure arithmetic on thread and
block indices alone (``ty * 16 + tx``, the bulk of index expressions) is computed once per
block and cached. Memory accesses are compiled in `gpu_memory`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ..arith import intrin_eval
from ..errors import TecompError
from ..ir import dtype as dt
from ..ir import expr as E  # noqa: N812
from ..ir import stmt as S  # noqa: N812
from ..ir.buffer import Buffer
from ..ir.printer import stmt_str
from ..te.intrin_cuda import FRAGMENT_SCOPES as _FRAGMENT_SCOPES
from ..te.intrin_cuda import MMA_CALLS as _WARP_CALLS
from . import interp as I  # noqa: N812
from . import interp_ops as ops
from .gpu_race import RaceTracker
from .gpu_shuffle import SHFL_XOR, compile_shfl_xor

Env = I.Env
ExprFn = I.ExprFn
StmtFn = I.StmtFn
_MISSING = I._MISSING
_AXES = {"x": 0, "y": 1, "z": 2}


class BarrierDivergenceError(TecompError):
    """A ``__syncthreads()`` reached by only some threads of a block."""




class BlockState:
    """The block being run, read by every compiled closure (one object per launch)."""

    def __init__(self, dims: tuple[int, int, int]) -> None:
        self.dims = dims
        self.T = dims[0] * dims[1] * dims[2]
        self.mask: np.ndarray | None = None  # active lanes; None: all
        self.vmask: np.ndarray | None = None  # [T, lanes] lane mask inside a varying vector Select
        self.block = (0, 0, 0)
        self.lin = np.arange(self.T, dtype=np.int64)  # lane -> linear thread id
        self._tid: dict[tuple[int, str], np.ndarray] = {}
        self.shared: dict[int, np.ndarray] = {}  # id(Allocate) -> the block's storage
        self.cache: dict[int, Any] = {}  # id(Expr) -> value, for block-invariant expressions
        self.shfl: dict[tuple[int, int], np.ndarray] = {}  # (lane mask, width) -> source lanes

    def start(self, block: tuple[int, int, int], lin: np.ndarray) -> None:
        self.block, self.lin = block, lin
        self.mask = self.vmask = None
        self._tid.clear()
        self.shared.clear()
        self.cache.clear()
        self.shfl.clear()

    def thread_index(self, axis: int, dtype: str) -> np.ndarray:
        key = (axis, dtype)
        a = self._tid.get(key)
        if a is None:
            x, y, _ = self.dims
            a = (self.lin % x, self.lin // x % y, self.lin // (x * y))[axis].astype(dt.to_numpy(dtype))
            self._tid[key] = a
        return a

    def thread(self, lane: int) -> tuple[int, int, int]:
        x, y, _ = self.dims
        lin = int(self.lin[lane])
        return (lin % x, lin // x % y, lin // (x * y))

    def first(self, lanes: np.ndarray | None) -> int:
        """Of the lanes set in ``lanes`` (a [T] or [T, k] bool array; None: all), the one with
        the lowest thread id, so messages do not depend on the seed's lane shuffle."""
        if lanes is None:
            return int(np.argmin(self.lin))
        a = np.asarray(lanes)
        if a.ndim > 1:
            a = np.asarray(a.any(axis=tuple(range(1, a.ndim))))
        idx = np.flatnonzero(a)
        return int(idx[np.argmin(self.lin[idx])]) if idx.size else 0

    def where(self, lanes: np.ndarray | None = None) -> str:
        return f"thread {self.thread(self.first(lanes))} of block {self.block}"


def _is_local(buf: Buffer) -> bool:
    return buf.scope.startswith("local")


_U32, _U64, _I32, _I64 = (np.dtype(t) for t in (np.uint32, np.uint64, np.int32, np.int64))


def _unsigned(o: np.ndarray) -> np.ndarray:
    """Offsets as unsigned ints, so numpy's own bounds check also rejects negative ones."""
    d = o.dtype
    if d == _I32:
        return o.view(_U32)
    if d == _I64:
        return o.view(_U64)
    return np.asarray(o, _I64).view(_U64)


def _header(s: S.Stmt) -> str:
    text = stmt_str(s).strip().splitlines()
    return text[0].strip() if text else type(s).__name__


class SimtCompiler(I._Compiler):
    """Compiles a kernel body into closures over the lanes of one block (see the module doc).

    Uniform expressions are compiled by the interpreter (its semantics exactly); varying ones,
    every statement, and every memory access (which must be bounds-checked with the thread
    named, and logged for the race detector) are compiled here.
    """

    def __init__(
        self, state: BlockState, tracker: RaceTracker | None, tracked: set[str],
        launch: dict[str, int], smem_limit: int | None, poison: bool,
    ) -> None:
        super().__init__({}, poison, None)
        self.state = state
        self.tracker = tracker
        self.tracked = tracked  # names of global buffers whose accesses are logged
        self.launch = launch  # "threadIdx.x" -> launch extent (threadIdx tags only)
        self.smem_limit = smem_limit
        self.smem_live = [0]
        self.views: dict[tuple[int, int, np.dtype], np.ndarray] = {}  # see gpu_memory._flat_storage
        self.vvars: set[E.Var] = set()
        self._vmemo: dict[int, bool] = {}
        # vars that hold one value for a whole block (thread and block indices), and those
        # some other binder rebinds: expressions of the first only are computed once per block
        self.block_vars: set[E.Var] = set()
        self.rebound: set[E.Var] = set()
        self._imemo: dict[int, bool] = {}
        self._path: list[str] = []  # headers of the enclosing statements
        self._where = ""  # the statement being compiled, for access sites

    # uniformity ----------------------------------------------------------------------------

    def varies(self, e: E.Expr) -> bool:
        """Whether ``e`` can differ between the threads of a block."""
        key = id(e)
        r = self._vmemo.get(key)
        if r is None:
            r = self._vmemo[key] = self._varies(e)
        return r

    def _varies(self, e: E.Expr) -> bool:
        if isinstance(e, E.Var):
            return e in self.vvars
        if isinstance(e, (E.IntImm, E.FloatImm, E.StringImm)):
            return False
        if isinstance(e, E.BufferLoad):
            return (_is_local(e.buffer) or any(self.varies(i) for i in e.indices)
                    or (e.predicate is not None and self.varies(e.predicate)))
        if isinstance(e, E.Let):
            with self._binding(e.var, self.varies(e.value)):
                return self.varies(e.body)
        if isinstance(e, (E.BinaryOp, E.CmpOp, E.And, E.Or)):
            return self.varies(e.a) or self.varies(e.b)
        if isinstance(e, E.Not):
            return self.varies(e.a)
        if isinstance(e, E.Select):
            return self.varies(e.cond) or self.varies(e.t) or self.varies(e.f)
        if isinstance(e, (E.Cast, E.Broadcast, E.VectorReduce)):
            return self.varies(e.value)
        if isinstance(e, E.Ramp):
            return self.varies(e.base) or self.varies(e.stride)
        if isinstance(e, E.Call):
            # a shuffle reads other lanes' registers: varying whatever its operands are
            return e.name == SHFL_XOR or any(self.varies(a) for a in e.args)
        return False

    def _binding(self, var: E.Var, varying: bool, thread: bool = False) -> _Binding:
        if thread and var not in self.rebound:
            self.block_vars.add(var)
        elif not thread:
            self.rebound.add(var)
            self.block_vars.discard(var)
        self._imemo.clear()
        return _Binding(self, var, varying)

    def invariant(self, e: E.Expr) -> bool:
        """Whether ``e`` is pure arithmetic on thread/block indices and constants only, so its
        value is the same all through a block (e.g. ``ty * 16 + tx``) and can be cached."""
        key = id(e)
        r = self._imemo.get(key)
        if r is None:
            r = self._imemo[key] = self._invariant(e)
        return r

    def _invariant(self, e: E.Expr) -> bool:
        if isinstance(e, E.Var):
            return e in self.block_vars
        if isinstance(e, (E.IntImm, E.FloatImm)):
            return True
        if isinstance(e, (E.Div, E.FloorDiv, E.FloorMod)):
            return False  # may raise, and only where the lane is live
        if isinstance(e, (E.BinaryOp, E.CmpOp, E.And, E.Or)):
            return self.invariant(e.a) and self.invariant(e.b)
        if isinstance(e, (E.Not,)):
            return self.invariant(e.a)
        if isinstance(e, (E.Cast, E.Broadcast)):
            return self.invariant(e.value)
        if isinstance(e, E.Ramp):
            return self.invariant(e.base) and self.invariant(e.stride)
        return False

    # dispatch ------------------------------------------------------------------------------

    def expr(self, e: E.Expr) -> ExprFn:
        if isinstance(e, E.Let):
            return self._let(e)
        if isinstance(e, E.Call) and e.name == S.BARRIER:
            raise TecompError(f"a barrier must be a statement of its own: {e}")
        if isinstance(e, E.Call) and e.extern and e.name.startswith("llvm."):
            from ..te.intrin import llvm_equivalent  # te.call_llvm_intrin: a few it knows

            same = llvm_equivalent(e.name)
            if same is None:
                raise TecompError(f"the GPU emulator cannot run the LLVM intrinsic {e.name!r} "
                                  f"in {e} (only those with a tecomp equivalent)")
            e = E.Call(e.dtype, same, e.args)
        if isinstance(e, E.Call) and e.extern:
            raise TecompError(f"extern call {e.name!r} cannot run in a GPU kernel: {e}")
        if self.varies(e):
            method = _VEXPR.get(type(e))
            if method is None:
                raise TecompError(f"the GPU emulator cannot evaluate {type(e).__name__}: {e}")
            fn: ExprFn = method(self, e)
            if isinstance(e, E.Var) or not self.invariant(e):
                return fn
            cache, key = self.state.cache, id(e)
            def cached(env: Env) -> Any:
                v = cache.get(key)
                if v is None:
                    v = cache[key] = fn(env)
                return v
            return cached
        if isinstance(e, E.BufferLoad):
            return self._u_load(e)
        return super().expr(e)

    def stmt(self, s: S.Stmt) -> StmtFn:
        method = _STMTS.get(type(s))
        if method is None:
            raise TecompError(f"the GPU emulator cannot execute {type(s).__name__}: {s}")
        old = self._where
        self._where = stmt_str(s).strip() if isinstance(s, S.BufferStore) else _header(s)
        try:
            fn: StmtFn = method(self, s)
        finally:
            self._where = old
        return fn

    # statements ----------------------------------------------------------------------------

    def _s_seq(self, s: S.SeqStmt) -> StmtFn:
        fns = tuple(self.stmt(x) for x in s.seq)
        def run_seq(env: Env) -> None:
            for f in fns:
                f(env)
        return run_seq

    def _s_attr(self, s: S.AttrStmt) -> StmtFn:
        if s.key == S.ASYNC_COPY_SCOPE:  # cp.async: gpu_async.py
            self._async_scope = getattr(self, "_async_scope", 0) + 1
            try:
                return self.stmt(s.body)
            finally:
                self._async_scope -= 1
        return self.stmt(s.body)

    def _nested(self, s: S.Stmt, body: S.Stmt) -> StmtFn:
        self._path.append(_header(s))
        try:
            return self.stmt(body)
        finally:
            self._path.pop()

    def _s_for(self, s: S.For) -> StmtFn:
        if s.kind is S.ForKind.THREAD_BINDING:
            return self._s_thread_loop(s)
        if s.kind is S.ForKind.PARALLEL:
            raise TecompError(f"a GPU kernel has no parallel loops: {_header(s)}")
        v, fmin, fext = s.var, self.expr(s.min), self.expr(s.extent)
        vmin, vext = self.varies(s.min), self.varies(s.extent)
        with self._binding(v, vmin):
            body = self._nested(s, s.body)
        state = self.state
        if not (vmin or vext):
            def run_for(env: Env) -> None:
                old = env.get(v, _MISSING)
                lo = fmin(env)
                for i in range(lo, lo + fext(env)):
                    env[v] = i
                    body(env)
                I._restore(env, v, old)
            return run_for
        T = state.T
        def run_varying_for(env: Env) -> None:
            # per-thread trip counts: run until the last active lane is done, masking the rest
            m0 = state.mask
            lo, n = fmin(env), np.broadcast_to(np.asarray(fext(env)), (T,))
            live_n = n if m0 is None else n[m0]
            steps = int(live_n.max()) if live_n.size else 0
            old = env.get(v, _MISSING)
            for k in range(max(steps, 0)):
                live = n > k
                if m0 is not None:
                    live &= m0
                state.mask = None if live.all() else live
                env[v] = lo + k
                body(env)
            state.mask = m0
            I._restore(env, v, old)
        return run_varying_for

    def _s_thread_loop(self, s: S.For) -> StmtFn:
        tag = S.thread_tag(s) or ""
        kind, _, axis_name = tag.partition(".")
        axis = _AXES.get(axis_name)
        if kind not in ("blockIdx", "threadIdx") or axis is None:
            raise TecompError(f"unknown thread tag {tag!r} on loop {s.var.name}: {_header(s)}")
        if not E.is_const_int(s.min, 0):
            raise TecompError(f"thread loop {s.var.name} must start at 0: {_header(s)}")
        v, fext, state = s.var, self.expr(s.extent), self.state
        if kind == "blockIdx":
            with self._binding(v, False, thread=True):
                body = self._nested(s, s.body)
            def run_block_loop(env: Env) -> None:
                b = state.block[axis]
                if b < fext(env):
                    old = env.get(v, _MISSING)
                    env[v] = b
                    body(env)
                    I._restore(env, v, old)
            return run_block_loop
        full = self.launch.get(tag, 1)
        if isinstance(s.extent, E.IntImm) and s.extent.value > full:
            raise TecompError(f"thread loop {s.var.name} has extent {s.extent.value} but the launch "
                              f"gives {tag} only {full} threads: {_header(s)}")
        narrow = not (isinstance(s.extent, E.IntImm) and s.extent.value >= full)
        with self._binding(v, True, thread=True):
            body = self._nested(s, s.body)
        vdtype = v.dtype
        def run_thread_loop(env: Env) -> None:
            old = env.get(v, _MISSING)
            idx = env[v] = state.thread_index(axis, vdtype)
            if narrow:  # threads past the loop's extent skip its body
                m0 = state.mask
                live = idx < fext(env)
                if m0 is not None:
                    live &= m0
                if live.any():
                    state.mask = None if live.all() else live
                    body(env)
                    state.mask = m0
            else:
                body(env)
            I._restore(env, v, old)
        return run_thread_loop

    def _s_if(self, s: S.IfThenElse) -> StmtFn:
        if dt.lanes(s.cond.dtype) != 1:
            raise TecompError(f"IfThenElse condition must be scalar, got {s.cond.dtype}: {s.cond}")
        cond = self.expr(s.cond)
        then = self._nested(s, s.then_case)
        other = self._nested(s, s.else_case) if s.else_case is not None else None
        if not self.varies(s.cond):
            other_fn = other or I._nothing
            return lambda env: (then if cond(env) else other_fn)(env)
        state = self.state
        def run_varying_if(env: Env) -> None:
            # both sides run, each with the lanes that take it (then first, as a GPU would)
            c = np.asarray(cond(env), bool)
            m0 = state.mask
            mt = c if m0 is None else (m0 & c)
            if mt.any():
                state.mask = None if mt.all() else mt
                then(env)
            if other is not None:
                mf = ~c if m0 is None else (m0 & ~c)
                if mf.any():
                    state.mask = None if mf.all() else mf
                    other(env)
            state.mask = m0
        return run_varying_if

    def _s_evaluate(self, s: S.Evaluate) -> StmtFn:
        if isinstance(s.value, E.Call) and s.value.name in _WARP_CALLS:
            from .gpu_mma import compile_warp_call  # tensor cores: ldmatrix, mma.sync

            return compile_warp_call(self, s.value)
        if not S.is_barrier(s):
            from .gpu_async import compile_group_call  # cp.async commit/wait

            return compile_group_call(self, s) or self.expr(s.value)
        state, tracker = self.state, self.tracker
        path = "\n".join(f"  {'  ' * k}{h}" for k, h in enumerate(self._path))
        path += f"\n  {'  ' * len(self._path)}syncthreads()"
        def barrier(env: Env) -> None:
            m = state.mask
            if m is not None:
                lane = state.first(~m)
                raise BarrierDivergenceError(
                    f"barrier divergence: __syncthreads() reached by {int(m.sum())} of {state.T} "
                    f"threads of block {state.block}; thread {state.thread(lane)} does not reach "
                    f"it. The barrier is inside:\n{path}")
            if tracker is not None:
                tracker.end_region()
        return barrier

    def _s_alloc(self, s: S.Allocate) -> StmtFn:
        buf = s.buffer
        if buf.scope in _FRAGMENT_SCOPES:
            from .gpu_mma import compile_fragment_alloc  # tensor-core fragments: per lane

            return compile_fragment_alloc(self, s)
        if _is_local(buf):
            return self._alloc_local(s)
        if not buf.scope.startswith("shared"):
            raise TecompError(f"a GPU kernel can allocate 'shared' or 'local' memory, not "
                              f"'{buf.scope}' ({buf.name})")
        from .gpu_async import note_allocation, wrap_allocation  # cp.async destinations

        note_allocation(self, s)
        return wrap_allocation(self, s, self._alloc_shared(s))

    def _alloc_shared(self, s: S.Allocate) -> StmtFn:
        buf = s.buffer
        npd, body, state, by_name = dt.storage_numpy(buf.dtype), self.stmt(s.body), self.state, self.by_name
        dims = [self.expr(x) for x in buf.shape]
        strides = [self.expr(x) for x in buf.strides]
        poison, data, key, live, limit = self.poison, buf.data, id(s), self.smem_live, self.smem_limit
        def run_shared(env: Env) -> None:
            # one array per block and allocation site, so a site re-run in a loop is the same
            # memory (as on the GPU) and races across iterations are seen
            flat = state.shared.get(key)
            if flat is None:
                size = _alloc_size(buf, [f(env) for f in dims], [f(env) for f in strides])
                flat = state.shared[key] = np.zeros(size, npd)
            if poison:
                flat.view(np.uint8 if npd.kind in "iu" else npd).fill(ops.POISON[npd.kind])
            else:
                flat.fill(0)
            live[0] += flat.nbytes
            if limit is not None and live[0] > limit:
                raise TecompError(f"shared memory of block {state.block} reaches {live[0]} bytes "
                                  f"with {buf.name}; the target allows {limit}")
            p = I.Pointer(flat, 0)
            old, old_name = env.get(data, _MISSING), by_name.get(buf.name, _MISSING)
            env[data] = by_name[buf.name] = p
            body(env)
            I._restore(env, data, old)
            I._restore(by_name, buf.name, old_name)
            live[0] -= flat.nbytes
        return run_shared

    def _alloc_local(self, s: S.Allocate) -> StmtFn:
        buf = s.buffer
        npd, body, state, by_name = dt.storage_numpy(buf.dtype), self.stmt(s.body), self.state, self.by_name
        dims = [self.expr(x) for x in buf.shape]
        strides = [self.expr(x) for x in buf.strides]
        poison, data = self.poison, buf.data
        def run_local(env: Env) -> None:
            size = _alloc_size(buf, [f(env) for f in dims], [f(env) for f in strides])
            init = np.zeros(state.T, npd)
            if poison:
                init.view(np.uint8 if npd.kind in "iu" else npd).fill(ops.POISON[npd.kind])
            cells = [init] * size  # per element, the [T] values of every thread; never mutated
            old, old_name = env.get(data, _MISSING), by_name.get(buf.name, _MISSING)
            env[data] = by_name[buf.name] = cells  # type: ignore[assignment]
            body(env)
            I._restore(env, data, old)
            I._restore(by_name, buf.name, old_name)
        return run_local

    def _s_store(self, s: S.BufferStore) -> StmtFn:
        buf = s.buffer
        if dt.element(s.value.dtype) != dt.element(buf.dtype):
            raise TecompError(f"storing {s.value.dtype} into {buf.dtype} buffer {buf.name}: {s}")
        from .gpu_memory import compile_store

        if buf.data in getattr(self, "async_dsts", ()):
            return self._async_store(s)
        return compile_store(self, s)

    def _async_store(self, s: S.BufferStore) -> StmtFn:
        """A store into a cp.async destination (gpu_async.py): a cp.async inside
        ASYNC_COPY_SCOPE, otherwise a plain store checked against copies in flight."""
        from ..passes.inject_software_pipeline import cp_async_bytes
        from .gpu_async import checked_access, compile_cp_async
        from .gpu_memory import _lanes, compile_store

        nbytes = cp_async_bytes(s) if getattr(self, "_async_scope", 0) else None
        if nbytes is not None:
            return compile_cp_async(self, s, nbytes)
        return checked_access(self, s.buffer, s.indices, _lanes(s.indices, s.value.dtype),
                              compile_store(self, s), "a store to")

    def _let(self, e: E.Let | S.LetStmt) -> ExprFn:  # type: ignore[override]
        v, value = e.var, self.expr(e.value)
        with self._binding(v, self.varies(e.value)):
            body = self.expr(e.body) if isinstance(e, E.Let) else self._nested(e, e.body)
        def let(env: Env) -> Any:
            old = env.get(v, _MISSING)
            env[v] = value(env)
            r = body(env)
            I._restore(env, v, old)
            return r
        return let

    # memory (gpu_memory.py) ----------------------------------------------------------------

    def _u_load(self, e: E.BufferLoad) -> ExprFn:
        from .gpu_memory import compile_uniform_load

        return self._async_checked(e, _widen_half(e, compile_uniform_load(self, e)))

    def _v_load(self, e: E.BufferLoad) -> ExprFn:
        from .gpu_memory import compile_varying_load

        return self._async_checked(e, _widen_half(e, compile_varying_load(self, e)))

    def _async_checked(self, e: E.BufferLoad, load: ExprFn) -> ExprFn:
        """A load of a cp.async destination fails on elements still in flight (gpu_async.py)."""
        if e.buffer.data not in getattr(self, "async_dsts", ()):
            return load
        from .gpu_async import checked_access
        from .gpu_memory import _lanes

        return checked_access(self, e.buffer, e.indices, _lanes(e.indices, e.dtype), load, "a load of")

    # varying expressions ---------------------------------------------------------------------

    def as_varying(self, e: E.Expr) -> ExprFn:
        """``e`` compiled to give the varying representation even where it is uniform: a fresh
        ``[T]`` (``[T, lanes]``) array of its dtype, every thread holding the uniform value.
        For a node classified varying that can produce the value of a uniform child as its
        own (a Select on a block-uniform condition picking its uniform side): consumers of a
        varying value index it by lane, so a bare scalar there is wrong."""
        fn = self.expr(e)
        if self.varies(e):
            return fn
        T, npd, lanes = self.state.T, dt.value_numpy(e.dtype), dt.lanes(e.dtype)
        if lanes == 1:
            return lambda env: np.full(T, fn(env), npd)
        return lambda env: np.tile(np.asarray(fn(env), npd), (T, 1))

    def live_for(self, lanes: int) -> Callable[[], np.ndarray | None]:
        """The active lanes as seen by a value of ``lanes`` vector lanes: None, [T] or [T, lanes]."""
        state = self.state
        if lanes == 1:
            return lambda: state.mask
        def live() -> np.ndarray | None:
            vm = state.vmask
            if vm is not None and vm.shape[1] == lanes:
                return vm
            m = state.mask
            return None if m is None else m[:, None]
        return live

    def _v_binary(self, e: E.BinaryOp) -> ExprFn:
        fa, fb, op = self.expr(e.a), self.expr(e.b), type(e)
        if dt.is_float(e.dtype):
            fn = ops.FLOAT_VECTOR[op]
        elif op in (E.Div, E.FloorDiv, E.FloorMod):
            return self._v_int_div(e, fa, fb)
        else:
            fn = ops.INT_VECTOR[op]
        if op in (E.Add, E.Sub, E.Mul) and isinstance(e.b, (E.IntImm, E.FloatImm)):
            # a 0-d array of the dtype: numpy mixes it with arrays faster than a Python scalar
            c = np.array(e.b.value, dt.value_numpy(e.dtype))
            return lambda env: fn(fa(env), c)
        return lambda env: fn(fa(env), fb(env))

    def _v_int_div(self, e: E.BinaryOp, fa: ExprFn, fb: ExprFn) -> ExprFn:
        fn, state, live_of = ops.INT_VECTOR[type(e)], self.state, self.live_for(dt.lanes(e.dtype))
        npd = dt.to_numpy(e.dtype)
        def vdiv(env: Env) -> Any:
            x, y = fa(env), fb(env)
            if not isinstance(y, np.ndarray):  # a uniform divisor
                if y == 0:
                    raise ZeroDivisionError(f"integer division by zero in {e} ({state.where(live_of())})")
                return fn(x, y)
            zero = y == 0
            if zero.any():
                live = live_of()
                hit = zero if live is None else zero & live
                if hit.any():
                    raise ZeroDivisionError(f"integer division by zero in {e} ({state.where(hit)})")
                y = np.where(zero, npd.type(1), y)  # lanes nobody reads
                return np.where(zero, npd.type(0), fn(x, y))
            return fn(x, y)
        return vdiv

    def _v_cmp(self, e: E.CmpOp) -> ExprFn:
        fa, fb, fn = self.expr(e.a), self.expr(e.b), ops.CMP[type(e)]
        return lambda env: fn(fa(env), fb(env))

    def _v_logic(self, e: E.And | E.Or) -> ExprFn:
        fa, fb = self.expr(e.a), self.expr(e.b)
        fn = np.logical_and if isinstance(e, E.And) else np.logical_or
        return lambda env: fn(fa(env), fb(env))

    def _v_not(self, e: E.Not) -> ExprFn:
        fa = self.expr(e.a)
        return lambda env: np.logical_not(fa(env))

    def _v_select(self, e: E.Select) -> ExprFn:
        npd, state = dt.value_numpy(e.dtype), self.state
        cond = self.expr(e.cond)
        vec_cond = dt.lanes(e.cond.dtype) > 1
        if not vec_cond and not self.varies(e.cond):
            # the same side for every thread, but the Select is varying (a side is): the side
            # taken must come out varying too, also when it is the uniform one
            ft, ff = self.as_varying(e.t), self.as_varying(e.f)
            return lambda env: ft(env) if cond(env) else ff(env)
        if vec_cond:
            return self._v_vector_select(e, cond)
        ft, ff = self.expr(e.t), self.expr(e.f)
        vec_value = dt.lanes(e.dtype) > 1
        def vselect(env: Env) -> Any:
            # each side runs only for the lanes that pick it (loads/divisions in the others
            # are not performed)
            c = np.asarray(cond(env), bool)
            m0 = state.mask
            mt = c if m0 is None else (m0 & c)
            mf = ~c if m0 is None else (m0 & ~c)
            tv: Any = 0
            fv: Any = 0
            if mt.any():
                state.mask = None if mt.all() else mt
                tv = ft(env)
            if mf.any():
                state.mask = None if mf.all() else mf
                fv = ff(env)
            state.mask = m0
            return np.where(c[:, None] if vec_value else c, tv, fv).astype(npd, copy=False)
        return vselect

    def _v_vector_select(self, e: E.Select, cond: ExprFn) -> ExprFn:
        lanes, npd, state, mcell = dt.lanes(e.dtype), dt.value_numpy(e.dtype), self.state, self.mask
        T = state.T
        self.masked_depth += 1  # uniform loads inside consult the interpreter's lane mask
        try:
            ft, ff = self.expr(e.t), self.expr(e.f)
        finally:
            self.masked_depth -= 1
        live_of = self.live_for(lanes)
        def side(f: ExprFn, pick: np.ndarray, env: Env) -> Any:
            if not pick.any():
                return 0
            m0, v0, l0 = state.mask, state.vmask, mcell[0]
            threads: np.ndarray = np.asarray(pick.any(axis=1))
            state.mask = None if threads.all() else threads
            state.vmask = pick
            lane: np.ndarray = np.asarray(pick.any(axis=0))  # needed in a lane if any thread picks it
            mcell[0] = lane if l0 is None or l0.shape != lane.shape else (lane & l0)
            try:
                return f(env)
            finally:
                state.mask, state.vmask, mcell[0] = m0, v0, l0
        def vselect(env: Env) -> Any:
            c = np.broadcast_to(np.asarray(cond(env), bool), (T, lanes))
            live = live_of()
            ct = c if live is None else (c & live)
            cf = ~c if live is None else (~c & live)
            return np.where(c, side(ft, ct, env), side(ff, cf, env)).astype(npd, copy=False)
        return vselect

    def _v_cast(self, e: E.Cast) -> ExprFn:
        fv, src, dst = self.expr(e.value), e.value.dtype, e.dtype
        if src == dst:
            return fv
        if dt.is_half(dst):  # one rounding to 16 bits, held as float32 (the interpreter's)
            if dt.is_float(src):
                return lambda env: dt.round_to(fv(env), dst)
            return lambda env: dt.round_to(np.asarray(fv(env)).astype(np.float64), dst)
        if dt.is_half(src):
            src = dt.compute_dtype(src)
            if dt.element(src) == dt.element(dst):
                return fv
        npd = dt.to_numpy(dst)
        if dt.is_bool(dst):
            return lambda env: np.asarray(fv(env)) != 0
        if dt.is_float(src) and not dt.is_float(dst):
            return lambda env: I.saturating_float_to_int(fv(env), npd)
        return lambda env: np.asarray(fv(env)).astype(npd)

    def _v_call(self, e: E.Call) -> ExprFn:
        if e.name in ("address_of", "debug_oob_axis"):
            return self._v_special_call(e)
        if e.name == SHFL_XOR:
            return self._v_shfl_xor(e)
        args = [self.expr(a) for a in e.args]
        if e.name == "prefetch":
            return lambda env: 0
        if e.name == "likely":
            return args[0]
        if e.name in ops.PREDICATES:
            pfn = ops.PREDICATES[e.name]
            return lambda env: pfn(*[a(env) for a in args])
        if e.name == "reinterpret":
            rfn, (r0,) = intrin_eval.reinterpret_fn(e.args[0].dtype, e.dtype, True), args
            return lambda env: rfn(r0(env))
        if e.name in intrin_eval.INT_NAMES:
            ifn = intrin_eval.int_vector_fn(e.name, e.args[0].dtype, e.dtype)
            assert ifn is not None
            return lambda env: ifn(*[a(env) for a in args])
        if not dt.is_float(e.dtype):
            if e.name not in ("abs", "fabs", "floor", "ceil", "round", "trunc", "nearbyint", "rint"):
                raise TecompError(f"unknown intrinsic {e.name!r} for {e.dtype} in {e}")
            (a0,) = args
            return (lambda env: np.abs(a0(env))) if e.name in ("abs", "fabs") else a0
        ffn = ops.float_fns(dt.value_numpy(e.dtype)).get(e.name)
        if ffn is None:
            raise TecompError(f"unknown intrinsic {e.name!r} in {e}")
        if len(args) == 1:
            (a0,) = args
            return lambda env: ffn(a0(env))
        return lambda env: ffn(*[a(env) for a in args])

    def _v_special_call(self, e: E.Call) -> ExprFn:
        if e.name == "address_of":
            raise TecompError(f"address_of of a per-thread address cannot run on the GPU emulator: {e}")
        _, name, axis, index, extent = e.args
        fi, fx, state = self.expr(index), self.expr(extent), self.state
        def oob(env: Env) -> Any:
            lane = state.first(state.mask)
            i = np.broadcast_to(np.asarray(fi(env)), (state.T,))[lane]
            n = np.broadcast_to(np.asarray(fx(env)), (state.T,))[lane]
            raise IndexError(f"out-of-bounds access to buffer {name.value!r}: index {i} on axis "  # type: ignore[attr-defined]
                             f"{axis.value} not in [0, {n}) ({state.where(state.mask)})")  # type: ignore[attr-defined]
        return oob

    def _v_shfl_xor(self, e: E.Call) -> ExprFn:
        return compile_shfl_xor(self, e)

    def _v_ramp(self, e: E.Ramp) -> ExprFn:
        fb, fs = self.expr(e.base), self.expr(e.stride)
        iota = np.arange(e.lanes).astype(dt.to_numpy(e.dtype))
        vb, vs = self.varies(e.base), self.varies(e.stride)
        def ramp(env: Env) -> Any:
            b, st = fb(env), fs(env)
            return iota * (st[:, None] if vs else st) + (b[:, None] if vb else b)
        return ramp

    def _v_broadcast(self, e: E.Broadcast) -> ExprFn:
        fv, lanes = self.expr(e.value), e.lanes
        return lambda env: np.repeat(fv(env)[:, None], lanes, axis=1)

    def _v_reduce(self, e: E.VectorReduce) -> ExprFn:
        fv, op = self.expr(e.value), ops.REDUCE_OPS.get(e.op)
        if op is None:
            raise TecompError(f"unknown VectorReduce op {e.op!r}: {e}")
        # lane by lane, left to right, each step rounded to the dtype: interp's ordered fold
        fn = ops.FLOAT_VECTOR[op] if dt.is_float(e.dtype) else ops.INT_VECTOR[op]
        def reduce(env: Env) -> Any:
            v = fv(env)
            return functools.reduce(fn, [v[:, k] for k in range(v.shape[1])])
        return reduce


class _Binding:
    """Scope of a variable's uniformity while its binder's body is compiled."""

    def __init__(self, c: SimtCompiler, var: E.Var, varying: bool) -> None:
        self.c, self.var, self.varying = c, var, varying

    def __enter__(self) -> None:
        c = self.c
        self.was = self.var in c.vvars
        if self.was != self.varying:
            (c.vvars.add if self.varying else c.vvars.discard)(self.var)
            c._vmemo.clear()

    def __exit__(self, *exc: object) -> None:
        c = self.c
        if self.was != self.varying:
            (c.vvars.add if self.was else c.vvars.discard)(self.var)
            c._vmemo.clear()


def _alloc_size(buf: Buffer, dims: list[int], strides: list[int]) -> int:
    if strides:
        size = 1 + sum((n - 1) * st for n, st in zip(dims, strides, strict=True))
        size = size if all(n > 0 for n in dims) else 0
    else:
        size = int(np.prod(dims, dtype=np.int64)) if dims else 1
    if size < 0:
        raise TecompError(f"allocation of {buf.name} has negative size {dims}")
    return size


_C = SimtCompiler
_VEXPR: dict[type, Callable[[SimtCompiler, Any], ExprFn]] = {
    E.Var: I._Compiler._var,
    **{k: _C._v_binary for k in ops.INT_SCALAR}, **{k: _C._v_cmp for k in ops.CMP},
    E.And: _C._v_logic, E.Or: _C._v_logic, E.Not: _C._v_not, E.Select: _C._v_select,
    E.Cast: _C._v_cast, E.Call: _C._v_call, E.Ramp: _C._v_ramp, E.Broadcast: _C._v_broadcast,
    E.VectorReduce: _C._v_reduce, E.BufferLoad: _C._v_load,
}
_STMTS: dict[type, Callable[[SimtCompiler, Any], StmtFn]] = {
    S.For: _C._s_for, S.SeqStmt: _C._s_seq, S.IfThenElse: _C._s_if, S.LetStmt: _C._let,
    S.Evaluate: _C._s_evaluate, S.AttrStmt: _C._s_attr, S.Allocate: _C._s_alloc,
    S.BufferStore: _C._s_store,
}


def _widen_half(e: E.BufferLoad, load: ExprFn) -> ExprFn:
    """16-bit float storage -> float32 values (exact: cvt.f32.f16, a shift for bfloat16)."""
    el = dt.element(e.buffer.dtype)
    if el == "bfloat16":
        return lambda env: dt.bf16_bits_to_f32(load(env))
    if el == "float16":
        return lambda env: np.asarray(load(env), np.float32)
    return load

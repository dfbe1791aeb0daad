"""cp.async in the GPU emulator: asynchronous copies into shared memory, their groups, and the
poison a destination holds until its group is waited for (docs/gpu-ir.md, "Software
pipelining").

A cp.async (a qualifying store inside ``ASYNC_COPY_SCOPE``, `cp_async_bytes`) reads its global
source when issued, but its shared destination only takes the value when a
``cp_async_wait_group n`` retires the copy's group (all but the n newest committed groups).
Until then every element it writes is *in flight*: a load or plain store of it, or another
cp.async into it, is an `AsyncCopyError` naming the buffer, the element and both threads, so a
missing or misplaced wait is caught on the CPU instead of reading stale data. The copy is logged
for the race detector twice, at issue (another thread still reading the slot it overwrites: a
missing barrier before the load) and at retirement (another thread reading it before the
barrier that follows the wait). Each copy must be aligned to its size (element offset times
element size; allocations and arguments start aligned), as PTX requires.

Groups are tracked per block: the compiler places commit and wait where every thread of the
block runs them (a commit or wait under thread-dependent control flow is refused).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import TecompError
from ..ir import dtype as dt
from ..ir import expr as E  # noqa: N812
from ..ir import stmt as S  # noqa: N812
from ..ir.buffer import Buffer
from ..ir.functor import StmtVisitor
from . import interp as I  # noqa: N812

if TYPE_CHECKING:
    from .gpu_simt import SimtCompiler

Env = I.Env
ExprFn = I.ExprFn
StmtFn = I.StmtFn


class AsyncCopyError(TecompError):
    """A cp.async destination used before its group was waited for, a misaligned cp.async, or
    cp.async bookkeeping the hardware does not allow. ``buffer``, ``element`` (flat index) and
    ``thread`` ((x, y, z) of the offending thread) say where."""

    def __init__(self, msg: str, buffer: str, element: int, thread: tuple[int, int, int]) -> None:
        super().__init__(msg)
        self.buffer, self.element, self.thread = buffer, element, thread


@dataclass
class _Copy:
    buffer: str
    flat: np.ndarray
    elems: np.ndarray  # flat offsets written (live lanes only)
    values: np.ndarray
    site: int | None  # race-detector site, and the entry to log at retirement
    offsets: Any
    live: Any


class AsyncCopies:
    """The block's cp.async state: per destination storage, which thread's copy is in flight
    at each element (-1: none); the open group; the committed groups, oldest first."""

    def __init__(self, c: SimtCompiler) -> None:
        self.state, self.tracker = c.state, c.tracker
        self.block: tuple[int, int, int] | None = None
        self.busy: dict[int, np.ndarray] = {}
        self.keep: dict[int, np.ndarray] = {}  # the storages (so their ids stay theirs)
        self.open: list[_Copy] = []
        self.groups: list[list[_Copy]] = []
        self.inflight = 0

    def sync_block(self) -> None:
        """A new block starts with nothing in flight."""
        if self.block != self.state.block or self.block is None:
            self.block = self.state.block
            self.busy.clear()
            self.keep.clear()
            self.open, self.groups, self.inflight = [], [], 0

    def busy_of(self, flat: np.ndarray) -> np.ndarray:
        b = self.busy.get(id(flat))
        if b is None:
            b = self.busy[id(flat)] = np.full(flat.shape[0], -1, np.int64)
            self.keep[id(flat)] = flat
        return b

    def retire(self, keep: int) -> None:
        while len(self.groups) > keep:
            for cp in self.groups.pop(0):
                cp.flat[cp.elems] = cp.values
                self.busy[id(cp.flat)][cp.elems] = -1
                self.inflight -= cp.elems.size
                t = self.tracker
                if t is not None and cp.site is not None:
                    t.log.append((cp.site, cp.offsets, cp.live, cp.flat))
                    t.hot.append(cp.site)

    def thread(self, lin: int) -> tuple[int, int, int]:
        x, y, _ = self.state.dims
        return (lin % x, lin // x % y, lin // (x * y))


def _copies(c: SimtCompiler) -> AsyncCopies:
    a = getattr(c, "_async_copies", None)
    if a is None:
        a = AsyncCopies(c)
        c._async_copies = a  # type: ignore[attr-defined]
    return a


class _HasAsync(StmtVisitor):
    def __init__(self) -> None:
        self.dsts: set[E.Var] = set()
        self._depth = 0

    def visit_AttrStmt(self, s: S.AttrStmt) -> None:
        inside = s.key == S.ASYNC_COPY_SCOPE
        self._depth += inside
        super().visit_AttrStmt(s)
        self._depth -= inside

    def visit_BufferStore(self, s: S.BufferStore) -> None:
        if self._depth:
            self.dsts.add(s.buffer.data)
        super().visit_BufferStore(s)


def note_allocation(c: SimtCompiler, s: S.Allocate) -> None:
    """Before a shared allocation's body is compiled: remember it if cp.async writes it, so its
    loads and stores are compiled with the in-flight check (`checked_access`)."""
    v = _HasAsync()
    v.visit_stmt(s.body)
    if s.buffer.data in v.dsts:
        dsts: set[E.Var] = getattr(c, "async_dsts", set())
        dsts.add(s.buffer.data)
        c.async_dsts = dsts  # type: ignore[attr-defined]


def wrap_allocation(c: SimtCompiler, s: S.Allocate, run: StmtFn) -> StmtFn:
    """A cp.async destination's allocation: at its end nothing may still be in flight (the
    data would land in memory that is gone: a missing final wait)."""
    if s.buffer.data not in getattr(c, "async_dsts", ()):
        return run
    a, name = _copies(c), s.buffer.name
    def run_async_alloc(env: Env) -> None:
        a.sync_block()
        run(env)
        for cp in (*a.open, *(x for g in a.groups for x in g)):
            if cp.buffer == name and cp.elems.size:
                lin = int(a.busy[id(cp.flat)][cp.elems[0]])
                raise AsyncCopyError(
                    f"cp.async into shared buffer '{name}' element {int(cp.elems[0])} (issued by "
                    f"thread {a.thread(lin)} of block {a.state.block}) is still in flight when "
                    "the buffer's allocation ends: no cp_async_wait_group retired it",
                    name, int(cp.elems[0]), a.thread(lin))
    return run_async_alloc


def _shape(c: SimtCompiler, lanes: int) -> tuple[int, ...]:
    return (c.state.T,) if lanes == 1 else (c.state.T, lanes)


def _access(c: SimtCompiler, buf: Buffer, index: E.Expr, lanes: int
            ) -> Callable[[Env], tuple[np.ndarray, np.ndarray]]:
    """(offsets, live) of an access, both broadcast to [T] / [T, lanes]."""
    from .gpu_memory import _expand, _lane_axis

    off, shape, live_of = c.expr(index), _shape(c, lanes), c.live_for(lanes)
    o_axis = _lane_axis(c, index, lanes)
    def get(env: Env) -> tuple[np.ndarray, np.ndarray]:
        o = _expand(np.asarray(off(env), np.int64), shape, o_axis)
        live = live_of()
        sel = np.ones(shape, bool) if live is None else np.broadcast_to(np.asarray(live, bool), shape)
        return o, sel
    return get


def _in_flight_error(c: SimtCompiler, a: AsyncCopies, buf: Buffer, flat: np.ndarray, o: np.ndarray,
                     sel: np.ndarray, what: str, where: str) -> None:
    busy = a.busy.get(id(flat))
    if busy is None:
        return
    ok = sel & (o >= 0) & (o < busy.shape[0])  # out-of-bounds is the access's own error
    hit = np.zeros(o.shape, bool)
    hit[ok] = busy[o[ok]] >= 0
    if not hit.any():
        return
    state = c.state
    lane = state.first(hit)
    row = hit[lane] if hit.ndim > 1 else None
    elem = int(o[lane] if row is None else o[lane][row][0])
    issuer = a.thread(int(busy[elem]))
    me = state.thread(lane)
    raise AsyncCopyError(
        f"{what} shared buffer '{buf.name}' element {elem} by thread {me} of block {state.block} "
        f"while the cp.async into it issued by thread {issuer} is still in flight (its group "
        f"has not been retired by cp_async_wait_group) in `{where}`", buf.name, elem, me)


def checked_access(c: SimtCompiler, buf: Buffer, indices: tuple[E.Expr, ...], lanes: int,
                   fn: Any, what: str) -> Any:
    """``fn`` (a compiled load or plain store of a cp.async destination) preceded by the check
    that none of the elements it touches is in flight."""
    from .gpu_memory import _flat_storage

    if len(indices) != 1:
        return fn
    storage, get, a = _flat_storage(c, buf), _access(c, buf, indices[0], lanes), _copies(c)
    where = c._where  # the statement, read now: the compiler moves on before this runs
    def checked(env: Env) -> Any:
        if a.inflight:
            o, sel = get(env)
            _in_flight_error(c, a, buf, storage(env), o, sel, what, where)
        return fn(env)
    return checked


def compile_cp_async(c: SimtCompiler, s: S.BufferStore, nbytes: int) -> StmtFn:
    """One cp.async per live thread: read the source now, put the copy in the open group. A
    guarded copy (`cp_async_source`: ``select(cond, A[j], 0)``) is the zero-filling form,
    source size ``cond ? nbytes : 0`` (or the live prefix of a vector): the lanes it does not
    read take zeros, in flight like any copy; a copy that reads nothing has its source at
    element 0 (codegen), so its source address is not checked."""
    from ..passes.inject_software_pipeline import cp_async_source
    from .gpu_memory import _expand, _flat_storage, _lane_axis, _oob, _site, compile_varying_load

    found = cp_async_source(s)
    assert found is not None
    src, cond = found
    buf, state = s.buffer, c.state
    lanes = dt.lanes(src.dtype)
    shape, npd = _shape(c, lanes), dt.storage_numpy(buf.dtype)
    # storage values (no float16 widening), bounds-checked; with a guard, a load predicated on
    # it: the lanes it turns off read nothing and give 0, the zero fill
    read, reads, some = src, None, None
    if cond is not None and dt.is_bool(cond.dtype):  # all lanes or none
        read = E.BufferLoad(src.buffer, src.indices, src.dtype,
                            predicate=cond if lanes == 1 else E.Broadcast(cond, lanes))
        reads = c.expr(cond)
    elif cond is not None:  # the first `cond` lanes
        lane = E.Ramp(E.const(0, cond.dtype), E.const(1, cond.dtype), lanes)
        read = E.BufferLoad(src.buffer, src.indices, src.dtype,
                            predicate=E.LT(lane, E.Broadcast(cond, lanes)))
        some = E.GT(cond, E.const(0, cond.dtype))
        reads = c.expr(some)
    value = compile_varying_load(c, read)
    # the compiler caches values by id(expression): the expressions made here must outlive the
    # compiled statement, or a later one could take their ids (kept by the closure below)
    made = (src, read, cond, some)
    v_axis = _lane_axis(c, read, lanes)
    storage = _flat_storage(c, buf)
    dst = _access(c, buf, s.indices[0], lanes)
    srco = _access(c, src.buffer, src.indices[0], lanes)
    site = _site(c, buf, True, True, lanes)
    a, where, size = _copies(c), c._where, dt.itemsize(buf.dtype)
    lane_ids = np.arange(state.T)
    def cp_async(env: Env, _made: Any = made) -> None:
        o, sel = dst(env)
        if not sel.any():
            return
        v = _expand(np.asarray(value(env), npd), shape, v_axis)
        flat = storage(env)
        bad = sel & ((o < 0) | (o >= flat.shape[0]))
        if bad.any():
            raise _oob(c, buf, where, o, sel, flat.shape[0], shape) or IndexError(buf.name)
        so, _ = srco(env)
        live = sel if sel.ndim == 1 else sel[:, 0]
        # a copy that reads nothing has its source at element 0 (aligned): only the reading
        # copies' sources are checked
        reading = live if reads is None else live & np.broadcast_to(
            np.asarray(reads(env), bool), (state.T,))
        for name, first, mis in ((buf.name, o, live), (src.buffer.name, so, reading)):
            f = first if first.ndim == 1 else first[:, 0]
            mis = mis & ((f * size) % nbytes != 0)
            if mis.any():
                lane = state.first(mis)
                raise AsyncCopyError(
                    f"cp.async of {nbytes} bytes at element {int(f[lane])} of '{name}' by thread "
                    f"{state.thread(lane)} of block {state.block} is not {nbytes}-byte aligned "
                    f"in `{where}`", name, int(f[lane]), state.thread(lane))
        _in_flight_error(c, a, buf, flat, o, sel, "cp.async into", where)
        elems = o[sel]
        a.busy_of(flat)[elems] = state.lin[np.broadcast_to(
            lane_ids if lanes == 1 else lane_ids[:, None], shape)[sel]]
        a.open.append(_Copy(buf.name, flat, elems, np.array(v[sel]), site, o, sel))
        a.inflight += elems.size
        t = c.tracker
        if t is not None and site is not None:
            t.log.append((site, o, sel, flat))
            t.hot.append(site)
    return cp_async


def compile_group_call(c: SimtCompiler, s: S.Evaluate) -> StmtFn | None:
    """``cp_async_commit_group()`` / ``cp_async_wait_group(n)``; None for other statements."""
    e = s.value
    if not isinstance(e, E.Call) or e.name not in (S.CP_ASYNC_COMMIT, S.CP_ASYNC_WAIT):
        return None
    a, state, where = _copies(c), c.state, c._where
    keep = 0
    if e.name == S.CP_ASYNC_WAIT:
        if len(e.args) != 1 or not isinstance(e.args[0], E.IntImm) or e.args[0].value < 0:
            raise TecompError(f"cp_async_wait_group takes one constant count >= 0: {e}")
        keep = e.args[0].value

    def uniform() -> None:
        a.sync_block()
        if state.mask is not None:
            lane = state.first(~state.mask)
            raise AsyncCopyError(
                f"{e.name} reached by only some threads of block {state.block} (thread "
                f"{state.thread(lane)} skips it) in `{where}`; the emulator tracks cp.async "
                "groups per block", "", -1, state.thread(lane))

    if e.name == S.CP_ASYNC_COMMIT:
        def commit(env: Env) -> None:
            uniform()
            a.groups.append(a.open)
            a.open = []
        return commit

    def wait(env: Env) -> None:
        uniform()
        a.retire(keep)
    return wait


__all__ = ["AsyncCopies", "AsyncCopyError", "checked_access", "compile_cp_async",
           "compile_group_call", "note_allocation", "wrap_allocation"]

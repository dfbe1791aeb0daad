"""Loads and stores of the GPU emulator: global and shared memory (one flat numpy array each,
shared by the block's threads) and local memory (per thread), bounds-checked with the thread
and block named, and logged for the race detector (`gpu_race`).

The common access, a scalar at a per-thread flat offset, takes a fast path: numpy's own
bounds check on the offsets viewed as unsigned ints (negative ones become huge) replaces an
explicit comparison, and the message is only worked out when it fails.

Local memory is a list with one ``[T]`` array per element (every thread's copy of it): the
usual register-tile access at a constant index is a list lookup, and a store replaces the
entry (masked lanes keep their old values), so values already loaded never change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import TecompError
from ..ir import dtype as dt
from ..ir import expr as E  # noqa: N812
from ..ir import stmt as S  # noqa: N812
from ..ir.buffer import Buffer
from . import interp as I  # noqa: N812
from .gpu_simt import BlockState, _is_local, _unsigned

if TYPE_CHECKING:
    from .gpu_simt import SimtCompiler

Env = I.Env
ExprFn = I.ExprFn
StmtFn = I.StmtFn
# offsets of an access: (env, storage size, live lanes) -> int or array
Offsets = Callable[[Env, int, Any], Any]


def _lanes(indices: tuple[E.Expr, ...], dtype: str) -> int:
    return max([dt.lanes(dtype)] + [dt.lanes(i.dtype) for i in indices])


def _site(c: SimtCompiler, buf: Buffer, write: bool, varying: bool, lanes: int) -> int | None:
    """Register an access with the race detector; None when it is not tracked."""
    if c.tracker is None or _is_local(buf):
        return None
    if not buf.scope.startswith("shared") and buf.name not in c.tracked:
        return None  # a global buffer the kernel never writes cannot race
    return c.tracker.site(buf, write, varying, lanes, c._where)


def _logs(c: SimtCompiler, site: int | None) -> tuple[list[Any] | None, list[Any] | None]:
    """Where an access logs itself: every tracked access goes to the log; those that can make a
    region need analysis (stores, reads of written globals) also mark it, so a region of shared
    reads only is dropped without a look."""
    if site is None or c.tracker is None:
        return None, None
    t = c.tracker
    return t.log, (t.hot if t.sites[site].write or not t.sites[site].buffer.scope.startswith("shared") else None)


def _shape(state: BlockState, lanes: int) -> tuple[int, ...]:
    return (state.T,) if lanes == 1 else (state.T, lanes)


def _expand(v: Any, shape: tuple[int, ...], lane_axis: bool) -> np.ndarray:
    """``v`` broadcast to the access's full ``shape``; ``lane_axis``: a 1-D ``v`` is over threads
    (a varying scalar used by every vector lane), not over vector lanes."""
    a = np.asarray(v)
    if lane_axis and len(shape) == 2 and a.ndim == 1:
        a = a[:, None]
    return np.broadcast_to(a, shape)


def _lane_axis(c: SimtCompiler, e: E.Expr | None, lanes: int) -> bool:
    return e is not None and lanes > 1 and dt.lanes(e.dtype) == 1 and c.varies(e)


def _oob(c: SimtCompiler, buf: Buffer, where: str, o: Any, live: Any, size: int,
         shape: tuple[int, ...]) -> IndexError | None:
    """The error for the first live lane whose offset is outside [0, size), or None if none is."""
    state = c.state
    full = _expand(np.asarray(o, np.int64), shape, False)
    bad = (full < 0) | (full >= size)
    if live is not None:
        bad = bad & _expand(live, shape, True)
    if not bad.any():
        return None
    lane = state.first(bad)
    row = full[lane] if full.ndim == 1 else full[lane][bad[lane]][0]
    return IndexError(
        f"out-of-bounds access to {buf.scope} buffer '{buf.name}': index {int(row)} not in "
        f"[0, {size}) by thread {state.thread(lane)} of block {state.block} in `{where}`")


def _offsets(c: SimtCompiler, buf: Buffer, indices: tuple[E.Expr, ...], lanes: int,
             node: object) -> tuple[Offsets, bool]:
    """Flat offsets of an access and whether numpy's bounds check on the storage is all the
    checking they need (one flat index); multi-axis indices are checked here, axis by axis,
    on the live lanes."""
    idx = [c.expr(i) for i in indices]
    if len(indices) == 1 and (buf.ndim != 1 or not buf.strides):
        f0 = idx[0]
        return (lambda env, size, live: f0(env)), True
    dims = c._dims(buf, len(indices), node)
    state, shape, where = c.state, _shape(c.state, lanes), c._where
    axes = [_lane_axis(c, i, lanes) for i in indices]
    def offsets(env: Env, size: int, live: Any) -> Any:
        o: Any = 0
        flat = np.empty(size, np.int8)  # _dims only reads the storage's size
        for axis, (f, (n, st), la) in enumerate(zip(idx, dims(env, flat), axes, strict=True)):
            i = f(env)
            full = _expand(np.asarray(i, np.int64), shape, la)
            bad = (full < 0) | (full >= n)
            if live is not None:
                bad = bad & _expand(live, shape, True)
            if bad.any():
                lane = state.first(bad)
                v = full[lane] if full.ndim == 1 else full[lane][bad[lane]][0]
                raise IndexError(
                    f"out-of-bounds access to {buf.scope} buffer '{buf.name}': index {int(v)} on "
                    f"axis {axis} not in [0, {n}) by thread {state.thread(lane)} of block "
                    f"{state.block} in `{where}`")
            o = o + full * st
        return o
    return offsets, False


def _flat_storage(c: SimtCompiler, buf: Buffer) -> Callable[[Env], np.ndarray]:
    """The flat storage of a global or shared buffer: the same array object at every access
    (the race detector groups accesses by it), also where it must be viewed at an offset or
    as another dtype."""
    data, npd, by_name, views = buf.data, dt.storage_numpy(buf.dtype), c.by_name, c.views
    def storage(env: Env) -> np.ndarray:
        p = env.get(data) or by_name.get(buf.name)
        if p is None or not isinstance(p, I.Pointer):
            raise TecompError(f"buffer {buf.name} is neither a parameter nor allocated")
        flat = p.array
        if p.offset == 0 and flat.dtype == npd:
            return flat
        key = (id(flat), p.offset, npd)
        hit = views.get(key)
        if hit is None:  # the view keeps its base alive, so the key's id stays its own
            hit = views[key] = flat[p.offset:].view(npd)
        return hit
    return storage


def _storage(c: SimtCompiler, buf: Buffer) -> Callable[[Env], Any]:
    if not _is_local(buf):
        return _flat_storage(c, buf)
    data, by_name = buf.data, c.by_name
    def cells(env: Env) -> list[np.ndarray]:
        p = env.get(data) or by_name.get(buf.name)
        if p is None:
            raise TecompError(f"buffer {buf.name} is neither a parameter nor allocated")
        return p  # type: ignore[return-value]
    return cells


# loads ----------------------------------------------------------------------------------------


def compile_uniform_load(c: SimtCompiler, e: E.BufferLoad) -> ExprFn:
    """A load every active thread makes at the same address: one read, the interpreter's way."""
    buf, state, mcell, masked = e.buffer, c.state, c.mask, c.masked_depth > 0
    if dt.element(e.dtype) != dt.element(buf.dtype):
        raise TecompError(f"loading {e.dtype} from {buf.dtype} buffer {buf.name}: {e}")
    storage, npd, lanes = _flat_storage(c, buf), dt.storage_numpy(buf.dtype), _lanes(e.indices, e.dtype)
    site = _site(c, buf, False, False, lanes)
    log, hot = _logs(c, site)
    if lanes == 1 and e.predicate is None:
        offset = c._scalar_offset(buf, e.indices, e)
        zero, py = npd.type(0), npd.kind != "f"
        def load(env: Env) -> Any:
            if masked and mcell[0] is not None and not mcell[0].any():
                return zero.item() if py else zero
            flat = storage(env)
            try:
                o = offset(env, flat)
                v = flat.item(o) if py else flat[o]
            except IndexError as err:
                raise IndexError(f"{err} ({state.where(state.mask)})") from None
            if log is not None:
                log.append((site, o, state.mask, flat))
                if hot is not None:
                    hot.append(site)
            return v
        return load
    offsets = c._vector_offsets(buf, e.indices, lanes, e)
    pred = c.expr(e.predicate) if e.predicate is not None else None
    def vload(env: Env) -> Any:
        flat = storage(env)
        m = None if pred is None else np.broadcast_to(np.asarray(pred(env), bool), (lanes,))
        if masked:
            outer = I._lane_mask(mcell[0], lanes)
            if outer is not None:
                m = outer if m is None else (m & outer)
        try:
            o = offsets(env, flat, m)
        except IndexError as err:
            raise IndexError(f"{err} ({state.where(state.mask)})") from None
        if m is None:
            v = flat[o]
        else:
            v = np.zeros(lanes, npd)
            v[m] = flat[o[m]]
        if log is not None:
            tm = state.mask
            live = None if m is None else (m[None, :] if tm is None else (tm[:, None] & m[None, :]))
            log.append((site, o, tm if m is None else live, flat))
            if hot is not None:
                hot.append(site)
        return v
    return vload


def compile_varying_load(c: SimtCompiler, e: E.BufferLoad) -> ExprFn:
    buf, state, where = e.buffer, c.state, c._where
    if dt.element(e.dtype) != dt.element(buf.dtype):
        raise TecompError(f"loading {e.dtype} from {buf.dtype} buffer {buf.name}: {e}")
    lanes, npd = _lanes(e.indices, e.dtype), dt.storage_numpy(buf.dtype)
    if _is_local(buf):
        return _local_load(c, e, lanes, npd)
    storage = _flat_storage(c, buf)
    offsets, flat_index = _offsets(c, buf, e.indices, lanes, e)
    idx_varying = any(c.varies(i) for i in e.indices)
    if lanes == 1 and e.predicate is None and flat_index and idx_varying:
        return _fast_load(c, buf, e, storage)
    site = _site(c, buf, False, True, lanes)
    log, hot = _logs(c, site)
    pred = c.expr(e.predicate) if e.predicate is not None else None
    shape, live_of = _shape(state, lanes), c.live_for(lanes)
    o_axis, p_axis = _lane_axis(c, e.indices[0], lanes), _lane_axis(c, e.predicate, lanes)
    def load(env: Env) -> Any:
        flat = storage(env)
        live = live_of()
        p = None
        if pred is not None:
            p = _expand(np.asarray(pred(env), bool), shape, p_axis)
            live = p if live is None else (p & live)
        o = _expand(offsets(env, flat.shape[0], live), shape, o_axis)
        if live is None:
            oo = o
        else:
            live = np.broadcast_to(live, shape)
            oo = np.where(live, o, 0)
        try:
            v = flat[_unsigned(oo)]
        except IndexError:
            err = _oob(c, buf, where, o, live, flat.shape[0], shape)
            if err is not None:
                raise err from None
            v = np.zeros(shape, npd)  # empty storage and no live lane
        if p is not None:
            v[~p] = 0  # lanes a predicate turns off read as 0, as in the interpreter
        if log is not None:
            log.append((site, o, live, flat))
            if hot is not None:
                hot.append(site)
        return v
    return load


def _fast_load(c: SimtCompiler, buf: Buffer, e: E.BufferLoad, storage: Callable[[Env], Any]) -> ExprFn:
    """A scalar load at a per-thread flat offset: the hot path of most kernels."""
    state, f0, where = c.state, c.expr(e.indices[0]), c._where
    site = _site(c, buf, False, True, 1)
    log, hot = _logs(c, site)
    shape = (state.T,)
    def load(env: Env) -> Any:
        flat = storage(env)
        o = f0(env)
        m = state.mask
        try:
            v = flat.take(_unsigned(o if m is None else np.where(m, o, 0)))
        except IndexError:
            err = _oob(c, buf, where, o, m, flat.shape[0], shape)
            if err is not None:
                raise err from None
            v = np.zeros(shape, flat.dtype)
        if log is not None:
            log.append((site, o, m, flat))
            if hot is not None:
                hot.append(site)
        return v
    return load


def _local_load(c: SimtCompiler, e: E.BufferLoad, lanes: int, npd: np.dtype) -> ExprFn:
    buf, state, where = e.buffer, c.state, c._where
    cells_of = _storage(c, buf)
    if lanes == 1 and e.predicate is None and len(e.indices) == 1 and not c.varies(e.indices[0]):
        fi = c.expr(e.indices[0])
        def load(env: Env) -> Any:
            cells = cells_of(env)
            i = fi(env)
            if 0 <= i < len(cells):
                return cells[i]
            raise _local_oob(c, buf, where, i, len(cells))
        return load
    offsets, _ = _offsets(c, buf, e.indices, lanes, e)
    pred = c.expr(e.predicate) if e.predicate is not None else None
    shape, live_of = _shape(state, lanes), c.live_for(lanes)
    o_axis, p_axis = _lane_axis(c, e.indices[0], lanes), _lane_axis(c, e.predicate, lanes)
    rows = np.arange(state.T) if lanes == 1 else np.arange(state.T)[:, None]
    def vload(env: Env) -> Any:
        cells = cells_of(env)
        live = live_of()
        p = None
        if pred is not None:
            p = _expand(np.asarray(pred(env), bool), shape, p_axis)
            live = p if live is None else (p & live)
        o = _expand(offsets(env, len(cells), live), shape, o_axis)
        err = _oob(c, buf, where, o, live, len(cells), shape)
        if err is not None:
            raise err
        if not cells:
            return np.zeros(shape, npd)
        table = np.stack(cells, axis=1)  # [T, size]
        oo = o if live is None else np.where(np.broadcast_to(live, shape), o, 0)
        v = table[rows, oo]
        if p is not None:
            v[~p] = 0
        return v
    return vload


def _local_oob(c: SimtCompiler, buf: Buffer, where: str, i: int, size: int) -> IndexError:
    return IndexError(f"out-of-bounds access to local buffer '{buf.name}': index {i} not in "
                      f"[0, {size}) by {c.state.where(c.state.mask)} in `{where}`")


# stores ---------------------------------------------------------------------------------------


def compile_store(c: SimtCompiler, s: S.BufferStore) -> StmtFn:
    buf, state, where = s.buffer, c.state, c._where
    lanes, npd = _lanes(s.indices, s.value.dtype), dt.storage_numpy(buf.dtype)
    value, vval = c.expr(s.value), c.varies(s.value)
    if dt.element(buf.dtype) == "bfloat16":  # float32 values -> bits, RNE (cvt.rn.bf16.f32)
        v32 = value
        value = lambda env: dt.f32_to_bf16_bits(v32(env))  # noqa: E731
    # float16: numpy's float32 -> float16 assignment rounds to nearest even (cvt.rn.f16.f32)
    if _is_local(buf):
        return _local_store(c, s, lanes, npd, value)
    storage = _flat_storage(c, buf)
    idx_varying = any(c.varies(i) for i in s.indices)
    if lanes == 1 and s.predicate is None and not idx_varying:
        return _uniform_store(c, s, storage, value, vval)
    offsets, flat_index = _offsets(c, buf, s.indices, lanes, s)
    site = _site(c, buf, True, True, lanes)
    log, hot = _logs(c, site)
    shape = _shape(state, lanes)
    if lanes == 1 and s.predicate is None and flat_index:
        def store(env: Env) -> None:  # the hot path: a scalar per thread at a per-thread offset
            v = value(env)
            flat = storage(env)
            o = offsets(env, 0, None)
            m = state.mask
            if m is not None:  # outside the try: only the storage's bounds check is an OOB
                o_live, v = o[m], (v[m] if vval else v)
            try:
                # put stores in lane order: with equal offsets the last lane lands
                flat.put(_unsigned(o if m is None else o_live), v)
            except IndexError:
                raise _oob(c, buf, where, o, m, flat.shape[0], shape) or IndexError(buf.name) from None
            if log is not None:
                log.append((site, o, m, flat))
                if hot is not None:
                    hot.append(site)
        return store
    pred = c.expr(s.predicate) if s.predicate is not None else None
    live_of = c.live_for(lanes)
    o_axis, p_axis = _lane_axis(c, s.indices[0], lanes), _lane_axis(c, s.predicate, lanes)
    v_axis = _lane_axis(c, s.value, lanes)
    def vstore(env: Env) -> None:
        live = live_of()
        if pred is not None:
            p = _expand(np.asarray(pred(env), bool), shape, p_axis)
            live = p if live is None else (p & live)
        v = _expand(np.asarray(_under(state, live, lanes, value, env), npd), shape, v_axis)
        flat = storage(env)
        o = _expand(offsets(env, flat.shape[0], live), shape, o_axis)
        try:
            if live is None:
                flat[_unsigned(o)] = v  # lanes in order: with equal offsets the last one lands
            else:
                sel = np.broadcast_to(live, shape)
                flat[_unsigned(o[sel])] = v[sel]
        except IndexError:
            raise _oob(c, buf, where, o, live, flat.shape[0], shape) or IndexError(buf.name) from None
        if log is not None:
            log.append((site, o, live, flat))
            if hot is not None:
                hot.append(site)
    return vstore


def _under(state: Any, live: np.ndarray | None, lanes: int, value: ExprFn, env: Env) -> Any:
    """``value(env)`` with the store's live lanes as the vector lane mask: a predicated vector
    store's masked-off lanes (a vector tail) may divide by a zero that nobody stores, which the
    GPU (and the CPU codegen, see llvm_base._int_division) does not trap on either."""
    if live is None or lanes == 1:
        return value(env)
    v0 = state.vmask
    state.vmask = np.broadcast_to(live, (state.T, lanes))
    try:
        return value(env)
    finally:
        state.vmask = v0


def _uniform_store(c: SimtCompiler, s: S.BufferStore, storage: Callable[[Env], Any],
                   value: ExprFn, vval: bool) -> StmtFn:
    """Every active thread stores to one address; with a per-thread value the last active lane
    (in the seed's shuffled thread order) lands, as one of them would on the GPU."""
    buf, state = s.buffer, c.state
    offset = c._scalar_offset(buf, s.indices, s)
    site = _site(c, buf, True, False, 1)
    log, hot = _logs(c, site)
    last = state.T - 1
    def store(env: Env) -> None:
        v = value(env)
        flat = storage(env)
        m = state.mask
        try:
            o = offset(env, flat)
            if vval:
                v = v[last if m is None else int(np.flatnonzero(m)[-1])]
            flat[o] = v
        except IndexError as err:
            raise IndexError(f"{err} ({state.where(m)})") from None
        if log is not None:
            log.append((site, o, m, flat))
            if hot is not None:
                hot.append(site)
    return store


def _local_store(c: SimtCompiler, s: S.BufferStore, lanes: int, npd: np.dtype, value: ExprFn) -> StmtFn:
    buf, state, where = s.buffer, c.state, c._where
    cells_of = _storage(c, buf)
    T = state.T
    vval = c.varies(s.value)
    if lanes == 1 and s.predicate is None and len(s.indices) == 1 and not c.varies(s.indices[0]):
        fi = c.expr(s.indices[0])
        def store(env: Env) -> None:
            v = value(env)
            cells = cells_of(env)
            i = fi(env)
            if not 0 <= i < len(cells):
                raise _local_oob(c, buf, where, i, len(cells))
            m = state.mask
            if m is None:
                if not (vval and v.dtype == npd):
                    v = np.full(T, v, npd)
                cells[i] = v
            else:
                cells[i] = np.where(m, v, cells[i]).astype(npd, copy=False)
        return store
    offsets, _ = _offsets(c, buf, s.indices, lanes, s)
    pred = c.expr(s.predicate) if s.predicate is not None else None
    shape, live_of = _shape(state, lanes), c.live_for(lanes)
    o_axis, p_axis = _lane_axis(c, s.indices[0], lanes), _lane_axis(c, s.predicate, lanes)
    v_axis = _lane_axis(c, s.value, lanes)
    rows = np.broadcast_to(np.arange(T) if lanes == 1 else np.arange(T)[:, None], shape)
    def vstore(env: Env) -> None:
        live = live_of()
        if pred is not None:
            p = _expand(np.asarray(pred(env), bool), shape, p_axis)
            live = p if live is None else (p & live)
        v = _expand(np.asarray(_under(state, live, lanes, value, env), npd), shape, v_axis)
        cells = cells_of(env)
        o = _expand(offsets(env, len(cells), live), shape, o_axis)
        err = _oob(c, buf, where, o, live, len(cells), shape)
        if err is not None:
            raise err
        if not cells:
            return
        table = np.stack(cells, axis=1)  # a fresh [T, size] copy: earlier values stay intact
        sel = np.ones(shape, bool) if live is None else np.broadcast_to(live, shape)
        table[rows[sel], o[sel]] = v[sel]
        cells[:] = list(table.T)
    return vstore

"""Warp shuffles in the GPU emulator: CUDA's ``__shfl_xor_sync`` (PTX ``shfl.sync.bfly``) run
over a block's lanes, and the check that every lane its member mask names executes it.

Split from `gpu_simt` (the per-thread compiler), which compiles a shuffle call through
`compile_shfl_xor`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import TecompError
from ..ir import dtype as dt
from ..ir import expr as E  # noqa: N812

if TYPE_CHECKING:
    from .gpu_simt import BlockState, SimtCompiler

Env = dict[Any, Any]
ExprFn = Any  # Callable[[Env], Any]; the interpreter's closure type


class ShuffleDivergenceError(TecompError):
    """A warp shuffle (``shfl_xor_sync``) not executed by every lane its member mask names:
    some are inactive (masked off by thread-dependent control flow) or missing (the block
    ends inside the warp), or an executing lane or the lane it reads is not in the mask."""


SHFL_XOR = "shfl_xor_sync"  # Call(dtype, SHFL_XOR, (member mask, value, lane mask, width))
WARP = 32


def compile_shfl_xor(c: SimtCompiler, e: E.Call) -> ExprFn:
    """CUDA's ``__shfl_xor_sync(mask, value, lane_mask, width)`` (PTX ``shfl.sync.bfly``):
    lane ``l`` (linear thread id % 32) gets ``value`` of lane ``l ^ lane_mask`` (its low 5
    bits, as the hardware takes them), or its own where that lane lies in a later segment
    of ``width`` lanes. Every lane the member mask names must execute it (see
    `ShuffleDivergenceError`). It reads registers, not memory: the race detector does not
    see it."""
    if len(e.args) != 4:
        raise TecompError(f"{SHFL_XOR} takes (mask, value, lane_mask, width), got {len(e.args)} "
                          f"arguments: {e}")
    a_mask, a_value, a_lane, a_width = e.args
    if dt.lanes(e.dtype) != 1 or dt.bits(e.dtype) != 32 or a_value.dtype != e.dtype:
        raise TecompError(f"{SHFL_XOR} shuffles a scalar 32-bit value of the call's dtype; got "
                          f"{a_value.dtype} as {e.dtype}: {e}")
    for name, a in (("mask", a_mask), ("lane_mask", a_lane), ("width", a_width)):
        if dt.lanes(a.dtype) != 1 or dt.is_float(a.dtype) or dt.is_bool(a.dtype):
            raise TecompError(f"{SHFL_XOR}: {name} must be a scalar integer, got {a.dtype}: {e}")
        if c.varies(a):
            raise TecompError(f"{SHFL_XOR}: {name} must be the same for every thread: {e}")
    fm, fv, fb, fw = (c.expr(a) for a in e.args)
    state, T, npd = c.state, c.state.T, dt.value_numpy(e.dtype)
    vval = c.varies(a_value)
    site = f"`{e}` in `{c._where}`"
    path = "\n".join(f"  {'  ' * k}{h}" for k, h in enumerate([*c._path, c._where]))
    ragged = T % WARP != 0
    def shfl(env: Env) -> Any:
        members, b, width = int(fm(env)) & 0xFFFFFFFF, int(fb(env)) & (WARP - 1), int(fw(env))
        if width < 1 or width > WARP or width & (width - 1):
            raise TecompError(f"{SHFL_XOR}: width {width} is not a power of two in [1, {WARP}] "
                              f"({state.where(state.mask)}): {e}")
        if state.mask is not None or ragged or members != 0xFFFFFFFF:
            _check_warps(state, members, b, width, site, path)
        src = state.shfl.get((b, width))
        if src is None:
            src = state.shfl[(b, width)] = _shfl_sources(state.lin, b, width)
        v = fv(env)
        return v[src] if vval else np.full(T, v, npd)
    return shfl


def _shfl_sources(lin: np.ndarray, b: int, width: int) -> np.ndarray:
    """For each lane of the block's arrays, the lane (array position) whose value a butterfly
    shuffle with lane mask ``b`` in segments of ``width`` gives it: PTX's ``j = lane ^ b``,
    taken where ``j <= maxLane`` (the last lane of the caller's segment), else the caller's own.
    Sources past the end of a ragged block (only callers that `_check_warps` refuses read
    them) are the caller's own, to stay inside the arrays."""
    T = lin.shape[0]
    lane = lin & (WARP - 1)
    j = lane ^ b
    src = lin - lane + np.where(j <= (lane | (width - 1)), j, lane)
    src = np.where(src < T, src, lin)
    pos = np.empty(T, np.int64)
    pos[lin] = np.arange(T)  # thread id -> its position in the (seed-shuffled) arrays
    return pos[src]


def _lane_ranges(lanes: np.ndarray) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"``."""
    runs: list[list[int]] = []
    for k in lanes.tolist():
        if runs and runs[-1][1] == k - 1:
            runs[-1][1] = k
        else:
            runs.append([k, k])
    return ", ".join(str(a) if a == z else f"{a}-{z}" for a, z in runs)


def _check_warps(state: BlockState, members: int, b: int, width: int, site: str, path: str) -> None:
    """Refuse a shuffle that not every lane of the member mask executes, in every warp where
    some thread executes it (the lowest such warp is reported, independent of the seed)."""
    T, nwarps = state.T, -(-state.T // WARP)
    active = np.zeros(nwarps * WARP, bool)  # by thread id
    active[state.lin if state.mask is None else state.lin[state.mask]] = True
    exists = np.arange(nwarps * WARP) < T
    act, ex = active.reshape(nwarps, WARP), exists.reshape(nwarps, WARP)
    need: np.ndarray = np.asarray((members >> np.arange(WARP)) & 1 == 1)
    lane = np.arange(WARP)
    j = lane ^ b
    src = np.where(j <= (lane | (width - 1)), j, lane)
    calling: np.ndarray = np.asarray(act.any(axis=1))
    missing = calling[:, None] & need[None, :] & ~ex
    inactive = calling[:, None] & need[None, :] & ex & ~act
    outside = act & ~need[None, :]  # an executing lane the mask does not name
    unnamed = act & ~need[src][None, :]  # an executing lane reading one the mask does not name
    bad = missing | inactive | outside | unnamed
    if not bad.any():
        return
    w = int(np.flatnonzero(bad.any(axis=1))[0])
    first, last = w * WARP, min(w * WARP + WARP, T) - 1
    x, y, _ = state.dims

    def thread(tid: int) -> tuple[int, int, int]:
        return (tid % x, tid // x % y, tid // (x * y))

    why = []
    if inactive[w].any():
        ls = np.flatnonzero(inactive[w])
        why.append(f"lanes {_lane_ranges(ls)} are inactive (thread {thread(first + int(ls[0]))} does not "
                   f"reach it)")
    if missing[w].any():
        why.append(f"lanes {_lane_ranges(np.flatnonzero(missing[w]))} are missing (the block has "
                   f"{T} threads, not a multiple of {WARP})")
    if outside[w].any():
        why.append(f"lanes {_lane_ranges(np.flatnonzero(outside[w]))} execute it but are not in the mask")
    if unnamed[w].any():
        ls = np.flatnonzero(unnamed[w])
        why.append(f"lanes {_lane_ranges(ls)} read lanes {_lane_ranges(np.unique(src[ls]))}, which are "
                   f"not in the mask")
    raise ShuffleDivergenceError(
        f"warp shuffle divergence: {site} with member mask {members:#010x} in block "
        f"{state.block}, warp {w} (threads {thread(first)} to {thread(last)}): {'; '.join(why)}. "
        f"The shuffle is inside:\n{path}")

"""Run a lowered GPU kernel on the CPU with GPU semantics: blocks, threads, shared memory,
barriers, and a race detector, so GPU code is tested on machines without a GPU.

The kernel is a `PrimFunc` under the GPU IR contract (docs/gpu-ir.md): thread-binding loops
name the hardware indices, ``func.attrs["launch"]`` gives the grid and block extents,
``Allocate`` with scope "shared" / "local" gives per-block / per-thread memory, and
``tecomp.ir.stmt.barrier()`` is ``__syncthreads()``. Expressions mean exactly what they mean to
the reference interpreter (`tecomp.runtime.interp`, whose closures compute every value that is
the same for all threads of a block).

How it runs (`gpu_simt` has the details):
  * the blocks of the grid run one after another; the threads of a block run together, in
    lockstep, as numpy vectors with one lane per thread (threadIdx.x/y/z flattened, x fastest);
  * control flow that depends on the thread runs masked: both sides of an ``if``, serial loops
    until the last thread is done, thread loops narrower than the launch only for their threads;
  * a barrier must be reached by every thread of the block: one reached while some are masked
    off is a `BarrierDivergenceError` that names the barrier's enclosing statements;
  * warp shuffles, ``Call(dtype, "shfl_xor_sync", (mask, value, lane_mask, width))`` with
    CUDA's ``__shfl_xor_sync`` semantics (lane = linear thread id % 32, x fastest; the source
    lane is ``lane ^ lane_mask``, one in a later segment of ``width`` lanes gives the caller's
    own value): every lane the member mask names must execute it, in a complete warp, else a
    `ShuffleDivergenceError` names the statement, the warp and the inactive or missing lanes.
    They read registers, so the race detector does not see them;
  * every global, shared and local access is bounds-checked: an `IndexError` names the buffer,
    the index, the thread and the block;
  * with ``race_check`` (default), `gpu_race.RaceError` reports two threads that touch one
    shared or global element between two barriers, at least one writing (also two lanes of one
    store), and, for global buffers the kernel writes, an element one block writes and another
    block reads or writes (blocks of a launch are not ordered). It names the buffer, the
    element, both threads as (x, y, z), their blocks and the statements;
  * limits of the target's arch (``func.attrs["target"].gpu``) are enforced when present:
    threads per block, block and grid dims, shared memory per block.

What ``seed`` shuffles, where the order could matter: the order in which blocks run, and, per
block, which thread each lane is (so the order in which threads' stores land). With several
threads storing to one address in one statement, the last lane in that order wins; with a
race-free kernel (``race_check`` passes) neither changes any result. It does not shuffle
statement order: threads run in lockstep, so within a barrier region every thread finishes a
statement before any starts the next, and ``if``/``else`` run the ``then`` side first. A kernel
whose result depends on another interleaving is racy, and the race detector reports it.

Limitations: no warp-level semantics beyond ``shfl_xor_sync`` (no other shuffles, no votes;
warp-synchronous code through shared memory without barriers is treated as racy), no atomics,
no dynamic parallelism; uninitialised shared/local memory reads as 0 (or NaN / 0x5A bytes with
``poison=True``) instead of garbage, and reading it is not reported; the race detector sees
memory at element granularity of each access's own dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..codegen.target import Target
from ..errors import TecompError
from ..ir import expr as E  # noqa: N812
from ..ir import stmt as S  # noqa: N812
from ..ir.functor import StmtVisitor
from . import interp as I  # noqa: N812
from .gpu_race import RaceError, RaceTracker
from .gpu_shuffle import ShuffleDivergenceError
from .gpu_simt import BarrierDivergenceError, BlockState, SimtCompiler

_TAGS = tuple(f"{k}.{a}" for k in ("blockIdx", "threadIdx") for a in "xyz")


def emulate(
    func: S.PrimFunc, *arrays: np.ndarray, seed: int = 0, race_check: bool = True,
    poison: bool = False,
) -> None:
    """Run the GPU kernel ``func`` on the CPU, in place on ``arrays`` (one per ``func.params``
    buffer, in order; symbolic dims are bound from their shapes, and scalar parameters,
    ``attrs["scalar_params"]``, take a number at their place, as `interp.run` does).

    >>> import numpy as np
    >>> from tecomp.ir import Buffer, BufferLoad, BufferStore, For, ForKind, PrimFunc, Var, const
    >>> A, B = Buffer("A", (const(64),), "float32"), Buffer("B", (const(64),), "float32")
    >>> bx, tx = Var("bx"), Var("tx")
    >>> i = bx * 32 + tx
    >>> body = For(bx, const(0), const(2), ForKind.THREAD_BINDING,
    ...            For(tx, const(0), const(32), ForKind.THREAD_BINDING,
    ...                BufferStore(B, BufferLoad(A, (i,)) * 2.0, (i,)),
    ...                (("thread_tag", "threadIdx.x"),)), (("thread_tag", "blockIdx.x"),))
    >>> f = PrimFunc("double", [A, B], body, attrs={"launch": {"blockIdx.x": const(2),
    ...                                                        "threadIdx.x": const(32)}})
    >>> a, b = np.arange(64, dtype="float32"), np.zeros(64, "float32")
    >>> emulate(f, a, b); bool((b == 2 * a).all())
    True
    """
    env, copy_back = I.bind_args(func, arrays)
    launch = _launch(func, env)
    grid = tuple(launch[f"blockIdx.{a}"] for a in "xyz")
    dims = (launch["threadIdx.x"], launch["threadIdx.y"], launch["threadIdx.z"])
    limits = _gpu_limits(func)
    if limits is not None:
        _check_limits(func, grid, dims, limits)
    state = BlockState(dims)
    tracker = RaceTracker(state.T, dims) if race_check else None
    written = _written_globals(func)
    compiler = SimtCompiler(
        state, tracker, written, {t: launch[t] for t in _TAGS if t.startswith("threadIdx")},
        limits.max_dynamic_smem if limits is not None else None, poison)
    compiler.by_name.update((b.name, env[b.data]) for b in func.params)
    body = compiler.stmt(func.body)
    if tracker is not None:
        tracker.grid = grid  # type: ignore[assignment]
        for b in func.params:
            if b.name in written:
                tracker.track_global(b.name, env[b.data].array)
    rng = np.random.default_rng(seed)
    gx, gy, gz = grid
    nblocks = gx * gy * gz
    try:
        with np.errstate(all="ignore"):
            if state.T == 0 or nblocks == 0:
                return
            for b in rng.permutation(nblocks).tolist():
                block = (b % gx, b // gx % gy, b // (gx * gy))
                lin = rng.permutation(state.T)
                state.start(block, lin)
                if tracker is not None:
                    tracker.start_block(block, b, lin)
                body(env)
                if tracker is not None:
                    tracker.end_block()
    finally:
        for user, work in copy_back:
            user[...] = work


def _launch(func: S.PrimFunc, env: I.Env) -> dict[str, int]:
    """The launch extent of every tag (1 for tags the launch does not name), evaluated."""
    raw = func.attrs.get("launch") or {}
    unknown = sorted(set(raw) - set(_TAGS))
    if unknown:
        raise TecompError(f"{func.name}: unknown launch tags {unknown}; expected {list(_TAGS)}")
    out: dict[str, int] = {}
    for tag in _TAGS:
        if tag not in raw:
            out[tag] = 1
            continue
        e = E.to_expr(raw[tag])
        if tag.startswith("threadIdx") and not isinstance(e, E.IntImm):
            raise TecompError(f"{func.name}: the launch extent of {tag} must be a constant, got {e}")
        n = int(I._Compiler({}, False, None).expr(e)(env))
        if n < 0:
            raise TecompError(f"{func.name}: launch extent of {tag} is {n}")
        out[tag] = n
    return out


def _gpu_limits(func: S.PrimFunc) -> Any:
    t = func.attrs.get("target")
    if t is None:
        return None
    target = t if isinstance(t, Target) else Target.parse(str(t))
    if not target.is_gpu:
        raise TecompError(f"{func.name} is compiled for '{target}', not a GPU")
    return target.gpu


def _check_limits(func: S.PrimFunc, grid: tuple[int, ...], dims: tuple[int, int, int], limits: Any) -> None:
    arch = limits.arch
    T = dims[0] * dims[1] * dims[2]
    if T > limits.max_threads_per_block:
        raise TecompError(f"{func.name}: {T} threads per block {dims}; {arch} allows "
                          f"{limits.max_threads_per_block}")
    for axis, n, top in zip("xyz", dims, limits.max_block_dims, strict=True):
        if n > top:
            raise TecompError(f"{func.name}: threadIdx.{axis} extent {n} exceeds {arch}'s {top}")
    for axis, n, top in zip("xyz", grid, limits.max_grid_dims, strict=True):
        if n > top:
            raise TecompError(f"{func.name}: blockIdx.{axis} extent {n} exceeds {arch}'s {top}")


class _Stores(StmtVisitor):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_BufferStore(self, s: S.BufferStore) -> None:
        self.names.add(s.buffer.name)
        super().visit_BufferStore(s)


def _written_globals(func: S.PrimFunc) -> set[str]:
    """Names of the parameters the kernel stores to: only those can race (reads never do)."""
    v = _Stores()
    v.visit_stmt(func.body)
    params = {b.name for b in func.params}
    return v.names & params


__all__ = ["BarrierDivergenceError", "RaceError", "ShuffleDivergenceError", "emulate"]

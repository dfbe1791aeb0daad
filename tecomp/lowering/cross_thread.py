"""Cross-thread reductions: a reduction axis bound to ``threadIdx`` on a GPU target.

A stage such as ``s[B].bind(B.op.reduce_axis[0], te.thread_axis("threadIdx.x"))`` asks the
threads of a block to cooperate on each output element: every thread folds its share of the
reduction (the reduce loops that are not bound to a thread) into a per-thread partial, then the
threads of each *group* (those that differ only in the reduced thread indices) combine their
partials, and every thread of the group ends with the total. Only then is the output stored,
under the stage's bound guards and its store predicate (``set_store_predicate``, e.g. only
``threadIdx.x == 0`` writes).

Following TVM's ``MakeCrossThreadReduction`` + ``LowerThreadAllreduce``, the loop nest is
rearranged: the stage's loops that are not serial reduce loops (spatial loops and the
thread-bound reduce loops) stay in their order outside; the serial reduce loops move innermost,
around the update of the partial. The combination itself is built here, as plain GPU IR
(docs/gpu-ir.md), in one of three shapes:

* ``threadIdx.x`` of a power-of-two extent up to 32, the whole x extent of the block, 32-bit
  values, whole warps: a butterfly of ``shfl_xor_sync`` in registers (log2 steps, no shared
  memory, no barrier);
* ``threadIdx.x`` of 64, 128, ... 1024 threads: the butterfly within each warp, one partial per
  warp through shared memory, one barrier, and every thread folds the warps' partials in order;
* anything else (y/z tags, several reduced tags, extents that are not a power of two, 8/16/64-bit
  values): a tree in shared memory with a barrier per level.

Every path leaves the same value in every thread of a group; thread order never changes the
result (the fold order is fixed), so the emulator's shuffled thread order cannot expose it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..arith.simplify import simplify
from ..errors import ScheduleError
from ..ir import dtype as dt
from ..ir.buffer import Buffer
from ..ir.expr import EQ, LT, And, BufferLoad, Call, Expr, FloorDiv, FloorMod, IntImm, Reduce, Var, const
from ..ir.functor import free_vars, substitute
from ..ir.stmt import Allocate, BufferStore, ForKind, IfThenElse, LetStmt, Stmt, barrier, seq
from ..te.schedule import Stage
from ..te.tensor import ComputeOp, IterVar, IterVarKind

if TYPE_CHECKING:  # schedule_ops imports this module
    from ..te.reduction import CommReducer
    from .schedule_ops import Lowering

WARP = 32
FULL_MASK = const(-1, "int32")  # 0xffffffff: every lane of the warp takes part
SHFL_XOR = "shfl_xor_sync"


def thread_reduce_leaves(st: Stage) -> list[IterVar]:
    """The reduce leaves of ``st`` bound to a ``threadIdx`` tag."""
    out = []
    for iv in st.leaf_iter_vars:
        a = st.iter_var_attrs.get(iv)
        if (iv.kind == IterVarKind.REDUCE and a is not None and a.bind_thread is not None
                and a.bind_thread.thread_tag.startswith("threadIdx")):
            out.append(iv)
    return out


def _tag(st: Stage, iv: IterVar) -> str | None:
    a = st.iter_var_attrs.get(iv)
    return a.bind_thread.thread_tag if a is not None and a.bind_thread is not None else None


def _root(st: Stage) -> Stage:
    while st.attach_stage is not None:
        st = st.attach_stage
    return st


def block_extents(lw: Lowering, st: Stage) -> dict[str, int]:
    """threadIdx extents of the block of ``st``'s kernel: the widest loop bound to each tag
    among the stages of that kernel (one kernel per root stage: the others have their own)."""
    out: dict[str, int] = {}
    root = _root(st)
    for s in lw.stages:
        if _root(s) is not root:
            continue
        b = lw.bounds[s]
        for iv in s.leaf_iter_vars:
            tag = _tag(s, iv)
            if tag is None or not tag.startswith("threadIdx"):
                continue
            ext = simplify(b.ext[iv])
            if not isinstance(ext, IntImm):
                raise ScheduleError(f"stage {s.name}: axis '{iv.name}' is bound to {tag} with the "
                                    f"non-constant extent {ext}; split it by a constant first")
            out[tag] = max(out.get(tag, 1), ext.value)
    return out


def enclosing_threads(st: Stage) -> list[tuple[str, IterVar, Stage]]:
    """Thread-bound loops of the stages ``st`` is (transitively) computed inside, outermost
    stage last: (tag, loop, the stage owning the loop)."""
    out: list[tuple[str, IterVar, Stage]] = []
    p: Stage = st
    while p.attach_stage is not None and p.attach_ivar is not None:
        parent = p.attach_stage
        leaves = parent.leaf_iter_vars
        for iv in leaves[: leaves.index(p.attach_ivar) + 1]:
            tag = _tag(parent, iv)
            if tag is not None and tag.startswith("threadIdx"):
                out.append((tag, iv, parent))
        p = parent
    return out


@dataclass
class _Group:
    """How the block's threads split into reduction groups at the reduction point."""

    red: list[tuple[str, Var, int]]  # reduced tags: (tag, index var, extent), in x, y, z order
    other: list[tuple[str, Var, int]]  # the other tags of the block with extent > 1
    threads: int  # threads per block

    @property
    def size(self) -> int:  # threads per group
        n = 1
        for _, _, e in self.red:
            n *= e
        return n

    @property
    def count(self) -> int:  # groups per block
        return self.threads // self.size

    @staticmethod
    def _linear(items: list[tuple[str, Var, int]]) -> Expr:
        idx: Expr = const(0)
        stride = 1
        for _, v, e in items:
            idx = idx + v * const(stride) if stride > 1 else idx + v
            stride *= e
        return simplify(idx)

    def rank(self) -> Expr:  # this thread's position in its group
        return self._linear(self.red)

    def group(self) -> Expr:  # this thread's group
        return self._linear(self.other)


def _combine(comb: CommReducer, a: Sequence[Expr], b: Sequence[Expr]) -> list[Expr]:
    lhs, rhs, res = comb.lhs, comb.rhs, comb.result
    m = {**dict(zip(lhs, a)), **dict(zip(rhs, b))}
    return [substitute(r, m) for r in res]


def _assign(bufs: list[Buffer], idx: Expr, values: Sequence[Expr], name: str) -> Stmt:
    """bufs[k][idx] = values[k] for all k at once (values may read the old contents)."""
    if len(bufs) == 1:
        return BufferStore(bufs[0], values[0], (idx,))
    tmps = [Var(f"{name}_v{k}", bf.dtype) for k, bf in enumerate(bufs)]
    body: Stmt = seq(*[BufferStore(bf, t, (idx,)) for bf, t in zip(bufs, tmps)])
    for t, v in reversed(list(zip(tmps, values))):
        body = LetStmt(t, v, body)
    return body


def _is_32bit(dtype: str) -> bool:
    return dt.lanes(dtype) == 1 and dt.itemsize(dtype) == 4 and not dt.is_bool(dtype)


def allreduce(comb: CommReducer, partial: list[Buffer], grp: _Group, name: str) -> tuple[Stmt, list[Buffer]]:
    """Statements leaving in ``partial[k][0]`` of every thread the combination of the group's
    partials; also the shared buffers they need (allocated by the caller around them)."""
    zero = const(0)
    n_red = grp.size
    rank = grp.rank()
    load = [BufferLoad(p, (zero,)) for p in partial]
    whole_warps = grp.threads % WARP == 0
    x_only = len(grp.red) == 1 and grp.red[0][0] == "threadIdx.x"
    pow2 = n_red & (n_red - 1) == 0
    if (x_only and pow2 and whole_warps and (n_red <= WARP or n_red % WARP == 0)
            and all(_is_32bit(p.dtype) for p in partial)):
        width = min(n_red, WARP)
        steps: list[Stmt] = []
        off = width // 2
        while off >= 1:
            others = [Var(f"{name}_shfl{k}", p.dtype) for k, p in enumerate(partial)]
            upd = _assign(partial, zero, _combine(comb, load, list(others)), name)
            for o, p in reversed(list(zip(others, partial))):
                upd = LetStmt(o, Call(p.dtype, SHFL_XOR, (FULL_MASK, BufferLoad(p, (zero,)),
                                                          const(off), const(width))), upd)
            steps.append(upd)
            off //= 2
        if n_red <= WARP:
            return seq(*steps), []
        # one partial per warp through shared memory; every thread folds them in order
        nw = n_red // WARP
        bufs = [Buffer(f"{name}_red_warps{k}", (const(grp.count * nw),), p.dtype, scope="shared")
                for k, p in enumerate(partial)]
        base = simplify(grp.group() * const(nw))
        x = grp.red[0][1]
        put = IfThenElse(EQ(FloorMod(x, const(WARP)), zero),
                         seq(*[BufferStore(bf, ld, (simplify(base + FloorDiv(x, const(WARP))),))
                               for bf, ld in zip(bufs, load)]))
        gather: list[Stmt] = [seq(*[BufferStore(p, BufferLoad(bf, (base,)), (zero,))
                                    for p, bf in zip(partial, bufs)])]
        for j in range(1, nw):
            got = [BufferLoad(bf, (simplify(base + const(j)),)) for bf in bufs]
            gather.append(_assign(partial, zero, _combine(comb, load, got), name))
        return seq(*steps, put, barrier(), *gather), bufs
    # the general tree in shared memory: log2 levels, a barrier after each
    bufs = [Buffer(f"{name}_red_buf{k}", (const(grp.count * n_red),), p.dtype, scope="shared")
            for k, p in enumerate(partial)]
    base = simplify(grp.group() * const(n_red))
    me = simplify(base + rank)
    body: list[Stmt] = [seq(*[BufferStore(bf, ld, (me,)) for bf, ld in zip(bufs, load)]), barrier()]
    p2 = 1
    while p2 < n_red:
        p2 *= 2
    s = p2 // 2
    while s >= 1:
        cond: Expr = LT(rank, const(s))
        if 2 * s > n_red:  # some upper partners do not exist
            cond = And(cond, LT(simplify(rank + const(s)), const(n_red)))
        mine = [BufferLoad(bf, (me,)) for bf in bufs]
        partner = [BufferLoad(bf, (simplify(me + const(s)),)) for bf in bufs]
        body += [IfThenElse(cond, _assign(bufs, me, _combine(comb, mine, partner), name)), barrier()]
        s //= 2
    body.append(seq(*[BufferStore(p, BufferLoad(bf, (base,)), (zero,)) for p, bf in zip(partial, bufs)]))
    return seq(*body), bufs


def cross_thread_nest(lw: Lowering, st: Stage) -> Stmt:
    """The loop nest of reduction stage ``st`` whose reduce leaves include threadIdx-bound ones."""
    from .schedule_ops import _guard

    op = st.op
    assert isinstance(op, ComputeOp)
    b = lw.bounds[st]
    leaves = st.leaf_iter_vars
    reds = lw.bodies[st]
    r0 = reds[0]
    if not isinstance(r0, Reduce):
        raise ScheduleError(f"stage {st.name}: only reduction axes reduce across threads")
    for iv in leaves:
        a = st.iter_var_attrs.get(iv)
        if a is not None and a.tensor_intrin is not None:
            raise ScheduleError(f"stage {st.name}: a stage with a cross-thread reduction cannot "
                                "also be tensorized")
    t_red = thread_reduce_leaves(st)
    tags = [_tag(st, iv) for iv in t_red]
    if len(set(tags)) != len(tags):
        raise ScheduleError(f"stage {st.name}: two reduction axes are bound to the same thread tag "
                            f"({', '.join(str(t) for t in tags)})")
    normal = [iv for iv in leaves if iv.kind == IterVarKind.REDUCE and iv not in t_red]
    common = [iv for iv in leaves if iv not in normal]
    if normal:
        # the serial reduce loops move innermost: a stage computed at a loop that was inside
        # one of them would lose that loop's variable
        first = leaves.index(normal[0])
        for iv in common[:]:
            if leaves.index(iv) > first:
                kids = [c.name for c in lw._attached(st, iv)]
                if kids:
                    raise ScheduleError(
                        f"stage {', '.join(kids)} is computed at '{iv.name}' of {st.name}, inside the "
                        f"serial reduction loop '{normal[0].name}'; in a cross-thread reduction the "
                        "serial reduce loops run innermost, after the thread loops: compute it at a "
                        "loop outside them, or at one of them")
    for iv in common:
        a = st.iter_var_attrs.get(iv)
        if a is not None and a.kind == ForKind.VECTORIZED:
            raise ScheduleError(
                f"stage {st.name}: axis '{iv.name}' encloses a cross-thread reduction (barriers, "
                "warp shuffles) and cannot be vectorized; vectorize a loop of another stage")

    # which threads reduce together, read from the loops around the reduction point
    block = block_extents(lw, st)
    here: dict[str, tuple[Var, int, str]] = {}
    around = [(_tag(st, iv), iv, st) for iv in common] + enclosing_threads(st)
    for tag, iv, owner in around:
        if tag is None or not tag.startswith("threadIdx") or tag in here:
            continue
        ext = simplify(lw.bounds[owner].ext[iv])
        assert isinstance(ext, IntImm)
        if ext.value != block.get(tag, 1):
            what = "reduces over" if iv in t_red else "is computed inside"
            raise ScheduleError(
                f"stage {st.name} {what} the loop '{iv.name}' bound to {tag} with extent "
                f"{ext.value}, but the block has {block[tag]} threads in {tag}: a cross-thread "
                "reduction needs every thread of the block (split the axes so the extents match)")
        here[tag] = (iv.var, ext.value, iv.name)
    red_tags = {t for t in tags if t is not None}
    red: list[tuple[str, Var, int]] = []
    other: list[tuple[str, Var, int]] = []
    threads = 1
    for tag in ("threadIdx.x", "threadIdx.y", "threadIdx.z"):
        e = block.get(tag, 1)
        threads *= e
        if e == 1 and tag not in red_tags:
            continue
        if tag not in here:
            raise ScheduleError(
                f"stage {st.name}: its cross-thread reduction is not inside a loop bound to {tag}, "
                f"but the block has {e} threads in {tag}: they would all reduce into the same "
                f"place; bind an axis of {st.name} (or of the stage it is computed at) to {tag}")
        v, e2, _ = here[tag]
        (red if tag in red_tags else other).append((tag, v, e2))
    grp = _Group(red, other, threads)

    # the per-thread partial over the serial reduce loops
    vmap = {iv.var: b.root_value(iv) for iv in op.axis + op.reduce_axis}
    out_idx = tuple(simplify(b.value[iv]) for iv in op.axis)
    comb = r0.combiner
    outs = [lw.buffers[(st, k)] for k in range(len(reds))]
    name = outs[0].name
    partial = [Buffer(f"{bf.name}_red_local", (const(1),), bf.dtype, scope="local") for bf in outs]
    zero = const(0)
    mut = lw.mutator
    src = [mut.visit(substitute(s, vmap)) for s in r0.source]
    cond = simplify(mut.visit(substitute(r0.condition, vmap)))
    conds = [simplify(c) for c in b.conds]
    update = _assign(partial, zero, _combine(comb, [BufferLoad(p, (zero,)) for p in partial], src), name)
    if not (isinstance(cond, IntImm) and cond.value == 1):
        update = IfThenElse(cond, update)
    update = _guard(conds, update)
    init = seq(*[BufferStore(p, v, (zero,)) for p, v in zip(partial, comb.identity)])
    inner = update
    for iv in reversed(normal):
        inner = lw._loop(st, iv, inner)
    combine, shared = allreduce(comb, partial, grp, name)

    # the store, by the threads the store predicate names, of elements inside the bounds
    total: list[Expr] = [BufferLoad(p, (zero,)) for p in partial]
    if r0.init:
        total = _combine(comb, [mut.visit(substitute(v, vmap)) for v in r0.init], total)
    red_vars = {iv.var for iv in leaves if iv.kind == IterVarKind.REDUCE}
    spatial = [c for c in conds if not (free_vars(c) & red_vars)]
    pred = lw.store_predicate(st)
    # every thread of the group holds the total; without a predicate of the user's, the first
    # one stores it into shared or global memory (the others would write the same value:
    # redundant stores, and races to the race detector); a per-thread ("local") result is
    # stored by every thread into its own copy
    if pred is not None:
        spatial.append(pred)
    elif any(o.scope != "local" for o in outs):
        spatial.append(EQ(grp.rank(), zero))
    store = _guard(spatial, seq(*[BufferStore(o, t, out_idx) for o, t in zip(outs, total)]))
    body: Stmt = seq(seq(init, inner), combine, store)
    for bf in shared + partial:
        body = Allocate(bf, body)
    for iv in reversed(common):
        body = lw._loop(st, iv, body)
    return body


__all__ = ["SHFL_XOR", "allreduce", "cross_thread_nest", "thread_reduce_leaves"]

"""Software pipelining of shared tiles with asynchronous copies (``s[AA].pipeline(depth)``), as
TVM's InjectSoftwarePipeline with its cp.async lowering (``async_scope`` + commit/wait).

Lowering wraps the nest of a pipelined shared stage in ``AttrStmt(ASYNC_PIPELINE_SCOPE,
(buffer data var, depth))`` inside the loop ``k`` it is computed at (a GEMM's k.outer), whose
body is ``load tile k into AA; compute on AA``. Here the tile gets a leading dimension of
``D = depth`` (a ring of D slots, tile t in slot t % D), its loads become cp.async copies
(``AttrStmt(ASYNC_COPY_SCOPE)``), and the loop is rewritten in CUTLASS's multistage order::

    for t in [0, D-1):  load(t) -> slot t; commit            # prologue: D-1 tiles in flight
    for k in [0, n):                                          # (unrolled by D, see below)
        wait_group(min(k+D-2, n-1) - k)                       # tile k has landed ...
        syncthreads()                                         # ... for every thread, and every
                                                              # thread is done with tile k-1
        if k+D-1 < n: load(k+D-1) -> slot (k+D-1) % D; commit
        compute(k) on slot k % D

At the wait, the groups in flight are the tiles k .. min(k+D-2, n-1), one group per tile, so
waiting until all but the newest ``min(k+D-2, n-1) - k`` have landed retires exactly tile k
(D-2 in the steady state, 0 for the last tile: the epilogue drains). The barrier after it does
two jobs: tile k (copied by all threads together) is visible to all, and nobody still reads
slot (k-1) % D, which the load issued next overwrites; so one barrier per tile, and the copies
of tiles k+1 .. k+D-1 overlap the computation on tile k.

The steady-state loop is unrolled by D (as inject_double_buffer unrolls by 2): every slot index
is then a constant, so thread_sync sees that the load into one slot and the reads of another
touch different elements and adds no barrier; the few steps that do not fill a whole round,
and the D-1 epilogue steps (no load, a smaller wait), are emitted with constant k, where
loop_partition's guards of a ragged last tile fold away.

Only a constant trip count n >= 2 is pipelined; otherwise (one tile, or a symbolic n) the marker
is dropped and the stage is loaded synchronously, single-buffered, as written. Runs where
inject_double_buffer runs (after inject_virtual_thread, before loop_partition and flatten).
"""

from __future__ import annotations

import dataclasses
import math

from ..arith.simplify import simplify
from ..ir.buffer import Buffer
from ..ir.expr import (
    And,
    Broadcast,
    BufferLoad,
    Call,
    Cast,
    Expr,
    FloatImm,
    IntImm,
    Max,
    Min,
    Not,
    Ramp,
    Select,
    Var,
    const,
)
from ..ir.functor import StmtMutator, substitute
from ..ir.stmt import (
    ASYNC_COPY_SCOPE,
    ASYNC_PIPELINE_SCOPE,
    CP_ASYNC_COMMIT,
    CP_ASYNC_WAIT,
    Allocate,
    AttrStmt,
    BufferStore,
    Evaluate,
    For,
    ForKind,
    IfThenElse,
    PrimFunc,
    SeqStmt,
    Stmt,
    barrier,
    seq,
)
from ..ir.structural import structural_equal
from .flatten import flat_size
from .inject_double_buffer import touched


def commit_group() -> Evaluate:
    """``cp.async.commit_group``: the copies issued since the last commit form one group."""
    return Evaluate(Call("int32", CP_ASYNC_COMMIT, ()))


def wait_group(n: int) -> Evaluate:
    """``cp.async.wait_group n``: all but the ``n`` newest committed groups have landed."""
    return Evaluate(Call("int32", CP_ASYNC_WAIT, (const(n),)))


class _Strip(StmtMutator):
    """Drop the markers (what no loop could pipeline is loaded synchronously, as written)."""

    def visit_AttrStmt(self, s: AttrStmt) -> Stmt:
        if s.key == ASYNC_PIPELINE_SCOPE:
            return self.visit_stmt(s.body)
        return super().visit_AttrStmt(s)


class _Slot(StmtMutator):
    """Accesses of the pipelined buffers -> the given slot of the ring buffer.

    A multi-dimensional access gets the slot as a new leading index. A single index into a
    buffer of two or more dimensions is already a flat element offset (flatten's convention;
    tensorized intrinsics address their operands so, e.g. ldmatrix's ``address_of(AS[off])``):
    it gets the slot's flat offset added instead."""

    def __init__(self, ring: dict[Var, Buffer], slot: int) -> None:
        self.ring, self.slot = ring, slot

    def _indices(self, nb: Buffer, indices: tuple[Expr, ...]) -> tuple[Expr, ...]:
        dtype = indices[0].dtype if indices else "int32"
        if len(indices) == 1 and nb.ndim > 2:  # a flat offset into the (>= 2-D) tile
            step = nb.strides[0] if nb.strides else flat_size(dataclasses.replace(
                nb, shape=nb.shape[1:], strides=()))
            off = simplify(const(self.slot, "int32") * step)
            (idx,) = indices
            if isinstance(idx, Ramp):
                return (Ramp(simplify(idx.base + off), idx.stride, idx.lanes),)
            return (simplify(idx + off),)
        return (const(self.slot, dtype), *indices)

    def visit_BufferLoad(self, e: BufferLoad) -> Expr:
        e2 = super().visit_BufferLoad(e)
        assert isinstance(e2, BufferLoad)
        nb = self.ring.get(e2.buffer.data)
        if nb is None:
            return e2
        return BufferLoad(nb, self._indices(nb, e2.indices), predicate=e2.predicate)

    def visit_BufferStore(self, s: BufferStore) -> Stmt:
        s2 = super().visit_BufferStore(s)
        assert isinstance(s2, BufferStore)
        nb = self.ring.get(s2.buffer.data)
        if nb is None:
            return s2
        return BufferStore(nb, s2.value, self._indices(nb, s2.indices), s2.predicate)


class _ZeroFillForm(StmtMutator):
    """``if c: AA[i] = A[j] else: AA[i] = 0`` -> ``AA[i] = select(c, A[j], 0)``: the one form of
    a guarded copy that `cp_async_source` turns into a zero-filling cp.async (the other
    branch order too). Only stores into the pipelined tiles ``dsts`` are rewritten."""

    def __init__(self, dsts: set[Var]) -> None:
        self.dsts = dsts

    def visit_IfThenElse(self, s: IfThenElse) -> Stmt:
        s2 = super().visit_IfThenElse(s)
        if not isinstance(s2, IfThenElse):
            return s2
        t, f = s2.then_case, s2.else_case
        if not (isinstance(t, BufferStore) and isinstance(f, BufferStore)):
            return s2
        if t.buffer.data not in self.dsts or f.buffer.data is not t.buffer.data \
                or t.predicate is not None or f.predicate is not None \
                or not structural_equal(t.indices, f.indices):
            return s2
        if _zero(f.value) and isinstance(t.value, BufferLoad):
            return BufferStore(t.buffer, Select(s2.cond, t.value, f.value), t.indices)
        if _zero(t.value) and isinstance(f.value, BufferLoad):
            return BufferStore(t.buffer, Select(Not(s2.cond), f.value, t.value), t.indices)
        return s2


def _ring(buf: Buffer, depth: int) -> Buffer:
    strides = buf.strides
    if strides:  # storage_align'ed rows: the slots are whole padded tiles apart
        strides = (simplify(strides[0] * buf.shape[0]), *strides)
    return dataclasses.replace(buf, shape=(const(depth), *buf.shape), strides=strides,
                               data=Var(buf.data.name, "handle"))


def _unwrap(m: Stmt) -> tuple[dict[Var, int], Stmt] | None:
    """The buffers (with depths) a chain of markers names, and the loads inside it."""
    if not (isinstance(m, AttrStmt) and m.key == ASYNC_PIPELINE_SCOPE):
        return None
    data: dict[Var, int] = {}
    while isinstance(m, AttrStmt) and m.key == ASYNC_PIPELINE_SCOPE:
        var, depth = m.value
        data[var] = int(depth)
        m = m.body
    return data, m


class _Injector(StmtMutator):
    def visit_For(self, s: For) -> Stmt:
        body = self.visit_stmt(s.body)
        loop = s if body is s.body else For(s.var, s.min, s.extent, s.kind, body, s.annotations)
        out = self._pipeline(loop)
        return loop if out is None else out

    def _pipeline(self, s: For) -> Stmt | None:
        """The pipelined form of ``s``, or None when ``s`` has no marker in its own body."""
        if s.kind not in (ForKind.SERIAL, ForKind.UNROLLED):
            return None
        allocs: list[Allocate] = []
        core = s.body
        while isinstance(core, Allocate):
            allocs.append(core)
            core = core.body
        items = list(core.seq) if isinstance(core, SeqStmt) else [core]
        own = {a.buffer.data: a.buffer for a in allocs}
        ours = [_unwrap(m) for m in items]
        marked = {d: dep for u in ours if u is not None and set(u[0]) <= set(own)
                  for d, dep in u[0].items()}
        if not marked:
            return None
        n = simplify(s.extent)
        mn = simplify(s.min)
        if not (isinstance(mn, IntImm) and mn.value == 0 and isinstance(n, IntImm)) or n.value <= 1:
            # one tile: nothing to overlap; a symbolic trip count: the epilogue's wait counts
            # depend on n (and loop_partition would cut the unrolled body at symbolic points),
            # so such loops load synchronously, single-buffered, as written (see the doc)
            return None
        # the stages of one loop share one ring depth (the deepest asked for), since they
        # are loaded in the same steps and committed as one group per tile
        D = max(marked.values())
        ring = {d: _ring(own[d], D) for d in marked}
        kept = [a.buffer for a in allocs if a.buffer.data not in marked]
        k = s.var
        is_ours = [u is not None and set(u[0]) <= set(marked) for u in ours]
        loads = [u[1] for u, o in zip(ours, is_ours) if o and u is not None]
        rest = [m for m, o in zip(items, is_ours) if not o]
        if touched(seq(*loads)) & {b.data for b in kept}:
            return None  # the loads use another stage of this iteration: no prologue for it
        kd = k.dtype

        def producer(at: Expr, slot: int) -> Stmt:
            """The cp.async loads of the tile of iteration ``at`` into ``slot``, one group."""
            body = _Slot(ring, slot).visit_stmt(substitute(seq(*loads), {k: at}))
            body = _ZeroFillForm({b.data for b in ring.values()}).visit_stmt(body)
            return seq(AttrStmt(ASYNC_COPY_SCOPE, 1, body), commit_group())

        def compute(at: Expr, slot: int) -> Stmt:
            body = _Slot(ring, slot).visit_stmt(substitute(seq(*rest), {k: at}))
            for b in reversed(kept):  # the other attached buffers, around each computation
                body = Allocate(b, body)
            return body

        total = n.value
        steady = max(0, total - D + 1)  # steps that still issue a load (of tile k + D - 1)

        def step(at: Expr, slot: int, wait: int, load: bool) -> Stmt:
            nxt = producer(simplify(at + (D - 1)), (slot + D - 1) % D) if load else None
            return seq(wait_group(wait), barrier(), nxt, compute(at, slot))

        prologue = [producer(const(t, kd), t) for t in range(min(D - 1, total))]
        rounds = steady // D
        parts: list[Stmt] = []
        if rounds:
            ko = Var(f"{k.name}.pipe", kd)
            body = seq(*[step(simplify(ko * D + j), j, D - 2, True) for j in range(D)])
            parts.append(For(ko, const(0, kd), const(rounds, kd), s.kind, body, s.annotations))
        for t in range(rounds * D, total):
            wait = min(t + D - 2, total - 1) - t
            parts.append(step(const(t, kd), t % D, wait, t < steady))
        out: Stmt = seq(*prologue, *parts)
        for a in reversed(allocs):
            if a.buffer.data in marked:
                out = Allocate(ring[a.buffer.data], out)
        return out


def inject_software_pipeline(func: PrimFunc) -> PrimFunc:
    body = _Strip().visit_stmt(_Injector().visit_stmt(func.body))
    return func if body is func.body else dataclasses.replace(func, body=body)



def _zero(e: Expr) -> bool:
    """Is ``e`` the constant +0 (scalar or broadcast), the value a zero-filling copy writes?"""
    if isinstance(e, Broadcast):
        e = e.value
    if isinstance(e, IntImm):
        return e.value == 0
    return isinstance(e, FloatImm) and e.value == 0.0 and math.copysign(1.0, e.value) > 0


def _prefix(c: Expr) -> Expr | None:
    """For a lane condition true on a leading run of lanes, ``ramp(b, 1, n) < x(c)`` (or
    ``<=``, or written the other way round), the number of those lanes before clamping to
    [0, n]: ``c - b`` (``c - b + 1``); None for any other form."""
    from ..ir.expr import GE, GT, LE, LT

    if isinstance(c, (LT, LE)):
        r, x, incl = c.a, c.b, isinstance(c, LE)
    elif isinstance(c, (GT, GE)):
        r, x, incl = c.b, c.a, isinstance(c, GE)
    else:
        return None
    if not (isinstance(r, Ramp) and isinstance(r.stride, IntImm) and r.stride.value == 1
            and isinstance(x, Broadcast)):
        return None
    bound = x.value if x.value.dtype == r.base.dtype else Cast(r.base.dtype, x.value)
    return bound - r.base + (1 if incl else 0)


def copy_guard(cond: Expr, lanes: int) -> Expr | None:
    """What a guarded copy's condition lets through, as one cp.async can say it: a scalar bool
    (all lanes or none), or an int32 count of leading lanes (a ragged vector's live prefix:
    the copy reads that many elements and zero-fills the rest). A conjunction of lane-uniform
    conditions and prefix conditions (`_prefix`) qualifies; None: anything else."""
    from ..ir import dtype as dt

    uniform: list[Expr] = []
    counts: list[Expr] = []
    todo = [cond]
    while todo:
        c = todo.pop()
        if isinstance(c, And):
            todo += [c.b, c.a]
            continue
        u = c.value if isinstance(c, Broadcast) else c
        if dt.lanes(u.dtype) == 1:
            uniform.append(u)
            continue
        n = _prefix(c)
        if n is None or dt.lanes(c.dtype) != lanes:
            return None
        counts.append(n if n.dtype == "int32" else Cast("int32", n))
    every: Expr | None = None
    for u in uniform:
        every = u if every is None else And(every, u)
    if not counts:
        return every
    live = counts[0]
    for n in counts[1:]:
        live = Min(live, n)
    live = Max(Min(live, const(lanes)), const(0))
    if every is not None:
        live = Select(every, live, const(0))
    return simplify(live)


def cp_async_source(s: BufferStore) -> tuple[BufferLoad, Expr | None] | None:
    """The global load a shared store copies and what guards it (None: nothing):
    ``AA[i] = A[j]``; ``AA[i] = select(c, A[j], 0)`` (a padded input, a ragged tile's
    ``if_then_else``), also with the sides swapped; or ``AA[i] = A[j]`` with a load predicate
    ``c`` (masked-off lanes read 0). A guarded copy is a zero-filling cp.async: the guard
    (`copy_guard`: a bool, or the count of leading live lanes) gives its source size, ``c ?
    size : 0`` or ``count * element size``; the bytes it does not read are written as zeros.
    None: not a copy cp.async can make."""
    from ..ir import dtype as dt

    v = s.value
    cond: Expr | None = None
    if isinstance(v, Select):
        if _zero(v.f) and isinstance(v.t, BufferLoad):
            cond, v = v.cond, v.t
        elif _zero(v.t) and isinstance(v.f, BufferLoad):
            cond, v = Not(v.cond), v.f
        else:
            return None
        if v.predicate is not None:
            return None
    elif isinstance(v, BufferLoad) and v.predicate is not None:
        cond = v.predicate
        v = BufferLoad(v.buffer, v.indices, v.dtype)
    if not isinstance(v, BufferLoad):
        return None
    if cond is None:
        return v, None
    guard = copy_guard(cond, dt.lanes(v.dtype))
    return None if guard is None else (v, guard)


def cp_async_bytes(s: BufferStore) -> int | None:
    """The bytes one thread's ``cp.async`` moves for ``s`` (a store inside an
    ``ASYNC_COPY_SCOPE``), or None when ``s`` is not a copy cp.async can do and stays an
    ordinary store: a flat shared destination, the value a plain load of a flat global buffer
    of the same element type (no cast, no store predicate; guarded as `cp_async_source` says),
    scalar or unit-stride Ramp indices, and 4, 8 or 16 bytes. Codegen and the emulator both
    decide with this function."""
    from ..ir import dtype as dt

    src = cp_async_source(s)
    if src is None or s.predicate is not None:
        return None
    v = src[0]
    if not s.buffer.scope.startswith("shared") or v.buffer.scope != "global":
        return None
    if len(s.indices) != 1 or len(v.indices) != 1:
        return None
    if dt.element(s.buffer.dtype) != dt.element(v.buffer.dtype) or dt.element(v.dtype) != dt.element(s.buffer.dtype):
        return None
    lanes = dt.lanes(v.dtype)
    for idx in (s.indices[0], v.indices[0]):
        if dt.lanes(idx.dtype) != lanes:
            return None
        if lanes > 1 and not (isinstance(idx, Ramp) and isinstance(idx.stride, IntImm)
                              and idx.stride.value == 1):
            return None
    nbytes = dt.itemsize(v.dtype) * lanes  # of the whole (vector) value
    return nbytes if nbytes in (4, 8, 16) else None


__all__ = ["commit_group", "copy_guard", "cp_async_bytes", "cp_async_source", "inject_software_pipeline",
           "wait_group"]

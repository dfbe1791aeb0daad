"""Double buffering of shared tiles (``s[AA].double_buffer()``), as TVM's InjectDoubleBuffer.

Lowering wraps the nest of a double-buffered shared stage in an ``AttrStmt(DOUBLE_BUFFER_SCOPE,
buffer data var)`` inside the loop ``k`` it is computed at (typically a GEMM's k.outer), whose
body is ``load tile k into AA; compute on AA``. Here the tile gets a leading dimension of 2
and the loop is software-pipelined so that the load of tile k+1 (into half (k+1) % 2) is issued
before the computation on tile k (half k % 2), with no barrier between the two::

    AA[0] = tile(0)                               # prologue
    for k.db in [0, (n-1) // 2):                  # TVM's split_loop=2 form
        AA[1] = tile(2*k.db + 1); compute(2*k.db, AA[0])
        AA[0] = tile(2*k.db + 2); compute(2*k.db + 1, AA[1])
    n odd:  compute(n-1, AA[0])                   # the tail
    n even: AA[1] = tile(n-1); compute(n-2, AA[0]); compute(n-1, AA[1])

The loop is unrolled by two (TVM's ``split_loop=2``) rather than indexing the halves with
``k % 2``: with constant halves the shared indices of the loads and the computation do not
depend on the loop at all, so thread_sync can see that the load of the next tile and the reads
of the current one touch different halves (and needs no barrier between them) however long the
loop is. It then places one barrier per iteration: between the computation on a half and the
load that overwrites it, which also orders that load before the next computation.

A trip count of 1 gains nothing, and a symbolic one is left alone too (see `_pipeline`): the
marker is dropped and the loop runs single-buffered, as written. Runs right after
inject_virtual_thread (the shared load is then outside the virtual-thread copies) and before
loop_partition, which cuts the pipelined loop at the ragged last tile like any other loop, and
before flatten (the new dimension is an ordinary axis).
"""

from __future__ import annotations

import dataclasses

from ..arith.simplify import simplify
from ..ir.buffer import Buffer
from ..ir.expr import BufferLoad, Expr, IntImm, Var, const
from ..ir.functor import StmtMutator, StmtVisitor, substitute
from ..ir.stmt import (
    DOUBLE_BUFFER_SCOPE,
    Allocate,
    AttrStmt,
    BufferStore,
    For,
    ForKind,
    PrimFunc,
    SeqStmt,
    Stmt,
    seq,
)


class _Strip(StmtMutator):
    """Drop the markers (what no loop could double-buffer runs single-buffered, as written)."""

    def visit_AttrStmt(self, s: AttrStmt) -> Stmt:
        if s.key == DOUBLE_BUFFER_SCOPE:
            return self.visit_stmt(s.body)
        return super().visit_AttrStmt(s)


class _Half(StmtMutator):
    """Accesses of the doubled buffers -> the given half of the new buffer."""

    def __init__(self, doubled: dict[Var, Buffer], half: int) -> None:
        self.doubled, self.half = doubled, half

    def _half(self, indices: tuple[Expr, ...]) -> Expr:
        return const(self.half, indices[0].dtype if indices else "int32")

    def visit_BufferLoad(self, e: BufferLoad) -> Expr:
        e2 = super().visit_BufferLoad(e)
        assert isinstance(e2, BufferLoad)
        nb = self.doubled.get(e2.buffer.data)
        if nb is None:
            return e2
        return BufferLoad(nb, (self._half(e2.indices), *e2.indices), predicate=e2.predicate)

    def visit_BufferStore(self, s: BufferStore) -> Stmt:
        s2 = super().visit_BufferStore(s)
        assert isinstance(s2, BufferStore)
        nb = self.doubled.get(s2.buffer.data)
        if nb is None:
            return s2
        return BufferStore(nb, s2.value, (self._half(s2.indices), *s2.indices), s2.predicate)


def _doubled(buf: Buffer) -> Buffer:
    strides = buf.strides
    if strides:  # storage_align'ed rows: the halves are whole padded tiles apart
        strides = (simplify(strides[0] * buf.shape[0]), *strides)
    return dataclasses.replace(buf, shape=(const(2), *buf.shape), strides=strides,
                               data=Var(buf.data.name, "handle"))


def _is_marker(s: Stmt) -> bool:
    return isinstance(s, AttrStmt) and s.key == DOUBLE_BUFFER_SCOPE


def _unwrap(m: Stmt) -> tuple[set[Var], Stmt]:
    """The buffers a chain of markers names, and the loads inside it."""
    data: set[Var] = set()
    while isinstance(m, AttrStmt) and m.key == DOUBLE_BUFFER_SCOPE:
        data.add(m.value)
        m = m.body
    return data, m


class Touched(StmtVisitor):
    def __init__(self) -> None:
        self.data: set[Var] = set()

    def visit_BufferLoad(self, e: BufferLoad) -> None:
        self.data.add(e.buffer.data)
        super().visit_BufferLoad(e)

    def visit_BufferStore(self, s: BufferStore) -> None:
        self.data.add(s.buffer.data)
        super().visit_BufferStore(s)


def touched(s: Stmt) -> set[Var]:
    """The data vars of the buffers ``s`` loads or stores."""
    t = Touched()
    t.visit_stmt(s)
    return t.data


class _Injector(StmtMutator):
    def visit_For(self, s: For) -> Stmt:
        body = self.visit_stmt(s.body)  # inner loops first (a nest of double-buffered loops)
        loop = s if body is s.body else For(s.var, s.min, s.extent, s.kind, body, s.annotations)
        out = self._pipeline(loop)
        return loop if out is None else out

    def _pipeline(self, s: For) -> Stmt | None:
        """The pipelined form of ``s``, or None when ``s`` has no marker in its own body."""
        if s.kind not in (ForKind.SERIAL, ForKind.UNROLLED):
            return None
        # the body lowering builds: Allocates (the attached stages' buffers) around a sequence
        # holding the attached stages' nests (the markers) and then the computation
        allocs: list[Allocate] = []
        core = s.body
        while isinstance(core, Allocate):
            allocs.append(core)
            core = core.body
        items = list(core.seq) if isinstance(core, SeqStmt) else [core]
        own = {a.buffer.data: a.buffer for a in allocs}
        # a marker whose buffers are not allocated around this body is not this loop's to
        # pipeline (it is dropped at the end); a stage with several outputs has one per buffer
        ours = [_unwrap(m) if _is_marker(m) else None for m in items]
        marked = {d for u in ours if u is not None and u[0] <= set(own) for d in u[0]}
        if not marked:
            return None
        n = simplify(s.extent)
        mn = simplify(s.min)
        if not (isinstance(mn, IntImm) and mn.value == 0 and isinstance(n, IntImm)) or n.value <= 1:
            # one tile: nothing to overlap. A symbolic trip count: the guarded form (a tail
            # under ``n % 2``) is correct, but loop_partition then cuts the pipelined body at
            # four symbolic points (the ragged tile's guards in both steps' loads and
            # computations), a kernel many times the size that also takes thread_sync long
            # to plan, so such loops stay single-buffered, as written.
            return None
        doubled = {d: _doubled(own[d]) for d in marked}
        kept = [a.buffer for a in allocs if a.buffer.data not in marked]
        k = s.var
        loads = [u[1] for u in ours if u is not None and u[0] <= marked]
        rest = [m for m, u in zip(items, ours) if not (u is not None and u[0] <= marked)]
        if touched(seq(*loads)) & {b.data for b in kept}:
            return None  # the loads use another stage of this iteration: no prologue for it

        def producer(at: Expr, half: int) -> Stmt:
            """The marked loads of the tile of iteration ``at`` into ``half``."""
            return _Half(doubled, half).visit_stmt(substitute(seq(*loads), {k: at}))

        def compute(at: Expr, half: int) -> Stmt:
            """Iteration ``at`` without the marked loads, reading the tile in ``half``."""
            return _Half(doubled, half).visit_stmt(substitute(seq(*rest), {k: at}))

        def step(at: Expr, half: int) -> Stmt:
            """One pipelined iteration: the next tile's loads, then this tile's computation."""
            return seq(producer(simplify(at + 1), 1 - half), compute(at, half))

        def local(stmt: Stmt) -> Stmt:
            for b in reversed(kept):  # the other attached buffers, once around both copies
                stmt = Allocate(b, stmt)
            return stmt

        kd = Var(f"{k.name}.db", k.dtype)
        pairs = (n.value - 1) // 2
        base = const(2 * pairs, k.dtype)
        main = For(kd, const(0, k.dtype), const(pairs, k.dtype), s.kind,
                   local(seq(step(kd * 2, 0), step(kd * 2 + 1, 1))), s.annotations)
        if n.value % 2:  # n - 1 == base: only the computation on the last tile is left
            tail = compute(base, 0)
        else:  # iteration base still loads tile base + 1, computed last
            tail = seq(step(base, 0), compute(simplify(base + 1), 1))
        loops = [main] if n.value > 2 else []  # n == 2: the prologue and the tail are all
        body: Stmt = seq(producer(const(0, k.dtype), 0), *loops, local(tail))
        for a in reversed(allocs):
            if a.buffer.data in marked:
                body = Allocate(doubled[a.buffer.data], body)
        return body


def inject_double_buffer(func: PrimFunc) -> PrimFunc:
    body = _Strip().visit_stmt(_Injector().visit_stmt(func.body))
    return func if body is func.body else dataclasses.replace(func, body=body)


__all__ = ["inject_double_buffer"]

"""Storage rewrite: temporaries whose lifetimes do not overlap share one allocation.

Works on a chain of Allocates around a sequence (what lowering emits for the intermediate
stages of a DAG, at root or inside a compute_at loop). Each buffer's live interval is the span
of statements of the sequence that touch it; buffers are then packed into slots greedily in
order of first use (the interval-colouring buffer assignment XLA uses), a slot being reusable
once its last user has run. Only constant-size buffers of the same dtype share.
"""

from __future__ import annotations

import dataclasses

from ..ir.buffer import Buffer
from ..ir.expr import BufferLoad, Expr, IntImm, const
from ..ir.functor import StmtMutator, StmtVisitor
from ..ir.stmt import Allocate, BufferStore, PrimFunc, SeqStmt, Stmt


class _Touched(StmtVisitor):
    def __init__(self) -> None:
        self.bufs: set[Buffer] = set()

    def visit_BufferLoad(self, e: BufferLoad) -> None:
        self.bufs.add(e.buffer)
        super().visit_BufferLoad(e)

    def visit_BufferStore(self, s: BufferStore) -> None:
        self.bufs.add(s.buffer)
        super().visit_BufferStore(s)


def _touched(s: Stmt) -> set[Buffer]:
    t = _Touched()
    t.visit_stmt(s)
    return t.bufs


class _Rename(StmtMutator):
    def __init__(self, remap: dict[Buffer, Buffer]) -> None:
        self.remap = remap

    def visit_BufferLoad(self, e: BufferLoad) -> Expr:
        e2 = super().visit_BufferLoad(e)
        assert isinstance(e2, BufferLoad)
        nb = self.remap.get(e2.buffer)
        return e2 if nb is None else BufferLoad(nb, e2.indices, predicate=e2.predicate)

    def visit_BufferStore(self, s: BufferStore) -> Stmt:
        s2 = super().visit_BufferStore(s)
        assert isinstance(s2, BufferStore)
        nb = self.remap.get(s2.buffer)
        return s2 if nb is None else BufferStore(nb, s2.value, s2.indices, s2.predicate)


def _size(b: Buffer) -> int | None:
    if len(b.shape) == 1 and isinstance(b.shape[0], IntImm):
        return b.shape[0].value
    return None


class StorageRewrite(StmtMutator):
    def visit_Allocate(self, s: Allocate) -> Stmt:
        chain: list[Buffer] = []
        body: Stmt = s
        while isinstance(body, Allocate):
            chain.append(body.buffer)
            body = body.body
        body = self.visit_stmt(body)
        slots = self._assign(chain, body)
        remap = {b: slot for b, slot in slots.items() if slot is not b}
        if remap:
            body = _Rename(remap).visit_stmt(body)
        used: list[Buffer] = []
        for b in chain:
            slot = slots.get(b, b)
            if slot not in used:
                used.append(slot)
        for b in reversed(used):
            body = Allocate(b, body)
        return body

    def _assign(self, chain: list[Buffer], body: Stmt) -> dict[Buffer, Buffer]:
        if len(chain) < 2 or not isinstance(body, SeqStmt):
            return {}
        first: dict[Buffer, int] = {}
        last: dict[Buffer, int] = {}
        for k, st in enumerate(body.seq):
            for b in _touched(st):
                first.setdefault(b, k)
                last[b] = k
        order = sorted((b for b in chain if b in first and _size(b) is not None), key=lambda b: first[b])
        slots: list[list[Buffer]] = []  # buffers sharing a slot, in order of use
        out: dict[Buffer, Buffer] = {}
        for b in order:
            for group in slots:
                tail = group[-1]
                if tail.dtype == b.dtype and tail.scope == b.scope and last[tail] < first[b]:
                    group.append(b)
                    break
            else:
                slots.append([b])
        for group in slots:
            if len(group) == 1:
                continue
            size = max(_size(b) or 0 for b in group)
            head = group[0]
            merged = Buffer(head.name, (const(size),), head.dtype, scope=head.scope, align=head.align)
            for b in group:
                out[b] = merged
        return out


def storage_rewrite(func: PrimFunc) -> PrimFunc:
    body = StorageRewrite().visit_stmt(func.body)
    return func if body is func.body else dataclasses.replace(func, body=body)

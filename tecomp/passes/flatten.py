"""Flatten multi-dimensional buffer accesses to one element offset.

Arguments keep their N-d Buffer (the runtime checks shapes against it) and are addressed
row-major; local buffers become 1-D buffers whose size accounts for ``storage_align`` strides.
"""

from __future__ import annotations

import dataclasses

from ..arith.simplify import simplify
from ..ir.buffer import Buffer
from ..ir.expr import BufferLoad, Expr, const
from ..ir.functor import StmtMutator
from ..ir.stmt import Allocate, BufferStore, PrimFunc, Stmt


def _strides(b: Buffer) -> tuple[Expr, ...]:
    if b.strides:
        return b.strides
    out: list[Expr] = []
    acc: Expr = const(1)
    for d in reversed(b.shape):
        out.append(acc)
        acc = acc * d
    return tuple(reversed(out))


def flat_size(b: Buffer) -> Expr:
    """Elements needed to hold ``b`` (more than the product of the shape when rows are padded)."""
    if not b.shape:
        return const(1)
    if b.strides:
        return simplify(b.strides[0] * b.shape[0])
    acc: Expr = const(1)
    for d in b.shape:
        acc = acc * d
    return simplify(acc)


class Flatten(StmtMutator):
    def __init__(self) -> None:
        self.local: dict[Buffer, Buffer] = {}

    def _index(self, b: Buffer, idx: tuple[Expr, ...]) -> tuple[Buffer, tuple[Expr, ...]]:
        nb = self.local.get(b, b)
        if len(idx) == 1 and (b.ndim != 1 or not b.strides):
            return nb, idx  # already a flat offset (or a 1-D compact buffer)
        if not idx:
            return nb, (const(0),)
        flat: Expr | None = None
        for i, s in zip(idx, _strides(b)):
            term = i * s
            flat = term if flat is None else flat + term
        assert flat is not None
        return nb, (simplify(flat),)

    def visit_BufferLoad(self, e: BufferLoad) -> Expr:
        idx = tuple(self.visit(i) for i in e.indices)
        nb, flat = self._index(e.buffer, idx)
        if nb is e.buffer and all(x is y for x, y in zip(flat, e.indices)) and len(flat) == len(e.indices):
            return e
        pred = self.visit(e.predicate) if e.predicate is not None else None
        return BufferLoad(nb, flat, predicate=pred)

    def visit_BufferStore(self, s: BufferStore) -> Stmt:
        v = self.visit(s.value)
        idx = tuple(self.visit(i) for i in s.indices)
        nb, flat = self._index(s.buffer, idx)
        pred = self.visit(s.predicate) if s.predicate is not None else None
        return BufferStore(nb, v, flat, pred)

    def visit_Allocate(self, s: Allocate) -> Stmt:
        b = s.buffer
        nb = Buffer(b.name, (flat_size(b),), b.dtype, scope=b.scope, align=b.align)
        self.local[b] = nb
        body = self.visit_stmt(s.body)
        return Allocate(nb, body)


def flatten(func: PrimFunc) -> PrimFunc:
    body = Flatten().visit_stmt(func.body)
    return func if body is func.body else dataclasses.replace(func, body=body)

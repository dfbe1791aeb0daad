"""Debug builds: check every index of multi-dimensional accesses against its own axis.

Codegen's debug checks see only the flat offset, so ``A[i, j + 1]`` reading one past the end of
a row, but still inside the allocation, would pass. Before flattening, this pass puts in front of
each store a check per axis of every access the store makes (its own and the loads of its
value); a failing check reports ``buffer, axis, index, extent`` through the kernel's
out-of-bounds record. Loads under an ``if_then_else`` are checked only where that branch is
taken, so padding stays legal. Checks the simplifier can prove are removed again later.
"""

from __future__ import annotations

import dataclasses

from ..ir.buffer import Buffer
from ..ir.expr import (
    GE,
    LT,
    And,
    BufferLoad,
    Call,
    Expr,
    IntImm,
    Not,
    Select,
    StringImm,
    const,
)
from ..ir.functor import ExprVisitor, StmtMutator
from ..ir.stmt import BufferStore, Evaluate, IfThenElse, PrimFunc, Stmt, seq

CHECK = "debug_oob_axis"


class _Accesses(ExprVisitor):
    """Multi-dimensional loads of an expression, each with the condition guarding it."""

    def __init__(self) -> None:
        self.found: list[tuple[Buffer, tuple[Expr, ...], Expr | None]] = []
        self.cond: Expr | None = None

    def visit_BufferLoad(self, e: BufferLoad) -> None:
        if len(e.indices) > 1:
            self.found.append((e.buffer, e.indices, self.cond))
        super().visit_BufferLoad(e)

    def visit_Select(self, e: Select) -> None:
        self.visit(e.cond)
        saved = self.cond
        for branch, c in ((e.t, e.cond), (e.f, Not(e.cond))):
            self.cond = c if saved is None else And(saved, c)
            self.visit(branch)
        self.cond = saved

    def visit_Call(self, e: Call) -> None:
        if e.name != CHECK:
            super().visit_Call(e)


def axis_checks(buf: Buffer, idx: tuple[Expr, ...], cond: Expr | None) -> list[Stmt]:
    out: list[Stmt] = []
    for axis, (i, ext) in enumerate(zip(idx, buf.shape)):
        bad: Expr = Not(And(GE(i, const(0, i.dtype)), LT(i, ext)))
        if cond is not None:
            bad = And(cond, bad)
        report = Call("int32", CHECK, (BufferLoad(buf, (const(0),)), StringImm(buf.name),
                                       IntImm(axis), i, ext))
        out.append(IfThenElse(bad, Evaluate(report)))
    return out


class InsertAxisChecks(StmtMutator):
    def visit_BufferStore(self, s: BufferStore) -> Stmt:
        acc = _Accesses()
        acc.visit(s.value)
        checks: list[Stmt] = []
        for buf, idx, cond in acc.found:
            checks.extend(axis_checks(buf, idx, cond))
        if len(s.indices) > 1:
            checks.extend(axis_checks(s.buffer, s.indices, None))
        return seq(*checks, s) if checks else s


def insert_axis_checks(func: PrimFunc) -> PrimFunc:
    body = InsertAxisChecks().visit_stmt(func.body)
    return func if body is func.body else dataclasses.replace(func, body=body)

"""Unroll loops: UNROLLED loops are replicated; ``auto_unroll_max_step`` unrolls small nests.

``pragma(axis, "auto_unroll_max_step", N)`` unrolls ``axis`` and every constant-extent loop inside it
whose whole nest executes at most N iterations of its body, like TVM's pass of that name.
"""

from __future__ import annotations

import dataclasses

from ..arith.simplify import simplify
from ..ir.expr import IntImm, const
from ..ir.functor import StmtMutator, StmtVisitor, substitute
from ..ir.stmt import Allocate, For, ForKind, PrimFunc, Stmt, seq

MAX_UNROLL = 4096  # an explicit unroll of a huge loop is almost surely a mistake; keep the loop


def _const_extent(s: For) -> int | None:
    e = simplify(s.extent)
    m = simplify(s.min)
    if isinstance(e, IntImm) and isinstance(m, IntImm):
        return e.value
    return None


class _Steps(StmtVisitor):
    """Total body executions of a nest when every loop has a constant extent (else None)."""

    def __init__(self) -> None:
        self.ok = True

    def count(self, s: Stmt) -> int | None:
        if isinstance(s, For):
            ext = _const_extent(s)
            inner = self.count(s.body)
            if ext is None or inner is None:
                return None
            return ext * inner
        from ..ir.stmt import SeqStmt

        if isinstance(s, SeqStmt):
            total = 0
            for x in s.seq:
                c = self.count(x)
                if c is None:
                    return None
                total += c
            return total
        if isinstance(s, Allocate):
            return None
        body = getattr(s, "body", None)
        if isinstance(body, Stmt):
            return self.count(body)
        return 1


class Unroll(StmtMutator):
    def __init__(self) -> None:
        self.auto_max = 0

    def visit_For(self, s: For) -> Stmt:
        saved = self.auto_max
        step = s.annotation("auto_unroll_max_step")
        if step is not None:
            self.auto_max = int(step)
        body = self.visit_stmt(s.body)
        ext = _const_extent(s)
        want = s.kind == ForKind.UNROLLED
        # the annotated loop itself is in the budget too (TVM: the pragma wraps the loop)
        if not want and self.auto_max and s.kind == ForKind.SERIAL and ext is not None:
            steps = _Steps().count(body)
            want = steps is not None and steps * ext <= self.auto_max
        self.auto_max = saved
        if want and ext is not None and ext <= MAX_UNROLL:
            m = simplify(s.min)
            return seq(*[substitute(body, {s.var: const(m.value + k, s.var.dtype)})  # type: ignore[attr-defined]
                         for k in range(ext)])
        kind = ForKind.SERIAL if s.kind == ForKind.UNROLLED else s.kind
        if body is s.body and kind is s.kind:
            return s
        return For(s.var, s.min, s.extent, kind, body, s.annotations)


def unroll(func: PrimFunc) -> PrimFunc:
    body = Unroll().visit_stmt(func.body)
    return func if body is func.body else dataclasses.replace(func, body=body)

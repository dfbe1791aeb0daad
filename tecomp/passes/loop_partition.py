"""Loop partition: split a loop where a guard switches from always-true to unknown.

Non-divisible splits leave guards such as ``io*32 + ii < n`` around the innermost body. For the
outer loop ``io`` the guard holds for every ``ii`` as long as ``io < n // 32``, so the loop is
cut there: the steady-state part runs without the ``if`` (and with constant inner extents, so it
vectorizes), the short tail keeps it. Vectorized loops are never cut (their tail becomes a
predicate instead).
"""

from __future__ import annotations

import dataclasses

from ..arith.interval import Interval, can_prove, eval_interval
from ..arith.simplify import simplify
from ..ir.expr import (
    GE,
    GT,
    LE,
    LT,
    And,
    Expr,
    FloorDiv,
    IntImm,
    Max,
    Min,
    Sub,
    Var,
    const,
)
from ..ir.functor import StmtMutator, StmtVisitor, free_vars, substitute
from ..ir.stmt import For, ForKind, IfThenElse, PrimFunc, Stmt, seq

MAX_DEPTH = 4  # partitions per loop nest level; bounds code growth


def conjuncts(c: Expr) -> list[Expr]:
    if isinstance(c, And):
        return conjuncts(c.a) + conjuncts(c.b)
    return [c]


class _Guards(StmtVisitor):
    """Conjuncts of IfThenElse conditions and the ranges of loops enclosing each."""

    def __init__(self) -> None:
        self.loops: list[tuple[Var, Expr, Expr]] = []
        self.found: list[tuple[Expr, list[tuple[Var, Expr, Expr]]]] = []

    def visit_For(self, s: For) -> None:
        self.loops.append((s.var, s.min, s.extent))
        self.visit_stmt(s.body)
        self.loops.pop()

    def visit_IfThenElse(self, s: IfThenElse) -> None:
        for c in conjuncts(s.cond):
            self.found.append((c, list(self.loops)))
        self.visit_stmt(s.then_case)
        if s.else_case is not None:
            self.visit_stmt(s.else_case)


class _SetTrue(StmtMutator):
    def __init__(self, target: Expr) -> None:
        self.target = target

    def visit_IfThenElse(self, s: IfThenElse) -> Stmt:
        parts = conjuncts(s.cond)
        keep = [c for c in parts if c is not self.target]
        t = self.visit_stmt(s.then_case)
        f = self.visit_stmt(s.else_case) if s.else_case is not None else None
        if len(keep) == len(parts):
            if t is s.then_case and f is s.else_case:
                return s
            return IfThenElse(s.cond, t, f)
        if not keep:
            return t
        c = keep[0]
        for x in keep[1:]:
            c = And(c, x)
        return IfThenElse(c, t, f)


def _as_negative(c: Expr) -> Expr | None:
    """Rewrite a comparison as ``d < 0`` (integers), or None."""
    if isinstance(c, LT):
        return Sub(c.a, c.b)
    if isinstance(c, LE):
        return Sub(c.a, c.b) - 1
    if isinstance(c, GT):
        return Sub(c.b, c.a)
    if isinstance(c, GE):
        return Sub(c.b, c.a) - 1
    return None


def _linear(e: Expr, v: Var) -> tuple[int, Expr] | None:
    """``e == a*v + r`` with constant a: returns (a, r)."""
    e0 = simplify(substitute(e, {v: const(0, v.dtype)}))
    e1 = simplify(substitute(e, {v: const(1, v.dtype)}))
    e2 = simplify(substitute(e, {v: const(2, v.dtype)}))
    a = simplify(e1 - e0)
    a2 = simplify(e2 - e1)
    if isinstance(a, IntImm) and isinstance(a2, IntImm) and a.value == a2.value and a.value != 0:
        # Three samples do not make a line (x // 6 * 15 + x % 6 is x on 0, 1, 2): the rest
        # must not depend on v at all.
        rest = simplify(e - const(a.value, v.dtype) * v)
        if v not in free_vars(rest):
            return a.value, rest
    return None


class LoopPartition(StmtMutator):
    def __init__(self) -> None:
        self.depth = 0

    def visit_For(self, s: For) -> Stmt:
        if s.kind == ForKind.THREAD_BINDING:
            # a thread loop does not iterate: nothing to partition, but its body may
            body = self.visit_stmt(s.body)
            return s if body is s.body else For(s.var, s.min, s.extent, s.kind, body, s.annotations)
        if s.kind == ForKind.VECTORIZED or self.depth >= MAX_DEPTH:
            return s
        g = _Guards()
        g.visit_stmt(s.body)
        lo, hi_excl = s.min, simplify(s.min + s.extent)
        for cond, loops in g.found:
            if s.var not in free_vars(cond):
                continue
            d = _as_negative(cond)
            if d is None:
                continue
            dom = {var: Interval.from_range(mn, ext) for var, mn, ext in loops}
            iv = eval_interval(simplify(d), dom)
            if iv.hi is None:
                continue
            lin = _linear(iv.hi, s.var)
            if lin is None or lin[0] < 0:
                continue
            a, r = lin
            # a*v + r < 0  <=>  v < floor((-r - 1) / a) + 1
            split = simplify(Min(Max(FloorDiv(simplify(0 - r - 1), const(a)) + 1, lo), hi_excl))
            if can_prove(GE(split, hi_excl)):
                body = _SetTrue(cond).visit_stmt(s.body)
                return self.visit_For(For(s.var, s.min, s.extent, s.kind, body, s.annotations))
            if can_prove(LE(split, lo)):
                continue
            steady_body = _SetTrue(cond).visit_stmt(s.body)
            tail_var = Var(s.var.name, s.var.dtype)
            tail_body = substitute(s.body, {s.var: tail_var})
            self.depth += 1
            steady = self.visit_for_plain(For(s.var, lo, simplify(split - lo), s.kind, steady_body, s.annotations))
            tail = self.visit_for_plain(For(tail_var, split, simplify(hi_excl - split), s.kind, tail_body, s.annotations))
            self.depth -= 1
            return seq(steady, tail)
        body = self.visit_stmt(s.body)
        if body is s.body:
            return s
        return For(s.var, s.min, s.extent, s.kind, body, s.annotations)

    def visit_for_plain(self, s: For) -> Stmt:
        return self.visit_For(s)


def loop_partition(func: PrimFunc) -> PrimFunc:
    body = LoopPartition().visit_stmt(func.body)
    return func if body is func.body else dataclasses.replace(func, body=body)

"""Loop partition: split a loop where a guard switches from always-true to unknown.

Non-divisible splits leave guards such as ``io*32 + ii < n`` around the innermost body. For the
outer loop ``io`` the guard holds for every ``ii`` as long as ``io < n // 32``, so the loop is
cut there: the steady-state part runs without the ``if`` (and with constant inner extents, so it
vectorizes), the short tail keeps it. Vectorized loops are never cut (their tail becomes a
predicate instead).

In a GPU kernel a cut whose position depends on threadIdx (``ty*4 + i < 70`` for a loop ``i``
inside the thread loops) gives every thread its own trip counts for the pieces. That is
harmless for per-thread work, but a loop whose body touches shared memory (or holds a barrier)
may need barriers inside it, which every thread of the block must reach, so such a loop is only
cut at block-uniform positions (blockIdx, sizes, uniform loops); its guard stays otherwise.
CPU code is cut exactly as before.
"""

from __future__ import annotations

import dataclasses

from ..arith.interval import Interval, can_prove, eval_interval
from ..arith.simplify import simplify
from ..ir.buffer import Buffer
from ..ir.expr import (
    GE,
    GT,
    LE,
    LT,
    And,
    BufferLoad,
    Call,
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
from ..ir.stmt import (
    BufferStore,
    Evaluate,
    For,
    ForKind,
    IfThenElse,
    LetStmt,
    PrimFunc,
    Stmt,
    is_barrier,
    seq,
    thread_tag,
)

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


class _TouchesShared(StmtVisitor):
    """Does a statement access a shared buffer, hold a barrier, or shuffle across a warp (every
    lane must reach a ``shfl_xor_sync`` too)?"""

    def __init__(self) -> None:
        self.found = False

    def _buf(self, b: Buffer) -> None:
        if b.scope == "shared":
            self.found = True

    def visit_BufferStore(self, s: BufferStore) -> None:
        self._buf(s.buffer)
        super().visit_BufferStore(s)

    def visit_BufferLoad(self, e: BufferLoad) -> None:
        self._buf(e.buffer)
        super().visit_BufferLoad(e)

    def visit_Evaluate(self, s: Evaluate) -> None:
        if is_barrier(s):
            self.found = True
        super().visit_Evaluate(s)

    def visit_Call(self, e: Call) -> None:
        if e.name == "shfl_xor_sync":
            self.found = True
        super().visit_Call(e)


def _touches_shared(s: Stmt) -> bool:
    v = _TouchesShared()
    v.visit_stmt(s)
    return v.found


class LoopPartition(StmtMutator):
    def __init__(self, gpu: bool = False) -> None:
        self.depth = 0
        self.gpu = gpu
        # GPU: variables whose value may differ between the threads of a block (threadIdx
        # loops, loops and lets over them)
        self.varying: set[Var] = set()
        self._shared: dict[int, tuple[Stmt, bool]] = {}

    def _thread_dependent_cut(self, split: Expr, body: Stmt) -> bool:
        """Would cutting at ``split`` give threads different trip counts around shared memory?"""
        if not self.gpu or not free_vars(split) & self.varying:
            return False
        m = self._shared.get(id(body))
        if m is None or m[0] is not body:
            m = self._shared[id(body)] = (body, _touches_shared(body))
        return m[1]

    def visit_LetStmt(self, s: LetStmt) -> Stmt:
        if self.gpu and free_vars(s.value) & self.varying:
            self.varying.add(s.var)
        return super().visit_LetStmt(s)

    def visit_For(self, s: For) -> Stmt:
        if s.kind == ForKind.THREAD_BINDING:
            tag = thread_tag(s)
            if self.gpu and tag is not None and tag.startswith("threadIdx"):
                self.varying.add(s.var)
            # a thread loop does not iterate: nothing to partition, but its body may
            body = self.visit_stmt(s.body)
            return s if body is s.body else For(s.var, s.min, s.extent, s.kind, body, s.annotations)
        if self.gpu and (free_vars(s.min) | free_vars(s.extent)) & self.varying:
            self.varying.add(s.var)
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
            if self._thread_dependent_cut(split, s.body):
                continue  # the guard stays: see the module docstring
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


def _is_gpu(target: object) -> bool:
    """A `Target`, or the string of one (hand-built kernels carry "cuda -arch=...")."""
    if isinstance(target, str):
        return target.strip().split(" ", 1)[0] == "cuda"
    return bool(getattr(target, "is_gpu", False))


def loop_partition(func: PrimFunc) -> PrimFunc:
    body = LoopPartition(gpu=_is_gpu(func.attrs.get("target"))).visit_stmt(func.body)
    return func if body is func.body else dataclasses.replace(func, body=body)

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
The same holds for a loop whose variable indexes a per-thread ("local") buffer, a register
tile such as ``C_local[i*4 + j]``: cut at a thread-dependent point its pieces have trip counts
that LLVM cannot unroll, the tile is then indexed with run-time values and lives in local
memory (a stack frame, spills) instead of registers. Kept whole, the loop has a constant trip
count, unrolls, and the guard becomes a predicate on each (constant-indexed) element.
A GPU loop that is cut keeps one ``Allocate`` of each shared buffer in its body: the allocation
is hoisted around both pieces instead of being copied into each (see `_hoist_shared`).
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
    Allocate,
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


class _IndexesLocal(StmtVisitor):
    """Does ``var`` (or a let or loop bound derived from it) appear in the index of an access
    to a "local" buffer?"""

    def __init__(self, var: Var) -> None:
        self.dep: set[Var] = {var}
        self.found = False

    def _access(self, b: Buffer, indices: tuple[Expr, ...] | list[Expr]) -> None:
        if b.scope == "local" and not self.found:
            self.found = any(free_vars(i) & self.dep for i in indices)

    def visit_BufferStore(self, s: BufferStore) -> None:
        self._access(s.buffer, s.indices)
        super().visit_BufferStore(s)

    def visit_BufferLoad(self, e: BufferLoad) -> None:
        self._access(e.buffer, e.indices)
        super().visit_BufferLoad(e)

    def visit_LetStmt(self, s: LetStmt) -> None:
        if free_vars(s.value) & self.dep:
            self.dep.add(s.var)
        super().visit_LetStmt(s)

    def visit_For(self, s: For) -> None:
        if (free_vars(s.min) | free_vars(s.extent)) & self.dep:
            self.dep.add(s.var)
        super().visit_For(s)


def _indexes_local(var: Var, s: Stmt) -> bool:
    v = _IndexesLocal(var)
    v.visit_stmt(s)
    return v.found


class _HoistShared(StmtMutator):
    """Take the shared ``Allocate``s (constant shape) out of a statement, keeping their bodies."""

    def __init__(self) -> None:
        self.allocs: list[Buffer] = []

    def visit_Allocate(self, s: Allocate) -> Stmt:
        b = s.buffer
        if b.scope != "shared" or any(free_vars(d) for d in b.shape) or any(b is x for x in self.allocs):
            return super().visit_Allocate(s)
        self.allocs.append(b)
        return self.visit_stmt(s.body)


def _hoist_shared(body: Stmt) -> tuple[Stmt, list[Buffer]]:
    """``body`` without its shared allocations, and their buffers (outermost first).

    Cutting a loop copies its body; copied with it, an ``Allocate`` of a shared buffer became
    two allocations, and codegen gave each its own ``.shared`` array: twice the block's shared
    memory for a k loop with a tail. The cut loop is wrapped in the allocations instead, so the
    IR itself says there is one buffer. This is done here, not by merging arrays in codegen,
    because flatten gives each ``Allocate`` its own flat buffer and thread_sync then plans
    barriers for the copies as distinct buffers (maybe none between one copy's last reads and the
    next copy's first writes): arrays shared behind its back could race, unseen by the emulator and
    its race detector, which run the IR as written. Hoisting is sound for shared memory: it is
    one per block whatever the loop nest, and a copy's contents were never defined on entry.
    """
    h = _HoistShared()
    return h.visit_stmt(body), h.allocs


class LoopPartition(StmtMutator):
    def __init__(self, gpu: bool = False) -> None:
        self.depth = 0
        self.gpu = gpu
        # GPU: variables whose value may differ between the threads of a block (threadIdx
        # loops, loops and lets over them)
        self.varying: set[Var] = set()
        self._shared: dict[int, tuple[Stmt, Var, bool]] = {}

    def _thread_dependent_cut(self, split: Expr, loop: For) -> bool:
        """Would cutting ``loop`` at ``split`` give threads different trip counts around shared
        memory, or around a register tile indexed by the loop?"""
        if not self.gpu or not free_vars(split) & self.varying:
            return False
        body = loop.body
        m = self._shared.get(id(body))
        if m is None or m[0] is not body or m[1] is not loop.var:
            keep = _touches_shared(body) or _indexes_local(loop.var, body)
            m = self._shared[id(body)] = (body, loop.var, keep)
        return m[2]

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
            if self._thread_dependent_cut(split, s):
                continue  # the guard stays: see the module docstring
            body, allocs = _hoist_shared(s.body) if self.gpu else (s.body, [])
            steady_body = _SetTrue(cond).visit_stmt(body)
            tail_var = Var(s.var.name, s.var.dtype)
            tail_body = substitute(body, {s.var: tail_var})
            self.depth += 1
            steady = self.visit_for_plain(For(s.var, lo, simplify(split - lo), s.kind, steady_body, s.annotations))
            tail = self.visit_for_plain(For(tail_var, split, simplify(hi_excl - split), s.kind, tail_body, s.annotations))
            self.depth -= 1
            out = seq(steady, tail)
            for b in reversed(allocs):
                out = Allocate(b, out)
            return out
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

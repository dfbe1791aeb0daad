"""Simplify every expression of a loop nest, using the ranges of the loops around it.

Inside ``for i in range(m, m + e)`` the simplifier knows ``m <= i < m + e`` and inside
``x = v`` (a LetStmt) it knows ``x == v``, which is what turns the bound checks and the index
arithmetic that lowering emits (``(io*32 + ii) // 32``, ``if io*32 + ii < 1024``) into what a
person would write. Control flow that the ranges decide is removed as well:

* an ``if`` whose condition is provably true or false keeps only the branch taken;
* a loop whose extent is provably at most 0 disappears (an empty ``SeqStmt(())``);
* a loop of extent 1 becomes its body with the loop variable replaced by the loop's min.

>>> from tecomp.ir import Buffer, BufferStore, For, ForKind, IfThenElse, PrimFunc, Var, const
>>> A = Buffer("A", (const(64),), "float32")
>>> i = Var("i")
>>> body = IfThenElse(i < 64, BufferStore(A, const(0.0), (i // 1,)))
>>> print(simplify_func(PrimFunc("f", [A], For(i, const(0), const(64), ForKind.SERIAL, body))))
def f(A: float32[64]):
  for i in range(64):
    A[i] = 0.0f
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

from ..arith.interval import VarBounds
from ..arith.simplify import Simplifier
from ..ir import dtype as dt
from ..ir.expr import Broadcast, Expr, FloatImm, IntImm, Not, Var
from ..ir.functor import StmtMutator, free_vars, substitute
from ..ir.stmt import (
    Allocate,
    BufferStore,
    Evaluate,
    For,
    ForKind,
    IfThenElse,
    LetStmt,
    PrimFunc,
    SeqStmt,
    Stmt,
)

T = TypeVar("T")


def _bv(e: Expr) -> bool | None:
    """The value of a constant bool (or a broadcast one), else None."""
    if isinstance(e, Broadcast):
        e = e.value
    return bool(e.value) if isinstance(e, IntImm) and dt.is_bool(e.dtype) else None


def _empty() -> Stmt:
    return SeqStmt(())


def _is_empty(s: Stmt) -> bool:
    return isinstance(s, SeqStmt) and not s.seq


class Simplify(StmtMutator):
    """The pass: one `Simplifier` per scope, so memoised results never cross a range change."""

    def __init__(self, var_bounds: VarBounds | None = None) -> None:
        self._ranges: dict[Var, tuple[Expr, Expr]] = {}
        self._var_bounds = var_bounds
        self._simp = Simplifier(None, var_bounds)

    def visit(self, e: Expr) -> Expr:
        return self._simp.visit(e)

    def _scoped(self, var: Var, mn: Expr, ext: Expr, fn: Callable[[], T]) -> T:
        saved = self._ranges, self._simp
        self._ranges = {**self._ranges, var: (mn, ext)}
        self._simp = Simplifier(self._ranges, self._var_bounds)
        try:
            return fn()
        finally:
            self._ranges, self._simp = saved

    def visit_For(self, s: For) -> Stmt:
        mn, ext = self.visit(s.min), self.visit(s.extent)
        lo, hi = self._simp.bounds_of(ext)
        if hi <= 0:
            return _empty()
        if lo == hi == 1 and s.kind != ForKind.THREAD_BINDING:
            # (a thread loop of extent 1 still means "thread 0 only")
            return self.visit_stmt(substitute(s.body, {s.var: mn}))
        body = self._scoped(s.var, mn, ext, lambda: self.visit_stmt(s.body))
        if _is_empty(body):
            return body
        if mn is s.min and ext is s.extent and body is s.body:
            return s
        return For(s.var, mn, ext, s.kind, body, s.annotations)

    def visit_IfThenElse(self, s: IfThenElse) -> Stmt:
        c = self.visit(s.cond)
        taken = _bv(c)
        if taken is True:
            return self.visit_stmt(s.then_case)
        if taken is False:
            return self.visit_stmt(s.else_case) if s.else_case is not None else _empty()
        t = self.visit_stmt(s.then_case)
        f = self.visit_stmt(s.else_case) if s.else_case is not None else None
        if f is not None and _is_empty(f):
            f = None
        if _is_empty(t):
            if f is None:
                return t  # the condition has no side effects
            c, t, f = self.visit(Not(c)), f, None  # if c: pass else: f  ->  if !c: f
        if c is s.cond and t is s.then_case and f is s.else_case:
            return s
        return IfThenElse(c, t, f)

    def visit_LetStmt(self, s: LetStmt) -> Stmt:
        v = self.visit(s.value)
        if dt.is_int(v.dtype) and dt.lanes(v.dtype) == 1:  # x = v: the range [v, v + 1)
            body = self._scoped(s.var, v, IntImm(1, v.dtype), lambda: self.visit_stmt(s.body))
        else:
            body = self.visit_stmt(s.body)
        if v is s.value and body is s.body:
            return s
        return LetStmt(s.var, v, body)

    def visit_BufferStore(self, s: BufferStore) -> Stmt:
        new = super().visit_BufferStore(s)
        assert isinstance(new, BufferStore)
        if new.predicate is not None:
            p = _bv(new.predicate)
            if p is False:
                return _empty()  # every lane masked off
            if p is True:
                return BufferStore(new.buffer, new.value, new.indices)
        return new

    def visit_Allocate(self, s: Allocate) -> Stmt:
        body = self.visit_stmt(s.body)
        if _is_empty(body):
            return body
        return s if body is s.body else Allocate(s.buffer, body)

    def visit_Evaluate(self, s: Evaluate) -> Stmt:
        v = self.visit(s.value)
        if isinstance(v, (IntImm, FloatImm)):
            return _empty()  # a constant has no side effect to keep
        return s if v is s.value else Evaluate(v)


def simplify_stmt(s: Stmt, var_bounds: VarBounds | None = None) -> Stmt:
    """Simplify a statement with no enclosing loops (returns ``s`` itself when unchanged).

    ``var_bounds`` gives constant bounds of free vars, e.g. ``{n: (0, None)}`` for a shape dim.
    """
    return Simplify(var_bounds).visit_stmt(s)


def simplify_func(func: PrimFunc) -> PrimFunc:
    """``func`` with its body simplified; the same object when nothing changed.

    Symbolic dimensions (``func.dim_vars`` and vars in parameter shapes) are known to be >= 0,
    which is what lets ``max(n // 32, 0)`` become ``n // 32``.
    """
    dims = set(func.dim_vars)
    for b in func.params:
        dims |= {v for x in b.shape for v in free_vars(x)}
    body = simplify_stmt(func.body, {v: (0, None) for v in dims if dt.is_int(v.dtype)})
    return func if body is func.body else dataclasses.replace(func, body=body)


__all__ = ["Simplify", "simplify_func", "simplify_stmt"]

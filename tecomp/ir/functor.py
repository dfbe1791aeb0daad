"""Visitors and mutators over expressions and statements.

Dispatch is by node class (walking the MRO, so ``visit_BinaryOp`` catches every arithmetic
node unless a subclass handler exists). Mutators return the *same object* when no child changed,
so fixpoint loops can stop on identity.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .buffer import Buffer
from .expr import (
    And,
    BinaryOp,
    Broadcast,
    BufferLoad,
    Call,
    Cast,
    CmpOp,
    Expr,
    FloatImm,
    IntImm,
    Let,
    Not,
    Or,
    ProducerLoad,
    Ramp,
    Reduce,
    Select,
    Shuffle,
    StringImm,
    Var,
    VectorReduce,
)
from .stmt import (
    Allocate,
    AttrStmt,
    BufferStore,
    Evaluate,
    For,
    IfThenElse,
    LetStmt,
    SeqStmt,
    Stmt,
)


class _Dispatch:
    def _find(self, node: object) -> Callable[..., Any]:
        key = (type(self), type(node))
        cache = type(self).__dict__.get("_dcache")
        if cache is None:
            cache = {}
            type.__setattr__(type(self), "_dcache", cache)
        fn = cache.get(key)
        if fn is None:
            for klass in type(node).__mro__:
                fn = getattr(type(self), "visit_" + klass.__name__, None)
                if fn is not None:
                    break
            if fn is None:
                raise TypeError(f"{type(self).__name__} cannot visit {type(node).__name__}")
            cache[key] = fn
        return fn


class ExprVisitor(_Dispatch):
    """Read-only walk over an expression tree."""

    def visit(self, e: Expr) -> None:
        self._find(e)(self, e)

    def visit_IntImm(self, e: IntImm) -> None:
        pass

    def visit_FloatImm(self, e: FloatImm) -> None:
        pass

    def visit_StringImm(self, e: StringImm) -> None:
        pass

    def visit_Var(self, e: Var) -> None:
        pass

    def visit_BinaryOp(self, e: BinaryOp) -> None:
        self.visit(e.a)
        self.visit(e.b)

    visit_CmpOp = visit_BinaryOp
    visit_And = visit_BinaryOp
    visit_Or = visit_BinaryOp

    def visit_Not(self, e: Not) -> None:
        self.visit(e.a)

    def visit_Select(self, e: Select) -> None:
        self.visit(e.cond)
        self.visit(e.t)
        self.visit(e.f)

    def visit_Cast(self, e: Cast) -> None:
        self.visit(e.value)

    def visit_Call(self, e: Call) -> None:
        for a in e.args:
            self.visit(a)

    def visit_Let(self, e: Let) -> None:
        self.visit(e.value)
        self.visit(e.body)

    def visit_Ramp(self, e: Ramp) -> None:
        self.visit(e.base)
        self.visit(e.stride)

    def visit_Broadcast(self, e: Broadcast) -> None:
        self.visit(e.value)

    def visit_VectorReduce(self, e: VectorReduce) -> None:
        self.visit(e.value)

    def visit_Shuffle(self, e: Shuffle) -> None:
        for v in e.vectors:
            self.visit(v)

    def visit_BufferLoad(self, e: BufferLoad) -> None:
        for i in e.indices:
            self.visit(i)
        if e.predicate is not None:
            self.visit(e.predicate)

    def visit_ProducerLoad(self, e: ProducerLoad) -> None:
        for i in e.indices:
            self.visit(i)

    def visit_Reduce(self, e: Reduce) -> None:
        for s in e.source:
            self.visit(s)
        self.visit(e.condition)
        for s in e.init:
            self.visit(s)


class ExprMutator(_Dispatch):
    """Rebuilds an expression bottom-up, returning the input object when nothing changed."""

    def visit(self, e: Expr) -> Expr:
        return self._find(e)(self, e)  # type: ignore[no-any-return]

    def visit_IntImm(self, e: IntImm) -> Expr:
        return e

    visit_FloatImm = visit_IntImm
    visit_StringImm = visit_IntImm
    visit_Var = visit_IntImm

    def visit_BinaryOp(self, e: BinaryOp) -> Expr:
        a, b = self.visit(e.a), self.visit(e.b)
        if a is e.a and b is e.b:
            return e
        return type(e)(a, b)

    def visit_CmpOp(self, e: CmpOp) -> Expr:
        a, b = self.visit(e.a), self.visit(e.b)
        if a is e.a and b is e.b:
            return e
        return type(e)(a, b)

    def visit_And(self, e: And | Or) -> Expr:
        a, b = self.visit(e.a), self.visit(e.b)
        if a is e.a and b is e.b:
            return e
        return type(e)(a, b)

    visit_Or = visit_And

    def visit_Not(self, e: Not) -> Expr:
        a = self.visit(e.a)
        return e if a is e.a else Not(a)

    def visit_Select(self, e: Select) -> Expr:
        c, t, f = self.visit(e.cond), self.visit(e.t), self.visit(e.f)
        if c is e.cond and t is e.t and f is e.f:
            return e
        return Select(c, t, f)

    def visit_Cast(self, e: Cast) -> Expr:
        v = self.visit(e.value)
        return e if v is e.value else Cast(e.dtype, v)

    def visit_Call(self, e: Call) -> Expr:
        args = tuple(self.visit(a) for a in e.args)
        if all(x is y for x, y in zip(args, e.args)):
            return e
        return Call(e.dtype, e.name, args, e.extern)

    def visit_Let(self, e: Let) -> Expr:
        v, b = self.visit(e.value), self.visit(e.body)
        if v is e.value and b is e.body:
            return e
        return Let(e.var, v, b)

    def visit_Ramp(self, e: Ramp) -> Expr:
        b, s = self.visit(e.base), self.visit(e.stride)
        if b is e.base and s is e.stride:
            return e
        return Ramp(b, s, e.lanes)

    def visit_Broadcast(self, e: Broadcast) -> Expr:
        v = self.visit(e.value)
        return e if v is e.value else Broadcast(v, e.lanes)

    def visit_VectorReduce(self, e: VectorReduce) -> Expr:
        v = self.visit(e.value)
        return e if v is e.value else VectorReduce(e.op, v)

    def visit_Shuffle(self, e: Shuffle) -> Expr:
        vs = tuple(self.visit(v) for v in e.vectors)
        return e if all(x is y for x, y in zip(vs, e.vectors)) else Shuffle(vs, e.indices)

    def visit_BufferLoad(self, e: BufferLoad) -> Expr:
        idx = tuple(self.visit(i) for i in e.indices)
        p = self.visit(e.predicate) if e.predicate is not None else None
        if all(x is y for x, y in zip(idx, e.indices)) and p is e.predicate:
            return e
        return BufferLoad(e.buffer, idx, predicate=p)

    def visit_ProducerLoad(self, e: ProducerLoad) -> Expr:
        idx = tuple(self.visit(i) for i in e.indices)
        if all(x is y for x, y in zip(idx, e.indices)):
            return e
        return ProducerLoad(e.producer, idx)

    def visit_Reduce(self, e: Reduce) -> Expr:
        src = tuple(self.visit(s) for s in e.source)
        cond = self.visit(e.condition)
        init = tuple(self.visit(s) for s in e.init)
        if (
            all(x is y for x, y in zip(src, e.source))
            and cond is e.condition
            and all(x is y for x, y in zip(init, e.init))
        ):
            return e
        return Reduce(e.combiner, src, e.axis, cond, e.value_index, init)


class StmtMutator(ExprMutator):
    """Rebuilds statements; expressions go through the ExprMutator methods."""

    def visit_stmt(self, s: Stmt) -> Stmt:
        return self._find(s)(self, s)  # type: ignore[no-any-return]

    def visit_For(self, s: For) -> Stmt:
        mn, ext = self.visit(s.min), self.visit(s.extent)
        body = self.visit_stmt(s.body)
        if mn is s.min and ext is s.extent and body is s.body:
            return s
        return For(s.var, mn, ext, s.kind, body, s.annotations)

    def visit_BufferStore(self, s: BufferStore) -> Stmt:
        v = self.visit(s.value)
        idx = tuple(self.visit(i) for i in s.indices)
        p = self.visit(s.predicate) if s.predicate is not None else None
        if v is s.value and all(x is y for x, y in zip(idx, s.indices)) and p is s.predicate:
            return s
        return BufferStore(s.buffer, v, idx, p)

    def visit_SeqStmt(self, s: SeqStmt) -> Stmt:
        new = tuple(self.visit_stmt(x) for x in s.seq)
        if all(x is y for x, y in zip(new, s.seq)):
            return s
        from .stmt import seq

        return seq(*new)

    def visit_IfThenElse(self, s: IfThenElse) -> Stmt:
        c = self.visit(s.cond)
        t = self.visit_stmt(s.then_case)
        f = self.visit_stmt(s.else_case) if s.else_case is not None else None
        if c is s.cond and t is s.then_case and f is s.else_case:
            return s
        return IfThenElse(c, t, f)

    def visit_Allocate(self, s: Allocate) -> Stmt:
        b = self.visit_stmt(s.body)
        return s if b is s.body else Allocate(s.buffer, b)

    def visit_LetStmt(self, s: LetStmt) -> Stmt:
        v, b = self.visit(s.value), self.visit_stmt(s.body)
        if v is s.value and b is s.body:
            return s
        return LetStmt(s.var, v, b)

    def visit_Evaluate(self, s: Evaluate) -> Stmt:
        v = self.visit(s.value)
        return s if v is s.value else Evaluate(v)

    def visit_AttrStmt(self, s: AttrStmt) -> Stmt:
        b = self.visit_stmt(s.body)
        return s if b is s.body else AttrStmt(s.key, s.value, b)


class StmtVisitor(ExprVisitor):
    """Read-only walk over statements and the expressions inside them."""

    def visit_stmt(self, s: Stmt) -> None:
        self._find(s)(self, s)

    def visit_For(self, s: For) -> None:
        self.visit(s.min)
        self.visit(s.extent)
        self.visit_stmt(s.body)

    def visit_BufferStore(self, s: BufferStore) -> None:
        self.visit(s.value)
        for i in s.indices:
            self.visit(i)
        if s.predicate is not None:
            self.visit(s.predicate)

    def visit_SeqStmt(self, s: SeqStmt) -> None:
        for x in s.seq:
            self.visit_stmt(x)

    def visit_IfThenElse(self, s: IfThenElse) -> None:
        self.visit(s.cond)
        self.visit_stmt(s.then_case)
        if s.else_case is not None:
            self.visit_stmt(s.else_case)

    def visit_Allocate(self, s: Allocate) -> None:
        self.visit_stmt(s.body)

    def visit_LetStmt(self, s: LetStmt) -> None:
        self.visit(s.value)
        self.visit_stmt(s.body)

    def visit_Evaluate(self, s: Evaluate) -> None:
        self.visit(s.value)

    def visit_AttrStmt(self, s: AttrStmt) -> None:
        self.visit_stmt(s.body)


class Substitute(StmtMutator):
    """Replace variables by expressions (``vmap`` keys are Var objects)."""

    def __init__(self, vmap: dict[Var, Expr]) -> None:
        self.vmap = vmap

    def visit_Var(self, e: Var) -> Expr:  # type: ignore[override]
        return self.vmap.get(e, e)


def substitute(node: Any, vmap: dict[Var, Expr]) -> Any:
    """Substitute in an Expr or a Stmt."""
    if not vmap:
        return node
    m = Substitute(vmap)
    return m.visit_stmt(node) if isinstance(node, Stmt) else m.visit(node)


class _VarCollector(StmtVisitor):
    def __init__(self) -> None:
        self.vars: set[Var] = set()

    def visit_Var(self, e: Var) -> None:
        self.vars.add(e)


def free_vars(node: Any) -> set[Var]:
    """Every Var that appears in ``node`` (Expr or Stmt)."""
    c = _VarCollector()
    if isinstance(node, Stmt):
        c.visit_stmt(node)
    else:
        c.visit(node)
    return c.vars


def uses_var(node: Any, var: Var) -> bool:
    return var in free_vars(node)


def post_order_visit(e: Expr, fn: Callable[[Expr], None]) -> None:
    """Call ``fn`` on every sub-expression, children first."""

    class _V(ExprVisitor):
        def visit(self, x: Expr) -> None:
            super().visit(x)
            fn(x)

    _V().visit(e)


__all__ = [
    "Buffer",
    "ExprMutator",
    "ExprVisitor",
    "StmtMutator",
    "StmtVisitor",
    "Substitute",
    "free_vars",
    "post_order_visit",
    "substitute",
    "uses_var",
]

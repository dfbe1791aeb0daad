"""Virtual threads (``bind(ax, te.thread_axis("vthread"))``) pushed inward, as TVM's
InjectVirtualThread does.

Lowering emits a vthread as an unrolled loop around its body (annotated ``thread_tag =
"vthread"``). Unrolled as a whole, every virtual thread would also repeat what does not depend
on it: the cooperative load of a shared tile, its barriers, the tile's allocation (n copies of
shared memory, n times the global loads). Virtual threads behave like threads (independent,
communicating only through memory between barriers), so the body can be split:

* a statement that neither uses the vthread variable nor touches a buffer holding per-vthread
  data runs once;
* a sequence is injected element by element, a loop / ``if`` / ``let`` whose bounds, condition
  or value do not depend on the vthread is kept and injected inside;
* anything else is replicated once per virtual thread with the variable replaced by 0, 1, ...
* a buffer allocated inside whose contents differ per vthread (a store with an index or a value
  that depends on the variable or on such a buffer: the register tile of a GEMM) gets a leading
  dimension of the vthread count, one slice per virtual thread.

Runs first in the GPU pipeline, on multi-dimensional buffers, before loop partitioning.
"""

from __future__ import annotations

import dataclasses

from ..arith.simplify import simplify
from ..ir.buffer import Buffer
from ..ir.expr import BufferLoad, Expr, IntImm, Var, const
from ..ir.functor import StmtMutator, StmtVisitor, free_vars, substitute
from ..ir.stmt import (
    THREAD_TAG,
    Allocate,
    BufferStore,
    For,
    IfThenElse,
    LetStmt,
    PrimFunc,
    SeqStmt,
    Stmt,
    seq,
)

VTHREAD = "vthread"


def is_vthread_loop(s: Stmt) -> bool:
    return isinstance(s, For) and s.annotation(THREAD_TAG) == VTHREAD


class _Accesses(StmtVisitor):
    """Per buffer data var: the stores into it (index and value expressions)."""

    def __init__(self) -> None:
        self.stores: list[tuple[Var, list[Expr]]] = []

    def visit_BufferStore(self, s: BufferStore) -> None:
        self.stores.append((s.buffer.data, [s.value, *s.indices]))
        super().visit_BufferStore(s)


class _Reads(StmtVisitor):
    def __init__(self) -> None:
        self.data: set[Var] = set()

    def visit_BufferLoad(self, e: BufferLoad) -> None:
        self.data.add(e.buffer.data)
        super().visit_BufferLoad(e)


def _reads(e: Expr) -> set[Var]:
    r = _Reads()
    r.visit(e)
    return r.data


def _touched(body: Stmt, var: Var, local: set[Var]) -> set[Var]:
    """The buffers allocated in ``body`` (``local``) whose contents depend on ``var``: stored
    at an index or with a value that uses ``var`` or reads such a buffer (to a fixpoint)."""
    acc = _Accesses()
    acc.visit_stmt(body)
    deps = [(d, set().union(*(free_vars(x) for x in exprs)), set().union(*(_reads(x) for x in exprs)))
            for d, exprs in acc.stores if d in local]
    touched: set[Var] = set()
    changed = True
    while changed:
        changed = False
        for d, vs, rd in deps:
            if d not in touched and (var in vs or rd & touched):
                touched.add(d)
                changed = True
    return touched


class _Specialize(StmtMutator):
    """One virtual thread's copy: ``var`` -> k, expanded buffers indexed by k first."""

    def __init__(self, var: Var, k: int, expanded: dict[Var, Buffer]) -> None:
        self.var, self.k, self.expanded = var, k, expanded

    def visit_Var(self, e: Var) -> Expr:  # type: ignore[override]
        return const(self.k, e.dtype) if e is self.var else e

    def visit_BufferLoad(self, e: BufferLoad) -> Expr:
        idx = tuple(self.visit(i) for i in e.indices)
        p = self.visit(e.predicate) if e.predicate is not None else None
        nb = self.expanded.get(e.buffer.data)
        if nb is not None:
            return BufferLoad(nb, (const(self.k), *idx), predicate=p)
        if all(x is y for x, y in zip(idx, e.indices)) and p is e.predicate:
            return e
        return BufferLoad(e.buffer, idx, predicate=p)

    def visit_BufferStore(self, s: BufferStore) -> Stmt:
        v = self.visit(s.value)
        idx = tuple(self.visit(i) for i in s.indices)
        p = self.visit(s.predicate) if s.predicate is not None else None
        nb = self.expanded.get(s.buffer.data)
        if nb is not None:
            return BufferStore(nb, v, (const(self.k), *idx), p)
        return BufferStore(s.buffer, v, idx, p)


class _Injector:
    def __init__(self, var: Var, n: int, expanded: dict[Var, Buffer]) -> None:
        self.var, self.n, self.expanded = var, n, expanded

    def _uses(self, x: Stmt | Expr) -> bool:
        if self.var in free_vars(x):
            return True
        if isinstance(x, Stmt):
            acc = _Accesses()
            acc.visit_stmt(x)
            rd = _Reads()
            rd.visit_stmt(x)
            return bool(({d for d, _ in acc.stores} | rd.data) & set(self.expanded))
        return bool(_reads(x) & set(self.expanded))

    def replicate(self, s: Stmt) -> Stmt:
        return seq(*[_Specialize(self.var, k, self.expanded).visit_stmt(s) for k in range(self.n)])

    def inject(self, s: Stmt) -> Stmt:
        if not self._uses(s):
            return s
        if isinstance(s, SeqStmt):
            return seq(*[self.inject(x) for x in s.seq])
        if isinstance(s, Allocate):
            return Allocate(self.expanded.get(s.buffer.data, s.buffer), self.inject(s.body))
        if isinstance(s, For):
            if self._uses(s.min) or self._uses(s.extent):
                return self.replicate(s)
            return For(s.var, s.min, s.extent, s.kind, self.inject(s.body), s.annotations)
        if isinstance(s, IfThenElse):
            if self._uses(s.cond):
                return self.replicate(s)
            return IfThenElse(s.cond, self.inject(s.then_case),
                              self.inject(s.else_case) if s.else_case is not None else None)
        if isinstance(s, LetStmt):
            if self._uses(s.value):
                return self.replicate(s)
            return LetStmt(s.var, s.value, self.inject(s.body))
        return self.replicate(s)


class _Allocs(StmtVisitor):
    def __init__(self) -> None:
        self.bufs: dict[Var, Buffer] = {}

    def visit_Allocate(self, s: Allocate) -> None:
        self.bufs[s.buffer.data] = s.buffer
        super().visit_Allocate(s)


def _expand(buf: Buffer, n: int) -> Buffer:
    strides = buf.strides
    if strides:
        strides = (simplify(strides[0] * buf.shape[0]), *strides)
    return dataclasses.replace(buf, name=buf.name, shape=(const(n), *buf.shape), strides=strides,
                               data=Var(buf.data.name, "handle"))


class _Pass(StmtMutator):
    def visit_For(self, s: For) -> Stmt:
        body = self.visit_stmt(s.body)  # inner virtual threads first
        if not is_vthread_loop(s):
            return s if body is s.body else For(s.var, s.min, s.extent, s.kind, body, s.annotations)
        ext, mn = simplify(s.extent), simplify(s.min)
        if not isinstance(ext, IntImm) or not isinstance(mn, IntImm):
            raise ValueError(f"vthread loop {s.var.name} needs a constant extent, got {s.extent}")
        if mn.value != 0:
            body = substitute(body, {s.var: s.var + mn})
        allocs = _Allocs()
        allocs.visit_stmt(body)
        touched = _touched(body, s.var, set(allocs.bufs))
        expanded = {d: _expand(allocs.bufs[d], ext.value) for d in touched}
        return _Injector(s.var, ext.value, expanded).inject(body)


def inject_virtual_thread(func: PrimFunc) -> PrimFunc:
    body = _Pass().visit_stmt(func.body)
    return func if body is func.body else dataclasses.replace(func, body=body)


__all__ = ["VTHREAD", "inject_virtual_thread", "is_vthread_loop"]


"""Vectorize loops marked VECTORIZED: the loop variable becomes ``ramp(0, 1, lanes)``.

Scalar operands are broadcast, affine index arithmetic stays a Ramp (so codegen emits one
contiguous vector load/store), conditions that depend on the lane become store/load
predicates, and inner serial loops keep running with vector bodies (legal because spatial
iterations of a stage are independent). Anything that cannot be widened (a store to a
lane-invariant address, allocations, extern calls on a GPU or with pointer/vector operands)
makes the loop fall back to a serial loop.

On the CPU an extern call of scalars (``call_extern``, ``call_llvm_intrin``) is widened to a
call of the vector type, its lane-invariant operands left scalar: the CPU codegen emits one
vector call of an overloaded LLVM intrinsic (``llvm.fma.v8f32``) or one scalar call per
active lane (a C function), so one call no longer makes the whole loop scalar.
"""

from __future__ import annotations

import dataclasses

from ..arith.simplify import simplify
from ..ir import dtype as dt
from ..ir.expr import (
    Add,
    And,
    BinaryOp,
    Broadcast,
    BufferLoad,
    Call,
    Cast,
    CmpOp,
    Expr,
    IntImm,
    Let,
    Mul,
    Not,
    Or,
    Ramp,
    Select,
    Sub,
    Var,
    VectorReduce,
    const,
)
from ..ir.functor import StmtMutator, free_vars, substitute
from ..ir.stmt import (
    Allocate,
    AttrStmt,
    BufferStore,
    Evaluate,
    For,
    ForKind,
    IfThenElse,
    LetStmt,
    PrimFunc,
    SeqStmt,
    Stmt,
    seq,
)

MAX_LANES = 64


class _Scalarize(Exception):
    """Raised inside the widening visitor when the loop must stay scalar."""


def _lanes(e: Expr) -> int:
    return dt.lanes(e.dtype)


def _bcast(e: Expr, n: int) -> Expr:
    return e if _lanes(e) == n else Broadcast(e, n)


class _Widen(StmtMutator):
    def __init__(self, var: Var, lanes: int, widen_extern: bool = False) -> None:
        self.var = var
        self.n = lanes
        self.widen_extern = widen_extern
        self.env: dict[Var, Expr] = {}
        self.mask: Expr | None = None

    # expressions ----------------------------------------------------------------------------
    def visit_Var(self, e: Var) -> Expr:  # type: ignore[override]
        if e is self.var:
            return Ramp(const(0, e.dtype), const(1, e.dtype), self.n)
        return self.env.get(e, e)

    def visit_BinaryOp(self, e: BinaryOp) -> Expr:
        a, b = self.visit(e.a), self.visit(e.b)
        if a is e.a and b is e.b:
            return e
        la, lb = _lanes(a), _lanes(b)
        if la == 1 and lb == 1:
            return type(e)(a, b)
        t = type(e)
        if t in (Add, Sub) and isinstance(a, Ramp) and lb == 1:
            return Ramp(simplify(t(a.base, b)), a.stride, a.lanes)
        if t is Add and isinstance(b, Ramp) and la == 1:
            return Ramp(simplify(Add(a, b.base)), b.stride, b.lanes)
        if t in (Add, Sub) and isinstance(a, Ramp) and isinstance(b, Ramp):
            return Ramp(simplify(t(a.base, b.base)), simplify(t(a.stride, b.stride)), a.lanes)
        if t is Mul and isinstance(a, Ramp) and lb == 1:
            return Ramp(simplify(Mul(a.base, b)), simplify(Mul(a.stride, b)), a.lanes)
        if t is Mul and isinstance(b, Ramp) and la == 1:
            return Ramp(simplify(Mul(a, b.base)), simplify(Mul(a, b.stride)), b.lanes)
        return t(_bcast(a, self.n), _bcast(b, self.n))

    def visit_CmpOp(self, e: CmpOp) -> Expr:
        a, b = self.visit(e.a), self.visit(e.b)
        if a is e.a and b is e.b:
            return e
        if _lanes(a) == 1 and _lanes(b) == 1:
            return type(e)(a, b)
        return type(e)(_bcast(a, self.n), _bcast(b, self.n))

    def visit_And(self, e: And | Or) -> Expr:  # type: ignore[override]
        a, b = self.visit(e.a), self.visit(e.b)
        if a is e.a and b is e.b:
            return e
        if _lanes(a) == 1 and _lanes(b) == 1:
            return type(e)(a, b)
        return type(e)(_bcast(a, self.n), _bcast(b, self.n))

    visit_Or = visit_And  # type: ignore[assignment]

    def visit_Select(self, e: Select) -> Expr:
        c, t, f = self.visit(e.cond), self.visit(e.t), self.visit(e.f)
        if c is e.cond and t is e.t and f is e.f:
            return e
        if _lanes(c) == 1 and _lanes(t) == 1 and _lanes(f) == 1:
            return Select(c, t, f)
        return Select(_bcast(c, self.n), _bcast(t, self.n), _bcast(f, self.n))

    def visit_Cast(self, e: Cast) -> Expr:
        v = self.visit(e.value)
        if v is e.value:
            return e
        return Cast(dt.with_lanes(e.dtype, _lanes(v)), v)

    def visit_Call(self, e: Call) -> Expr:
        args = [self.visit(a) for a in e.args]
        if all(x is y for x, y in zip(args, e.args)):
            return e
        if e.name in ("address_of", "prefetch") or (e.extern and not self._widenable(e)):
            raise _Scalarize
        if all(_lanes(a) == 1 for a in args):
            return Call(e.dtype, e.name, tuple(args), e.extern)
        if e.extern:  # lane-invariant operands stay scalar: the codegen picks the overload
            return Call(dt.with_lanes(e.dtype, self.n), e.name, tuple(args), True)
        return Call(dt.with_lanes(e.dtype, self.n), e.name, tuple(_bcast(a, self.n) for a in args))

    def _widenable(self, e: Call) -> bool:
        """Whether the extern call ``e`` may become a call per lane / a vector intrinsic:
        scalar numeric operands and result only (a pointer or a vector operand has no
        lane-wise meaning), and only where the codegen knows how (the CPU's)."""
        types = [e.dtype, *(a.dtype for a in e.args)]
        return self.widen_extern and all(
            dt.lanes(t) == 1 and t not in ("handle", "void", "") for t in types)

    def visit_Let(self, e: Let) -> Expr:
        v = self.visit(e.value)
        if _lanes(v) > 1:
            nv = Var(e.var.name, v.dtype)
            self.env[e.var] = nv
            return Let(nv, v, self.visit(e.body))
        return Let(e.var, v, self.visit(e.body))

    def visit_BufferLoad(self, e: BufferLoad) -> Expr:
        idx = [self.visit(i) for i in e.indices]
        if all(_lanes(i) == 1 for i in idx):
            if self.mask is None:
                return e if all(x is y for x, y in zip(idx, e.indices)) else BufferLoad(e.buffer, tuple(idx))
            # A lane-invariant load under a lane mask may be out of bounds in the dead lanes'
            # iteration: make it a masked gather of one address so no dead lane reads memory.
        if len(idx) != 1:
            raise _Scalarize
        i = _bcast(idx[0], self.n)
        return BufferLoad(e.buffer, (i,), predicate=self.mask)

    def visit_Ramp(self, e: Ramp) -> Expr:
        raise _Scalarize

    def visit_Broadcast(self, e: Broadcast) -> Expr:
        raise _Scalarize

    def visit_VectorReduce(self, e: VectorReduce) -> Expr:
        raise _Scalarize

    # statements -----------------------------------------------------------------------------
    def visit_BufferStore(self, s: BufferStore) -> Stmt:
        v = self.visit(s.value)
        idx = [self.visit(i) for i in s.indices]
        if len(idx) != 1:
            raise _Scalarize
        i = idx[0]
        if _lanes(i) == 1:
            if _lanes(v) > 1 or self.mask is not None:
                raise _Scalarize  # many lanes would write one address
            return BufferStore(s.buffer, v, (i,))
        return BufferStore(s.buffer, _bcast(v, self.n), (i,), self.mask)

    def visit_IfThenElse(self, s: IfThenElse) -> Stmt:
        c = self.visit(s.cond)
        if _lanes(c) == 1:
            t = self.visit_stmt(s.then_case)
            f = self.visit_stmt(s.else_case) if s.else_case is not None else None
            return IfThenElse(c, t, f)
        saved = self.mask
        self.mask = c if saved is None else And(saved, c)
        t = self.visit_stmt(s.then_case)
        f = None
        if s.else_case is not None:
            nc = Not(c)
            self.mask = nc if saved is None else And(saved, nc)
            f = self.visit_stmt(s.else_case)
        self.mask = saved
        return seq(t, f)

    def visit_For(self, s: For) -> Stmt:
        if self.var in free_vars(s.min) or self.var in free_vars(s.extent):
            raise _Scalarize
        body = self.visit_stmt(s.body)
        kind = ForKind.SERIAL if s.kind in (ForKind.VECTORIZED, ForKind.PARALLEL) else s.kind
        return For(s.var, s.min, s.extent, kind, body, s.annotations)

    def visit_LetStmt(self, s: LetStmt) -> Stmt:
        v = self.visit(s.value)
        if _lanes(v) > 1:
            nv = Var(s.var.name, v.dtype)
            self.env[s.var] = nv
            return LetStmt(nv, v, self.visit_stmt(s.body))
        return LetStmt(s.var, v, self.visit_stmt(s.body))

    def visit_Allocate(self, s: Allocate) -> Stmt:
        raise _Scalarize

    def visit_Evaluate(self, s: Evaluate) -> Stmt:
        raise _Scalarize

    def visit_AttrStmt(self, s: AttrStmt) -> Stmt:
        return AttrStmt(s.key, s.value, self.visit_stmt(s.body))

    def visit_SeqStmt(self, s: SeqStmt) -> Stmt:
        return seq(*[self.visit_stmt(x) for x in s.seq])


class Vectorize(StmtMutator):
    def __init__(self, widen_extern: bool = False) -> None:
        super().__init__()
        self.widen_extern = widen_extern

    def visit_For(self, s: For) -> Stmt:
        body = self.visit_stmt(s.body)
        if s.kind != ForKind.VECTORIZED:
            return s if body is s.body else For(s.var, s.min, s.extent, s.kind, body, s.annotations)
        ext = simplify(s.extent)
        serial = For(s.var, s.min, s.extent, ForKind.SERIAL, body, s.annotations)
        if not isinstance(ext, IntImm) or ext.value <= 1:
            return serial
        n = ext.value
        if n > MAX_LANES:
            # widen in chunks the hardware likes; an outer serial loop walks the chunks
            chunk = next((c for c in (16, 8, 4) if n % c == 0), 0)
            if not chunk:
                return serial
            outer = Var(s.var.name + ".vo", s.var.dtype)
            inner = Var(s.var.name + ".vi", s.var.dtype)
            sub = substitute(body, {s.var: simplify(outer * chunk + inner + s.min)})
            inner_loop = For(inner, const(0), const(chunk), ForKind.VECTORIZED, sub)
            return For(outer, const(0), const(n // chunk), ForKind.SERIAL,
                       self.visit_For(inner_loop), s.annotations)
        if n > 8 and n & (n - 1):
            return self._pow2_pieces(s, body, n, serial)
        if not (isinstance(s.min, IntImm) and s.min.value == 0):
            body = substitute(body, {s.var: s.var + s.min})
        try:
            return _Widen(s.var, n, self.widen_extern).visit_stmt(body)
        except _Scalarize:
            return serial

    def _pow2_pieces(self, s: For, body: Stmt, n: int, serial: Stmt) -> Stmt:
        """Widen an odd-width loop as consecutive power-of-two pieces (56 = 32 + 16 + 8).

        LLVM splits a vector value that lives across blocks (a loop-carried accumulator)
        into registers by halving, and a width that is not a power of two ends up as one
        scalar register per lane: a ``<56 x float>`` phi became hundreds of vinsertps per
        iteration (a conv2d ran at 13 GFLOP/s instead of 183). Widths up to 8 stay whole:
        LLVM widens them to one register."""
        pieces: list[Stmt] = []
        off = 0
        for bit in reversed(range(n.bit_length())):
            w = 1 << bit
            if not n & w:
                continue
            v = Var(s.var.name, s.var.dtype)
            sub = substitute(body, {s.var: v + simplify(s.min + off)})
            try:
                pieces.append(_Widen(v, w, self.widen_extern).visit_stmt(sub) if w > 1 else
                              substitute(sub, {v: const(0, v.dtype)}))
            except _Scalarize:
                return serial
            off += w
        return seq(*pieces)


def vectorize(func: PrimFunc) -> PrimFunc:
    # GPU kernels keep loops with extern calls scalar (NVPTX codegen has no per-lane calls)
    target = func.attrs.get("target")
    body = Vectorize(widen_extern=not getattr(target, "is_gpu", False)).visit_stmt(func.body)
    return func if body is func.body else dataclasses.replace(func, body=body)

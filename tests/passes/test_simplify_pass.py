"""The Simplify pass: before/expected loop nests (compared as printed IR)."""

from __future__ import annotations

import textwrap

from tecomp.ir import (
    Allocate,
    Buffer,
    BufferStore,
    Evaluate,
    For,
    ForKind,
    IfThenElse,
    LetStmt,
    PrimFunc,
    SeqStmt,
    Stmt,
    Var,
    const,
    seq,
)
from tecomp.ir.expr import Broadcast, BufferLoad, Call, IntImm, Max, Min, Ramp
from tecomp.passes.simplify import Simplify, simplify_func, simplify_stmt

A = Buffer("A", (const(1024),), "float32")
B = Buffer("B", (const(32), const(32)), "float32")
n = Var("n")
io, ii, i, j, t = Var("io"), Var("ii"), Var("i"), Var("j"), Var("t")


def loop(v: Var, extent: object, body: Stmt, start: object = 0) -> For:
    return For(v, const(start) if isinstance(start, int) else start,  # type: ignore[arg-type]
               const(extent) if isinstance(extent, int) else extent, ForKind.SERIAL, body)  # type: ignore[arg-type]


def text(s: str) -> str:
    return textwrap.dedent(s).strip("\n")


def test_tiled_index_arithmetic_and_bound_check() -> None:
    idx = io * 32 + ii
    body = IfThenElse(idx < 1024, BufferStore(B, BufferLoad(A, (idx,)), (idx // 32, idx % 32)))
    out = simplify_stmt(loop(io, 32, loop(ii, 32, body)))
    assert str(out) == text("""
        for io in range(32):
          for ii in range(32):
            B[io, ii] = A[io * 32 + ii]
        """)


def test_symbolic_bound_check_is_kept_only_where_needed() -> None:
    # i in [0, n): i < n is always true, i < n - 1 is not
    store = BufferStore(A, const(1.0), (i,))
    out = simplify_stmt(loop(i, n, seq(IfThenElse(i < n, store), IfThenElse(i < n - 1, store))))
    assert str(out) == text("""
        for i in range(n):
          A[i] = 1.0f
          if i < n - 1:
            A[i] = 1.0f
        """)


def test_extent_one_loop_is_replaced_by_its_body() -> None:
    out = simplify_stmt(loop(i, 1, BufferStore(A, const(0.0), (i * 4 + 2,)), start=3))
    assert str(out) == "A[14] = 0.0f"
    # min(32, 33 - i*32) is 1 for i == 1: the extent simplifies to a constant first
    tail = loop(i, 2, loop(j, Min(const(32), 33 - i * 32), BufferStore(A, const(0.0), (i * 32 + j,))))
    assert "for j" in str(simplify_stmt(tail))


def test_empty_and_negative_extent_loops_disappear() -> None:
    store = BufferStore(A, const(0.0), (i,))
    assert isinstance(simplify_stmt(loop(i, 0, store)), SeqStmt)
    out = simplify_stmt(seq(loop(i, n - n, store), loop(j, 4, BufferStore(A, const(1.0), (j,)))))
    assert str(out) == text("""
        for j in range(4):
          A[j] = 1.0f
        """)
    assert str(simplify_stmt(loop(i, j // 64, store))) == str(loop(i, j // 64, store))
    inner = loop(i, 8, loop(j, i // 8, BufferStore(A, const(0.0), (j,))))
    out = simplify_stmt(inner)  # i // 8 is 0 inside i in [0, 8): the whole nest is empty
    assert isinstance(out, SeqStmt) and not out.seq


def test_if_with_else_and_constant_conditions() -> None:
    s1, s2 = BufferStore(A, const(1.0), (i,)), BufferStore(A, const(2.0), (i,))
    out = simplify_stmt(loop(i, 16, IfThenElse(i >= 16, s1, s2)))
    assert str(out) == text("""
        for i in range(16):
          A[i] = 2.0f
        """)
    keep = loop(i, 16, IfThenElse(i < 8, s1, s2))
    assert simplify_stmt(keep) is keep
    out = simplify_stmt(loop(i, 16, IfThenElse(i < 8, SeqStmt(()), SeqStmt(()))))
    assert isinstance(out, SeqStmt) and not out.seq
    out = simplify_stmt(loop(i, 16, IfThenElse(i < 8, SeqStmt(()), s2)))
    assert str(out) == text("""
        for i in range(16):
          if i >= 8:
            A[i] = 2.0f
        """)


def test_let_values_are_ranges() -> None:
    body = IfThenElse(t < 64, BufferStore(A, const(0.0), (t,)))
    out = simplify_stmt(loop(i, 8, LetStmt(t, i * 8 + 7, body)))
    assert str(out) == text("""
        for i in range(8):
          t = i * 8 + 7
          A[t] = 0.0f
        """)


def test_predicates_allocations_and_evaluates() -> None:
    vec = Ramp(io * 4, const(1), 4)
    tmp = Buffer("tmp", (const(4),), "float32", scope="local")
    always = BufferStore(A, Broadcast(const(0.0), 4), (vec,), Broadcast(io < 300, 4))
    never = BufferStore(A, Broadcast(const(0.0), 4), (vec,), Broadcast(io > 300, 4))
    out = simplify_stmt(loop(io, 256, seq(always, never, Allocate(tmp, SeqStmt(())), Evaluate(const(0)))))
    assert str(out) == text("""
        for io in range(256):
          A[ramp(io * 4, 1, 4)] = x4(0.0f)
        """)
    call = Evaluate(Call("int32", "side_effect", (const(1) + 2,), extern=True))
    assert str(simplify_stmt(call)) == "@side_effect(3)"


def test_unchanged_function_is_returned_as_is() -> None:
    body = loop(i, n, BufferStore(A, BufferLoad(A, (i,)) * 2.0, (i,)))
    f = PrimFunc("f", [A], body, dim_vars=[n])
    assert simplify_func(f) is f
    g = PrimFunc("g", [A], loop(i, 4, BufferStore(A, const(0.0), (i + 0,))))
    h = simplify_func(g)
    assert h is not g and h.name == "g" and h.params == [A]
    assert str(h.body) == text("""
        for i in range(4):
          A[i] = 0.0f
        """)


def test_nested_scopes_do_not_leak_ranges() -> None:
    # j's range [0, 4) must not be used after its loop ends
    s = seq(loop(j, 4, BufferStore(A, const(0.0), (j // 4,))),
            loop(i, 4, BufferStore(A, const(0.0), (j // 4,))))
    out = simplify_stmt(s)
    assert str(out) == text("""
        for j in range(4):
          A[0] = 0.0f
        for i in range(4):
          A[j // 4] = 0.0f
        """)
    assert isinstance(Simplify()._simp.visit(IntImm(3)), IntImm)


def test_shape_dims_are_non_negative() -> None:
    An = Buffer("An", (n,), "float32")
    body = loop(i, Min(Max(n // 32, const(0)), (n + 31) // 32), BufferStore(An, const(0.0), (i,)))
    f = simplify_func(PrimFunc("f", [An], body))
    assert str(f.body) == text("""
        for i in range(n // 32):
          An[i] = 0.0f
        """)

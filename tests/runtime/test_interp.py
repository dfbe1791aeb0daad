"""The loop-nest interpreter against numpy and Python on hand-built PrimFuncs."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tecomp.errors import TecompError
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
    Var,
    const,
    seq,
)
from tecomp.ir import expr as E
from tecomp.runtime.interp import Pointer, run


def c(v: int) -> E.Expr:
    return const(v)


def loop(v: Var, extent: int | E.Expr, body: object, kind: ForKind = ForKind.SERIAL) -> For:
    ext = extent if isinstance(extent, E.Expr) else c(extent)
    return For(v, c(0), ext, kind, body)  # type: ignore[arg-type]


def load(buf: Buffer, *idx: E.Expr, pred: E.Expr | None = None) -> E.BufferLoad:
    return E.BufferLoad(buf, tuple(idx), predicate=pred)


def store(buf: Buffer, value: E.Expr, *idx: E.Expr, pred: E.Expr | None = None) -> BufferStore:
    return BufferStore(buf, value, tuple(idx), pred)


Make = Callable[[Any, Any], E.Expr]


def scalar_func(dtype: str, make: Make) -> PrimFunc:
    """out[0] = make(a[0], b[0]) for scalar-semantics tests."""
    a, b, out = (Buffer(n, (c(1),), dtype) for n in "abo")
    body = store(out, make(load(a, c(0)), load(b, c(0))), c(0))
    return PrimFunc("scalar", [a, b, out], body)


def eval_scalar(dtype: str, make: Make, x: Any, y: Any) -> Any:
    out = np.zeros(1, dtype)
    run(scalar_func(dtype, make), np.array([x], dtype), np.array([y], dtype), out)
    return out[0]


# elementwise, matmul, symbolic dims ---------------------------------------------------------


def add_2d(n: int, m: int) -> PrimFunc:
    A, B, C = (Buffer(x, (c(n), c(m)), "float32") for x in "ABC")
    i, j = Var("i"), Var("j")
    body = loop(i, n, loop(j, m, store(C, load(A, i, j) + load(B, i, j), i, j)))
    return PrimFunc("add", [A, B, C], body)


def test_elementwise_add_2d() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.random((3, 5), "float32"), rng.random((3, 5), "float32")
    out = np.zeros((3, 5), "float32")
    run(add_2d(3, 5), a, b, out)
    np.testing.assert_array_equal(out, a + b)


def test_elementwise_add_flattened() -> None:
    # After flattening: the same 2-D buffers addressed with one flat index i*5+j.
    A, B, C = (Buffer(x, (c(3), c(5)), "float32") for x in "ABC")
    i, j = Var("i"), Var("j")
    flat = i * 5 + j
    body = loop(i, 3, loop(j, 5, store(C, load(A, flat) + load(B, flat), flat)))
    rng = np.random.default_rng(1)
    a, b = rng.random((3, 5), "float32"), rng.random((3, 5), "float32")
    out = np.zeros((3, 5), "float32")
    run(PrimFunc("add_flat", [A, B, C], body), a, b, out)
    np.testing.assert_array_equal(out, a + b)


def test_matmul_with_reduction_loop() -> None:
    n, k, m = 4, 6, 5
    A = Buffer("A", (c(n), c(k)), "float32")
    B = Buffer("B", (c(k), c(m)), "float32")
    C = Buffer("C", (c(n), c(m)), "float32")
    i, j, r = Var("i"), Var("j"), Var("r")
    body = loop(i, n, loop(j, m, seq(
        store(C, const(0.0, "float32"), i, j),
        loop(r, k, store(C, load(C, i, j) + load(A, i, r) * load(B, r, j), i, j)),
    )))
    rng = np.random.default_rng(2)
    a, b = rng.random((n, k), "float32"), rng.random((k, m), "float32")
    out = np.full((n, m), 7.0, "float32")
    run(PrimFunc("matmul", [A, B, C], body), a, b, out)
    # float32 accumulation in loop order, exactly
    ref = np.zeros((n, m), "float32")
    for kk in range(k):
        ref = ref + a[:, kk:kk + 1] * b[kk:kk + 1, :]
    np.testing.assert_array_equal(out, ref)


def test_symbolic_dim_bound_from_shape() -> None:
    n = Var("n")
    A, B = Buffer("A", (n, c(2)), "int32"), Buffer("B", (n, c(2)), "int32")
    i, j = Var("i"), Var("j")
    body = For(i, c(0), n, ForKind.PARALLEL, loop(j, 2, store(B, load(A, i, j) * 3, i, j)))
    f = PrimFunc("triple", [A, B], body, dim_vars=[n])
    a = np.arange(14, dtype="int32").reshape(7, 2)
    out = np.zeros_like(a)
    run(f, a, out)
    np.testing.assert_array_equal(out, a * 3)
    out2 = np.zeros_like(a)
    run(f, a, out2, 7)  # an explicit dim value that agrees
    np.testing.assert_array_equal(out2, a * 3)
    with pytest.raises(ValueError, match=r"argument 1 \(B\) dim 0"):
        run(f, a, np.zeros((6, 2), "int32"))
    with pytest.raises(ValueError, match=r"argument 1 \(B\): dtype"):
        run(f, a, np.zeros((7, 2), "float32"))
    with pytest.raises(ValueError, match="expected 2"):
        run(f, a, np.zeros((7, 3), "int32"))
    with pytest.raises(TypeError):
        run(f, a)


def test_non_contiguous_argument_is_written_back() -> None:
    a = np.ones((5, 3), "float32").T
    out = np.zeros((3, 10), "float32")[:, ::2]
    run(add_2d(3, 5), a, a, out)
    np.testing.assert_array_equal(out, np.full((3, 5), 2.0, "float32"))


def test_explicit_strides() -> None:
    # A padded buffer (storage_align): rows of 5 elements stored 8 apart.
    A = Buffer("A", (c(3), c(5)), "float32", strides=(c(8), c(1)))
    i, j = Var("i"), Var("j")
    body = loop(i, 3, loop(j, 5, store(A, E.Cast("float32", i * 10 + j), i, j)))
    backing = np.zeros((3, 8), "float32")
    run(PrimFunc("pad", [A], body), backing[:, :5])
    np.testing.assert_array_equal(backing[:, :5], np.arange(3)[:, None] * 10 + np.arange(5))
    assert not backing[:, 5:].any()


# integer and float semantics ----------------------------------------------------------------


def test_int32_wraparound() -> None:
    assert eval_scalar("int32", lambda a, b: a + b, 2**31 - 1, 1) == -(2**31)
    assert eval_scalar("int32", lambda a, b: a * b, 65536, 65536) == 0
    assert eval_scalar("int32", lambda a, b: a - b, -(2**31), 1) == 2**31 - 1
    assert eval_scalar("uint8", lambda a, b: a - b, 0, 1) == 255
    assert eval_scalar("int8", lambda a, b: a * b, 16, 8) == -128


@settings(max_examples=200, deadline=None)
@given(st.integers(-1000, 1000), st.integers(-50, 50).filter(lambda v: v != 0))
def test_floordiv_floormod_truncdiv_match_python(x: int, y: int) -> None:
    assert eval_scalar("int32", lambda a, b: E.FloorDiv(a, b), x, y) == x // y
    assert eval_scalar("int32", lambda a, b: E.FloorMod(a, b), x, y) == x % y
    assert eval_scalar("int32", lambda a, b: E.Div(a, b), x, y) == math.trunc(x / y)


def test_vector_int_division_matches_scalar() -> None:
    xs = np.array([-7, 7, -7, 7, -8, 0, 5, -1], "int32")
    ys = np.array([2, 2, -2, -2, 3, 3, -5, 1], "int32")
    A, B, Q, F, M = (Buffer(n, (c(8),), "int32") for n in "ABQFM")
    idx = E.Ramp(c(0), c(1), 8)
    body = seq(*(store(out, op(load(A, idx), load(B, idx)), idx)
                 for out, op in ((Q, E.Div), (F, E.FloorDiv), (M, E.FloorMod))))
    q, f, m = (np.zeros(8, "int32") for _ in range(3))
    run(PrimFunc("vdiv", [A, B, Q, F, M], body), xs, ys, q, f, m)
    assert q.tolist() == [math.trunc(x / y) for x, y in zip(xs.tolist(), ys.tolist())]
    assert f.tolist() == [x // y for x, y in zip(xs.tolist(), ys.tolist())]
    assert m.tolist() == [x % y for x, y in zip(xs.tolist(), ys.tolist())]


def test_division_by_zero_raises() -> None:
    with pytest.raises(ZeroDivisionError, match="//"):
        eval_scalar("int32", lambda a, b: E.FloorDiv(a, b), 3, 0)
    assert np.isinf(eval_scalar("float32", lambda a, b: a / b, 1.0, 0.0))


def test_float32_rounds_every_op() -> None:
    # 1 + 2**-24 is not representable in float32: each add must round, so the sum stays 1.
    tiny = np.float32(2.0**-24)
    got = eval_scalar("float32", lambda a, b: (a + b) + b, 1.0, tiny)
    assert got == np.float32(1.0)
    assert eval_scalar("float64", lambda a, b: (a + b) + b, 1.0, 2.0**-24) > 1.0


def test_casts() -> None:
    A = Buffer("A", (c(6),), "float32")
    I, Bo = Buffer("I", (c(6),), "int32"), Buffer("Bo", (c(6),), "bool")
    i = Var("i")
    body = loop(i, 6, seq(store(I, E.Cast("int32", load(A, i)), i),
                          store(Bo, E.Cast("bool", load(A, i)), i)))
    a = np.array([2.7, -2.7, 0.0, np.nan, np.inf, 3e10], "float32")
    ints, bools = np.zeros(6, "int32"), np.zeros(6, bool)
    run(PrimFunc("cast", [A, I, Bo], body), a, ints, bools)
    assert ints.tolist() == [2, -2, 0, 0, 2**31 - 1, 2**31 - 1]  # truncates; NaN 0; saturates
    assert bools.tolist() == [True, True, False, True, True, True]
    big = 2**24 + 1  # int -> float32 rounds to nearest even
    assert eval_scalar("int32", lambda a, b: E.Cast("int32", E.Cast("float32", a)), big, 0) == 2**24


def test_intrinsics() -> None:
    A, O = Buffer("A", (c(8),), "float32"), Buffer("O", (c(8),), "float32")
    x = np.array([-2.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, 3.7, -3.7], "float32")
    i = Var("i")
    cases: list[tuple[str, np.ndarray]] = [
        ("round", np.round(x)),
        ("floor", np.floor(x)), ("trunc", np.trunc(x)), ("fabs", np.abs(x)),
        ("exp", np.exp(x)), ("tanh", np.tanh(x)), ("sigmoid", 1 / (1 + np.exp(-x))),
        ("erf", np.array([math.erf(v) for v in x.tolist()], "float32")),
    ]
    for name, ref in cases:
        out = np.zeros(8, "float32")
        body = loop(i, 8, store(O, E.Call("float32", name, (load(A, i),)), i))
        run(PrimFunc(name, [A, O], body), x, out)
        np.testing.assert_allclose(out, ref, rtol=1e-6, err_msg=name)
        assert out.dtype == np.float32


def test_min_max_and_nan() -> None:
    assert eval_scalar("float32", lambda a, b: E.Min(a, b), np.nan, 1.0) == 1.0
    assert eval_scalar("int32", lambda a, b: E.Max(a, b), -3, 2) == 2


# Select laziness, vectors ------------------------------------------------------------------


def test_lazy_select_guards_out_of_bounds_load() -> None:
    # B[i] = i >= 1 ? A[i - 1] : 0   -- A[-1] must never be read
    A, B = Buffer("A", (c(4),), "float32"), Buffer("B", (c(4),), "float32")
    i = Var("i")
    body = loop(i, 4, store(B, E.Select(i >= 1, load(A, i - 1), const(0.0, "float32")), i))
    a, out = np.array([1, 2, 3, 4], "float32"), np.zeros(4, "float32")
    run(PrimFunc("shift", [A, B], body), a, out)
    assert out.tolist() == [0, 1, 2, 3]


def test_vector_ramp_broadcast_store() -> None:
    A, B = Buffer("A", (c(16),), "float32"), Buffer("B", (c(16),), "float32")
    io = Var("io")
    idx = E.Ramp(io * 8, c(1), 8)
    body = loop(io, 2, store(B, load(A, idx) * E.Broadcast(const(2.0, "float32"), 8), idx),
                ForKind.VECTORIZED)
    a, out = np.arange(16, dtype="float32"), np.zeros(16, "float32")
    run(PrimFunc("vmul", [A, B], body), a, out)
    np.testing.assert_array_equal(out, a * 2)


def test_predicated_vector_load_and_store() -> None:
    # A tail of 10 elements in vectors of 8: lanes past 10 are masked, never read or written.
    A, B = Buffer("A", (c(10),), "int32"), Buffer("B", (c(10),), "int32")
    io = Var("io")
    idx = E.Ramp(io * 8, c(1), 8)
    pred = idx < E.Broadcast(c(10), 8)
    body = loop(io, 2, store(B, load(A, idx, pred=pred) + E.Broadcast(c(1), 8), idx, pred=pred))
    a, out = np.arange(10, dtype="int32"), np.zeros(10, "int32")
    run(PrimFunc("tail", [A, B], body), a, out)
    np.testing.assert_array_equal(out, a + 1)


def test_vector_select_masks_loads() -> None:
    # B[ramp] = select(ramp >= 1, A[ramp - 1], 0): lane 0 of the first vector must not read A[-1].
    A, B = Buffer("A", (c(8),), "float32"), Buffer("B", (c(8),), "float32")
    idx = E.Ramp(c(0), c(1), 8)
    one = E.Broadcast(c(1), 8)
    val = E.Select(idx >= one, load(A, idx - one), E.Broadcast(const(0.0, "float32"), 8))
    a, out = np.arange(1, 9, dtype="float32"), np.zeros(8, "float32")
    run(PrimFunc("vshift", [A, B], store(B, val, idx)), a, out)
    assert out.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]


def test_vector_select_masks_integer_division() -> None:
    # O = B != 0 ? A // B : -1, vectorised: the zero divisors sit in lanes the select drops.
    A, B, O = (Buffer(n, (c(4),), "int32") for n in "ABO")
    idx = E.Ramp(c(0), c(1), 4)
    b = load(B, idx)
    val = E.Select(b != E.Broadcast(c(0), 4), E.FloorDiv(load(A, idx), b), E.Broadcast(c(-1), 4))
    out = np.zeros(4, "int32")
    run(PrimFunc("vsafe", [A, B, O], store(O, val, idx)),
        np.array([7, 8, -9, 10], "int32"), np.array([2, 0, 4, 0], "int32"), out)
    assert out.tolist() == [3, -1, -3, -1]


def test_vector_reduce() -> None:
    A, O = Buffer("A", (c(8),), "float32"), Buffer("O", (c(4),), "float32")
    v = load(A, E.Ramp(c(0), c(1), 8))
    body = seq(*(store(O, E.VectorReduce(op, v), c(k))
                 for k, op in enumerate(("add", "mul", "min", "max"))))
    a, out = np.array([3, 1, 4, 1, 5, 9, 2, 6], "float32"), np.zeros(4, "float32")
    run(PrimFunc("vred", [A, O], body), a, out)
    assert out.tolist() == [31, 6480, 1, 9]
    Ai, Oi = Buffer("Ai", (c(4),), "int32"), Buffer("Oi", (c(1),), "int32")
    body = store(Oi, E.VectorReduce("add", load(Ai, E.Ramp(c(0), c(1), 4))), c(0))
    out_i = np.zeros(1, "int32")
    run(PrimFunc("vred_i", [Ai, Oi], body), np.full(4, 2**30, "int32"), out_i)
    assert out_i[0] == 0  # wraps like int32


# memory safety, locals, externs, limits ------------------------------------------------------


def test_allocate_and_poison() -> None:
    # T is a local scratch; B[i] = T[i] + 1 with T[3] never written.
    A, B = Buffer("A", (c(4),), "float32"), Buffer("B", (c(4),), "float32")
    T = Buffer("T", (c(4),), "float32", scope="local")
    i = Var("i")
    body = Allocate(T, seq(
        loop(i, 3, store(T, load(A, i), i)),
        loop(i, 4, store(B, load(T, i) + const(1.0, "float32"), i)),
    ))
    f = PrimFunc("scratch", [A, B], body)
    a, out = np.ones(4, "float32"), np.zeros(4, "float32")
    run(f, a, out)
    assert out.tolist() == [2, 2, 2, 1]
    run(f, a, out, poison=True)
    assert out[:3].tolist() == [2, 2, 2] and np.isnan(out[3])


def test_out_of_bounds_raises_index_error() -> None:
    A, B = Buffer("A", (c(4), c(3)), "float32"), Buffer("B", (c(4), c(3)), "float32")
    i, j = Var("i"), Var("j")
    body = loop(i, 4, loop(j, 3, store(B, load(A, i, j + 1), i, j)))
    a, out = np.zeros((4, 3), "float32"), np.zeros((4, 3), "float32")
    with pytest.raises(IndexError, match=r"buffer 'A'.*index 3 on axis 1"):
        run(PrimFunc("oob", [A, B], body), a, out)
    flat = Buffer("F", (c(4),), "int32")
    body = loop(i, 5, store(flat, i, i))
    with pytest.raises(IndexError, match=r"buffer 'F'.*index 4"):
        run(PrimFunc("oob_store", [flat], body), np.zeros(4, "int32"))
    vec = store(flat, E.Broadcast(c(0), 4), E.Ramp(c(1), c(1), 4))
    with pytest.raises(IndexError, match="buffer 'F'"):
        run(PrimFunc("oob_vec", [flat], vec), np.zeros(4, "int32"))


def test_extern_call_and_address_of() -> None:
    A = Buffer("A", (c(6),), "float32")
    seen: list[int] = []

    def fill(ptr: Pointer, n: int, value: float) -> int:
        ptr.array[ptr.offset:ptr.offset + n] = value
        seen.append(n)
        return n

    call = E.Call("int32", "fill", (E.Call("handle", "address_of", (load(A, c(2)),)),
                                     c(3), const(5.0, "float32")), extern=True)
    f = PrimFunc("ext", [A], Evaluate(call))
    a = np.zeros(6, "float32")
    run(f, a, externs={"fill": fill})
    assert a.tolist() == [0, 0, 5, 5, 5, 0] and seen == [3]
    with pytest.raises(TecompError, match="'fill'"):
        run(f, a)


def test_let_if_prefetch_and_unbound_var() -> None:
    A = Buffer("A", (c(4),), "int32")
    i, t = Var("i"), Var("t")
    body = loop(i, 4, seq(
        Evaluate(E.Call("int32", "prefetch", (load(A, i),))),
        LetStmt(t, i * i, IfThenElse(i % 2 == 0, store(A, t, i), store(A, -t, i))),
    ))
    a = np.zeros(4, "int32")
    run(PrimFunc("let", [A], body), a)
    assert a.tolist() == [0, -1, 4, -9]
    with pytest.raises(TecompError, match="t is used outside"):
        run(PrimFunc("bad", [A], store(A, t, c(0))), a)


def test_max_steps() -> None:
    A = Buffer("A", (c(1),), "int32")
    i = Var("i")
    f = PrimFunc("long", [A], loop(i, 10**9, store(A, i, c(0))))
    with pytest.raises(TecompError, match="max_steps=100"):
        run(f, np.zeros(1, "int32"), max_steps=100)


def test_buffers_sharing_a_data_var() -> None:
    # Flattening and storage rewrite make new Buffers over the same storage (same data var).
    A = Buffer("A", (c(3), c(5)), "float32")
    flat = Buffer("A_flat", (c(15),), "float32", data=A.data)
    as_int = Buffer("A_bits", (c(15),), "int32", data=A.data)
    i = Var("i")
    body = seq(loop(i, 15, store(flat, E.Cast("float32", i), i)),
               store(as_int, load(as_int, c(1)) + 1, c(0)))
    a = np.zeros((3, 5), "float32")
    run(PrimFunc("alias", [A], body), a)
    assert a.ravel()[1:].tolist() == list(range(1, 15))
    assert a.view("int32").ravel()[0] == np.float32(1.0).view("int32") + 1


def test_symbolic_shape_expression_is_checked() -> None:
    n = Var("n")
    X, Y = Buffer("X", (n,), "int32"), Buffer("Y", (n * 2,), "int32")
    f = PrimFunc("twice", [X, Y], Evaluate(c(0)), dim_vars=[n])
    run(f, np.zeros(3, "int32"), np.zeros(6, "int32"))
    with pytest.raises(ValueError, match=r"argument 1 \(Y\) dim 0 is 7"):
        run(f, np.zeros(3, "int32"), np.zeros(7, "int32"))


def test_shadowed_loop_var_is_restored() -> None:
    C = Buffer("C", (c(1),), "int32")
    i = Var("i")
    inner = loop(i, 2, store(C, load(C, c(0)) + 1, c(0)))
    body = loop(i, 3, seq(inner, store(C, load(C, c(0)) + i * 100, c(0))))
    out = np.zeros(1, "int32")
    run(PrimFunc("shadow", [C], body), out)
    assert out[0] == 6 + 300


def test_strided_allocation() -> None:
    T = Buffer("T", (c(2), c(3)), "int32", strides=(c(4), c(1)), scope="local")
    O = Buffer("O", (c(2), c(3)), "int32")
    i, j = Var("i"), Var("j")
    body = Allocate(T, seq(loop(i, 2, loop(j, 3, store(T, i * 10 + j, i, j))),
                           loop(i, 2, loop(j, 3, store(O, load(T, i, j), i, j)))))
    out = np.zeros((2, 3), "int32")
    run(PrimFunc("strided", [O], body), out, poison=True)
    assert out.tolist() == [[0, 1, 2], [10, 11, 12]]


def test_float16_and_wide_int_casts() -> None:
    assert eval_scalar("float16", lambda a, b: a + b, 2048, 1) == 2048  # rounds in float16
    big = 2**62 + 2**38 + 1  # int64 -> float32 rounds once, like the hardware
    got = eval_scalar("int64", lambda a, b: E.Cast("int64", E.Cast("float32", a)), big, 0)
    assert got == int(np.float32(np.int64(big)))

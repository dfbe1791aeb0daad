"""Every dtype through element-wise, reduction and cast kernels; math and integer semantics.

References are numpy. Kernels run both scalar and vectorized (the vector path has its own code
for every operation), on an extent that leaves a vector tail.
"""

from __future__ import annotations

import numpy as np
import pytest

import tecomp as tc
from tecomp import te

RNG = np.random.default_rng(42)
N = 45  # not a multiple of any vector width: every vectorized kernel has a tail

DTYPES = ["float32", "float64", "float16", "int8", "uint8", "int32", "int64", "bool"]
NUMERIC = [d for d in DTYPES if d != "bool"]
FLOATS = ["float32", "float64", "float16"]
INTS = ["int8", "uint8", "int32", "int64"]


def rand(shape, dtype, lo=None, hi=None):
    d = np.dtype(dtype)
    if d.kind == "f":
        lo = -4.0 if lo is None else lo
        hi = 4.0 if hi is None else hi
        return RNG.uniform(lo, hi, shape).astype(dtype)
    if d.kind == "b":
        return RNG.integers(0, 2, shape).astype(bool)
    info = np.iinfo(d)
    lo = max(info.min, -50) if lo is None else lo
    hi = min(info.max, 50) if hi is None else hi
    return RNG.integers(lo, hi, shape, endpoint=True).astype(dtype)


def schedule_1d(out, vec):
    s = te.create_schedule(out.op)
    if vec:
        xo, xi = s[out].split(out.op.axis[0], factor=16)
        s[out].vectorize(xi)
    return s


def build_run(s, args, inputs, out_shape, out_dtype):
    f = tc.build(s, args)
    out = np.zeros(out_shape, out_dtype)
    f(*inputs, out)
    return out


def unary_kernel(fn, dtype, out_dtype=None, vec=False, n=N):
    A = te.placeholder((n,), dtype, name="A")
    B = te.compute((n,), lambda i: fn(A[i]), name="B")
    assert out_dtype is None or B.dtype == out_dtype, B.dtype
    return A, B, schedule_1d(B, vec)


def tol(dtype):
    return {"float16": (2e-3, 2e-3), "float32": (2e-6, 1e-6), "float64": (1e-13, 1e-14)}[dtype]


VEC = pytest.mark.parametrize("vec", [False, True], ids=["scalar", "vector"])


# element-wise arithmetic on every dtype -------------------------------------------------------


@VEC
@pytest.mark.parametrize("dtype", NUMERIC)
def test_elementwise_arith(dtype, vec):
    A = te.placeholder((N,), dtype, name="A")
    B = te.placeholder((N,), dtype, name="B")
    C = te.compute((N,), lambda i: A[i] * B[i] + A[i] - B[i], name="C")
    assert C.dtype == dtype
    s = schedule_1d(C, vec)
    a, b = rand(N, dtype), rand(N, dtype)
    out = build_run(s, [A, B, C], [a, b], (N,), dtype)
    with np.errstate(over="ignore"):
        ref = a * b + a - b
    if dtype == "float16":  # tecomp may contract a * b + a into an fma
        np.testing.assert_allclose(out, ref, rtol=2e-3, atol=2e-2)
    elif np.dtype(dtype).kind == "f":
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(out, ref)  # ints wrap like numpy


@VEC
@pytest.mark.parametrize("dtype", NUMERIC)
def test_min_max_elementwise(dtype, vec):
    A = te.placeholder((N,), dtype, name="A")
    B = te.placeholder((N,), dtype, name="B")
    C = te.compute((N,), lambda i: te.max(A[i], B[i]) - te.min(A[i], B[i]), name="C")
    s = schedule_1d(C, vec)
    a, b = rand(N, dtype), rand(N, dtype)
    out = build_run(s, [A, B, C], [a, b], (N,), dtype)
    np.testing.assert_array_equal(out, np.maximum(a, b) - np.minimum(a, b))


@VEC
@pytest.mark.parametrize("dtype", DTYPES)
def test_copy_and_compare(dtype, vec):
    A = te.placeholder((N,), dtype, name="A")
    B = te.placeholder((N,), dtype, name="B")
    C = te.compute((N,), lambda i: A[i] < B[i], name="C")
    D = te.compute((N,), lambda i: te.if_then_else(C[i], A[i], B[i]), name="D")
    assert C.dtype == "bool" and D.dtype == dtype
    s = te.create_schedule(D.op)
    if vec:
        for t in (C, D):
            xo, xi = s[t].split(t.op.axis[0], factor=16)
            s[t].vectorize(xi)
    f = tc.build(s, [A, B, C, D])
    a, b = rand(N, dtype), rand(N, dtype)
    c, d = np.zeros(N, bool), np.zeros(N, dtype)
    f(a, b, c, d)
    np.testing.assert_array_equal(c, a < b)
    np.testing.assert_array_equal(d, np.where(a < b, a, b))


# reductions -----------------------------------------------------------------------------------


@VEC
@pytest.mark.parametrize("dtype", NUMERIC)
@pytest.mark.parametrize("red", ["sum", "max", "min", "prod"])
def test_reduction(dtype, red, vec):
    # reduce over rows; the spatial axis (columns) is the vectorized one
    n, k = N, 23 if red != "prod" else 6
    A = te.placeholder((k, n), dtype, name="A")
    r = te.reduce_axis((0, k), name="r")
    fn = {"sum": te.sum, "max": te.max, "min": te.min, "prod": te.prod}[red]
    B = te.compute((n,), lambda i: fn(A[r, i], axis=r), name="B")
    assert B.dtype == dtype
    s = te.create_schedule(B.op)
    if vec:
        io, ii = s[B].split(B.op.axis[0], factor=16)
        s[B].reorder(io, r, ii)
        s[B].vectorize(ii)
    lo, hi = (-3, 3) if red == "prod" else (None, None)
    a = rand((k, n), dtype, lo, hi)
    out = build_run(s, [A, B], [a], (n,), dtype)
    ref = getattr(np, red)(a, axis=0, dtype=dtype) if red in ("sum", "prod") else getattr(np, red)(a, 0)
    if np.dtype(dtype).kind == "f":
        rt = {"float16": 1e-2, "float32": 1e-5, "float64": 1e-12}[dtype]
        np.testing.assert_allclose(out, ref, rtol=rt, atol=rt * 10)
    else:
        np.testing.assert_array_equal(out, ref)


def test_reduction_accumulates_in_wider_type_via_cast():
    A = te.placeholder((4, 300), "int8", name="A")
    r = te.reduce_axis((0, 300), name="r")
    B = te.compute((4,), lambda i: te.sum(A[i, r].astype("int32"), axis=r), name="B")
    assert B.dtype == "int32"
    s = te.create_schedule(B.op)
    a = rand((4, 300), "int8", -128, 127)
    out = build_run(s, [A, B], [a], (4,), "int32")
    np.testing.assert_array_equal(out, a.astype(np.int32).sum(1))


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_min_max_value(dtype):
    A = te.placeholder((3, 7), dtype, name="A")
    r = te.reduce_axis((0, 7), name="r")
    lo = te.compute((3,), lambda i: te.max(A[i, r], axis=r, where=r > 100), name="lo")
    hi = te.compute((3,), lambda i: te.min(A[i, r], axis=r, where=r > 100), name="hi")
    s = te.create_schedule([lo.op, hi.op])
    f = tc.build(s, [A, lo, hi])
    a = rand((3, 7), dtype)
    o1, o2 = np.zeros(3, dtype), np.zeros(3, dtype)
    f(a, o1, o2)  # empty reductions give the identities: min_value / max_value
    if dtype == "float32":
        assert np.all(o1 == -np.inf) and np.all(o2 == np.inf)
    elif dtype == "bool":
        assert not o1.any() and o2.all()
    else:
        assert np.all(o1 == np.iinfo(dtype).min) and np.all(o2 == np.iinfo(dtype).max)
    for d in INTS:
        assert te.min_value(d).value == np.iinfo(d).min
        assert te.max_value(d).value == np.iinfo(d).max
        assert te.min_value(d).dtype == d


def test_custom_comm_reducer_sum_of_squares_and_argmin():
    n, k = 4, 19
    A = te.placeholder((n, k), "float64", name="A")
    sumsq = te.comm_reducer(lambda x, y: x + y * y, lambda d: tc.const(0, d), name="sumsq")
    r = te.reduce_axis((0, k), name="r")
    B = te.compute((n,), lambda i: sumsq(A[i, r], axis=r), name="B")
    argmin = te.comm_reducer(
        lambda x, y: (te.if_then_else(x[1] <= y[1], x[0], y[0]),
                      te.if_then_else(x[1] <= y[1], x[1], y[1])),
        lambda t0, t1: (tc.const(-1, t0), te.max_value(t1)), name="argmin")
    r2 = te.reduce_axis((0, k), name="r2")
    idx, val = te.compute((n,), lambda i: argmin((r2, A[i, r2]), axis=r2), name="am")
    s = te.create_schedule([B.op, idx.op])
    f = tc.build(s, [A, B, idx, val])
    a = rand((n, k), "float64")
    b, oi, ov = np.zeros(n), np.zeros(n, "int32"), np.zeros(n)
    f(a, b, oi, ov)
    np.testing.assert_allclose(b, (a * a).sum(1))
    np.testing.assert_array_equal(oi, a.argmin(1))
    np.testing.assert_array_equal(ov, a.min(1))


@VEC
@pytest.mark.parametrize("dtype", NUMERIC)
def test_custom_reducer_every_dtype(dtype, vec):
    absmax = te.comm_reducer(lambda x, y: te.max(x, te.abs(y)), lambda d: tc.const(0, d),
                             name="absmax")
    k, n = 13, N
    A = te.placeholder((k, n), dtype, name="A")
    r = te.reduce_axis((0, k), name="r")
    B = te.compute((n,), lambda i: absmax(A[r, i], axis=r), name="B")
    s = te.create_schedule(B.op)
    if vec:
        io, ii = s[B].split(B.op.axis[0], factor=16)
        s[B].reorder(io, r, ii)
        s[B].vectorize(ii)
    a = rand((k, n), dtype)
    np.testing.assert_array_equal(build_run(s, [A, B], [a], (n,), dtype), np.abs(a).max(0))


@VEC
@pytest.mark.parametrize("kind", ["or", "and"])
def test_bool_comm_reducers(kind, vec):
    red = te.comm_reducer((lambda x, y: x | y) if kind == "or" else (lambda x, y: te.all(x, y)),
                          lambda d: tc.const(kind == "and", d), name=kind)
    A = te.placeholder((13, N), "bool", name="A")
    r = te.reduce_axis((0, 13), name="r")
    B = te.compute((N,), lambda i: red(A[r, i], axis=r), name="B")
    s = te.create_schedule(B.op)
    if vec:
        io, ii = s[B].split(B.op.axis[0], factor=16)
        s[B].reorder(io, r, ii)
        s[B].vectorize(ii)
    a = RNG.random((13, N)) < (0.1 if kind == "or" else 0.9)
    ref = a.any(0) if kind == "or" else a.all(0)
    np.testing.assert_array_equal(build_run(s, [A, B], [a], (N,), "bool"), ref)


def test_custom_reducer_with_init_and_where():
    n, k = 3, 12
    A = te.placeholder((n, k), "int32", name="A")
    r = te.reduce_axis((0, k), name="r")
    B = te.compute((n,), lambda i: te.sum(A[i, r], axis=r, where=A[i, r] > 0, init=100), name="B")
    s = te.create_schedule(B.op)
    a = rand((n, k), "int32")
    out = build_run(s, [A, B], [a], (n,), "int32")
    np.testing.assert_array_equal(out, np.where(a > 0, a, 0).sum(1) + 100)


# every dtype through scheduled pipelines ------------------------------------------------------


@pytest.mark.parametrize("n", [32, 37], ids=["divisible", "nondivisible"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_dtype_through_scheduled_pipeline(dtype, n):
    # P = f(A) -> R = max over a row of P -> O = (P == R): cache_read, compute_at, split,
    # parallel, vectorize with a tail, all on this dtype
    m = 12
    A = te.placeholder((n, m), dtype, name="A")
    P = te.compute((n, m), (lambda i, j: ~A[i, j]) if dtype == "bool" else (lambda i, j: A[i, j] * 3),
                   name="P")
    r = te.reduce_axis((0, m), name="r")
    R = te.compute((n,), lambda i: te.max(P[i, r], axis=r), name="R")
    O = te.compute((n, m), lambda i, j: P[i, j] == R[i], name="O")
    s = te.create_schedule(O.op)
    AA = s.cache_read(A, "local", [P])
    i, j = O.op.axis
    io, ii = s[O].split(i, factor=8)
    jo, ji = s[O].split(j, factor=8)
    s[O].parallel(io)
    s[O].vectorize(ji)
    for t in (R, P, AA):
        s[t].compute_at(s[O], io)
    s[P].vectorize(s[P].op.axis[1])
    a = rand((n, m), dtype)
    with np.errstate(over="ignore"):
        p = ~a if dtype == "bool" else a * np.array(3, dtype)
    out = build_run(s, [A, O], [a], (n, m), "bool")
    np.testing.assert_array_equal(out, p == p.max(1, keepdims=True))


@pytest.mark.parametrize("k", [64, 77], ids=["divisible", "nondivisible"])
@pytest.mark.parametrize("dtype", NUMERIC)
def test_dtype_rfactor_sum(dtype, k):
    A = te.placeholder((3, k), dtype, name="A")
    r = te.reduce_axis((0, k), name="r")
    B = te.compute((3,), lambda i: te.sum(A[i, r], axis=r), name="B")
    s = te.create_schedule(B.op)
    ro, ri = s[B].split(r, factor=16)
    BF = s.rfactor(B, ri)
    s[BF].vectorize(s[BF].op.axis[0])
    s[BF].compute_at(s[B], s[B].op.axis[0])
    a = rand((3, k), dtype, *((-1, 1) if dtype == "float16" else (None, None)))
    out = build_run(s, [A, B], [a], (3,), dtype)
    if np.dtype(dtype).kind == "f":
        ref = a.astype("float64").sum(1)
        half = dtype == "float16"
        np.testing.assert_allclose(out, ref, rtol=2e-2 if half else 1e-5, atol=0.1 if half else 1e-4)
    else:
        np.testing.assert_array_equal(out, a.sum(1, dtype=dtype))  # wraps like numpy


# casts ----------------------------------------------------------------------------------------


CAST_PAIRS = [(a, b) for a in DTYPES for b in DTYPES if a != b]


@pytest.mark.parametrize("src,dst", CAST_PAIRS)
def test_cast(src, dst):
    A = te.placeholder((N,), src, name="A")
    B = te.compute((N,), lambda i: A[i].astype(dst), name="B")
    assert B.dtype == dst
    s = schedule_1d(B, vec=True)
    # values representable in both, so numpy's astype is the reference (out-of-range float->int
    # saturates; tests/codegen/test_llvm_cpu_arith.py checks that against its own reference)
    if np.dtype(src).kind == "f":
        a = rand(N, src, -9.0, 9.0)
        if np.dtype(dst).kind == "u":
            a = np.abs(a)
        a[:4] = [0.0, -0.0 if np.dtype(dst).kind != "u" else 0.25, 2.5, 0.75]
    elif np.dtype(src).kind == "b":
        a = rand(N, src)
    else:
        a = rand(N, src, *((0, 120) if np.dtype(dst).kind == "u" else (-120, 120)))
        if np.dtype(src).kind in "iu" and dst in INTS:  # wrap-around of narrowing int casts
            a = rand(N, src)
    out = build_run(s, [A, B], [a], (N,), dst)
    with np.errstate(invalid="ignore"):
        ref = a.astype(dst)
    np.testing.assert_array_equal(out, ref)


def test_narrowing_int_cast_wraps():
    A = te.placeholder((6,), "int32", name="A")
    B = te.compute((6,), lambda i: A[i].astype("int8"), name="B")
    C = te.compute((6,), lambda i: A[i].astype("uint8"), name="C")
    s = te.create_schedule([B.op, C.op])
    f = tc.build(s, [A, B, C])
    a = np.array([127, 128, 255, 256, -1, -129], "int32")
    b, c = np.zeros(6, "int8"), np.zeros(6, "uint8")
    f(a, b, c)
    np.testing.assert_array_equal(b, a.astype("int8"))
    np.testing.assert_array_equal(c, a.astype("uint8"))


def test_implicit_promotion():
    A = te.placeholder((N,), "int8", name="A")
    B = te.placeholder((N,), "float32", name="B")
    C = te.placeholder((N,), "int64", name="C")
    D = te.compute((N,), lambda i: A[i] + B[i], name="D")
    E = te.compute((N,), lambda i: A[i] + C[i], name="E")
    F = te.compute((N,), lambda i: A[i] * 2, name="F")  # python ints keep the tensor's dtype
    assert (D.dtype, E.dtype, F.dtype) == ("float32", "int64", "int8")
    s = te.create_schedule([D.op, E.op, F.op])
    f = tc.build(s, [A, B, C, D, E, F])
    a, b, c = rand(N, "int8"), rand(N, "float32"), rand(N, "int64")
    d, e, g = np.zeros(N, "float32"), np.zeros(N, "int64"), np.zeros(N, "int8")
    f(a, b, c, d, e, g)
    np.testing.assert_allclose(d, a.astype("float32") + b)
    np.testing.assert_array_equal(e, a.astype("int64") + c)
    np.testing.assert_array_equal(g, a * np.int8(2))


# math functions ---------------------------------------------------------------------------------


def _erf(x):
    from math import erf

    return np.vectorize(erf)(x.astype("float64"))


MATH = {
    "exp": (te.exp, np.exp, (-10, 10)),
    "log": (te.log, np.log, (0.01, 100)),
    "sqrt": (te.sqrt, np.sqrt, (0, 100)),
    "rsqrt": (te.rsqrt, lambda x: 1 / np.sqrt(x), (0.01, 100)),
    "tanh": (te.tanh, np.tanh, (-8, 8)),
    "sigmoid": (te.sigmoid, lambda x: 1 / (1 + np.exp(-x.astype("float64"))), (-20, 20)),
    "erf": (te.erf, _erf, (-4, 4)),
    "abs": (te.abs, np.abs, (-5, 5)),
    "floor": (te.floor, np.floor, (-5, 5)),
    "ceil": (te.ceil, np.ceil, (-5, 5)),
}


@VEC
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", list(MATH))
def test_math_unary(name, dtype, vec):
    fn, ref_fn, (lo, hi) = MATH[name]
    A, B, s = unary_kernel(fn, dtype, out_dtype=dtype, vec=vec)
    a = rand(N, dtype, lo, hi)
    out = build_run(s, [A, B], [a], (N,), dtype)
    ref = ref_fn(a.astype("float64")).astype(dtype)
    rtol, atol = tol(dtype)
    rtol = rtol * 4  # a few ulp
    np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol)


@VEC
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_math_special_values(dtype, vec):
    vals = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0], dtype)
    n = len(vals)
    for name in ("exp", "log", "sqrt", "tanh", "sigmoid", "erf", "abs", "floor", "ceil"):
        fn, ref_fn, _ = MATH[name]
        A, B, s = unary_kernel(fn, dtype, vec=False, n=n)
        if vec:
            s[B].vectorize(B.op.axis[0])
        with np.errstate(all="ignore"):
            ref = ref_fn(vals.astype("float64")).astype(dtype)
            out = build_run(s, [A, B], [vals], (n,), dtype)
        np.testing.assert_allclose(out, ref, rtol=1e-6, err_msg=name)


@VEC
@pytest.mark.parametrize("dtype", FLOATS)
def test_power(dtype, vec):
    A = te.placeholder((N,), dtype, name="A")
    B = te.placeholder((N,), dtype, name="B")
    C = te.compute((N,), lambda i: te.power(A[i], B[i]), name="C")
    D = te.compute((N,), lambda i: te.power(A[i], 2), name="D")
    s = te.create_schedule([C.op, D.op])
    if vec:
        for t in (C, D):
            s[t].vectorize(s[t].split(t.op.axis[0], factor=8)[1])
    f = tc.build(s, [A, B, C, D])
    a, b = rand(N, dtype, 0.1, 4), rand(N, dtype, -3, 3)
    c, d = np.zeros(N, dtype), np.zeros(N, dtype)
    f(a, b, c, d)
    rtol = {"float16": 4e-3, "float32": 1e-5, "float64": 1e-13}[dtype]
    np.testing.assert_allclose(c, np.power(a.astype("float64"), b).astype(dtype), rtol=rtol)
    np.testing.assert_allclose(d, (a.astype("float64") ** 2).astype(dtype), rtol=rtol)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64"])
def test_abs_int(dtype):
    A, B, s = unary_kernel(te.abs, dtype, out_dtype=dtype, vec=True)
    a = rand(N, dtype)
    np.testing.assert_array_equal(build_run(s, [A, B], [a], (N,), dtype), np.abs(a))


def test_math_on_int_converts_to_float32():
    A, B, s = unary_kernel(te.sqrt, "int32", out_dtype="float32")
    a = rand(N, "int32", 0, 1000)
    np.testing.assert_allclose(build_run(s, [A, B], [a], (N,), "float32"),
                               np.sqrt(a).astype("float32"), rtol=1e-6)


# integer division semantics ---------------------------------------------------------------------


@VEC
@pytest.mark.parametrize("dtype", ["int8", "int32", "int64"])
def test_floordiv_floormod_negative(dtype, vec):
    A = te.placeholder((N,), dtype, name="A")
    B = te.placeholder((N,), dtype, name="B")
    D = te.compute((N,), lambda i: tc.indexdiv(A[i], B[i]), name="D")
    M = te.compute((N,), lambda i: tc.indexmod(A[i], B[i]), name="M")
    T = te.compute((N,), lambda i: tc.truncdiv(A[i], B[i]), name="T")  # truncates, like C
    R = te.compute((N,), lambda i: tc.floordiv(A[i], 7) + tc.floormod(A[i], -3), name="R")
    s = te.create_schedule([D.op, M.op, T.op, R.op])
    if vec:
        for t in (D, M, T, R):
            s[t].vectorize(s[t].split(t.op.axis[0], factor=8)[1])
    f = tc.build(s, [A, B, D, M, T, R])
    a = rand(N, dtype, -100, 100)
    b = rand(N, dtype, -9, 9)
    b[b == 0] = 3
    b[:2] = [-1, 1]
    outs = [np.zeros(N, dtype) for _ in range(4)]
    f(a, b, *outs)
    np.testing.assert_array_equal(outs[0], a // b)
    np.testing.assert_array_equal(outs[1], a % b)
    np.testing.assert_array_equal(outs[2], (np.trunc(a / b)).astype(dtype))
    np.testing.assert_array_equal(outs[3], (a // 7 + a % -3).astype(dtype))


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64"])
def test_int_min_divided_by_minus_one_wraps(dtype):
    # x86 traps on INT_MIN / -1; tecomp gives the wrapped result, like numpy
    A = te.placeholder((4,), dtype, name="A")
    B = te.placeholder((4,), dtype, name="B")
    D = te.compute((4,), lambda i: A[i] // B[i], name="D")
    M = te.compute((4,), lambda i: A[i] % B[i], name="M")
    T = te.compute((4,), lambda i: tc.truncdiv(A[i], B[i]), name="T")
    s = te.create_schedule([D.op, M.op, T.op])
    f = tc.build(s, [A, B, D, M, T])
    lo = np.iinfo(dtype).min
    a = np.array([lo, lo, lo + 1, 7], dtype)
    b = np.array([-1, 1, -1, -1], dtype)
    d, m, t = (np.zeros(4, dtype) for _ in range(3))
    f(a, b, d, m, t)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(d, a // b)
        np.testing.assert_array_equal(m, a % b)
        np.testing.assert_array_equal(t, a // b)  # exact here: every quotient is whole


def test_uint8_division():
    A = te.placeholder((N,), "uint8", name="A")
    B = te.compute((N,), lambda i: A[i] // 7 + A[i] % 5 + A[i] / 3, name="B")
    s = schedule_1d(B, vec=True)
    a = rand(N, "uint8", 0, 255)
    out = build_run(s, [A, B], [a], (N,), "uint8")
    np.testing.assert_array_equal(out, (a // 7 + a % 5 + a // 3).astype("uint8"))


def test_float_floordiv_floormod():
    A = te.placeholder((N,), "float32", name="A")
    D = te.compute((N,), lambda i: A[i] // 0.75, name="D")
    M = te.compute((N,), lambda i: A[i] % 0.75, name="M")
    s = te.create_schedule([D.op, M.op])
    f = tc.build(s, [A, D, M])
    a = rand(N, "float32")
    d, m = np.zeros(N, "float32"), np.zeros(N, "float32")
    f(a, d, m)
    np.testing.assert_allclose(d, np.floor(a / np.float32(0.75)))
    np.testing.assert_allclose(m, a - np.floor(a / np.float32(0.75)) * np.float32(0.75), atol=1e-6)


def test_index_floordiv_floormod_in_layout_transform():
    # indexdiv/indexmod on axes: NC -> NCc (blocking by 4) with negative-free indices
    n, c = 3, 10
    A = te.placeholder((n, c), "float32", name="A")
    B = te.compute((n, (c + 3) // 4, 4), lambda i, co, ci: te.if_then_else(
        co * 4 + ci < c, A[i, te.min(co * 4 + ci, c - 1)], 0.0), name="B")
    C = te.compute((n, c), lambda i, j: B[i, tc.indexdiv(j, 4), tc.indexmod(j, 4)], name="C")
    s = te.create_schedule(C.op)
    f = tc.build(s, [A, B, C])
    a = rand((n, c), "float32")
    b, cc = np.zeros((n, 3, 4), "float32"), np.zeros((n, c), "float32")
    f(a, b, cc)
    np.testing.assert_array_equal(cc, a)
    np.testing.assert_array_equal(b.reshape(n, 12)[:, :c], a)
    assert not b.reshape(n, 12)[:, c:].any()


# bool tensors and logic ------------------------------------------------------------------------


@VEC
def test_bool_tensors_all_any(vec):
    A = te.placeholder((N,), "bool", name="A")
    B = te.placeholder((N,), "bool", name="B")
    X = te.placeholder((N,), "int32", name="X")
    C = te.compute((N,), lambda i: te.all(A[i], B[i], X[i] > 0), name="C")
    D = te.compute((N,), lambda i: te.any(A[i], te.logical_not(B[i]), X[i] == 3), name="D")
    E = te.compute((N,), lambda i: (A[i] & B[i]) | ~A[i], name="E")
    s = te.create_schedule([C.op, D.op, E.op])
    if vec:
        for t in (C, D, E):
            s[t].vectorize(s[t].split(t.op.axis[0], factor=16)[1])
    f = tc.build(s, [A, B, X, C, D, E])
    a, b, x = rand(N, "bool"), rand(N, "bool"), rand(N, "int32", -5, 5)
    c, d, e = (np.zeros(N, bool) for _ in range(3))
    f(a, b, x, c, d, e)
    np.testing.assert_array_equal(c, a & b & (x > 0))
    np.testing.assert_array_equal(d, a | ~b | (x == 3))
    np.testing.assert_array_equal(e, (a & b) | ~a)


def test_bool_sum_via_cast_and_any_reduction():
    A = te.placeholder((4, 9), "bool", name="A")
    r = te.reduce_axis((0, 9), name="r")
    r2 = te.reduce_axis((0, 9), name="r2")
    cnt = te.compute((4,), lambda i: te.sum(A[i, r].astype("int32"), axis=r), name="cnt")
    anyr = te.compute((4,), lambda i: te.max(A[i, r2], axis=r2), name="anyr")
    s = te.create_schedule([cnt.op, anyr.op])
    f = tc.build(s, [A, cnt, anyr])
    a = rand((4, 9), "bool")
    a[0] = False
    c, y = np.zeros(4, "int32"), np.zeros(4, bool)
    f(a, c, y)
    np.testing.assert_array_equal(c, a.sum(1))
    np.testing.assert_array_equal(y, a.any(1))


@pytest.mark.parametrize("dtype", NUMERIC)
def test_if_then_else_padding_never_reads_out_of_bounds(dtype):
    n = 17
    A = te.placeholder((n,), dtype, name="A")
    B = te.compute((n + 4,), lambda i: te.if_then_else(
        te.all(i >= 2, i < n + 2), A[i - 2], tc.const(1, dtype)), name="B")
    s = te.create_schedule(B.op)
    xo, xi = s[B].split(B.op.axis[0], factor=8)
    s[B].vectorize(xi)
    f = tc.build(s, [A, B], debug=True)  # an out-of-bounds read would raise IndexError
    a = rand(n, dtype)
    b = np.zeros(n + 4, dtype)
    f(a, b)
    np.testing.assert_array_equal(b, np.pad(a, 2, constant_values=1))

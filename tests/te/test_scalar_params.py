"""Scalar kernel parameters: a te.var in build's / lower's argument list (TVM semantics)."""

from __future__ import annotations

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.errors import LoweringError
from tecomp.lowering import lower
from tecomp.runtime import interp


def _axpy(dtype: str = "float32"):
    n = te.var("n")
    alpha = te.var("alpha", dtype)
    A = te.placeholder((n,), dtype, name="A")
    B = te.compute((n,), lambda i: A[i] * alpha + 1, name="B")
    return n, alpha, A, B


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float_scalar_jit_and_interp(dtype: str) -> None:
    n, alpha, A, B = _axpy(dtype)
    s = te.create_schedule(B.op)
    xo, xi = s[B].split(B.op.axis[0], factor=4)
    s[B].parallel(xo)
    f = tc.build(s, [A, alpha, B])
    a = np.random.default_rng(30).random(37).astype(dtype)
    b = np.zeros_like(a)
    # The JIT may contract a * alpha + 1 to one fma, numpy rounds the product first: where
    # a * alpha is close to -1 the sum cancels and the relative error grows, so an absolute
    # tolerance of a few ulps of 1 is the honest bound.
    tol = {"rtol": 1e-5, "atol": 4 * float(np.finfo(dtype).eps)}
    f(a, 2.5, b)
    np.testing.assert_allclose(b, a * 2.5 + 1, **tol)
    f(a, np.float32(-1.5), b)  # numpy scalars and ints are accepted for floats
    np.testing.assert_allclose(b, a * -1.5 + 1, **tol)
    f(a, 3, b)
    np.testing.assert_allclose(b, a * 3 + 1, **tol)
    r = np.zeros_like(a)
    interp.run(lower(s, [A, alpha, B]), a, 3, r)
    np.testing.assert_allclose(r, b, **tol)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int16", "int32", "int64", "uint32", "uint64"])
def test_int_scalar_types_and_range(dtype: str) -> None:
    k = te.var("k", dtype)
    A = te.placeholder((8,), "int64", name="A")
    B = te.compute((8,), lambda i: A[i] + k.astype("int64"), name="B")
    f = tc.build(te.create_schedule(B.op), [A, k, B])
    a = np.arange(8, dtype="int64")
    b = np.zeros_like(a)
    info = np.iinfo(dtype)
    for v in (int(info.min), int(info.max), 7):
        f(a, v, b)
        # the cast to int64 wraps uint64 values above INT64_MAX, as C does
        np.testing.assert_array_equal(b, a + np.array(v, dtype).astype("int64"))
    with pytest.raises(ValueError, match="out of range"):
        f(a, int(info.max) + 1, b)
    with pytest.raises(ValueError, match="out of range"):
        f(a, int(info.min) - 1, b)
    with pytest.raises(TypeError, match=r"argument 1 \('k'\)"):
        f(a, 1.5, b)
    with pytest.raises(TypeError, match="'k'"):
        f(a, True, b)


def test_wrong_type_names_the_parameter() -> None:
    _, alpha, A, B = _axpy()
    f = tc.build(te.create_schedule(B.op), [A, alpha, B])
    a = np.ones(4, "float32")
    with pytest.raises(TypeError, match=r"argument 1 \('alpha'\).*float32"):
        f(a, "2.0", a.copy())
    with pytest.raises(TypeError, match="alpha"):
        f(a, np.ones(2), a.copy())
    with pytest.raises(TypeError, match="takes 3 arguments"):
        f(a, a.copy())


def test_scalar_as_loop_extent_and_in_reduction() -> None:
    k = te.var("k")
    A = te.placeholder((16,), name="A")
    r = te.reduce_axis((0, k), name="r")
    B = te.compute((1,), lambda i: te.sum(A[r], axis=r), name="B")
    f = tc.build(te.create_schedule(B.op), [A, k, B])
    a = np.random.default_rng(84).random(16).astype("float32")
    b = np.zeros(1, "float32")
    f(a, 5, b)
    np.testing.assert_allclose(b[0], a[:5].sum(), rtol=1e-5)


def test_dim_var_as_explicit_argument_must_agree() -> None:
    n, alpha, A, B = _axpy()
    s = te.create_schedule(B.op)
    f = tc.build(s, [A, alpha, n, B])
    a = np.arange(5, dtype="float32")
    b = np.zeros_like(a)
    f(a, 2.0, 5, b)
    np.testing.assert_allclose(b, a * 2 + 1)
    with pytest.raises(ValueError, match=r"'n'.* is 4, but n = 5"):
        f(a, 2.0, 4, b)
    fn = lower(s, [A, alpha, n, B])
    with pytest.raises(ValueError, match="n"):
        interp.run(fn, a, 2.0, 4, b)


def test_dim_bound_only_by_scalar() -> None:
    # n appears only inside a shape expression (n + 1): the explicit argument gives it
    n = te.var("n")
    A = te.placeholder((n + 1,), name="A")
    B = te.compute((n + 1,), lambda i: A[i] * 2, name="B")
    f = tc.build(te.create_schedule(B.op), [n, A, B])
    a = np.arange(6, dtype="float32")
    b = np.zeros_like(a)
    f(5, a, b)
    np.testing.assert_allclose(b, a * 2)
    with pytest.raises(ValueError):
        f(4, a, b)


def test_unlisted_var_is_a_clear_error() -> None:
    _, alpha, A, B = _axpy()
    with pytest.raises(LoweringError, match="alpha"):
        tc.build(te.create_schedule(B.op), [A, B])


def test_bad_scalar_declarations() -> None:
    _, alpha, A, B = _axpy()
    s = te.create_schedule(B.op)
    with pytest.raises(LoweringError, match="listed twice"):
        tc.lower(s, [A, alpha, alpha, B])
    h = te.var("h", "float16")
    C = te.compute((4,), lambda i: h.astype("float32"), name="C")
    with pytest.raises(LoweringError, match="float16"):
        tc.lower(te.create_schedule(C.op), [h, C])
    # a cuda target takes scalars too (tests/runtime/test_gpu_scalar_params.py): what is
    # refused here is the unbound loop, not alpha
    with pytest.raises(tc.ScheduleError, match="thread-bound"):
        tc.lower(s, [A, alpha, B], target="cuda -arch=sm_80")

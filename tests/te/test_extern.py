"""te.extern with tc.tir.decl_buffer and binds= (TVM's "External Tensor Functions")."""

from __future__ import annotations

import numpy as np
import pytest
from c_libs import SGEMM_C, build_c_library, load_numpy_openblas

import tecomp as tc
from tecomp import te
from tecomp.errors import TecompError
from tecomp.runtime import interp


@pytest.fixture(scope="module")
def gemm_lib(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_c_library(tmp_path_factory, SGEMM_C, "tcgemm")


def _inputs(n: int, l: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.random((n, l), dtype="float32"), rng.random((l, m), dtype="float32")


def test_extern_gemm_then_compute(gemm_lib: str) -> None:
    n, l, m = 64, 48, 40
    A = te.placeholder((n, l), name="A")
    B = te.placeholder((l, m), name="B")
    C = te.extern((n, m), [A, B],
                  lambda ins, outs: te.call_extern("int32", "tc_test_sgemm", ins[0].data,
                                                   ins[1].data, outs[0].data, n, l, m,
                                                   tc.const(l, "int64"), tc.const(m, "int64")),
                  name="C")
    D = te.compute(C.shape, lambda i, j: C[i, j] + 1.0, name="D")
    s = te.create_schedule(D.op)
    xo, xi = s[D].split(D.op.axis[1], factor=8)
    s[D].vectorize(xi)
    f = tc.build(s, [A, B, D])
    a, b = _inputs(n, l, m)
    d = np.zeros((n, m), "float32")
    f(a, b, d)
    np.testing.assert_allclose(d, a @ b + 1.0, rtol=1e-5)
    # the extern's output passed as an argument too
    s2 = te.create_schedule(D.op)
    f2 = tc.build(s2, [A, B, C, D])
    c = np.zeros((n, m), "float32")
    d[:] = 0
    f2(a, b, c, d)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5)
    np.testing.assert_allclose(d, c + 1.0, rtol=1e-6)


def test_decl_buffer_binds_and_access_ptr(gemm_lib: str) -> None:
    n, l, m = 32, 16, 24
    A = te.placeholder((n, l), name="A")
    B = te.placeholder((l, m), name="B")
    s1 = te.var("s1")
    Ab = tc.tir.decl_buffer(A.shape, A.dtype, name="Ab", offset_factor=1, strides=[s1, 1])
    Bb = tc.tir.decl_buffer(B.shape, B.dtype, name="Bb", elem_offset=0)
    C = te.extern((n, m), [A, B],
                  lambda ins, outs: te.call_extern("int32", "tc_test_sgemm", ins[0].access_ptr("r"),
                                                   ins[1].access_ptr("r"), outs[0].access_ptr("w"),
                                                   n, l, m, s1.astype("int64"),
                                                   tc.const(m, "int64")),
                  name="C", in_buffers=[Ab, Bb])
    s = te.create_schedule(C.op)
    f = tc.build(s, [A, B, C], binds={A: Ab})
    a, b = _inputs(n, l, m)
    c = np.zeros((n, m), "float32")
    f(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5)
    assert Ab.offset_factor == 1 and isinstance(Ab.elem_offset, tc.tir.Var)


def test_numpy_openblas_sgemm() -> None:
    load_numpy_openblas()
    n, l, m = 96, 64, 80
    A = te.placeholder((n, l), name="A")
    B = te.placeholder((l, m), name="B")

    def sgemm(ins: list, outs: list):  # cblas_sgemm(RowMajor, NoTrans, NoTrans, ...) ILP64
        i64 = lambda v: tc.const(v, "int64")  # noqa: E731
        return te.call_extern("int32", "scipy_cblas_sgemm64_", 101, 111, 111, i64(n), i64(m),
                              i64(l), tc.const(1.0, "float32"), ins[0].data, i64(l),
                              ins[1].data, i64(m), tc.const(0.0, "float32"), outs[0].data,
                              i64(m))

    C = te.extern((n, m), [A, B], sgemm, name="C")
    f = tc.build(te.create_schedule(C.op), [A, B, C])
    a, b = _inputs(n, l, m)
    c = np.zeros((n, m), "float32")
    f(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4)


def test_python_callable_in_interpreter() -> None:
    n = 10
    A = te.placeholder((n,), name="A")

    @te.register_extern("tc_test_py_addone")
    def addone(a: interp.Pointer, b: interp.Pointer, k: int) -> int:
        b.array[b.offset:b.offset + k] = a.array[a.offset:a.offset + k] + 1
        return 0

    B = te.extern((n,), [A], lambda ins, outs: te.call_extern(
        "int32", "tc_test_py_addone", ins[0].data, outs[0].data, n), name="B")
    C = te.compute((n,), lambda i: B[i] * 2, name="C")
    s = te.create_schedule(C.op)
    fn = tc.lower(s, [A, C])
    a = np.arange(n, dtype="float32")
    c = np.zeros(n, "float32")
    interp.run(fn, a, c)
    np.testing.assert_array_equal(c, (a + 1) * 2)
    # compiled code needs the C symbol: a clear error, not a crash
    with pytest.raises(TecompError, match="tc_test_py_addone"):
        tc.build(s, [A, C])


def test_bad_extern_inputs() -> None:
    A = te.placeholder((8,), name="A")
    body = lambda ins, outs: te.call_extern("int32", "f", ins[0].data)  # noqa: E731
    with pytest.raises(TecompError, match="dimension 0 of buffer"):
        te.extern((8,), [A], body, in_buffers=[tc.tir.decl_buffer((9,), "float32")])
    with pytest.raises(TecompError, match="float64"):
        te.extern((8,), [A], body, in_buffers=[tc.tir.decl_buffer((8,), "float64")])
    with pytest.raises(TecompError, match="1 in_buffers for 2"):
        te.extern((8,), [A, A], body, in_buffers=[tc.tir.decl_buffer((8,), "float32")])
    with pytest.raises(TecompError, match="out_buffers"):
        te.extern((8,), [A], body, out_buffers=[tc.tir.decl_buffer((4,), "float32")])
    # declared strides are checked against the storage at lowering (a strided argument
    # bound with binds= may have them; a compact one may not)
    X = te.placeholder((8, 4), name="X")
    Y = te.extern((8, 4), [X], body,
                  in_buffers=[tc.tir.decl_buffer((8, 4), "float32", strides=[5, 1])])
    with pytest.raises(TecompError, match=r"stride 0 \(C-contiguous storage\) of buffer .* is 5, but the tensor needs 4"):
        tc.lower(te.create_schedule(Y.op), [X, Y])
    with pytest.raises(TecompError, match="statement or an expression"):
        te.extern((8,), [A], lambda ins, outs: 3)
    with pytest.raises(TecompError, match="call_packed"):
        tc.tir.call_packed("tvm.contrib.cblas.matmul", A)


def test_missing_symbol_is_a_clear_error() -> None:
    A = te.placeholder((4,), name="A")
    B = te.extern((4,), [A], lambda ins, outs: te.call_extern(
        "int32", "tc_test_no_such_symbol", ins[0].data, outs[0].data), name="B")
    with pytest.raises(TecompError, match="tc_test_no_such_symbol"):
        tc.build(te.create_schedule(B.op), [A, B])


def test_extern_cannot_be_serialized_for_tuning() -> None:
    from tecomp.te.serialize import dag_to_json

    A = te.placeholder((4,), name="A")
    B = te.extern((4,), [A], lambda ins, outs: te.call_extern("int32", "f", ins[0].data),
                  name="B")
    with pytest.raises(TecompError, match="cannot be tuned"):
        dag_to_json([A, B])

"""Strided kernel arguments: ``binds={A: tc.tir.decl_buffer(..., strides=[te.var("s"), 1])}``
(TVM's way of taking a row-padded matrix or a column slice without a copy)."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest
from c_libs import SGEMM_C, build_c_library, load_numpy_openblas

import tecomp as tc
from tecomp import te
from tecomp.errors import LoweringError, TecompError
from tecomp.runtime import interp, load_module
from tecomp.runtime.args import KernelSpec, ParamSpec

N, M = 16, 64


def _affine(shape: tuple = (N, M), strides: list | None = None, out_strides: list | None = None,
            **kw: object) -> tuple:
    A = te.placeholder(shape, name="A")
    B = te.compute(shape, lambda i, j: A[i, j] * 2.0 + 1.0, name="B")
    binds = {}
    if strides is not None:
        binds[A] = tc.tir.decl_buffer(A.shape, A.dtype, name="Ab", strides=strides, **kw)
    if out_strides is not None:
        binds[B] = tc.tir.decl_buffer(B.shape, B.dtype, name="Bb", strides=out_strides)
    return A, B, te.create_schedule(B.op), binds


def _views() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    big = rng.random((N, 100), dtype="float32")
    padded = np.zeros((N, 80), "float32")
    padded[:, :M] = rng.random((N, M), dtype="float32")
    return {"slice": big[:, 8:72], "padded": padded[:, :M],
            "compact": rng.random((N, M), dtype="float32")}


@pytest.mark.parametrize("debug", [False, True])
def test_padded_and_sliced_inputs_compiled(debug: bool) -> None:
    A, B, s, binds = _affine(strides=[te.var("s"), 1])
    f = tc.build(s, [A, B], binds=binds, debug=debug)
    for what, a in _views().items():
        b = np.zeros((N, M), "float32")
        f(a, b)
        np.testing.assert_allclose(b, a * 2 + 1, rtol=1e-6, err_msg=what)


def test_padded_and_sliced_inputs_interpreted() -> None:
    A, B, s, binds = _affine(strides=[te.var("s"), 1])
    fn = tc.lower(s, [A, B], binds=binds)
    for what, a in _views().items():
        b = np.zeros((N, M), "float32")
        interp.run(fn, a, b)
        np.testing.assert_allclose(b, a * 2 + 1, rtol=1e-6, err_msg=what)


def test_symbolic_shape_and_strides_are_dims_after_the_shape_dims() -> None:
    n, m = te.var("n"), te.var("m")
    A, B, s, binds = _affine((n, m), strides=[te.var("s"), te.var("t")])
    fn = tc.lower(s, [A, B], binds=binds)
    assert [v.name for v in fn.dim_vars] == ["n", "m", "s", "t"]
    spec = KernelSpec.of(fn)
    assert spec.dims == ("n", "m", "s", "t") and spec.params[0].strides == ("s", "t")
    f = tc.build(s, [A, B], binds=binds)
    big = np.random.default_rng(1).random((12, 90), dtype="float32")
    for a in (big[:, 3:63:2], big[1:11, 5:45], big[::2, ::3]):  # inner stride too
        b = np.zeros(a.shape, "float32")
        f(a, b)
        np.testing.assert_allclose(b, a * 2 + 1, rtol=1e-6)
        b2 = np.zeros(a.shape, "float32")
        interp.run(fn, a, b2)
        np.testing.assert_allclose(b2, a * 2 + 1, rtol=1e-6)


def test_constant_strides_must_match() -> None:
    A, B, s, binds = _affine(strides=[80, 1])
    f = tc.build(s, [A, B], binds=binds)
    fn = tc.lower(s, [A, B], binds=binds)
    v = _views()
    b = np.zeros((N, M), "float32")
    f(v["padded"], b)
    np.testing.assert_allclose(b, v["padded"] * 2 + 1, rtol=1e-6)
    for a in (v["compact"], v["slice"]):
        with pytest.raises(ValueError, match=r"'Ab'.*axis 0 has a stride of (64|100) elements"):
            f(a, b)
        with pytest.raises(ValueError, match="Ab.*stride 0"):
            interp.run(fn, a, b)


def test_compact_constant_strides_give_a_plain_parameter() -> None:
    A, B, s, binds = _affine(strides=[M, 1])
    fn = tc.lower(s, [A, B], binds=binds)
    assert not fn.params[0].strides and not fn.dim_vars
    f = tc.build(s, [A, B], binds=binds)
    with pytest.raises(ValueError, match="C-contiguous"):
        f(_views()["slice"], np.zeros((N, M), "float32"))


def test_unusable_strides_are_clear_errors() -> None:
    A, B, s, binds = _affine(strides=[te.var("s"), 1])
    f = tc.build(s, [A, B], binds=binds)
    fn = tc.lower(s, [A, B], binds=binds)
    big = np.random.default_rng(2).random((N, 100), dtype="float32")
    b = np.zeros((N, M), "float32")
    with pytest.raises(ValueError, match=r"'Ab'.*byte stride -400 of axis 0 is negative"):
        f(big[::-1, 8:72], b)
    with pytest.raises(ValueError, match="Ab.*negative"):
        interp.run(fn, big[::-1, 8:72], b)
    raw = np.zeros(N * 258, "uint8")  # rows 258 bytes apart: not whole float32 elements
    odd = np.ndarray((N, M), "float32", buffer=raw, strides=(258, 4))
    with pytest.raises(ValueError, match="'Ab'.*not a multiple of the item size"):
        f(odd, b)
    with pytest.raises(ValueError, match="Ab.*not a multiple of the item size"):
        interp.run(fn, odd, b)
    # the innermost stride is constant 1: a view with stride 2 is refused by name
    with pytest.raises(ValueError, match=r"'Ab'.*axis 1 has a stride of 2.*expected 1"):
        f(np.zeros((N, 2 * M), "float32")[:, ::2], b)


def test_strided_output_writes_only_its_elements() -> None:
    A, B, s, binds = _affine(strides=[te.var("s"), 1], out_strides=[te.var("t"), 1])
    a = _views()["slice"]
    for debug in (False, True):
        f = tc.build(s, [A, B], binds=binds, debug=debug)
        big = np.full((N, 90), -7.0, "float32")
        f(a, big[:, 10:74])
        np.testing.assert_allclose(big[:, 10:74], a * 2 + 1, rtol=1e-6)
        assert (big[:, :10] == -7).all() and (big[:, 74:] == -7).all()
    fn = tc.lower(s, [A, B], binds=binds)
    big = np.full((N, 90), -7.0, "float32")
    interp.run(fn, a, big[:, 10:74])
    np.testing.assert_allclose(big[:, 10:74], a * 2 + 1, rtol=1e-6)
    assert (big[:, :10] == -7).all() and (big[:, 74:] == -7).all()
    # input and output interleaved in one array: disjoint elements, so allowed
    both = np.random.default_rng(3).random((N, 2 * M), dtype="float32")
    src = both[:, ::2].copy()
    A2, B2, s2, b2 = _affine(strides=[te.var("s"), te.var("u")],
                             out_strides=[te.var("t"), te.var("v")])
    f = tc.build(s2, [A2, B2], binds=b2)
    f(both[:, ::2], both[:, 1::2])
    np.testing.assert_allclose(both[:, 1::2], src * 2 + 1, rtol=1e-6)
    with pytest.raises(ValueError, match="overlaps"):
        f(both[:, ::2], both[:, ::2])


def test_vectorized_parallel_schedule_on_a_strided_input() -> None:
    n = te.var("n")
    A = te.placeholder((n, M), name="A")
    W = te.placeholder((M,), name="W")
    B = te.compute((n, M), lambda i, j: A[i, j] * W[j] + A[i, j], name="B")
    s = te.create_schedule(B.op)
    i, j = s[B].op.axis
    jo, ji = s[B].split(j, factor=8)
    s[B].vectorize(ji)
    s[B].parallel(i)
    Ab = tc.tir.decl_buffer(A.shape, A.dtype, name="Ab", strides=[te.var("lda"), 1])
    f = tc.build(s, [A, W, B], binds={A: Ab})
    assert "GOMP_parallel" in f.get_source("ll")
    rng = np.random.default_rng(4)
    big = rng.random((37, 77), dtype="float32")
    w = rng.random(M, dtype="float32")
    a = big[:, 5:5 + M]
    b = np.zeros(a.shape, "float32")
    f(a, w, b)
    np.testing.assert_allclose(b, a * w + a, rtol=1e-6)


def test_elem_offset_is_zero_for_the_kernel() -> None:
    # offset_factor gives the buffer a symbolic elem_offset (TVM): bound to 0, the array
    # coming by its own data pointer
    A, B, s, binds = _affine(strides=[te.var("s"), 1], offset_factor=16)
    assert isinstance(binds[A].elem_offset, tc.tir.Var)
    f = tc.build(s, [A, B], binds=binds)
    a = _views()["slice"]
    b = np.zeros((N, M), "float32")
    f(a, b)
    np.testing.assert_allclose(b, a * 2 + 1, rtol=1e-6)
    A, B, s, binds = _affine(strides=[te.var("s"), 1], elem_offset=4)
    with pytest.raises(TecompError, match="elem_offset"):
        tc.build(s, [A, B], binds=binds)


def test_cuda_refuses_strided_arguments() -> None:
    A, B, s, binds = _affine(strides=[te.var("s"), 1])
    with pytest.raises(LoweringError, match=r"binds of A: buffer Ab has strides \[s, 1\].*CPU targets only"):
        tc.lower(s, [A, B], target="cuda -arch=sm_80", binds=binds)


def _exported(tmp_path: Path) -> Path:
    A, B, s, binds = _affine(strides=[te.var("s"), 1], out_strides=[te.var("t"), 1])
    path = tmp_path / "strided.so"
    tc.build(s, [A, B], binds=binds, name="affine").export_library(path)
    return path


def test_export_and_load_round_trip(tmp_path: Path) -> None:
    path = _exported(tmp_path)
    header = (tmp_path / "strided.h").read_text()
    assert "int32_t affine(const float* Ab, float* Bb, int64_t s, int64_t t);" in header
    assert "float32[16, 64] strides [s, 1]" in header and "stride of Ab axis 0" in header
    manifest = json.loads((tmp_path / "strided.json").read_text())
    assert manifest["schema_version"] == 3  # older readers refuse it rather than misread it
    (entry,) = manifest["kernels"]
    assert entry["dims"] == ["s", "t"] and entry["params"][0]["strides"] == ["s", 1]
    assert ParamSpec.from_json(entry["params"][1]).strides == ("t", 1)
    m = load_module(path)
    a = _views()["slice"]
    big = np.full((N, 70), -1.0, "float32")
    m(a, big[:, 3:67])
    np.testing.assert_allclose(big[:, 3:67], a * 2 + 1, rtol=1e-6)
    assert (big[:, :3] == -1).all() and (big[:, 67:] == -1).all()
    with pytest.raises(ValueError, match="'Ab'.*negative"):
        m(a[::-1], big[:, 3:67])
    with pytest.raises(ValueError, match="'Bb'.*axis 1 has a stride of 2"):
        m(a, np.zeros((N, 2 * M), "float32")[:, ::2])
    with pytest.raises(ValueError, match="strides"):
        ParamSpec.from_json({"name": "A", "dtype": "float32", "shape": [4, 4], "strides": [4]})


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_c_program_passes_row_strides(tmp_path: Path) -> None:
    _exported(tmp_path)
    src = tmp_path / "main.c"
    src.write_text(textwrap.dedent('''
        #include <stdio.h>
        #include "strided.h"
        static float a[16][70], b[16][80];
        int main(void) {
            for (int i = 0; i < 16; ++i)
                for (int j = 0; j < 70; ++j) a[i][j] = (float)(i * 100 + j);
            /* columns 3..66 of a, into columns 10..73 of b */
            int rc = affine(&a[0][3], &b[0][10], 70, 80);
            printf("%d %g %g %g %g\\n", rc, b[0][10], b[15][73], b[0][9], b[15][74]);
            return 0;
        }
    '''))
    exe = tmp_path / "main"
    cc = subprocess.run(["gcc", "-std=c99", "-Wall", "-Werror", "-o", str(exe), str(src),
                         f"-I{tmp_path}", f"-L{tmp_path}", "-l:strided.so",
                         f"-Wl,-rpath,{tmp_path}"], capture_output=True, text=True, timeout=60)
    assert cc.returncode == 0, cc.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    # b[0][10] = 2*a[0][3] + 1, b[15][73] = 2*a[15][66] + 1; the padding stays 0
    assert run.stdout.split() == ["0", "7", str(2 * 1566 + 1), "0", "0"], run.stderr




@pytest.fixture(scope="module")
def gemm_lib(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_c_library(tmp_path_factory, SGEMM_C, "tcstrided")


def _extern_gemm(n: int, l: int, m: int) -> tuple:
    A = te.placeholder((n, l), name="A")
    B = te.placeholder((l, m), name="B")
    Ab = tc.tir.decl_buffer(A.shape, A.dtype, name="Ab", strides=[te.var("lda"), 1])
    Cb = tc.tir.decl_buffer((n, m), A.dtype, name="Cb", strides=[te.var("ldc"), 1])
    i64 = lambda v: tc.const(v, "int64") if isinstance(v, int) else v.astype("int64")  # noqa: E731
    C = te.extern((n, m), [A, B],
                  lambda ins, outs: te.call_extern(
                      "int32", "tc_test_sgemm", ins[0].access_ptr("r"), ins[1].data,
                      outs[0].access_ptr("w"), n, l, m, i64(ins[0].strides[0]),
                      i64(outs[0].strides[0])),
                  name="C", in_buffers=[Ab, tc.tir.decl_buffer(B.shape, B.dtype, name="Bb")],
                  out_buffers=[Cb])
    return A, B, C, Ab, Cb


def test_extern_gets_the_leading_dimension(gemm_lib: str) -> None:
    n, l, m = 24, 40, 32
    A, B, C, Ab, Cb = _extern_gemm(n, l, m)
    s = te.create_schedule(C.op)
    f = tc.build(s, [A, B, C], binds={A: Ab, C: Cb})
    rng = np.random.default_rng(5)
    big = rng.random((n, 100), dtype="float32")
    b = rng.random((l, m), dtype="float32")
    a = big[:, 30:30 + l]  # a column slice: lda = 100
    out = np.full((n, 50), -1.0, "float32")
    f(a, b, out[:, 9:9 + m])
    np.testing.assert_allclose(out[:, 9:9 + m], a @ b, rtol=1e-5)
    assert (out[:, :9] == -1).all() and (out[:, 9 + m:] == -1).all()
    # compact arrays: lda = l, ldc = m
    c = np.zeros((n, m), "float32")
    f(np.ascontiguousarray(a), b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5)

    # the interpreter, with a Python body reading the same leading dimensions
    @te.register_extern("tc_test_sgemm")
    def py_gemm(pa: interp.Pointer, pb: interp.Pointer, pc: interp.Pointer, n_: int, l_: int,
                m_: int, lda: int, ldc: int) -> int:
        for i in range(n_):
            row = pa.array[pa.offset + i * lda:pa.offset + i * lda + l_]
            bm = pb.array[pb.offset:pb.offset + l_ * m_].reshape(l_, m_)
            pc.array[pc.offset + i * ldc:pc.offset + i * ldc + m_] = row @ bm
        return 0

    fn = tc.lower(s, [A, B, C], binds={A: Ab, C: Cb})
    out2 = np.full((n, 50), -1.0, "float32")
    interp.run(fn, a, b, out2[:, 9:9 + m])
    np.testing.assert_allclose(out2[:, 9:9 + m], a @ b, rtol=1e-5)
    assert (out2[:, :9] == -1).all()


def test_extern_declared_compact_refuses_strided_storage() -> None:
    n = 8
    A = te.placeholder((n, n), name="A")
    B = te.extern((n, n), [A], lambda ins, outs: te.call_extern(
        "int32", "tc_never_called", ins[0].data, outs[0].data), name="B")
    Ab = tc.tir.decl_buffer(A.shape, A.dtype, name="Ab", strides=[te.var("s"), 1])
    with pytest.raises(TecompError, match="declared without strides.*strided storage"):
        tc.lower(te.create_schedule(B.op), [A, B], binds={A: Ab})


def test_shared_stride_var_and_extent_one_axes() -> None:
    # one stride var for two arguments: bound by the first, checked on the second
    A = te.placeholder((N, M), name="A")
    B = te.compute((N, M), lambda i, j: A[i, j] + 1.0, name="B")
    sv = te.var("s")
    binds = {A: tc.tir.decl_buffer(A.shape, A.dtype, name="Ab", strides=[sv, 1]),
             B: tc.tir.decl_buffer(B.shape, B.dtype, name="Bb", strides=[sv, 1])}
    s = te.create_schedule(B.op)
    f = tc.build(s, [A, B], binds=binds)
    big = np.zeros((N, 200), "float32")
    a = big[:, :M]
    a[:] = 3
    f(a, big[:, 100:100 + M])
    assert (big[:, 100:100 + M] == 4).all()
    with pytest.raises(ValueError, match=r"'Bb'.*expected 200 \(s = 200 from the strides of "
                                         r"argument 0 \('Ab'\)"):
        f(a, np.zeros((N, M), "float32"))
    # a constant stride on an axis of extent 1 addresses nothing: any array stride goes
    A1, B1, s1, b1 = _affine((1, M), strides=[80, 1])
    row = np.arange(100, dtype="float32")[None, :]  # byte strides (400, 4)
    out = np.zeros((1, M), "float32")
    tc.build(s1, [A1, B1], binds=b1)(row[:, :M], out)
    np.testing.assert_allclose(out, row[:, :M] * 2 + 1)
    interp.run(tc.lower(s1, [A1, B1], binds=b1), row[:, :M], out)
    np.testing.assert_allclose(out, row[:, :M] * 2 + 1)


def test_numpy_openblas_sgemm_on_a_column_slice() -> None:
    load_numpy_openblas()
    n, l, m = 48, 32, 40
    A = te.placeholder((n, l), name="A")
    B = te.placeholder((l, m), name="B")
    Ab = tc.tir.decl_buffer(A.shape, A.dtype, name="Ab", strides=[te.var("lda"), 1])

    def sgemm(ins: list, outs: list):  # cblas_sgemm(RowMajor, NoTrans, NoTrans, ...) ILP64
        i64 = lambda v: tc.const(v, "int64")  # noqa: E731
        return te.call_extern("int32", "scipy_cblas_sgemm64_", 101, 111, 111, i64(n), i64(m),
                              i64(l), tc.const(1.0, "float32"), ins[0].data,
                              ins[0].strides[0].astype("int64"), ins[1].data, i64(m),
                              tc.const(0.0, "float32"), outs[0].data, i64(m))

    C = te.extern((n, m), [A, B], sgemm, name="C",
                  in_buffers=[Ab, tc.tir.decl_buffer(B.shape, B.dtype, name="Bb")])
    f = tc.build(te.create_schedule(C.op), [A, B, C], binds={A: Ab})
    rng = np.random.default_rng(6)
    big = rng.random((n, 3 * l), dtype="float32")
    a, b = big[:, l:2 * l], rng.random((l, m), dtype="float32")
    c = np.zeros((n, m), "float32")
    f(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4)

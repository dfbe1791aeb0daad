"""Every schedule primitive, alone and combined, on divisible and non-divisible extents.

Each test builds a kernel, runs it on random data and compares with numpy. Extents that do not
divide the split factor exercise the tail guards; a subset is also run through the loop-nest
interpreter (the reference semantics) to catch a pass and the backend agreeing on a mistake.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.codegen.target import Target
from tecomp.runtime import interp

RNG = np.random.default_rng(1234)

# (extent, factor): the first divides, the second leaves a tail
EXTENTS = [pytest.param(32, id="divisible"), pytest.param(37, id="nondivisible")]


def rand(shape, dtype="float32"):
    return RNG.standard_normal(shape).astype(dtype)


def run(s, args, inputs, out_shapes, out_dtype="float32", target="llvm", interp_too=False):
    f = tc.build(s, args, target=target)
    outs = [np.full(sh, np.nan if np.dtype(out_dtype).kind == "f" else 0, out_dtype)
            for sh in out_shapes]
    f(*inputs, *outs)
    if interp_too:
        outs2 = [np.zeros(sh, out_dtype) for sh in out_shapes]
        interp.run(tc.lower(s, args), *inputs, *outs2)
        for a, b in zip(outs, outs2):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    return f, outs


def lowered(s, args):
    return str(tc.lower(s, args))


def elementwise_2d(n, m):
    A = te.placeholder((n, m), name="A")
    B = te.compute((n, m), lambda i, j: A[i, j] * 3.0 + 1.0, name="B")
    return A, B


def matmul(n, k, m, dtype="float32"):
    A = te.placeholder((n, k), dtype, name="A")
    B = te.placeholder((k, m), dtype, name="B")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    return A, B, C


def check_matmul(s, A, B, C, n, k, m, interp_too=False, target="llvm"):
    a, b = rand((n, k)), rand((k, m))
    f, (c,) = run(s, [A, B, C], [a, b], [(n, m)], interp_too=interp_too, target=target)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    return f


# split ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", EXTENTS)
@pytest.mark.parametrize("factor", [1, 4, 8, 64])
def test_split_factor(n, factor):
    A, B = elementwise_2d(n, 5)
    s = te.create_schedule(B.op)
    io, ii = s[B].split(s[B].op.axis[0], factor=factor)
    a = rand((n, 5))
    _, (b,) = run(s, [A, B], [a], [(n, 5)], interp_too=factor == 8)
    np.testing.assert_allclose(b, a * 3 + 1, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", EXTENTS)
@pytest.mark.parametrize("nparts", [1, 3, 4, 5, 40])
def test_split_nparts(n, nparts):
    A, B = elementwise_2d(n, 3)
    s = te.create_schedule(B.op)
    s[B].split(s[B].op.axis[0], nparts=nparts)
    a = rand((n, 3))
    _, (b,) = run(s, [A, B], [a], [(n, 3)], interp_too=nparts == 5)
    np.testing.assert_allclose(b, a * 3 + 1, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", EXTENTS)
def test_split_nested_and_both_axes(n):
    A, B = elementwise_2d(n, n - 1)
    s = te.create_schedule(B.op)
    i, j = s[B].op.axis
    io, ii = s[B].split(i, factor=8)
    iio, iii = s[B].split(ii, factor=3)
    jo, ji = s[B].split(j, nparts=6)
    s[B].reorder(jo, io, iio, ji, iii)
    a = rand((n, n - 1))
    _, (b,) = run(s, [A, B], [a], [(n, n - 1)], interp_too=True)
    np.testing.assert_allclose(b, a * 3 + 1, rtol=1e-5, atol=1e-6)


def test_split_symbolic_extent():
    n = te.var("n")
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] + 1.0, name="B")
    s = te.create_schedule(B.op)
    xo, xi = s[B].split(B.op.axis[0], factor=8)
    s[B].vectorize(xi)
    f = tc.build(s, [A, B])
    for size in (1, 7, 8, 9, 64, 67):
        a = rand((size,))
        b = np.full_like(a, np.nan)
        f(a, b)
        np.testing.assert_allclose(b, a + 1)


@pytest.mark.parametrize("k", EXTENTS)
def test_split_reduction_axis(k):
    n, m = 9, 11
    A, B, C = matmul(n, k, m)
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    ro, ri = s[C].split(s[C].op.reduce_axis[0], factor=5)
    s[C].reorder(ro, i, ri, j)
    check_matmul(s, A, B, C, n, k, m, interp_too=True)


# tile / fuse / reorder ------------------------------------------------------------------------


@pytest.mark.parametrize("n", EXTENTS)
def test_tile(n):
    m = n + 3
    A, B = elementwise_2d(n, m)
    s = te.create_schedule(B.op)
    xo, yo, xi, yi = s[B].tile(*s[B].op.axis, 8, 4)
    assert s[B].leaf_iter_vars == [xo, yo, xi, yi]
    a = rand((n, m))
    _, (b,) = run(s, [A, B], [a], [(n, m)], interp_too=True)
    np.testing.assert_allclose(b, a * 3 + 1, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", EXTENTS)
def test_fuse_then_split(n):
    A = te.placeholder((n, 3, 5), name="A")
    B = te.compute((n, 3, 5), lambda i, j, k: A[i, j, k] - i.astype("float32") * 0.5, name="B")
    s = te.create_schedule(B.op)
    f = s[B].fuse(*s[B].op.axis)
    fo, fi = s[B].split(f, factor=16)
    s[B].vectorize(fi)
    a = rand((n, 3, 5))
    _, (b,) = run(s, [A, B], [a], [(n, 3, 5)], interp_too=True)
    np.testing.assert_allclose(b, a - np.arange(n)[:, None, None] * 0.5, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", EXTENTS)
def test_split_then_fuse_back(n):
    A, B = elementwise_2d(n, 4)
    s = te.create_schedule(B.op)
    i, j = s[B].op.axis
    io, ii = s[B].split(i, factor=6)
    fused = s[B].fuse(ii, j)
    s[B].parallel(io)
    s[B].unroll(fused)
    a = rand((n, 4))
    _, (b,) = run(s, [A, B], [a], [(n, 4)])
    np.testing.assert_allclose(b, a * 3 + 1, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", EXTENTS)
def test_reorder_transpose(n):
    A = te.placeholder((n, 6, 5), name="A")
    B = te.compute((5, n, 6), lambda k, i, j: A[i, j, k] * 2.0, name="B")
    s = te.create_schedule(B.op)
    k, i, j = s[B].op.axis
    io, ii = s[B].split(i, factor=8)
    s[B].reorder(ii, j, io, k)
    assert s[B].leaf_iter_vars == [ii, j, io, k]
    a = rand((n, 6, 5))
    _, (b,) = run(s, [A, B], [a], [(5, n, 6)])
    np.testing.assert_allclose(b, a.transpose(2, 0, 1) * 2)


# annotations ----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", EXTENTS)
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int8"])
def test_vectorize(n, dtype):
    A = te.placeholder((n,), dtype, name="A")
    B = te.compute((n,), lambda i: A[i] + A[i], name="B")
    s = te.create_schedule(B.op)
    xo, xi = s[B].split(B.op.axis[0], factor=16)
    s[B].vectorize(xi)
    a = (RNG.standard_normal(n) * 20).astype(dtype)
    f, (b,) = run(s, [A, B], [a], [(n,)], out_dtype=dtype)
    np.testing.assert_array_equal(b, a + a)
    assert re.search(r"<16 x (float|double|i32|i8)>", f.get_source("ll"))


def test_vectorize_whole_axis_odd_extent():
    A, B = elementwise_2d(6, 13)
    s = te.create_schedule(B.op)
    s[B].vectorize(s[B].op.axis[1])
    a = rand((6, 13))
    f, (b,) = run(s, [A, B], [a], [(6, 13)], interp_too=True)
    np.testing.assert_allclose(b, a * 3 + 1, rtol=1e-5, atol=1e-6)
    assert "ramp(" in lowered(s, [A, B])


def test_default_host_vector_loop_uses_widest_registers():
    # 16 float lanes: one zmm register on an AVX-512 host, two ymm on AVX2, four xmm on SSE
    A, B = elementwise_2d(4, 64)
    s = te.create_schedule(B.op)
    jo, ji = s[B].split(s[B].op.axis[1], factor=16)
    s[B].vectorize(ji)
    f = tc.build(s, [A, B])
    asm = f.get_source("asm")
    regs = {128: "xmm", 256: "ymm", 512: "zmm"}
    bits = Target.host().vector_bits
    assert re.search(rf"%{regs[bits]}\d", asm), f"no {regs[bits]} on a {bits}-bit host"
    assert not any(re.search(rf"%{regs[w]}\d", asm) for w in regs if w > bits)
    a = rand((4, 64))
    b = np.empty_like(a)
    f(a, b)
    np.testing.assert_allclose(b, a * 3 + 1, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target,has,lacks", [
    ("llvm -mcpu=haswell -mattr=+avx2,+fma", "ymm", "zmm"),
    ("llvm -mcpu=x86-64", "xmm", "ymm"),
])
def test_target_string_picks_vector_registers(target, has, lacks):
    A, B = elementwise_2d(4, 64)
    s = te.create_schedule(B.op)
    jo, ji = s[B].split(s[B].op.axis[1], factor=16)
    s[B].vectorize(ji)
    f = tc.build(s, [A, B], target=target)
    asm = f.get_source("asm")
    assert has in asm and lacks not in asm
    a = rand((4, 64))
    b = np.empty_like(a)
    f(a, b)
    np.testing.assert_allclose(b, a * 3 + 1, rtol=1e-5, atol=1e-6)


def test_target_cpu_newer_than_host_still_runs():
    # sapphirerapids implies avx512fp16, which most hosts lack: running its float16 code
    # must not die on an illegal instruction
    A = te.placeholder((64,), "float16", name="A")
    B = te.compute((64,), lambda i: A[i] * A[i] + A[i], name="B")
    s = te.create_schedule(B.op)
    s[B].vectorize(s[B].split(B.op.axis[0], factor=32)[1])
    f = tc.build(s, [A, B], target="llvm -mcpu=sapphirerapids")
    a = rand((64,), "float16")
    b = np.zeros_like(a)
    f(a, b)
    np.testing.assert_allclose(b, a * a + a, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("n", EXTENTS)
def test_unroll(n):
    A, B = elementwise_2d(n, 3)
    s = te.create_schedule(B.op)
    i, j = s[B].op.axis
    io, ii = s[B].split(i, factor=4)
    s[B].unroll(ii)
    s[B].unroll(j)
    text = lowered(s, [A, B])
    assert "for i.inner" not in text and "for j" not in text, text
    assert "for i.outer" in text
    a = rand((n, 3))
    _, (b,) = run(s, [A, B], [a], [(n, 3)], interp_too=True)
    np.testing.assert_allclose(b, a * 3 + 1, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", EXTENTS)
def test_parallel(n):
    A, B = elementwise_2d(n, 33)
    s = te.create_schedule(B.op)
    i, j = s[B].op.axis
    io, ii = s[B].split(i, factor=5)
    s[B].parallel(io)
    f = tc.build(s, [A, B])
    assert "GOMP_parallel" in f.get_source("ll")
    assert "parallel i.outer" in lowered(s, [A, B])
    a = rand((n, 33))
    b = np.full_like(a, np.nan)
    f(a, b)
    np.testing.assert_allclose(b, a * 3 + 1, rtol=1e-5, atol=1e-6)


def _expected_threads():
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.split(",")[0].isdigit():
        return int(env.split(",")[0])
    return len(os.sched_getaffinity(0))


def test_parallel_runs_on_every_core():
    # each iteration records which OpenMP thread ran it: a parallel loop must use them all
    n = 997
    T = te.compute((n, 2), lambda i, c: te.if_then_else(
        c == 0, te.call_extern("int32", "omp_get_thread_num"),
        te.call_extern("int32", "omp_get_num_threads")), name="T")
    s = te.create_schedule(T.op)
    s[T].parallel(T.op.axis[0])
    f = tc.build(s, [T])
    out = np.full((n, 2), -1, "int32")
    f(out)
    nthreads = _expected_threads()
    assert set(out[:, 1]) == {nthreads}
    assert sorted(set(out[:, 0])) == list(range(nthreads))


def test_pragma_auto_unroll_removes_every_loop():
    A, B = elementwise_2d(3, 5)
    s = te.create_schedule(B.op)
    i, j = s[B].op.axis
    s[B].pragma(i, "auto_unroll_max_step", 64)
    text = lowered(s, [A, B])
    assert "for " not in text and "range(" not in text, text
    a = rand((3, 5))
    _, (b,) = run(s, [A, B], [a], [(3, 5)], interp_too=True)
    np.testing.assert_allclose(b, a * 3 + 1, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", EXTENTS)
def test_pragma_auto_unroll_inner_only(n):
    # the budget bounds what is unrolled: the inner split loop (4 steps) goes, the rest stays
    A, B = elementwise_2d(n, 2)
    s = te.create_schedule(B.op)
    i, j = s[B].op.axis
    io, ii = s[B].split(i, factor=4)
    s[B].pragma(io, "auto_unroll_max_step", 8)
    text = lowered(s, [A, B])
    steady = text.split("for i.outer")[1].split("\n  for")[0]
    assert "for i.inner" not in text and "for j" not in steady, text
    a = rand((n, 2))
    _, (b,) = run(s, [A, B], [a], [(n, 2)])
    np.testing.assert_allclose(b, a * 3 + 1, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k", EXTENTS)
def test_prefetch(k):
    n, m = 8, 24
    A, B, C = matmul(n, k, m)
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    ro, ri = s[C].split(s[C].op.reduce_axis[0], factor=4)
    s[C].reorder(i, ro, ri, j)
    s[C].prefetch(B, ro, 1)
    s[C].prefetch(A, i, 1)
    f = check_matmul(s, A, B, C, n, k, m)
    assert "llvm.prefetch" in f.get_source("ll")
    # debug build: prefetching ahead of the last iteration must not count as out of bounds
    fd = tc.build(s, [A, B, C], debug=True)
    a, b = rand((n, k)), rand((k, m))
    c = np.empty((n, m), "float32")
    fd(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


# placement ------------------------------------------------------------------------------------


def _stencil(n, m):
    A = te.placeholder((n, m + 2), name="A")
    P = te.compute((n, m + 2), lambda i, j: A[i, j] * 2.0, name="P")
    C = te.compute((n, m), lambda i, j: P[i, j] + P[i, j + 1] + P[i, j + 2], name="C")
    return A, P, C


def _stencil_ref(a):
    p = a * 2
    return p[:, :-2] + p[:, 1:-1] + p[:, 2:]


@pytest.mark.parametrize("n", EXTENTS)
@pytest.mark.parametrize("level", ["i.outer", "i.inner", "j.outer", "j.inner"])
def test_compute_at_levels(n, level):
    m = n - 5
    A, P, C = _stencil(n, m)
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    io, jo, ii, ji = s[C].tile(i, j, 8, 4)
    at = {"i.outer": io, "i.inner": ii, "j.outer": jo, "j.inner": ji}[level]
    s[P].compute_at(s[C], at)
    a = rand((n, m + 2))
    _, (c,) = run(s, [A, C], [a], [(n, m)], interp_too=level == "j.outer")
    np.testing.assert_allclose(c, _stencil_ref(a), rtol=1e-5, atol=1e-5)


def test_compute_at_then_compute_root():
    A, P, C = _stencil(10, 7)
    s = te.create_schedule(C.op)
    s[P].compute_at(s[C], s[C].op.axis[0])
    s[P].compute_root()
    text = lowered(s, [A, C])
    # back at root: P is produced in full before C's loop nest starts
    assert text.index("P[") < text.index("C[")
    a = rand((10, 9))
    _, (c,) = run(s, [A, C], [a], [(10, 7)])
    np.testing.assert_allclose(c, _stencil_ref(a), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", EXTENTS)
def test_compute_inline(n):
    A, P, C = _stencil(n, 6)
    s = te.create_schedule(C.op)
    s[P].compute_inline()
    text = lowered(s, [A, C])
    assert "P[" not in text
    a = rand((n, 8))
    _, (c,) = run(s, [A, C], [a], [(n, 6)])
    np.testing.assert_allclose(c, _stencil_ref(a), rtol=1e-5, atol=1e-5)


def test_compute_inline_chain_and_compute_at_mix():
    n = 19
    A = te.placeholder((n,), name="A")
    B1 = te.compute((n,), lambda i: A[i] + 1.0, name="B1")
    B2 = te.compute((n,), lambda i: B1[i] * 2.0, name="B2")
    B3 = te.compute((n,), lambda i: B2[i] - 3.0, name="B3")
    C = te.compute((n,), lambda i: B3[i] * B3[i], name="C")
    s = te.create_schedule(C.op)
    s[B1].compute_inline()
    s[B2].compute_inline()
    xo, xi = s[C].split(C.op.axis[0], factor=4)
    s[B3].compute_at(s[C], xo)
    a = rand((n,))
    _, (c,) = run(s, [A, C], [a], [(n,)], interp_too=True)
    np.testing.assert_allclose(c, ((a + 1) * 2 - 3) ** 2, rtol=1e-5)


# cache_read / cache_write / storage_align -----------------------------------------------------


@pytest.mark.parametrize("n", EXTENTS)
def test_cache_read_packing_matmul(n):
    k, m = n + 2, 48
    A, B, C = matmul(n, k, m)
    s = te.create_schedule(C.op)
    BB = s.cache_read(B, "global", [C])
    AA = s.cache_read(A, "local", [C])
    i, j = s[C].op.axis
    io, jo, ii, ji = s[C].tile(i, j, 8, 16)
    ro, ri = s[C].split(s[C].op.reduce_axis[0], factor=4)
    s[C].reorder(io, jo, ro, ri, ii, ji)
    s[C].vectorize(ji)
    s[AA].compute_at(s[C], ro)
    s[BB].compute_at(s[C], jo)
    bb_i, bb_j = s[BB].op.axis
    s[BB].vectorize(bb_j)
    text = lowered(s, [A, B, C])
    assert "B_global" in text and "A_local" in text
    check_matmul(s, A, B, C, n, k, m, interp_too=n == 37)


@pytest.mark.parametrize("n", EXTENTS)
def test_cache_write_compute_at(n):
    k, m = 20, n + 5
    A, B, C = matmul(n, k, m)
    s = te.create_schedule(C.op)
    CL = s.cache_write(C, "local")
    i, j = s[C].op.axis
    io, jo, ii, ji = s[C].tile(i, j, 4, 8)
    s[CL].compute_at(s[C], jo)
    ci, cj = s[CL].op.axis
    (r,) = s[CL].op.reduce_axis
    s[CL].reorder(r, ci, cj)
    s[CL].vectorize(cj)
    s[C].vectorize(ji)
    s[C].parallel(io)
    assert "C_local" in lowered(s, [A, B, C])
    check_matmul(s, A, B, C, n, k, m, interp_too=n == 37)


@pytest.mark.parametrize("n", EXTENTS)
def test_cache_write_keeps_the_declared_axes(n):
    """TVM's cache_write: the written stage keeps ``C.op.axis`` (of the tensor the user holds)
    and the cache stage keeps the declared reduce axis, so both are scheduled by the user's
    own IterVars."""
    k, m = 20, n + 3
    A, B, C = matmul(n, k, m)
    (r,) = C.op.reduce_axis
    s = te.create_schedule(C.op)
    CL = s.cache_write(C, "local")
    assert list(s[C].op.axis) == list(C.op.axis)
    assert list(s[CL].op.reduce_axis) == [r]
    io, ii = s[C].split(C.op.axis[0], factor=8)
    jo, ji = s[C].split(C.op.axis[1], factor=4)
    s[C].reorder(io, jo, ii, ji)
    s[CL].compute_at(s[C], jo)
    ro, ri = s[CL].split(r, factor=6)
    s[CL].reorder(ro, *s[CL].op.axis, ri)
    check_matmul(s, A, B, C, n, k, m, interp_too=n == 37)


def test_cache_write_then_cache_read_on_elementwise():
    A, B = elementwise_2d(17, 9)
    s = te.create_schedule(B.op)
    BL = s.cache_write(B, "local")
    AL = s.cache_read(A, "local", [BL])
    i, j = s[B].op.axis
    s[BL].compute_at(s[B], i)
    s[AL].compute_at(s[BL], s[BL].op.axis[1])
    a = rand((17, 9))
    _, (b,) = run(s, [A, B], [a], [(17, 9)], interp_too=True)
    np.testing.assert_allclose(b, a * 3 + 1, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", EXTENTS)
@pytest.mark.parametrize("factor,offset", [(16, 0), (16, 1), (32, 7)])
def test_storage_align_cache_read(n, factor, offset):
    k, m = 24, n
    A, B, C = matmul(n, k, m)
    s = te.create_schedule(C.op)
    AA = s.cache_read(A, "local", [C])
    s[AA].storage_align(s[AA].op.axis[0], factor, offset)
    i, j = s[C].op.axis
    io, ii = s[C].split(i, factor=8)
    s[AA].compute_at(s[C], io)
    text = lowered(s, [A, B, C])
    # rows of the cached tile are padded to a stride of k' = q * factor + offset >= k
    stride = -(-(k - offset) // factor) * factor + offset
    assert re.search(rf"\* {stride}\b", text), text
    check_matmul(s, A, B, C, n, k, m)


# rfactor ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [pytest.param(1024, id="divisible"), pytest.param(1001, id="nondivisible")])
@pytest.mark.parametrize("how", ["parallel", "vectorize"])
def test_rfactor_sum(k, how):
    A = te.placeholder((3, k), name="A")
    r = te.reduce_axis((0, k), name="r")
    B = te.compute((3,), lambda i: te.sum(A[i, r], axis=r), name="B")
    s = te.create_schedule(B.op)
    ro, ri = s[B].split(r, factor=16)
    if how == "vectorize":
        BF = s.rfactor(B, ri)
        s[BF].vectorize(s[BF].op.axis[0])
    else:
        BF = s.rfactor(B, ro, factor_axis=1)
        s[BF].parallel(s[BF].op.axis[0])
    assert BF.shape[0 if how == "vectorize" else 1].value == (16 if how == "vectorize" else -(-k // 16))
    a = rand((3, k)).astype("float32")
    f, (b,) = run(s, [A, B], [a], [(3,)], interp_too=how == "vectorize" and k == 1001)
    np.testing.assert_allclose(b, a.astype("float64").sum(1), rtol=1e-4, atol=1e-3)


def test_rfactor_max_compute_at():
    k = 100
    A = te.placeholder((5, k), name="A")
    r = te.reduce_axis((0, k), name="r")
    B = te.compute((5,), lambda i: te.max(A[i, r], axis=r), name="B")
    s = te.create_schedule(B.op)
    ro, ri = s[B].split(r, nparts=8)
    BF = s.rfactor(B, ro)
    s[BF].compute_at(s[B], s[B].op.axis[0])
    a = rand((5, k))
    _, (b,) = run(s, [A, B], [a], [(5,)], interp_too=True)
    np.testing.assert_array_equal(b, a.max(1))


def _sum_then_double(n: int, k: int):
    A = te.placeholder((n, k), name="A")
    r = te.reduce_axis((0, k), name="r")
    S = te.compute((n,), lambda i: te.sum(A[i, r], axis=r), name="S")
    R = te.compute((n,), lambda i: S[i] * 2.0, name="R")
    return A, S, R


@pytest.mark.parametrize("then", ["rfactor", "cache_read", "cache_write"])
def test_a_cache_read_copy_follows_its_source_when_the_source_is_replaced(then):
    # cache_read(A, .., [S]) gives S a new op; cache_read(S, "local", [R]) then copies from that
    # op. A later primitive replacing S's op again (rfactor, another cache_read into S,
    # cache_write) must re-point the copy (TVM's ReplaceDataFlow), else the copy reads a stale
    # op and S, computed at a loop of R, has "nothing reads it".
    n, k = 7, 37
    A, S, R = _sum_then_double(n, k)
    B = te.placeholder((n,), name="B")
    if then == "cache_read":  # a second input of S, cached after S was copied
        r = te.reduce_axis((0, k), name="r")
        S = te.compute((n,), lambda i: te.sum(A[i, r] + B[i], axis=r), name="S")
        R = te.compute((n,), lambda i: S[i] * 2.0, name="R")
    s = te.create_schedule(R.op)
    s.cache_read(A, "local", [S])
    SL = s.cache_read(S, "local", [R])
    if then == "rfactor":
        ro, ri = s[S].split(s[S].op.reduce_axis[0], factor=4)
        SF = s.rfactor(S, ri)
        s[SF].compute_at(s[R], R.op.axis[0])
    elif then == "cache_read":
        s.cache_read(B, "local", [S])
    else:
        s.cache_write(S, "local")
    s[SL].compute_at(s[R], R.op.axis[0])
    s[S].compute_at(s[R], R.op.axis[0])
    a, b = rand((n, k)), rand((n,))
    args = [A, B, R] if then == "cache_read" else [A, R]
    ins = [a, b] if then == "cache_read" else [a]
    _, (out,) = run(s, args, ins, [(n,)], interp_too=True)
    want = (a.astype("float64") + (b[:, None] if then == "cache_read" else 0)).sum(1) * 2
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


# combinations ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(64, 32, 64), (45, 33, 70)], ids=["divisible", "nondivisible"])
def test_tile_vectorize_parallel_unroll_matmul(shape):
    n, k, m = shape
    A, B, C = matmul(n, k, m)
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    io, jo, ii, ji = s[C].tile(i, j, 8, 16)
    ro, ri = s[C].split(s[C].op.reduce_axis[0], factor=4)
    s[C].reorder(io, jo, ro, ri, ii, ji)
    s[C].vectorize(ji)
    s[C].unroll(ri)
    s[C].unroll(ii)
    s[C].parallel(s[C].fuse(io, jo))
    f = check_matmul(s, A, B, C, n, k, m)
    assert "GOMP_parallel" in f.get_source("ll")


@pytest.mark.parametrize("n", EXTENTS)
def test_conv_like_pipeline(n):
    # pad (inline) -> conv-like row filter (cache_write + compute_at) -> relu (root, parallel)
    m = n + 4
    A = te.placeholder((n, m), name="A")
    P = te.compute((n, m + 2), lambda i, j: te.if_then_else(
        te.all(j >= 1, j < m + 1), A[i, te.max(j - 1, 0)], 0.0), name="P")
    W = te.placeholder((3,), name="W")
    r = te.reduce_axis((0, 3), name="r")
    Y = te.compute((n, m), lambda i, j: te.sum(P[i, j + r] * W[r], axis=r), name="Y")
    R = te.compute((n, m), lambda i, j: te.max(Y[i, j], 0.0), name="R")
    s = te.create_schedule(R.op)
    s[P].compute_inline()
    i, j = s[R].op.axis
    io, jo, ii, ji = s[R].tile(i, j, 4, 8)
    s[Y].compute_at(s[R], jo)
    s[R].vectorize(ji)
    s[R].parallel(io)
    a, w = rand((n, m)), rand((3,))
    _, (out,) = run(s, [A, W, R], [a, w], [(n, m)])
    ap = np.pad(a, ((0, 0), (1, 1)))
    ref = sum(ap[:, q:q + m] * w[q] for q in range(3))
    np.testing.assert_allclose(out, np.maximum(ref, 0), rtol=1e-5, atol=1e-5)

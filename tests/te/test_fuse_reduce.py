"""fuse() of a spatial and a reduction axis (TVM's Stage::fuse: the fused axis is a reduction
axis; the reduction's init loops over it too, so every output point it covers starts from the
identity before any update). Results against numpy, JIT-compiled, interpreted and emulated on
a GPU target; what a loop carrying the reduction cannot be (vectorized, parallel, bound) is
refused by name."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.runtime import interp
from tecomp.te.tensor import IterVarKind


def _matmul(n: int = 12, m: int = 10, kk: int = 7) -> tuple[Any, Any, Any, Any]:
    A = te.placeholder((n, kk), name="A")
    B = te.placeholder((kk, m), name="B")
    k = te.reduce_axis((0, kk), name="k")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return A, B, k, C


def _check(s: Any, args: list[Any], ins: list[np.ndarray], want: np.ndarray) -> None:
    f = tc.build(s, args)
    out = np.full(want.shape, 1e9, want.dtype)  # garbage: the init must overwrite every point
    f(*ins, out)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    ref = np.full(want.shape, -1e9, want.dtype)
    interp.run(tc.lower(s, args), *ins, ref)
    np.testing.assert_allclose(ref, want, rtol=1e-5, atol=1e-5)


def _inputs(n: int = 12, m: int = 10, kk: int = 7) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.standard_normal((n, kk)).astype("float32"),
            rng.standard_normal((kk, m)).astype("float32"))


def test_spatial_outer_reduce_inner() -> None:
    A, B, k, C = _matmul()
    s = te.create_schedule(C.op)
    i, j = C.op.axis
    s[C].reorder(i, k, j)
    f = s[C].fuse(i, k)
    assert f.kind == IterVarKind.REDUCE  # TVM: max(data-parallel, reduce)
    a, b = _inputs()
    _check(s, [A, B, C], [a, b], a @ b)


def test_reduce_outer_spatial_inner_split_unevenly() -> None:
    A, B, k, C = _matmul()
    s = te.create_schedule(C.op)
    i, j = C.op.axis
    s[C].reorder(k, i, j)
    f = s[C].fuse(k, i)  # 84 iterations, k-major
    fo, fi = s[C].split(f, factor=5)  # 84 is no multiple of 5: a guarded tail
    s[C].unroll(fi)
    s[C].vectorize(j)  # the spatial inner loop stays vectorizable
    a, b = _inputs()
    _check(s, [A, B, C], [a, b], a @ b)


def test_all_axes_fused_with_a_producer_at_the_fused_loop() -> None:
    A, B, k, C = _matmul(6, 5, 4)
    A2 = te.compute(A.shape, lambda x, y: A[x, y] * 2, name="A2")
    C2 = te.compute(C.shape, lambda x, y: te.sum(A2[x, k] * B[k, y], axis=k), name="C2")
    s = te.create_schedule(C2.op)
    i, j = C2.op.axis
    f = s[C2].fuse(i, j, k)
    s[A2].compute_at(s[C2], f)
    a, b = _inputs(6, 5, 4)
    _check(s, [A, B, C2], [a, b], (2 * a) @ b)


def test_max_reduction_with_an_init_value_and_two_reduce_axes() -> None:
    A = te.placeholder((8, 6, 5), name="A")
    r1 = te.reduce_axis((0, 6), name="r1")
    r2 = te.reduce_axis((0, 5), name="r2")
    M = te.compute((8,), lambda i: te.max(A[i, r1, r2], axis=[r1, r2]), name="M")
    s = te.create_schedule(M.op)
    i = M.op.axis[0]
    f = s[M].fuse(i, r1)  # r2 stays a reduction of its own inside
    assert s[M].reduce_only(r2) and not s[M].reduce_only(f)
    a = np.random.default_rng(1).standard_normal((8, 6, 5)).astype("float32") - 100
    _check(s, [A, M], [a], a.max(axis=(1, 2)))


def test_on_a_gpu_target_inside_a_bound_loop() -> None:
    A, B, k, C = _matmul(16, 8, 6)
    s = te.create_schedule(C.op)
    i, j = C.op.axis
    s[C].bind(i, te.thread_axis("blockIdx.x"))
    f = s[C].fuse(j, k)
    with pytest.raises(tc.ScheduleError, match=r"bind: axis 'j.k.fused' fuses spatial and "
                                               r"reduction axes"):
        s[C].bind(f, te.thread_axis("threadIdx.x"))
    g = tc.build(s, [A, B, C], target="cuda -arch=sm_80")
    a, b = _inputs(16, 8, 6)
    c = np.full((16, 8), np.nan, "float32")
    g.emulate(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_what_a_loop_carrying_the_reduction_cannot_be() -> None:
    A, B, k, C = _matmul()
    s = te.create_schedule(C.op)
    i, j = C.op.axis
    s[C].reorder(i, k, j)
    f = s[C].fuse(i, k)
    with pytest.raises(tc.ScheduleError, match=r"cannot parallel reduction axis 'i.k.fused'"):
        s[C].parallel(f)
    with pytest.raises(tc.ScheduleError, match=r"cannot vectorize reduction axis 'i.k.fused'"):
        s[C].vectorize(f)
    fo, fi = s[C].split(f, factor=4)  # its parts carry it too
    with pytest.raises(tc.ScheduleError, match=r"bind: axis 'i.k.fused.outer' fuses"):
        s[C].bind(fo, te.thread_axis("blockIdx.x"))
    with pytest.raises(tc.ScheduleError, match=r"rfactor: axis 'i.k.fused.outer' fuses spatial"):
        s.rfactor(C, fi)
    with pytest.raises(tc.ScheduleError, match="adjacent"):
        s[C].fuse(j, fo)

"""TVM's schedule corner cases (issue 15), each checked against numpy on the CPU build and the
loop-nest interpreter, on extents that divide and that do not.

fuse() of no axes, split of a fused axis, reorder of a subset, compute_at of a reduction,
rfactor with an init value, tuple reducers (argmax) and their rfactor, set_store_predicate on
the CPU, chained indexing ``A[i][j]``, ``tc.lower(..., simple_mode=True)``, and a printer whose
text is deterministic and unambiguous.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.runtime import interp

RNG = np.random.default_rng(15)


def rand(shape: Sequence[int], dtype: str = "float32") -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def check(s: te.Schedule, args: list[Any], inputs: list[np.ndarray],
          expected: list[np.ndarray], rtol: float = 1e-5, simple_mode: bool = False) -> None:
    """Build ``s`` and run it through the interpreter; both must match ``expected``."""
    for way in ("build", "interp"):
        outs = [np.zeros_like(e) for e in expected]
        if way == "build":
            tc.build(s, args)(*inputs, *outs)
        else:
            interp.run(tc.lower(s, args, simple_mode=simple_mode), *inputs, *outs)
        for o, e in zip(outs, expected):
            np.testing.assert_allclose(o, e, rtol=rtol, atol=1e-5, err_msg=way)


def leaf_names(stage: Any) -> list[str]:
    return [iv.name for iv in stage.leaf_iter_vars]


# fuse() of zero axes ------------------------------------------------------------------------


def test_fuse_no_axes_is_an_outermost_singleton():
    A = te.placeholder((10, 3), name="A")
    B = te.compute((10, 3), lambda i, j: A[i, j] + 1, name="B")
    s = te.create_schedule(B.op)
    one = s[B].fuse()
    assert one.name == "singleton"
    assert s[B].leaf_iter_vars[0] is one
    assert leaf_names(s[B]) == ["singleton", "i", "j"]
    s[B].parallel(one)
    a = rand((10, 3))
    check(s, [A, B], [a], [a + 1])
    # fuse of one axis is that axis
    assert s[B].fuse(B.op.axis[1]) is B.op.axis[1]


def test_fuse_no_axes_of_a_rank0_reduction():
    # the generic "fuse everything, then bind/parallelise the result" on a scalar output
    A = te.placeholder((37,), name="A")
    k = te.reduce_axis((0, 37), "k")
    B = te.compute((), lambda: te.sum(A[k], axis=k), name="B")
    s = te.create_schedule(B.op)
    f = s[B].fuse(*B.op.axis)  # no spatial axes at all
    s[B].parallel(f)
    ko, ki = s[B].split(k, 8)
    a = rand((37,))
    check(s, [A, B], [a], [np.array(a.sum(), "float32")], rtol=1e-4)


def test_fuse_no_axes_as_compute_at_target_and_split():
    A = te.placeholder((13,), name="A")
    B = te.compute((13,), lambda i: A[i] * 2, name="B")
    C = te.compute((13,), lambda i: B[i] + 1, name="C")
    s = te.create_schedule(C.op)
    one = s[C].fuse()
    s[B].compute_at(s[C], one)
    o, i = s[C].split(C.op.axis[0], 4)
    a = rand((13,))
    check(s, [A, C], [a], [a * 2 + 1])
    # a singleton can itself be split (extent 1 over any factor)
    s2 = te.create_schedule(C.op)
    so, si = s2[C].split(s2[C].fuse(), 4)
    assert leaf_names(s2[C]) == ["singleton.outer", "singleton.inner", "i"]
    check(s2, [A, C], [a], [a * 2 + 1])


def test_fuse_no_axes_bound_to_a_block_lowers_for_gpu():
    A = te.placeholder((64,), name="A")
    k = te.reduce_axis((0, 64), "k")
    B = te.compute((), lambda: te.sum(A[k], axis=k), name="B")
    s = te.create_schedule(B.op)
    s[B].bind(s[B].fuse(), te.thread_axis("blockIdx.x"))
    text = str(tc.lower(s, [A, B], target="cuda -arch=sm_80"))
    assert "singleton in range(1) thread_tag=blockIdx.x" in text


# split of a fused axis ------------------------------------------------------------------------


@pytest.mark.parametrize("shape,factor", [((8, 4), 8), ((7, 9), 8), ((5, 3, 7), 4)])
def test_split_of_a_fused_axis(shape, factor):
    A = te.placeholder(shape, name="A")
    B = te.compute(shape, lambda *i: A[i] * 2, name="B")
    s = te.create_schedule(B.op)
    f = s[B].fuse(*B.op.axis)
    o, i = s[B].split(f, factor)
    s[B].vectorize(i)
    s[B].parallel(o)
    a = rand(shape)
    check(s, [A, B], [a], [a * 2])
    check(s, [A, B], [a], [a * 2], simple_mode=True)


def test_split_fuse_split_again_with_nparts():
    A = te.placeholder((9, 11), name="A")
    B = te.compute((9, 11), lambda i, j: A[i, j] - 1, name="B")
    s = te.create_schedule(B.op)
    io, ii = s[B].split(B.op.axis[0], 4)
    f = s[B].fuse(ii, B.op.axis[1])
    fo, fi = s[B].split(f, nparts=3)
    assert leaf_names(s[B]) == ["i.outer", "i.inner.j.fused.outer", "i.inner.j.fused.inner"]
    a = rand((9, 11))
    check(s, [A, B], [a], [a - 1])


# reorder of a subset ------------------------------------------------------------------------


def test_reorder_subset_keeps_the_other_leaves_in_place():
    shape = (3, 4, 5, 6)
    A = te.placeholder(shape, name="A")
    B = te.compute(shape, lambda a, b, c, d: A[a, b, c, d] * 3, name="B")
    s = te.create_schedule(B.op)
    a_, b_, c_, d_ = B.op.axis
    s[B].reorder(d_, a_)  # TVM: the listed axes permute among their own slots
    assert leaf_names(s[B]) == ["d", "b", "c", "a"]
    s[B].reorder(c_, d_)
    assert leaf_names(s[B]) == ["c", "b", "d", "a"]
    s[B].reorder(b_)  # one axis: nothing moves
    assert leaf_names(s[B]) == ["c", "b", "d", "a"]
    x = rand(shape)
    check(s, [A, B], [x], [x * 3])


def test_reorder_subset_with_reduction_axes():
    A = te.placeholder((7, 13), name="A")
    k = te.reduce_axis((0, 13), "k")
    B = te.compute((7,), lambda i: te.sum(A[i, k], axis=k), name="B")
    s = te.create_schedule(B.op)
    ko, ki = s[B].split(k, 4)
    s[B].reorder(ki, B.op.axis[0])  # leaves i, ko, ki -> ki, ko, i
    assert leaf_names(s[B]) == ["k.inner", "k.outer", "i"]
    a = rand((7, 13))
    check(s, [A, B], [a], [a.sum(1)], rtol=1e-4)


def test_reorder_errors_name_the_stage_and_axis():
    A = te.placeholder((4, 4), name="A")
    B = te.compute((4, 4), lambda i, j: A[i, j], name="B")
    C = te.compute((4, 4), lambda i, j: B[i, j], name="C")
    s = te.create_schedule(C.op)
    i, j = B.op.axis
    with pytest.raises(tc.ScheduleError, match=r"stage B: reorder: an axis is listed twice \('i'\)"):
        s[B].reorder(i, j, i)
    with pytest.raises(tc.ScheduleError, match=r"stage B: reorder: axis 'i' does not belong"):
        s[B].reorder(C.op.axis[0], j)
    s[B].split(i, 2)
    with pytest.raises(tc.ScheduleError, match=r"stage B: reorder: axis 'i' has already been split"):
        s[B].reorder(j, i)


# compute_at of a stage with its own reductions -----------------------------------------------


@pytest.mark.parametrize("n,factor", [(16, 4), (19, 4)])
def test_compute_at_reduction_into_a_split_consumer(n, factor):
    A = te.placeholder((n, 11), name="A")
    k = te.reduce_axis((0, 11), "k")
    B = te.compute((n,), lambda i: te.sum(A[i, k], axis=k), name="B")
    C = te.compute((n,), lambda i: B[i] * 2, name="C")
    s = te.create_schedule(C.op)
    xo, xi = s[C].split(C.op.axis[0], factor)
    s[B].compute_at(s[C], xo)
    ko, ki = s[B].split(k, 3)  # the producer's own reduction is split (tail) and reordered
    s[B].reorder(ko, B.op.axis[0], ki)
    a = rand((n, 11))
    check(s, [A, C], [a], [a.sum(1) * 2], rtol=1e-4)


def test_compute_at_reduction_into_a_consumer_reduction_axis():
    # B[i, j] = sum_k A[i, j, k] computed inside C's reduction loop over j
    A = te.placeholder((6, 7, 5), name="A")
    k = te.reduce_axis((0, 5), "k")
    B = te.compute((6, 7), lambda i, j: te.sum(A[i, j, k], axis=k), name="B")
    r = te.reduce_axis((0, 7), "r")
    C = te.compute((6,), lambda i: te.max(B[i, r], axis=r), name="C")
    s = te.create_schedule(C.op)
    ro, ri = s[C].split(r, 3)
    s[B].compute_at(s[C], ro)
    a = rand((6, 7, 5))
    check(s, [A, C], [a], [a.sum(2).max(1)], rtol=1e-4)


def test_compute_at_matmul_into_tiled_consumer():
    M, N, K = 21, 18, 13
    A = te.placeholder((M, K), name="A")
    W = te.placeholder((K, N), name="W")
    k = te.reduce_axis((0, K), "k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), name="C")
    D = te.compute((M, N), lambda i, j: te.max(C[i, j], 0.0), name="D")
    s = te.create_schedule(D.op)
    xo, yo, xi, yi = s[D].tile(D.op.axis[0], D.op.axis[1], 8, 8)
    s[C].compute_at(s[D], yo)
    ko, ki = s[C].split(s[C].op.reduce_axis[0], 4)
    s[D].vectorize(yi)
    a, w = rand((M, K)), rand((K, N))
    check(s, [A, W, D], [a, w], [np.maximum(a @ w, 0)], rtol=1e-4)


# rfactor with an init value ----------------------------------------------------------------


@pytest.mark.parametrize("n", [32, 37])
def test_rfactor_with_constant_init(n):
    A = te.placeholder((5, n), name="A")
    k = te.reduce_axis((0, n), "k")
    B = te.compute((5,), lambda i: te.sum(A[i, k], axis=k, init=3.0), name="B")
    s = te.create_schedule(B.op)
    ko, ki = s[B].split(k, 8)
    BF = s.rfactor(B, ki)
    s[BF].vectorize(BF.op.axis[0])
    a = rand((5, n))
    # the init is combined once, not once per partial result
    check(s, [A, B], [a], [a.sum(1) + 3], rtol=1e-4)


@pytest.mark.parametrize("n", [16, 19])
def test_rfactor_with_tensor_init_and_factor_axis(n):
    # TVM's test_rfactor_init: a matmul accumulating onto I, factored along k's outer part
    A = te.placeholder((n, n), name="A")
    C = te.placeholder((n, n), name="C")
    Ini = te.placeholder((n, n), name="I")
    k = te.reduce_axis((0, n), "k")
    B = te.compute((n, n), lambda i, j: te.sum(A[i, k] * C[k, j], axis=k, init=Ini[i, j]),
                   name="B")
    s = te.create_schedule(B.op)
    kf, ki = s[B].split(k, nparts=4)
    BF = s.rfactor(B, kf, 1)
    assert tuple(int(x) for x in BF.shape) == (n, 4, n)
    s[BF].parallel(BF.op.axis[0])
    a, c, ii = rand((n, n)), rand((n, n)), rand((n, n))
    check(s, [A, C, Ini, B], [a, c, ii], [a @ c + ii], rtol=1e-4)


def test_rfactor_keeps_a_user_reducer_identity():
    # a product (identity 1) and a max (identity -inf): partials must start there, not at 0
    A = te.placeholder((4, 10), name="A")
    k = te.reduce_axis((0, 10), "k")
    mul = te.comm_reducer(lambda x, y: x * y, lambda t: tc.const(1, t), name="mul")
    P = te.compute((4,), lambda i: mul(A[i, k], axis=k), name="P")
    k2 = te.reduce_axis((0, 10), "k2")
    M = te.compute((4,), lambda i: te.max(A[i, k2], axis=k2, init=-100.0), name="M")
    s = te.create_schedule([P.op, M.op])
    s.rfactor(P, s[P].split(k, 3)[1])
    s.rfactor(M, s[M].split(k2, nparts=3)[0])
    a = (RNG.uniform(0.5, 1.5, (4, 10)) * -1).astype("float32")
    check(s, [A, P, M], [a], [np.prod(a, 1), a.max(1)], rtol=1e-4)


# tuple reducers (argmax) and their rfactor --------------------------------------------------


def _argmax() -> Any:
    def fcombine(x, y):
        lhs = te.if_then_else(x[1] >= y[1], x[0], y[0])
        rhs = te.if_then_else(x[1] >= y[1], x[1], y[1])
        return lhs, rhs

    def fidentity(t0, t1):
        return tc.const(-1, t0), te.min_value(t1)

    return te.comm_reducer(fcombine, fidentity, name="argmax")


def _argmax_decl(m: int, n: int) -> tuple[Any, ...]:
    argmax = _argmax()
    idx = te.placeholder((m, n), name="idx", dtype="int32")
    val = te.placeholder((m, n), name="val", dtype="float32")
    k = te.reduce_axis((0, n), "k")
    T0, T1 = te.compute((m,), lambda i: argmax((idx[i, k], val[i, k]), axis=k), name="T")
    return idx, val, k, T0, T1


def _argmax_data(m: int, n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    ni = np.tile(np.arange(n, dtype="int32"), (m, 1))
    nv = RNG.permuted(np.tile(np.arange(n, dtype="float32"), (m, 1)), axis=1)  # no ties
    return [ni, nv], [nv.argmax(1).astype("int32"), nv.max(1)]


@pytest.mark.parametrize("n", [16, 19])
def test_argmax_tuple_reducer(n):
    idx, val, k, T0, T1 = _argmax_decl(12, n)
    s = te.create_schedule(T0.op)
    ko, ki = s[T0].split(k, 4)
    inputs, expected = _argmax_data(12, n)
    check(s, [idx, val, T0, T1], inputs, expected)


@pytest.mark.parametrize("n", [32, 35])
def test_argmax_rfactor_returns_one_tensor_per_value(n):
    idx, val, k, T0, T1 = _argmax_decl(10, n)
    s = te.create_schedule(T0.op)
    ko, kf = s[T0].split(k, 8)
    BF = s.rfactor(T0, kf)
    assert isinstance(BF, list) and len(BF) == 2
    BF0, BF1 = BF
    assert BF0.op is BF1.op and (BF0.dtype, BF1.dtype) == ("int32", "float32")
    assert tuple(int(x) for x in BF0.shape) == (8, 10)
    s[BF0.op].parallel(BF0.op.axis[0])
    inputs, expected = _argmax_data(10, n)
    check(s, [idx, val, T0, T1], inputs, expected)


def test_argmax_rfactor_computed_at_the_final_stage():
    idx, val, k, T0, T1 = _argmax_decl(9, 29)
    s = te.create_schedule(T0.op)
    ko, kf = s[T0].split(k, nparts=4)
    BF0, BF1 = s.rfactor(T0, ko, 1)
    assert tuple(int(x) for x in BF1.shape) == (9, 4)
    xo, xi = s[T0].split(s[T0].op.axis[0], 4)
    s[BF1].compute_at(s[T0], xo)
    inputs, expected = _argmax_data(9, 29)
    check(s, [idx, val, T0, T1], inputs, expected)


def test_two_value_sum_product_reducer_with_rfactor():
    red = te.comm_reducer(lambda x, y: (x[0] + y[0], x[1] * y[1]),
                          lambda t0, t1: (tc.const(0, t0), tc.const(1, t1)), name="add_mul")
    A0 = te.placeholder((6, 23), name="A0")
    A1 = te.placeholder((6, 23), name="A1")
    k = te.reduce_axis((0, 23), "k")
    T0, T1 = te.compute((6,), lambda i: red((A0[i, k], A1[i, k]), axis=k), name="T")
    s = te.create_schedule(T0.op)
    s.rfactor(T0, s[T0].split(k, 5)[1])
    a0, a1 = rand((6, 23)), RNG.uniform(0.8, 1.2, (6, 23)).astype("float32")
    check(s, [A0, A1, T0, T1], [a0, a1], [a0.sum(1), np.prod(a1, 1)], rtol=1e-4)


def test_rfactor_errors_name_the_stage_and_axis():
    idx, val, k, T0, T1 = _argmax_decl(4, 8)
    s = te.create_schedule(T0.op)
    with pytest.raises(tc.ScheduleError, match=r"stage T: rfactor axis 'i' is not a reduction axis"):
        s.rfactor(T0, T0.op.axis[0])
    with pytest.raises(tc.ScheduleError, match=r"stage T: rfactor factor_axis 5 out of range"):
        s.rfactor(T0, k, 5)
    ko, ki = s[T0].split(k, 2)
    with pytest.raises(tc.ScheduleError, match=r"stage T: rfactor: axis 'k' has already been split"):
        s.rfactor(T0, k)
    A = te.placeholder((4,), name="A")
    B = te.compute((4,), lambda i: A[i] + 1, name="B")
    with pytest.raises(tc.ScheduleError, match=r"rfactor: stage B is not a reduction"):
        te.create_schedule(B.op).rfactor(B, B.op.axis[0])


# set_store_predicate on the CPU -------------------------------------------------------------


@pytest.mark.parametrize("n", [16, 21])
def test_store_predicate_elementwise(n):
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] + 1, name="B")
    s = te.create_schedule(B.op)
    xo, xi = s[B].split(B.op.axis[0], 4)
    s[B].set_store_predicate(B.op.axis[0].var % 3 != 1)
    a = rand((n,))
    want = np.where(np.arange(n) % 3 != 1, a + 1, 0).astype("float32")
    check(s, [A, B], [a], [want])


def test_store_predicate_reduction_keeps_unselected_outputs():
    A = te.placeholder((7, 9), name="A")
    k = te.reduce_axis((0, 9), "k")
    B = te.compute((7,), lambda i: te.sum(A[i, k], axis=k), name="B")
    s = te.create_schedule(B.op)
    s[B].set_store_predicate(B.op.axis[0] < 4)
    a = rand((7, 9))
    want = np.where(np.arange(7) < 4, a.sum(1), 0).astype("float32")
    check(s, [A, B], [a], [want], rtol=1e-4)


def test_store_predicate_errors():
    A = te.placeholder((4,), name="A")
    B = te.compute((4,), lambda i: A[i] + 1, name="B")
    s = te.create_schedule(B.op)
    with pytest.raises(tc.ScheduleError, match=r"stage B: set_store_predicate: expected a boolean"):
        s[B].set_store_predicate(A[0] * 2)


# chained indexing A[i][j] --------------------------------------------------------------------


def test_chained_indexing():
    A = te.placeholder((4, 5, 6), name="A")
    B = te.compute((4, 5, 6), lambda i, j, k: A[i][j][k] + A[i][j, k] * A[i, j][k], name="B")
    C = te.compute((4, 6), lambda i, k: B(i, 0, k) * 2, name="C")
    s = te.create_schedule(C.op)
    a = rand((4, 5, 6))
    b = a + a * a
    check(s, [A, C], [a], [b[:, 0, :] * 2], rtol=1e-4)
    sl = A[1]
    assert sl.dtype == "float32" and "A" in repr(sl)


def test_chained_indexing_errors():
    A = te.placeholder((4, 5), name="A")
    with pytest.raises(tc.TecompError, match=r"tensor A has 2 dimensions but was indexed with 1"):
        te.compute((4,), lambda i: A[i], name="B")
    with pytest.raises(tc.TecompError, match=r"tensor A has 2 dimensions but was indexed with 3"):
        A[0][1, 2]
    with pytest.raises(tc.TecompError, match=r"index 1 of tensor A must be a scalar integer"):
        A[0][1.5]
    with pytest.raises(tc.TecompError, match=r"tensor A has 2 dimensions but was called with 1"):
        A(0)


# tc.lower(..., simple_mode=True) -----------------------------------------------------------


def test_simple_mode_skips_loop_partition():
    A = te.placeholder((37,), name="A")
    B = te.compute((37,), lambda i: A[i] * 2, name="B")
    s = te.create_schedule(B.op)
    xo, xi = s[B].split(B.op.axis[0], 8)
    full = str(tc.lower(s, [A, B]))
    simple = str(tc.lower(s, [A, B], simple_mode=True))
    assert simple.startswith("def main(A: float32[37], B: float32[37]):")
    # one nest, the tail guarded in place (TVM 0.19: simple_mode disables LoopPartition)
    assert simple.count("for i.inner") == 1 and "if i.outer * 8 + i.inner < 37" in simple
    assert full.count("for i.inner") == 2 and "if " not in full
    a = rand((37,))
    check(s, [A, B], [a], [a * 2], simple_mode=True)
    f = tc.lower(s, [A, B], simple_mode=True)
    out = np.zeros(37, "float32")
    tc.build(f)(a, out)  # still a whole function: it builds
    np.testing.assert_allclose(out, a * 2)


def test_simple_mode_on_a_reduction_with_compute_at():
    A = te.placeholder((19, 7), name="A")
    k = te.reduce_axis((0, 7), "k")
    B = te.compute((19,), lambda i: te.sum(A[i, k], axis=k), name="B")
    C = te.compute((19,), lambda i: B[i] + 1, name="C")
    s = te.create_schedule(C.op)
    xo, xi = s[C].split(C.op.axis[0], 4)
    s[B].compute_at(s[C], xo)
    text = str(tc.lower(s, [A, C], simple_mode=True))
    assert text.count("allocate B") == 1
    a = rand((19, 7))
    check(s, [A, C], [a], [a.sum(1) + 1], rtol=1e-4, simple_mode=True)


# deterministic, unambiguous printing ----------------------------------------------------------


def _tiled_schedule() -> tuple[Any, list[Any]]:
    A = te.placeholder((37, 29), name="A")
    W = te.placeholder((29, 23), name="W")
    k = te.reduce_axis((0, 29), "k")
    C = te.compute((37, 23), lambda i, j: te.sum(A[i, k] * W[k, j], axis=k), name="C")
    D = te.compute((37, 23), lambda i, j: C[i, j] + 1, name="D")
    s = te.create_schedule(D.op)
    xo, yo, xi, yi = s[D].tile(D.op.axis[0], D.op.axis[1], 8, 8)
    s[C].compute_at(s[D], yo)
    s[C].split(s[C].op.reduce_axis[0], 4)
    s[D].vectorize(yi)
    s[D].parallel(xo)
    return s, [A, W, D]


@pytest.mark.parametrize("simple_mode", [False, True])
def test_lower_text_is_deterministic(simple_mode):
    s, args = _tiled_schedule()
    f = tc.lower(s, args, simple_mode=simple_mode)
    t1 = str(f)
    assert str(f) == t1  # printing twice
    assert str(tc.lower(s, args, simple_mode=simple_mode)) == t1  # lowering twice
    s2, args2 = _tiled_schedule()  # the same declaration and schedule, rebuilt
    assert str(tc.lower(s2, args2, simple_mode=simple_mode)) == t1
    assert not re.search(r"0x[0-9a-f]{6,}|\d{9,}", t1)  # no object ids in names


def _shadowing_schedule() -> tuple[Any, list[Any]]:
    # B is computed at C's loop i and has an axis named i of its own (extent 2 there)
    A = te.placeholder((9, 4), name="A")
    B = te.compute((9, 4), lambda i, j: A[i, j] * 2, name="B")
    C = te.compute((8, 4), lambda i, j: B[i, j] + B[i + 1, j], name="C")
    s = te.create_schedule(C.op)
    s[B].compute_at(s[C], C.op.axis[0])
    return s, [A, C]


def test_printer_renames_a_shadowing_loop_variable():
    s, args = _shadowing_schedule()
    text = str(tc.lower(s, args))
    assert "for i in range(8):" in text
    assert "for i_1 in range(2):" in text  # not a second "for i" inside the first
    assert text == str(tc.lower(*_shadowing_schedule()))
    a = rand((9, 4))
    check(s, args, [a], [a[:-1] * 2 + a[1:] * 2])

"""Cross-thread reductions on cuda targets: a reduce axis bound to threadIdx (warp shuffles,
shared memory across warps, a shared-memory tree), rfactor onto threads with a store predicate,
row softmax in one kernel. Every kernel is emulated against numpy and its PTX checked by ptxas."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.codegen.ptxas import find_ptxas
from tecomp.errors import ScheduleError

ARCHS = ["sm_80", "sm_90"]
ptxas_missing = find_ptxas() is None


def _rand(*shape: int, seed: int = 0, dtype: str = "float32") -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _ptxas_ok(s: Any, args: list[Any], shared: bool | None = None) -> str:
    """The sm_80 PTX; both archs assembled by ptxas with no spills (a failure without ptxas:
    CI machines have it)."""
    assert not ptxas_missing, "ptxas (CUDA toolkit) is needed: it is on every CI machine"
    ptx = ""
    for arch in ARCHS:
        f = tc.build(s, args, target=f"cuda -arch={arch}")
        r = f.resources
        assert r is not None, f.resources_why
        assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_frame == 0
        if shared is not None:
            assert (r.shared_bytes > 0) == shared
        if arch == "sm_80":
            ptx = f.get_source("ptx")
    return ptx


def row_sum(n: int, m: int, nthread: int, tag: str = "threadIdx.x", rows_per_block: int = 1,
            dtype: str = "float32", reducer: Callable[..., Any] = te.sum) -> tuple[Any, list[Any]]:
    """B[i] = reduce_k A[i, k]; k split by ``nthread`` threads of ``tag``; ``rows_per_block``
    rows per block on the other thread tag."""
    A = te.placeholder((n, m), name="A", dtype=dtype)
    k = te.reduce_axis((0, m), name="k")
    B = te.compute((n,), lambda i: reducer(A[i, k], axis=k), name="B")
    s = te.create_schedule(B.op)
    _, ki = s[B].split(B.op.reduce_axis[0], factor=nthread)
    t = te.thread_axis(tag)
    s[B].bind(ki, t)
    if rows_per_block > 1:
        other = "threadIdx.y" if tag == "threadIdx.x" else "threadIdx.x"
        io, ii = s[B].split(B.op.axis[0], factor=rows_per_block)
        s[B].bind(io, te.thread_axis("blockIdx.x"))
        s[B].bind(ii, te.thread_axis(other))
    else:
        s[B].bind(B.op.axis[0], te.thread_axis("blockIdx.x"))
    s[B].set_store_predicate(t.var.equal(0))
    return s, [A, B]


# (threads, tag, rows per block, the combination it takes)
SHAPES = [
    (32, "threadIdx.x", 1, "warp"),  # one warp: shuffles only
    (16, "threadIdx.x", 4, "warp"),  # 16-lane segments, two rows per warp
    (8, "threadIdx.x", 8, "warp"),
    (128, "threadIdx.x", 1, "warps"),  # shuffles, then one partial per warp in shared memory
    (64, "threadIdx.x", 2, "warps"),
    (20, "threadIdx.x", 1, "tree"),  # not a power of two
    (16, "threadIdx.x", 3, "tree"),  # 48 threads: the last warp is not whole
    (16, "threadIdx.y", 4, "tree"),  # reduced over y
]


@pytest.mark.parametrize("nthread,tag,rows,path", SHAPES)
def test_row_sum_across_threads(nthread: int, tag: str, rows: int, path: str) -> None:
    n, m = 10, 203  # tails everywhere: rows % rows_per_block, m % nthread
    s, args = row_sum(n, m, nthread, tag, rows)
    f = tc.build(s, args, target="cuda")
    tir = f.get_source("tir")
    assert ("shfl_xor_sync" in tir) == (path in ("warp", "warps"))
    assert ("syncthreads" in tir) == (path in ("warps", "tree"))
    a = _rand(n, m)
    for seed in (0, 1):
        b = np.zeros(n, np.float32)
        f.emulate(a, b, seed=seed)
        np.testing.assert_allclose(b, a.sum(1), rtol=1e-5, atol=1e-5)
    ptx = _ptxas_ok(s, args, shared=path != "warp")
    assert ("shfl.sync.bfly.b32" in ptx) == (path in ("warp", "warps"))


@pytest.mark.parametrize("dtype,reducer,ref", [
    ("int32", te.max, np.max),  # 32-bit ints shuffle too
    ("float64", te.sum, np.sum),  # 64-bit values take the shared-memory tree
    ("int8", te.min, np.min),
])
def test_other_types_and_reducers(dtype: str, reducer: Callable[..., Any], ref: Callable[..., Any]) -> None:
    s, args = row_sum(5, 77, 32, dtype=dtype, reducer=reducer)
    f = tc.build(s, args, target="cuda")
    a = (np.random.default_rng(3).integers(-100, 100, (5, 77))).astype(dtype)
    b = np.zeros(5, dtype)
    f.emulate(a, b)
    np.testing.assert_allclose(b, ref(a, axis=1), rtol=1e-12)
    assert ("shfl_xor_sync" in f.get_source("tir")) == (dtype == "int32")
    _ptxas_ok(s, args)


def test_two_reduced_thread_tags() -> None:
    # k split twice: 8 threads in x times 4 in y reduce each row together (a tree of 32)
    A = te.placeholder((6, 100), name="A")
    k = te.reduce_axis((0, 100), name="k")
    B = te.compute((6,), lambda i: te.sum(A[i, k], axis=k), name="B")
    s = te.create_schedule(B.op)
    ko, ki = s[B].split(k, factor=8)
    ko, kj = s[B].split(ko, factor=4)
    s[B].bind(B.op.axis[0], te.thread_axis("blockIdx.x"))
    tx, ty = te.thread_axis("threadIdx.x"), te.thread_axis("threadIdx.y")
    s[B].bind(ki, tx)
    s[B].bind(kj, ty)
    f = tc.build(s, [A, B], target="cuda")
    a = _rand(6, 100)
    b = np.zeros(6, np.float32)
    f.emulate(a, b)
    np.testing.assert_allclose(b, a.sum(1), rtol=1e-5, atol=1e-5)
    _ptxas_ok(s, [A, B])


def test_argmax_across_a_warp() -> None:
    # a tuple reducer: both values shuffle together, ties to the lower index
    def fcombine(x: Any, y: Any) -> Any:
        lhs = te.if_then_else(x[1] >= y[1], x[0], y[0])
        rhs = te.if_then_else(x[1] >= y[1], x[1], y[1])
        return lhs, rhs

    def fidentity(t0: str, t1: str) -> Any:
        return tc.const(-1, t0), te.min_value(t1)

    argmax = te.comm_reducer(fcombine, fidentity, name="argmax")
    n, m = 7, 90
    A = te.placeholder((n, m), name="A")
    k = te.reduce_axis((0, m), name="k")
    T0, T1 = te.compute((n,), lambda i: argmax((k.var, A[i, k]), axis=k), name="T")
    s = te.create_schedule(T0.op)
    _, ki = s[T0].split(k, factor=32)
    s[T0].bind(T0.op.axis[0], te.thread_axis("blockIdx.x"))
    s[T0].bind(ki, te.thread_axis("threadIdx.x"))
    f = tc.build(s, [A, T0, T1], target="cuda")
    assert f.get_source("tir").count("shfl_xor_sync") == 10  # 5 steps x 2 values
    a = np.random.default_rng(4).integers(0, 20, (n, m)).astype(np.float32)  # many ties
    idx, val = np.zeros(n, np.int32), np.zeros(n, np.float32)
    f.emulate(a, idx, val)
    # the fold order differs from numpy's, but with `>=` taking the left operand the winner
    # among equal maxima depends on the order: compare the values, and that idx points at one
    np.testing.assert_array_equal(val, a.max(1))
    np.testing.assert_array_equal(a[np.arange(n), idx], a.max(1))
    _ptxas_ok(s, [A, T0, T1])


def test_tvm_reduction_tutorial_rfactor_onto_threads() -> None:
    # TVM's "Reduction" how-to (cuda part), verbatim apart from the import and the sizes
    n = te.var("n")
    m = te.var("m")
    A = te.placeholder((n, m), name="A")
    k = te.reduce_axis((0, m), "k")
    B = te.compute((n,), lambda i: te.sum(A[i, k], axis=k), name="B")
    s = te.create_schedule(B.op)
    ko, ki = s[B].split(B.op.reduce_axis[0], factor=16)
    BF = s.rfactor(B, ki)
    xo, xi = s[B].split(s[B].op.axis[0], factor=32)
    s[B].bind(xo, te.thread_axis("blockIdx.x"))
    s[B].bind(xi, te.thread_axis("threadIdx.y"))
    tx = te.thread_axis("threadIdx.x")
    s[B].bind(s[B].op.reduce_axis[0], tx)
    s[BF].compute_at(s[B], s[B].op.reduce_axis[0])
    s[B].set_store_predicate(tx.var.equal(0))
    fcuda = tc.build(s, [A, B], "cuda")
    for nn, mm in ((70, 45), (32, 16), (5, 1)):
        a = np.random.default_rng(0).uniform(size=(nn, mm)).astype(A.dtype)
        b = np.zeros(nn, dtype=B.dtype)
        fcuda.emulate(a, b)
        np.testing.assert_allclose(b, np.sum(a, axis=1), rtol=1e-4)
    assert "if k_inner_v == 0" in fcuda.get_source("tir").replace(".", "_") or "== 0" in fcuda.get_source("tir")
    _ptxas_ok(s, [A, B])


def softmax_one_kernel(n: int, m: int, nthread: int) -> tuple[Any, list[Any]]:
    """Row softmax as one kernel: a block per row; the max and the sum are cross-thread
    reductions computed at the row's blockIdx loop (per block, in shared memory)."""
    A = te.placeholder((n, m), name="A")
    k1 = te.reduce_axis((0, m), "k1")
    k2 = te.reduce_axis((0, m), "k2")
    M = te.compute((n,), lambda i: te.max(A[i, k1], axis=k1), name="M")
    E = te.compute((n, m), lambda i, j: te.exp(A[i, j] - M[i]), name="E")
    S = te.compute((n,), lambda i: te.sum(E[i, k2], axis=k2), name="S")
    O = te.compute((n, m), lambda i, j: E[i, j] / S[i], name="O")
    s = te.create_schedule(O.op)
    bx, tx = te.thread_axis("blockIdx.x"), te.thread_axis("threadIdx.x")
    s[E].compute_inline()
    s[O].bind(O.op.axis[0], bx)
    jo, ji = s[O].split(O.op.axis[1], nparts=nthread)
    s[O].bind(jo, tx)
    for R in (M, S):
        _, ki = s[R].split(R.op.reduce_axis[0], factor=nthread)
        s[R].bind(ki, tx)
        s[R].compute_at(s[O], O.op.axis[0])
        s[R].set_store_predicate(tx.var.equal(0))
    return s, [A, O]


@pytest.mark.parametrize("nthread", [128, 48])
def test_row_softmax_in_one_kernel(nthread: int) -> None:
    n, m = 6, 1000
    s, args = softmax_one_kernel(n, m, nthread)
    f = tc.build(s, args, target="cuda")
    a = _rand(n, m) * 4
    o = np.zeros((n, m), np.float32)
    f.emulate(a, o)
    e = np.exp(a - a.max(1, keepdims=True))
    np.testing.assert_allclose(o, e / e.sum(1, keepdims=True), rtol=1e-5, atol=1e-7)
    _ptxas_ok(s, args, shared=True)


def test_the_reduction_needs_its_barriers(monkeypatch: pytest.MonkeyPatch) -> None:
    # the test-only hook: the tree without its barriers, and no thread-sync pass to put them
    # back, is reported as a race on the reduction buffer
    from tecomp.ir.expr import const
    from tecomp.ir.stmt import Evaluate
    from tecomp.lowering import cross_thread
    from tecomp.passes import pipeline
    from tecomp.runtime.gpu_race import RaceError

    monkeypatch.setattr(cross_thread, "barrier", lambda: Evaluate(const(0)))
    monkeypatch.setattr(pipeline, "GPU_PIPELINE", [p for p in pipeline.GPU_PIPELINE if p[0] != "thread_sync"])
    s, args = row_sum(4, 50, 20)
    f = tc.build(s, args, target="cuda")
    with pytest.raises(RaceError, match="B_red_buf0"):
        f.emulate(_rand(4, 50), np.zeros(4, np.float32))


def test_cross_thread_schedules_that_cannot_work_are_refused() -> None:
    A = te.placeholder((8, 64), name="A")
    k = te.reduce_axis((0, 64), name="k")
    B = te.compute((8,), lambda i: te.sum(A[i, k], axis=k), name="B")

    s = te.create_schedule(B.op)
    ko, ki = s[B].split(k, factor=32)
    s[B].bind(ko, te.thread_axis("blockIdx.y"))
    s[B].bind(ki, te.thread_axis("threadIdx.x"))
    with pytest.raises(ScheduleError, match="blocks cannot combine"):
        tc.build(s, [A, B], target="cuda")

    # the reduction over 16 threads in a block 32 wide (another stage binds 32)
    C = te.compute((8, 64), lambda i, j: A[i, j] * 2, name="C")
    D = te.compute((8,), lambda i: te.sum(C[i, k], axis=k), name="D")
    s = te.create_schedule(D.op)
    s[D].bind(D.op.axis[0], te.thread_axis("blockIdx.x"))
    _, ki = s[D].split(k, factor=16)
    tx = te.thread_axis("threadIdx.x")
    s[D].bind(ki, tx)
    s[C].compute_at(s[D], D.op.axis[0])
    _, cj = s[C].split(C.op.axis[1], factor=32)
    s[C].bind(cj, te.thread_axis("threadIdx.x"))
    with pytest.raises(ScheduleError, match="needs every thread of the block"):
        tc.build(s, [A, D], target="cuda")

    # the block has threadIdx.y threads, but the reduction is not inside a y loop
    s = te.create_schedule(D.op)
    s[D].bind(D.op.axis[0], te.thread_axis("blockIdx.x"))
    _, ki = s[D].split(k, factor=32)
    s[D].bind(ki, te.thread_axis("threadIdx.x"))
    s[C].compute_at(s[D], D.op.axis[0])
    ci, cj = s[C].split(C.op.axis[1], factor=32)
    s[C].bind(cj, te.thread_axis("threadIdx.x"))
    s[C].bind(ci, te.thread_axis("threadIdx.y"))
    with pytest.raises(ScheduleError, match="not inside a loop bound to threadIdx.y"):
        tc.build(s, [A, D], target="cuda")

    # a stage computed at the thread loop, which was inside the serial reduce loop
    s = te.create_schedule(B.op)
    AL = s.cache_read(A, "local", [B])
    ro, ri = s[B].split(k, factor=4)
    s[B].bind(B.op.axis[0], te.thread_axis("blockIdx.x"))
    s[B].bind(ri, te.thread_axis("threadIdx.x"))
    s[AL].compute_at(s[B], ri)
    with pytest.raises(ScheduleError, match="inside the serial reduction loop 'k.outer'"):
        tc.build(s, [A, B], target="cuda")
    s[B].reorder(ri, ro)  # the thread loop outside: fine
    f = tc.build(s, [A, B], target="cuda")
    a, b = _rand(8, 64), np.zeros(8, np.float32)
    f.emulate(a, b)
    np.testing.assert_allclose(b, a.sum(1), rtol=1e-5, atol=1e-5)


def test_store_predicate_on_an_ordinary_stage() -> None:
    # TVM semantics: the predicate guards the stage's stores, whatever the stage
    A = te.placeholder((64,), name="A")
    B = te.compute((64,), lambda i: A[i] + 1, name="B")
    s = te.create_schedule(B.op)
    bo, bi = s[B].split(B.op.axis[0], factor=32)
    s[B].bind(bo, te.thread_axis("blockIdx.x"))
    tx = te.thread_axis("threadIdx.x")
    s[B].bind(bi, tx)
    s[B].set_store_predicate(tx.var < 5)
    f = tc.build(s, [A, B], target="cuda")
    a = _rand(64)
    b = np.full(64, -7, np.float32)
    f.emulate(a, b)
    want = np.full(64, -7, np.float32)
    want[[0, 1, 2, 3, 4, 32, 33, 34, 35, 36]] = a[[0, 1, 2, 3, 4, 32, 33, 34, 35, 36]] + 1
    np.testing.assert_array_equal(b, want)
    with pytest.raises(ScheduleError, match="boolean"):
        s[B].set_store_predicate(A[0])


def test_a_per_thread_result_is_stored_by_every_thread() -> None:
    # R computed at the consumer's threadIdx.y loop is per thread ("local"); reduced across
    # threadIdx.x, every thread must get the total in its own copy, not only the first
    A = te.placeholder((8, 40), name="A")
    k = te.reduce_axis((0, 40), name="k")
    R = te.compute((8,), lambda i: te.sum(A[i, k], axis=k), name="R")
    B = te.compute((8, 32), lambda i, j: A[i, j] + R[i], name="B")
    s = te.create_schedule(B.op)
    i, j = B.op.axis
    io, ii = s[B].split(i, factor=4)
    s[B].bind(io, te.thread_axis("blockIdx.x"))
    s[B].bind(ii, te.thread_axis("threadIdx.y"))
    s[B].bind(j, te.thread_axis("threadIdx.x"))
    s[R].compute_at(s[B], ii)
    _, ki = s[R].split(R.op.reduce_axis[0], factor=32)
    s[R].bind(ki, te.thread_axis("threadIdx.x"))
    f = tc.build(s, [A, B], target="cuda")
    a = _rand(8, 40)
    b = np.zeros((8, 32), np.float32)
    f.emulate(a, b)
    np.testing.assert_allclose(b, a[:, :32] + a.sum(1, keepdims=True), rtol=1e-5, atol=1e-5)


def test_shuffles_in_a_loop_with_a_tail_are_reached_by_every_lane() -> None:
    # the serial row loop around the warp shuffles has a tail (15 rows, 2 per thread row):
    # loop partitioning must not give threads different trip counts around the shuffles
    A = te.placeholder((15, 16), name="A")
    k = te.reduce_axis((0, 16), name="k")
    B = te.compute((15,), lambda i: te.sum(A[i, k], axis=k), name="B")
    s = te.create_schedule(B.op)
    io, ii = s[B].split(B.op.axis[0], factor=2)
    _, ki = s[B].split(k, factor=4)
    s[B].reorder(io, ki, ii)
    s[B].bind(io, te.thread_axis("threadIdx.y"))
    s[B].bind(ki, te.thread_axis("threadIdx.x"))
    f = tc.build(s, [A, B], target="cuda")
    assert "shfl_xor_sync" in f.get_source("tir")
    a = _rand(15, 16)
    b = np.zeros(15, np.float32)
    f.emulate(a, b)
    np.testing.assert_allclose(b, a.sum(1), rtol=1e-5, atol=1e-5)


def test_each_kernel_has_its_own_block_for_a_cross_thread_reduction() -> None:
    # two root stages are two kernels: the reduction's 32 threads are compared with the block
    # of its own kernel, not with the 64 threads of the elementwise kernel before it
    n, m = 6, 96
    A = te.placeholder((n, m), name="A")
    E = te.compute((n, m), lambda i, j: A[i, j] * 2.0, name="E")
    k = te.reduce_axis((0, m), name="k")
    B = te.compute((n,), lambda i: te.sum(E[i, k], axis=k), name="B")
    s = te.create_schedule(B.op)
    fo, fi = s[E].split(s[E].fuse(*E.op.axis), factor=64)
    s[E].bind(fo, te.thread_axis("blockIdx.x"))
    s[E].bind(fi, te.thread_axis("threadIdx.x"))
    _, ki = s[B].split(B.op.reduce_axis[0], factor=32)
    tx = te.thread_axis("threadIdx.x")
    s[B].bind(ki, tx)
    s[B].bind(B.op.axis[0], te.thread_axis("blockIdx.x"))
    s[B].set_store_predicate(tx.var.equal(0))
    f = tc.build(s, [A, B], target="cuda")
    a = _rand(n, m)
    out = np.zeros(n, np.float32)
    f.emulate(a, out)
    np.testing.assert_allclose(out, (a * 2).sum(1), rtol=1e-5)
    assert len(f["main"].kernels) == 2

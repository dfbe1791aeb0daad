"""Before/expected checks of the lowering passes (loop partition, unroll, flatten, vectorize,
storage rewrite), each also run end to end against numpy."""

from __future__ import annotations

import numpy as np

import tecomp as tc
from tecomp import te
from tecomp.ir import ForKind, StmtVisitor
from tecomp.ir.expr import BufferLoad, Ramp
from tecomp.lowering import lower


class _Collect(StmtVisitor):
    def __init__(self):
        self.fors, self.ifs, self.allocs, self.stores, self.loads = [], [], [], [], []

    def visit_For(self, s):
        self.fors.append(s)
        super().visit_For(s)

    def visit_IfThenElse(self, s):
        self.ifs.append(s)
        super().visit_IfThenElse(s)

    def visit_Allocate(self, s):
        self.allocs.append(s)
        super().visit_Allocate(s)

    def visit_BufferStore(self, s):
        self.stores.append(s)
        super().visit_BufferStore(s)

    def visit_BufferLoad(self, e):
        self.loads.append(e)
        super().visit_BufferLoad(e)


def collect(func):
    c = _Collect()
    c.visit_stmt(func.body)
    return c


def test_loop_partition_removes_guard_from_steady_state():
    n = 100
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * 2, name="B")
    s = te.create_schedule(B.op)
    xo, xi = s[B].split(s[B].op.axis[0], factor=16)
    raw = collect(lower(s, [A, B], passes=False))
    assert len(raw.ifs) == 1  # 100 is not a multiple of 16
    f = lower(s, [A, B])
    c = collect(f)
    outer = [x for x in c.fors if x.var.name == "i.outer"]
    assert outer and all(isinstance(x.extent.value, int) for x in outer if hasattr(x.extent, "value"))
    # the steady-state loop (6 full tiles) has no guard; only the tail keeps one
    steady = outer[0]
    assert steady.extent.value == 6
    assert not collect_ifs(steady)
    a = np.arange(n, dtype="float32")
    b = np.zeros(n, "float32")
    tc.build(s, [A, B])(a, b)
    np.testing.assert_array_equal(b, a * 2)


def collect_ifs(stmt):
    c = _Collect()
    c.visit_stmt(stmt)
    return c.ifs


def test_unroll_and_auto_unroll_pragma():
    A = te.placeholder((8, 4), name="A")
    B = te.compute((8, 4), lambda i, j: A[i, j] + 1, name="B")
    s = te.create_schedule(B.op)
    i, j = s[B].op.axis
    s[B].unroll(j)
    c = collect(lower(s, [A, B]))
    assert [x.var.name for x in c.fors] == ["i"] and len(c.stores) == 4
    s2 = te.create_schedule(B.op)
    i2, _ = s2[B].op.axis
    s2[B].pragma(i2, "auto_unroll_max_step", 32)
    c2 = collect(lower(s2, [A, B]))
    assert not c2.fors and len(c2.stores) == 32


def test_flatten_uses_storage_align_strides():
    A = te.placeholder((6, 5), name="A")
    B = te.compute((6, 5), lambda i, j: A[i, j] * 3, name="B")
    s = te.create_schedule(B.op)
    AA = s.cache_read(A, "local", [B])
    s[AA].storage_align(s[AA].op.axis[0], 8, 1)  # row stride 5 -> 9
    c = collect(lower(s, [A, B]))
    (alloc,) = c.allocs
    assert alloc.buffer.shape[0].value == 6 * 9
    assert all(len(st.indices) == 1 for st in c.stores)
    a = np.random.default_rng(0).random((6, 5), dtype=np.float32)
    b = np.zeros((6, 5), "float32")
    tc.build(s, [A, B])(a, b)
    np.testing.assert_allclose(b, a * 3)


def test_vectorize_emits_ramp_and_predicates_tail():
    n = 20
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] + 1, name="B")
    s = te.create_schedule(B.op)
    xo, xi = s[B].split(s[B].op.axis[0], factor=8)
    s[B].vectorize(xi)
    c = collect(lower(s, [A, B]))
    assert not any(x.kind == ForKind.VECTORIZED for x in c.fors)
    assert all(isinstance(st.indices[0], Ramp) for st in c.stores)
    assert any(st.predicate is not None for st in c.stores)  # the 4-element tail is masked
    assert any(st.predicate is None for st in c.stores)  # the steady state is not
    a = np.arange(n, dtype="float32")
    b = np.zeros(n, "float32")
    tc.build(s, [A, B])(a, b)
    np.testing.assert_array_equal(b, a + 1)


def test_storage_rewrite_shares_dead_buffers():
    n = 64
    A = te.placeholder((n,), name="A")
    t1 = te.compute((n,), lambda i: A[i] + 1, name="t1")
    t2 = te.compute((n,), lambda i: t1[i] * 2, name="t2")
    t3 = te.compute((n,), lambda i: t2[i] - 3, name="t3")
    out = te.compute((n,), lambda i: t3[i] * t3[i], name="out")
    s = te.create_schedule(out.op)
    raw = collect(lower(s, [A, out], passes=False))
    assert len(raw.allocs) == 3
    c = collect(lower(s, [A, out]))
    assert len(c.allocs) == 2  # t1 is dead once t2 is computed: t3 reuses its memory
    a = np.arange(n, dtype="float32")
    o = np.zeros(n, "float32")
    tc.build(s, [A, out])(a, o)
    np.testing.assert_allclose(o, ((a + 1) * 2 - 3) ** 2)


def test_lowered_ir_prints_as_loop_nest():
    A = te.placeholder((4, 4), name="A")
    B = te.compute((4, 4), lambda i, j: A[j, i], name="B")
    s = te.create_schedule(B.op)
    text = str(tc.lower(s, [A, B]))
    assert text.splitlines()[0] == "def main(A: float32[4, 4], B: float32[4, 4]):"
    assert "for i in range(4):" in text and "for j in range(4):" in text
    assert "B[i * 4 + j] = A[j * 4 + i]" in text


def test_loads_under_vector_mask_are_masked():
    # a lane-invariant load inside the masked tail must not execute for dead lanes
    n, m = 3, 10
    A = te.placeholder((n,), name="A")
    B = te.compute((n, m), lambda i, j: A[i] * j, name="B")
    s = te.create_schedule(B.op)
    _, j = s[B].op.axis
    _, ji = s[B].split(j, factor=16)
    s[B].vectorize(ji)
    c = collect(lower(s, [A, B]))
    assert all(ld.predicate is not None for ld in c.loads if isinstance(ld, BufferLoad))
    a = np.arange(n, dtype="float32")
    b = np.zeros((n, m), "float32")
    tc.build(s, [A, B], debug=True)(a, b)
    np.testing.assert_array_equal(b, a[:, None] * np.arange(m))


def test_passes_do_not_leave_vectorized_or_unrolled_kinds():
    A = te.placeholder((16, 16), name="A")
    B = te.compute((16, 16), lambda i, j: A[i, j] * 2, name="B")
    s = te.create_schedule(B.op)
    i, j = s[B].op.axis
    s[B].vectorize(j)
    s[B].unroll(i)
    c = collect(lower(s, [A, B]))
    assert all(x.kind in (ForKind.SERIAL, ForKind.PARALLEL) for x in c.fors)
    # both loops are consumed: i by unroll (16 straight-line rows), j by vectorize (one
    # 16-lane store per row, no guard since 16 divides 16)
    assert c.fors == [] and c.ifs == []
    assert len(c.stores) == 16
    assert all(isinstance(st.indices[0], Ramp) and st.indices[0].lanes == 16 for st in c.stores)
    assert sorted(st.indices[0].base.value for st in c.stores) == list(range(0, 256, 16))


def _store_lanes(func):
    return sorted({st.indices[0].lanes for st in collect(func).stores if isinstance(st.indices[0], Ramp)})


def test_vectorize_splits_odd_widths_into_power_of_two_pieces():
    # A <56 x float> accumulator carried by the reduction loop was legalised by LLVM into 56
    # scalar registers (vinsertps storms, 15x slower); 32 + 16 + 8 keeps it in vector registers.
    n, k = 56, 9
    A = te.placeholder((k, n), name="A")
    B = te.placeholder((4, k), name="B")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((4, n), lambda i, j: te.sum(A[r, j] * B[i, r], axis=r), name="C")
    s = te.create_schedule(C.op)
    CL = s.cache_write(C, "local")
    s[C].vectorize(s[C].op.axis[1])
    ci, cj = s[CL].op.axis
    s[CL].reorder(s[CL].op.reduce_axis[0], ci, cj)
    s[CL].unroll(ci)
    s[CL].vectorize(cj)
    assert _store_lanes(lower(s, [A, B, C])) == [8, 16, 32]
    rng = np.random.default_rng(0)
    a = rng.random((k, n), dtype=np.float32)
    b = rng.random((4, k), dtype=np.float32)
    c = np.zeros((4, n), "float32")
    tc.build(s, [A, B, C])(a, b, c)
    np.testing.assert_allclose(c, b @ a, rtol=1e-5)


def test_vectorize_odd_width_pieces_keep_tail_predicates():
    # 13 = 8 + 4 + 1 lanes; the last block of 50 = 3 * 13 + 11 is masked in every piece
    n = 50
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * 2 + 1, name="B")
    s = te.create_schedule(B.op)
    _, xi = s[B].split(s[B].op.axis[0], factor=13)
    s[B].vectorize(xi)
    assert _store_lanes(lower(s, [A, B])) == [4, 8]
    a = np.arange(n, dtype="float32")
    b = np.zeros(n + 3, "float32")[:n]  # a view: a write past n would show in the base
    base = b.base
    tc.build(s, [A, B], debug=True)(a, b)
    np.testing.assert_array_equal(b, a * 2 + 1)
    np.testing.assert_array_equal(base[n:], 0)


def _partition_kernel(guard: str, touches_shared: bool, gpu: bool):
    """``for i in range(4): if <guard>: <store>`` inside a blockIdx and a threadIdx loop; the
    store goes to a shared tile or to the global output."""
    from tecomp.codegen.target import Target
    from tecomp.ir import Buffer, BufferLoad, BufferStore, For, IfThenElse, PrimFunc, Var, const
    from tecomp.ir.stmt import Allocate

    out = Buffer("out", (const(256),), "float32")
    sh = Buffer("sh", (const(128),), "float32", scope="shared")
    bx, tx, i = Var("bx"), Var("tx"), Var("i")
    env = {"bx": bx, "tx": tx, "i": i}
    cond = eval(guard, {}, env)  # noqa: S307 - the test's own strings
    dst = sh if touches_shared else out
    store = BufferStore(dst, BufferLoad(out, (tx * 4 + i,)) * 2.0, (tx * 4 + i,))
    loop = For(i, const(0), const(4), ForKind.SERIAL, IfThenElse(cond, store))
    body = For(tx, const(0), const(32), ForKind.THREAD_BINDING, loop, (("thread_tag", "threadIdx.x"),))
    body = For(bx, const(0), const(2), ForKind.THREAD_BINDING, Allocate(sh, body),
               (("thread_tag", "blockIdx.x"),))
    f = PrimFunc("k", [out], body)
    if gpu:
        f.attrs["target"] = Target.parse("cuda")
        f.attrs["launch"] = {"blockIdx.x": const(2), "threadIdx.x": const(32)}
    return f


def test_loop_partition_on_gpu_cuts_shared_memory_loops_only_where_all_threads_agree():
    from tecomp.passes.loop_partition import loop_partition

    def loops(f):
        return [x for x in collect(loop_partition(f)).fors if x.var.name == "i"]

    # a thread-dependent tail (tx*4 + i < 100): per-thread loops are cut as on the CPU, a loop
    # touching shared memory (which may need barriers, reached by every thread) keeps its guard
    # (a symbolic cut leaves the tail with the guard, cut again up to MAX_DEPTH times)
    assert len(loops(_partition_kernel("tx * 4 + i < 100", False, gpu=True))) > 1
    (kept,) = loops(_partition_kernel("tx * 4 + i < 100", True, gpu=True))
    assert str(kept.extent) == "4" and collect(kept).ifs
    # the CPU partition is unchanged whatever the loop touches
    assert len(loops(_partition_kernel("tx * 4 + i < 100", True, gpu=False))) > 1
    # a cut over blockIdx is the same in every thread of a block: allowed
    assert len(loops(_partition_kernel("bx * 4 + i < 6", True, gpu=True))) > 1

"""Schedules for a cuda target: thread binding, storage scopes, the block's footprint of a shared
buffer, and the schedules a GPU cannot run, refused with errors that name what is wrong."""

from __future__ import annotations

import pytest

import tecomp as tc
from tecomp import te
from tecomp.errors import LoweringError, ScheduleError, TecompError
from tecomp.ir.functor import StmtVisitor
from tecomp.ir.stmt import Allocate, For, ForKind, is_barrier, thread_tag


class _Collect(StmtVisitor):
    def __init__(self) -> None:
        self.loops: list[For] = []
        self.allocs: list[Allocate] = []
        self.barriers = 0

    def visit_For(self, s: For) -> None:
        self.loops.append(s)
        super().visit_For(s)

    def visit_Allocate(self, s: Allocate) -> None:
        self.allocs.append(s)
        super().visit_Allocate(s)

    def visit_Evaluate(self, s) -> None:  # noqa: ANN001
        self.barriers += is_barrier(s)
        super().visit_Evaluate(s)


def collect(f) -> _Collect:  # noqa: ANN001
    c = _Collect()
    c.visit_stmt(f.body)
    return c


def vector_add(n: int = 1000, block: int = 128):
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute((n,), lambda i: A[i] + B[i], name="C")
    s = te.create_schedule(C.op)
    bx, tx = s[C].split(C.op.axis[0], factor=block)
    s[C].bind(bx, te.thread_axis("blockIdx.x"))
    s[C].bind(tx, te.thread_axis("threadIdx.x"))
    return s, [A, B, C]


def simt_gemm(n: int = 64, tile: int = 16):
    """The classic shared-memory tiled GEMM of TVM's CUDA tutorials."""
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = te.create_schedule(C.op)
    AA = s.cache_read(A, "shared", [C])
    BB = s.cache_read(B, "shared", [C])
    i, j = s[C].op.axis
    by, ty = s[C].split(i, factor=tile)
    bx, tx = s[C].split(j, factor=tile)
    ko, ki = s[C].split(s[C].op.reduce_axis[0], factor=tile)
    s[C].reorder(by, bx, ty, tx, ko, ki)
    s[C].bind(by, te.thread_axis("blockIdx.y"))
    s[C].bind(bx, te.thread_axis("blockIdx.x"))
    s[C].bind(ty, te.thread_axis("threadIdx.y"))
    s[C].bind(tx, te.thread_axis("threadIdx.x"))
    for X in (AA, BB):
        s[X].compute_at(s[C], ko)
        a0, a1 = s[X].op.axis
        s[X].bind(a0, te.thread_axis("threadIdx.y"))
        s[X].bind(a1, te.thread_axis("threadIdx.x"))
    return s, [A, B, C]


def test_bound_loops_become_thread_loops_and_give_the_launch() -> None:
    s, args = vector_add()
    f = tc.lower(s, args, target="cuda")
    c = collect(f)
    assert [thread_tag(x) for x in c.loops] == ["blockIdx.x", "threadIdx.x"]
    assert all(x.kind == ForKind.THREAD_BINDING for x in c.loops)
    assert {k: v.value for k, v in f.attrs["launch"].items()} == {"blockIdx.x": 8, "threadIdx.x": 128}
    assert str(f.attrs["target"]) == "cuda -arch=sm_80"
    assert "if i.outer * 128 + i.inner < 1000" in str(f)  # the ragged last block is guarded


def test_shared_tiles_cover_the_block_and_barriers_fence_them() -> None:
    s, args = simt_gemm()
    f = tc.lower(s, args, target="cuda -arch=sm_90")
    c = collect(f)
    shared = {a.buffer.name: a.buffer for a in c.allocs}
    assert set(shared) == {"A_shared", "B_shared"}
    # a 16x16 tile per block: threadIdx.y/x of C are relaxed, blockIdx and k.outer fixed
    assert all(b.scope == "shared" and [int(str(d)) for d in b.shape] == [256] for b in shared.values())
    # after the cooperative loads (read after write) and at the end of k.outer (the next
    # iteration's loads would overwrite what slower threads still read)
    assert c.barriers == 2
    text = str(f)
    assert text.index("B_shared[ax0 * 16 + ax1] =") < text.index("syncthreads()") < text.index("for k.inner")
    assert text.rstrip().endswith("syncthreads()")


def test_default_scopes_follow_the_thread_loops() -> None:
    # a stage computed inside threadIdx loops is per thread ("local"), inside only blockIdx
    # loops per block ("shared")
    n = 256
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * 2, name="B")
    C = te.compute((n,), lambda i: B[i] + 1, name="C")
    s = te.create_schedule(C.op)
    bx, tx = s[C].split(C.op.axis[0], factor=64)
    s[C].bind(bx, te.thread_axis("blockIdx.x"))
    s[C].bind(tx, te.thread_axis("threadIdx.x"))
    s[B].compute_at(s[C], tx)
    (local,) = collect(tc.lower(s, [A, C], target="cuda")).allocs
    assert local.buffer.scope == "local" and [int(str(d)) for d in local.buffer.shape] == [1]
    s = te.create_schedule(C.op)
    bx, tx = s[C].split(C.op.axis[0], factor=64)
    s[C].bind(bx, te.thread_axis("blockIdx.x"))
    s[C].bind(tx, te.thread_axis("threadIdx.x"))
    s[B].compute_at(s[C], bx)
    b0, b1 = s[B].split(s[B].op.axis[0], factor=64)
    s[B].bind(b1, te.thread_axis("threadIdx.x"))
    f = tc.lower(s, [A, C], target="cuda")
    (shared,) = collect(f).allocs
    assert shared.buffer.scope == "shared" and [int(str(d)) for d in shared.buffer.shape] == [64]
    assert collect(f).barriers == 1


def test_cpu_targets_refuse_gpu_only_features() -> None:
    s, args = vector_add()
    with pytest.raises(LoweringError, match="thread binding needs a GPU target"):
        tc.lower(s, args)
    A = te.placeholder((64,), name="A")
    B = te.compute((64,), lambda i: A[i] * 2, name="B")
    s = te.create_schedule(B.op)
    s.cache_read(A, "shared", [B])
    with pytest.raises(LoweringError, match="storage scope 'shared'.*needs a GPU target"):
        tc.build(s, [A, B])


def _bound(s, st, axes, tags) -> None:  # noqa: ANN001
    for ax, tag in zip(axes, tags):
        s[st].bind(ax, te.thread_axis(tag))


def test_gpu_schedule_errors_name_the_problem() -> None:
    n = 4096
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] + 1, name="B")

    s = te.create_schedule(B.op)  # nothing bound
    with pytest.raises(ScheduleError, match="loop 'i' runs outside every thread-bound loop"):
        tc.lower(s, [A, B], target="cuda")

    s = te.create_schedule(B.op)
    xo, xi = s[B].split(B.op.axis[0], factor=2048)
    _bound(s, B, [xo, xi], ["blockIdx.x", "threadIdx.x"])
    with pytest.raises(ScheduleError, match="threadIdx.x extent 2048 exceeds sm_80's limit of 1024"):
        tc.lower(s, [A, B], target="cuda")

    s = te.create_schedule(B.op)
    xo, xi = s[B].split(B.op.axis[0], factor=64)
    xio, xii = s[B].split(xi, factor=32)
    _bound(s, B, [xo, xio, xii], ["blockIdx.x", "threadIdx.y", "threadIdx.y"])
    with pytest.raises(ScheduleError, match="threadIdx.y is bound to loops of different extents|inside a threadIdx.y"):
        tc.lower(s, [A, B], target="cuda")

    s = te.create_schedule(B.op)
    xo, xi = s[B].split(B.op.axis[0], factor=64)
    s[B].bind(xo, te.thread_axis("blockIdx.x"))
    s[B].parallel(xi)
    with pytest.raises(ScheduleError, match="parallel\\(\\); on a GPU bind it"):
        tc.lower(s, [A, B], target="cuda")

    s = te.create_schedule(B.op)
    xo, xi = s[B].split(B.op.axis[0], factor=64)
    _bound(s, B, [xo, xi], ["blockIdx.x", "warpIdx.x"])
    with pytest.raises(ScheduleError, match="unknown thread tag 'warpIdx.x'"):
        tc.lower(s, [A, B], target="cuda")

    s = te.create_schedule(B.op)
    xo, xi = s[B].split(B.op.axis[0], factor=64)
    s[B].bind(xo, te.thread_axis("blockIdx.x"))
    s[B].bind(xi, te.thread_axis((0, 32), "threadIdx.x"))
    with pytest.raises(ScheduleError, match="extent 64 but is bound to threadIdx.x declared with extent 32"):
        tc.lower(s, [A, B], target="cuda")


def test_a_thread_bound_reduction_axis_is_refused_not_raced() -> None:
    A = te.placeholder((8, 256), name="A")
    k = te.reduce_axis((0, 256), name="k")
    B = te.compute((8,), lambda i: te.sum(A[i, k], axis=k), name="B")
    s = te.create_schedule(B.op)
    ko, ki = s[B].split(k, factor=64)
    s[B].bind(B.op.axis[0], te.thread_axis("blockIdx.x"))
    s[B].bind(ki, te.thread_axis("threadIdx.x"))
    with pytest.raises(ScheduleError, match="reduction axis 'k.inner' is bound to threadIdx.x"):
        tc.lower(s, [A, B], target="cuda")


def test_shared_memory_over_the_arch_limit_is_refused() -> None:
    # ptxas would accept it; the launch would fail on the device
    s, args = simt_gemm(n=512, tile=128)  # two 128x128 float tiles: 128 KiB
    with pytest.raises((ScheduleError, LoweringError), match="exceed"):
        tc.lower(s, args, target="cuda")


def test_two_root_stages_are_one_kernel_too_many() -> None:
    A = te.placeholder((64,), name="A")
    B = te.compute((64,), lambda i: A[i] * 2, name="B")
    C = te.compute((64,), lambda i: B[i] + 1, name="C")
    s = te.create_schedule(C.op)
    for st in (B, C):
        xo, xi = s[st].split(st.op.axis[0], factor=32)
        _bound(s, st, [xo, xi], ["blockIdx.x", "threadIdx.x"])
    with pytest.raises(LoweringError, match="stages B, C are all computed at root"):
        tc.lower(s, [A, C], target="cuda")


def test_cuda_target_strings() -> None:
    from tecomp.codegen.target import Target

    assert Target.parse("cuda").gpu.arch == "sm_80"
    t = Target.parse("cuda -arch=sm_90a")
    assert (t.kind, t.cpu, str(t), t.gpu.max_dynamic_smem) == ("cuda", "sm_90a", "cuda -arch=sm_90a", 227 * 1024)
    with pytest.raises(TecompError, match="unsupported arch 'sm_70'"):
        Target.parse("cuda -arch=sm_70")
    with pytest.raises(TecompError, match="unknown target option '-mcpu-ish'"):
        Target.parse("cuda -mcpu-ish")

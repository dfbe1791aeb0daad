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
    # thread tx writes B[tx] and reads B[tx] back: no other thread touches it, no barrier
    assert collect(f).barriers == 0


def test_cpu_targets_refuse_gpu_only_features() -> None:
    s, args = vector_add()
    with pytest.raises(LoweringError, match="thread binding needs a GPU target"):
        tc.lower(s, args, target="llvm")
    with pytest.raises(LoweringError, match="thread binding needs a GPU target"):
        tc.build(s, args)  # build's target is llvm unless told (TVM's default too)
    # lower without a target follows the schedule, as TVM's target-less lower prints GPU code
    assert "threadIdx.x" in str(tc.lower(s, args, simple_mode=True))
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


def test_shared_memory_over_the_arch_limit_is_refused() -> None:
    # ptxas would accept it; the launch would fail on the device
    s, args = simt_gemm(n=512, tile=128)  # two 128x128 float tiles: 128 KiB
    with pytest.raises((ScheduleError, LoweringError), match="exceed"):
        tc.lower(s, args, target="cuda")


def test_cuda_target_strings() -> None:
    from tecomp.codegen.target import Target

    assert Target.parse("cuda").gpu.arch == "sm_80"
    t = Target.parse("cuda -arch=sm_90a")
    assert (t.kind, t.cpu, str(t), t.gpu.max_dynamic_smem) == ("cuda", "sm_90a", "cuda -arch=sm_90a", 227 * 1024)
    with pytest.raises(TecompError, match="unsupported arch 'sm_70'"):
        Target.parse("cuda -arch=sm_70")
    with pytest.raises(TecompError, match="unknown target option '-mcpu-ish'"):
        Target.parse("cuda -mcpu-ish")


# bound inference and launch extents: the regressions of tests/DIFFERENTIAL.md (bugs E, F) ------


def _shared_shapes(f) -> dict[str, list[int]]:  # noqa: ANN001
    return {a.buffer.name: [int(str(d)) for d in a.buffer.shape] for a in collect(f).allocs
            if a.buffer.scope == "shared"}


def _emulate_vs_numpy(s, args, inputs, want) -> None:  # noqa: ANN001
    import numpy as np

    f = tc.build(s, args, target="cuda")
    out = np.full(want.shape, -7.0, want.dtype)
    f.emulate(*inputs, out)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    from tecomp.codegen.ptxas import find_ptxas

    if find_ptxas() is not None:
        assert f.resources is not None, f.entry_func.resources_why


@pytest.mark.parametrize("blocks", ["constant", "symbolic"])
def test_a_guarded_read_past_a_stage_does_not_grow_its_buffer(blocks: str) -> None:
    # Bug E: R reads S[i * 1024 + j] only where that is < 16. The reads' window is [0, 15391]
    # (61 KiB of shared memory, refused), but S has 16 points: its region is clipped to its
    # domain, as TVM intersects a read region with the tensor's shape.
    import numpy as np

    m = te.var("m") if blocks == "symbolic" else 2
    A = te.placeholder((16,), name="A")
    S = te.compute((16,), lambda i: A[i] * 2.0, name="S")
    R = te.compute((m, 16, 32), lambda b, i, j: te.if_then_else(i * 1024 + j < 16, S[i * 1024 + j], 0.0),
                   name="R")
    s = te.create_schedule(R.op)
    b, i, j = s[R].op.axis
    s[R].reorder(b, j, i)
    s[R].bind(b, te.thread_axis("blockIdx.x"))
    s[R].bind(j, te.thread_axis("threadIdx.x"))
    s[S].compute_at(s[R], b)
    _, si = s[S].split(s[S].op.axis[0], factor=32)
    s[S].bind(si, te.thread_axis("threadIdx.x"))
    assert _shared_shapes(tc.lower(s, [A, R], target="cuda")) == {"S": [16]}
    a = np.random.default_rng(0).standard_normal(16).astype("float32")
    want = np.zeros((3 if blocks == "symbolic" else 2, 16, 32), "float32")
    want[:, 0, :16] = a * 2
    _emulate_vs_numpy(s, [A, R], [a], want)


def test_a_where_guarded_read_past_a_stage_is_clipped_on_gpu_and_cpu() -> None:
    # The same through a reduction's where=: R[i] sums S[i + k] for i + k < 16, i < 64 (the
    # reads' window is [0, 126] per block); S keeps 16 points, on the GPU and on the CPU.
    import numpy as np

    A = te.placeholder((16,), name="A")
    S = te.compute((16,), lambda i: A[i] + 1.0, name="S")
    k = te.reduce_axis((0, 64), name="k")
    R = te.compute((128,), lambda i: te.sum(S[i + k], axis=k, where=i + k < 16), name="R")
    a = np.random.default_rng(1).standard_normal(16).astype("float32")
    sv = a.astype("float64") + 1
    want = np.array([sv[i:].sum() if i < 16 else 0.0 for i in range(128)], "float32")

    s = te.create_schedule(R.op)
    bx, tx = s[R].split(R.op.axis[0], factor=64)
    s[R].bind(bx, te.thread_axis("blockIdx.x"))
    s[R].bind(tx, te.thread_axis("threadIdx.x"))
    s[S].compute_at(s[R], bx)
    _, si = s[S].split(s[S].op.axis[0], factor=64)
    s[S].bind(si, te.thread_axis("threadIdx.x"))
    assert _shared_shapes(tc.lower(s, [A, R], target="cuda")) == {"S": [16]}
    _emulate_vs_numpy(s, [A, R], [a], want)

    s = te.create_schedule(R.op)
    io, _ = s[R].split(R.op.axis[0], factor=64)
    s[S].compute_at(s[R], io)
    shapes = [[int(str(d)) for d in x.buffer.shape] for x in collect(tc.lower(s, [A, R])).allocs]
    assert shapes and all(sh == [16] for sh in shapes)  # one per piece of the partitioned loop
    out = np.full(128, -7.0, "float32")
    tc.build(s, [A, R])(a, out)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("load_threads", [24, 64, 128])
def test_a_cooperative_load_may_use_fewer_or_more_threads_than_its_consumer(load_threads: int) -> None:
    # Bug F: the shared stage's loop is bound to threadIdx.x beside R's threadIdx.x loop (not
    # inside it), with another extent. As in TVM the launch takes the largest; the narrower
    # loop runs only on the threads below its extent (masked in the emulator, guarded in PTX).
    import numpy as np

    n = 250
    A = te.placeholder((n,), name="A")
    S = te.compute((n,), lambda i: A[i] * 2.0, name="S")
    R = te.compute((n,), lambda i: S[i] + 1.0, name="R")
    s = te.create_schedule(R.op)
    bx, tx = s[R].split(R.op.axis[0], factor=64)
    s[R].bind(bx, te.thread_axis("blockIdx.x"))
    s[R].bind(tx, te.thread_axis("threadIdx.x"))
    s[S].compute_at(s[R], bx)
    _, si = s[S].split(s[S].op.axis[0], factor=load_threads)
    s[S].bind(si, te.thread_axis("threadIdx.x"))
    f = tc.lower(s, [A, R], target="cuda")
    assert {k: v.value for k, v in f.attrs["launch"].items()} == {"blockIdx.x": 4,
                                                                   "threadIdx.x": max(64, load_threads)}
    a = np.random.default_rng(2).standard_normal(n).astype("float32")
    _emulate_vs_numpy(s, [A, R], [a], a * 2 + 1)


def test_thread_extents_that_are_really_wrong_are_still_refused() -> None:
    n = 256
    A = te.placeholder((n,), name="A")
    S = te.compute((n,), lambda i: A[i] * 2.0, name="S")
    R = te.compute((n,), lambda i: S[i] + 1.0, name="R")

    # one te.thread_axis object is one index with one extent (TVM refuses it too)
    s = te.create_schedule(R.op)
    tx = te.thread_axis("threadIdx.x")
    bx, x = s[R].split(R.op.axis[0], factor=64)
    s[R].bind(bx, te.thread_axis("blockIdx.x"))
    s[R].bind(x, tx)
    s[S].compute_at(s[R], bx)
    _, si = s[S].split(s[S].op.axis[0], factor=32)
    s[S].bind(si, tx)
    with pytest.raises(ScheduleError, match=r"one te.thread_axis\('threadIdx.x'\) is bound to loops of "
                       r"different extents: 'i.inner' of R \(64\) and 'i.inner' of S \(32\)"):
        tc.lower(s, [A, R], target="cuda")

    # a sibling's larger extent is the launch's, but a loop nested in a narrower loop of the
    # same tag still cannot use more threads than that loop has
    B = te.placeholder((n, 8), name="B")
    k = te.reduce_axis((0, 8), name="k")
    C = te.compute((n,), lambda i: te.sum(S[i] * B[i, k], axis=k), name="C")
    s = te.create_schedule(C.op)
    BB = s.cache_read(B, "shared", [C])
    bx, x = s[C].split(C.op.axis[0], factor=32)
    s[C].bind(bx, te.thread_axis("blockIdx.x"))
    s[C].bind(x, te.thread_axis("threadIdx.x"))
    s[S].compute_at(s[C], bx)
    _, si = s[S].split(s[S].op.axis[0], factor=128)  # 128 threads beside C's 32
    s[S].bind(si, te.thread_axis("threadIdx.x"))
    s[BB].compute_at(s[C], s[C].op.reduce_axis[0])
    _, bi = s[BB].split(s[BB].fuse(*s[BB].op.axis), factor=64)  # 64 threads inside C's 32
    s[BB].bind(bi, te.thread_axis("threadIdx.x"))
    with pytest.raises(ScheduleError, match="extent 64.* is bound to threadIdx.x inside a threadIdx.x loop "
                       "of extent 32"):
        tc.lower(s, [A, B, C], target="cuda")

    # over the arch's limit, whichever loop has it
    s = te.create_schedule(R.op)
    bx, x = s[R].split(R.op.axis[0], factor=64)
    s[R].bind(bx, te.thread_axis("blockIdx.x"))
    s[R].bind(x, te.thread_axis("threadIdx.x"))
    s[S].compute_at(s[R], bx)
    _, si = s[S].split(s[S].op.axis[0], factor=2048)
    s[S].bind(si, te.thread_axis("threadIdx.x"))
    with pytest.raises(ScheduleError, match="threadIdx.x extent 2048 exceeds sm_80's limit of 1024"):
        tc.lower(s, [A, R], target="cuda")


def test_rfactor_after_a_cache_read_of_its_output_on_gpu() -> None:
    # Bug G (the fuzzer's order): the local copy of S made by cache_read must follow S when
    # rfactor replaces S's operation (tests/te/test_primitives.py has the CPU cases).
    import numpy as np

    A = te.placeholder((64, 32), name="A")
    k = te.reduce_axis((0, 32), name="k")
    S = te.compute((64,), lambda i: te.sum(A[i, k], axis=k), name="S")
    R = te.compute((64,), lambda i: S[i] * 2.0, name="R")
    s = te.create_schedule(R.op)
    AS = s.cache_read(A, "shared", [S])
    SL = s.cache_read(S, "local", [R])
    _, ki = s[S].split(s[S].op.reduce_axis[0], factor=4)
    SF = s.rfactor(S, ki)
    bx, tx = s[R].split(R.op.axis[0], factor=16)
    s[R].bind(bx, te.thread_axis("blockIdx.x"))
    s[R].bind(tx, te.thread_axis("threadIdx.x"))
    for X in (SL, S, SF):
        s[X].compute_at(s[R], tx)
    s[AS].compute_at(s[R], bx)
    _, ai = s[AS].split(s[AS].fuse(*s[AS].op.axis), factor=16)
    s[AS].bind(ai, te.thread_axis("threadIdx.x"))
    a = np.random.default_rng(3).standard_normal((64, 32)).astype("float32")
    _emulate_vs_numpy(s, [A, R], [a], (a.astype("float64").sum(1) * 2).astype("float32"))

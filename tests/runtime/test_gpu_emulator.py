"""The GPU emulator on hand-built GPU kernels (the IR of docs/gpu-ir.md), each against numpy:
results, barriers, the race detector, bounds checks, seeds, vectors, and interp parity."""

from __future__ import annotations

import numpy as np
import pytest

from tecomp.errors import TecompError
from tecomp.ir import Allocate, Buffer, BufferStore, For, ForKind, IfThenElse, LetStmt, PrimFunc, Var, const, seq
from tecomp.ir import expr as E
from tecomp.ir.stmt import THREAD_TAG, Stmt, barrier
from tecomp.runtime.gpu_emulator import BarrierDivergenceError, RaceError, ShuffleDivergenceError, emulate
from tecomp.runtime.interp import run

TARGET = "cuda -arch=sm_80"


def c(v: int) -> E.Expr:
    return const(v)


def tloop(v: Var, tag: str, extent: int | E.Expr, body: Stmt) -> For:
    ext = extent if isinstance(extent, E.Expr) else c(extent)
    return For(v, c(0), ext, ForKind.THREAD_BINDING, body, ((THREAD_TAG, tag),))


def loop(v: Var, extent: int | E.Expr, body: Stmt) -> For:
    ext = extent if isinstance(extent, E.Expr) else c(extent)
    return For(v, c(0), ext, ForKind.SERIAL, body)


def ld(buf: Buffer, idx: E.Expr, pred: E.Expr | None = None) -> E.BufferLoad:
    return E.BufferLoad(buf, (idx,), predicate=pred)


def st(buf: Buffer, idx: E.Expr, value: E.Expr, pred: E.Expr | None = None) -> BufferStore:
    return BufferStore(buf, value, (idx,), pred)


def kernel(name: str, params: list[Buffer], body: Stmt, launch: dict[str, int | E.Expr],
           dim_vars: list[Var] | None = None) -> PrimFunc:
    ext = {k: (v if isinstance(v, E.Expr) else c(v)) for k, v in launch.items()}
    return PrimFunc(name, params, body, dim_vars or [], {"target": TARGET, "launch": ext})


def shared(name: str, n: int, dtype: str = "float32") -> Buffer:
    return Buffer(name, (c(n),), dtype, scope="shared")


def local(name: str, n: int, dtype: str = "float32") -> Buffer:
    return Buffer(name, (c(n),), dtype, scope="local")


rng = np.random.default_rng(0)


# (a) elementwise add with a tail guard ----------------------------------------------------------


def vector_add(n: int | E.Expr, block: int = 128) -> PrimFunc:
    A, B, C = (Buffer(x, (c(n) if isinstance(n, int) else n,), "float32") for x in "ABC")
    bx, tx = Var("bx"), Var("tx")
    i = bx * block + tx
    nb = (n + block - 1) // block
    body = tloop(bx, "blockIdx.x", nb, tloop(tx, "threadIdx.x", block,
                 IfThenElse(i < (c(n) if isinstance(n, int) else n), st(C, i, ld(A, i) + ld(B, i)))))
    dims = [n] if isinstance(n, Var) else []
    return kernel("vadd", [A, B, C], body, {"blockIdx.x": nb, "threadIdx.x": block}, dims)


def test_elementwise_add_with_tail_guard() -> None:
    a, b = rng.random(1000, "float32"), rng.random(1000, "float32")
    out = np.zeros(1000, "float32")
    emulate(vector_add(1000), a, b, out)
    np.testing.assert_array_equal(out, a + b)


# (b) the shared-memory tiled SIMT GEMM --------------------------------------------------------


def simt_gemm(n: int, tile: int = 16, first_barrier: bool = True, second_barrier: bool = True) -> PrimFunc:
    A, B, C = (Buffer(x, (c(n), c(n)), "float32") for x in "ABC")
    As, Bs, acc = shared("As", tile * tile), shared("Bs", tile * tile), local("acc", 1)
    bx, by, tx, ty, ko, ki = (Var(x) for x in ("bx", "by", "tx", "ty", "ko", "ki"))
    k_loop = loop(ko, n // tile, seq(
        st(As, ty * tile + tx, ld(A, (by * tile + ty) * n + ko * tile + tx)),
        st(Bs, ty * tile + tx, ld(B, (ko * tile + ty) * n + bx * tile + tx)),
        barrier() if first_barrier else None,
        loop(ki, tile, st(acc, c(0), ld(acc, c(0)) + ld(As, ty * tile + ki) * ld(Bs, ki * tile + tx))),
        barrier() if second_barrier else None,
    ))
    threads = tloop(ty, "threadIdx.y", tile, tloop(tx, "threadIdx.x", tile, Allocate(acc, seq(
        st(acc, c(0), E.FloatImm(0.0)),
        k_loop,
        st(C, (by * tile + ty) * n + bx * tile + tx, ld(acc, c(0))),
    ))))
    body = tloop(by, "blockIdx.y", n // tile, tloop(bx, "blockIdx.x", n // tile,
                 Allocate(As, Allocate(Bs, threads))))
    launch = {"blockIdx.x": n // tile, "blockIdx.y": n // tile, "threadIdx.x": tile, "threadIdx.y": tile}
    return kernel("gemm", [A, B, C], body, launch)


def gemm_inputs(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a = rng.random((n, n), "float32")
    b = rng.random((n, n), "float32")
    return a, b, np.zeros((n, n), "float32")


def test_simt_gemm_matches_numpy() -> None:
    a, b, out = gemm_inputs(64)
    emulate(simt_gemm(64), a, b, out)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5)


def test_gemm_without_the_barrier_after_the_tile_load_races() -> None:
    a, b, out = gemm_inputs(32)
    with pytest.raises(RaceError) as info:
        emulate(simt_gemm(32, first_barrier=False), a, b, out)
    err = info.value
    assert err.buffer in ("As", "Bs") and f"shared buffer '{err.buffer}'" in str(err)
    t1, t2 = err.threads
    assert t1 != t2 and all(len(t) == 3 for t in (t1, t2))
    assert str(t1) in str(err) and str(t2) in str(err)
    assert "writes" in str(err) and "reads" in str(err)


def test_gemm_without_the_second_barrier_races() -> None:
    a, b, out = gemm_inputs(32)
    with pytest.raises(RaceError, match=r"shared buffer '(As|Bs)'") as info:
        emulate(simt_gemm(32, second_barrier=False), a, b, out)
    assert info.value.threads[0] != info.value.threads[1]
    # without the detector the racy kernel runs (lockstep happens to order it)
    emulate(simt_gemm(32, second_barrier=False), a, b, out, race_check=False)


# (c) transpose through a padded shared tile, 2-D threads ---------------------------------------


def transpose(n: int, m: int, tile: int = 16) -> PrimFunc:
    A, B = Buffer("A", (c(n), c(m)), "float32"), Buffer("B", (c(m), c(n)), "float32")
    T = shared("T", tile * (tile + 1))
    bx, by, tx, ty = (Var(x) for x in ("bx", "by", "tx", "ty"))
    body = tloop(by, "blockIdx.y", n // tile, tloop(bx, "blockIdx.x", m // tile, Allocate(T,
        tloop(ty, "threadIdx.y", tile, tloop(tx, "threadIdx.x", tile, seq(
            st(T, ty * (tile + 1) + tx, ld(A, (by * tile + ty) * m + bx * tile + tx)),
            barrier(),
            st(B, (bx * tile + ty) * n + by * tile + tx, ld(T, tx * (tile + 1) + ty)),
        ))))))
    launch = {"blockIdx.x": m // tile, "blockIdx.y": n // tile, "threadIdx.x": tile, "threadIdx.y": tile}
    return kernel("transpose", [A, B], body, launch)


def test_transpose_through_padded_shared_tile() -> None:
    a = rng.random((48, 32), "float32")
    out = np.zeros((32, 48), "float32")
    emulate(transpose(48, 32), a, out)
    np.testing.assert_array_equal(out, a.T)


def test_transpose_without_barrier_races() -> None:
    f = transpose(16, 16)
    body_without_barrier = _drop_barriers(f.body)
    g = PrimFunc(f.name, f.params, body_without_barrier, f.dim_vars, f.attrs)
    with pytest.raises(RaceError, match="shared buffer 'T'"):
        emulate(g, rng.random((16, 16), "float32"), np.zeros((16, 16), "float32"))


def _drop_barriers(s: Stmt) -> Stmt:
    from tecomp.ir.functor import StmtMutator
    from tecomp.ir.stmt import Evaluate, SeqStmt, is_barrier

    class Drop(StmtMutator):
        def visit_SeqStmt(self, x: SeqStmt) -> Stmt:  # type: ignore[override]
            kept = [self.visit_stmt(y) for y in x.seq if not (isinstance(y, Evaluate) and is_barrier(y))]
            return seq(*kept)

    return Drop().visit_stmt(s)  # type: ignore[no-any-return]


# (d) shared-memory tree reduction with barriers inside a loop ---------------------------------


def tree_sum(nblocks: int, block: int = 256) -> PrimFunc:
    A, out = Buffer("A", (c(nblocks * block),), "float32"), Buffer("out", (c(nblocks),), "float32")
    S = shared("S", block)
    bx, tx, k = Var("bx"), Var("tx"), Var("k")
    steps = block.bit_length() - 1
    s = Var("s")
    # s = block / 2**(k+1), from a float exp2 (exact on powers of two)
    half = E.Cast("int32", E.Call("float32", "exp2", (E.Cast("float32", c(steps - 1) - k),)))
    body = tloop(bx, "blockIdx.x", nblocks, Allocate(S, tloop(tx, "threadIdx.x", block, seq(
        st(S, tx, ld(A, bx * block + tx)),
        barrier(),
        loop(k, steps, LetStmt(s, half, seq(
            IfThenElse(tx < s, st(S, tx, ld(S, tx) + ld(S, tx + s))),
            barrier(),
        ))),
        IfThenElse(E.EQ(tx, c(0)), st(out, bx, ld(S, c(0)))),
    ))))
    return kernel("tree_sum", [A, out], body, {"blockIdx.x": nblocks, "threadIdx.x": block})


def test_tree_reduction_with_barriers_in_a_loop() -> None:
    a = rng.random(8 * 256, "float32")
    out = np.zeros(8, "float32")
    emulate(tree_sum(8), a, out)
    np.testing.assert_allclose(out, a.reshape(8, 256).sum(axis=1), rtol=1e-5)


def test_tree_reduction_without_its_loop_barrier_races() -> None:
    f = tree_sum(2)
    g = PrimFunc(f.name, f.params, _drop_loop_barrier(f.body), f.dim_vars, f.attrs)
    with pytest.raises(RaceError, match="shared buffer 'S'"):
        emulate(g, rng.random(512, "float32"), np.zeros(2, "float32"))


def _drop_loop_barrier(s: Stmt) -> Stmt:
    from tecomp.ir.functor import StmtMutator
    from tecomp.ir.stmt import Evaluate, LetStmt, is_barrier

    class Drop(StmtMutator):
        def visit_LetStmt(self, x: LetStmt) -> Stmt:  # type: ignore[override]
            body = x.body
            kept = [y for y in body.seq if not (isinstance(y, Evaluate) and is_barrier(y))]  # type: ignore[attr-defined]
            return LetStmt(x.var, x.value, seq(*kept))

    return Drop().visit_stmt(s)  # type: ignore[no-any-return]


# (e) barrier divergence -----------------------------------------------------------------------


def one_block(body_of: object, threads: int = 32, params: list[Buffer] | None = None) -> PrimFunc:
    tx = Var("tx")
    body = tloop(tx, "threadIdx.x", threads, body_of(tx))  # type: ignore[operator]
    return kernel("k", params or [], body, {"threadIdx.x": threads})


def test_barrier_under_a_thread_dependent_if_diverges() -> None:
    f = one_block(lambda tx: IfThenElse(tx < 8, barrier()))
    with pytest.raises(BarrierDivergenceError, match=r"(?s)8 of 32 threads.*thread \(8, 0, 0\).*if tx < 8"):
        emulate(f)


def test_barrier_in_a_narrow_thread_loop_diverges_but_one_after_it_does_not() -> None:
    S = shared("S", 64)
    tx, ty = Var("tx"), Var("tx2")
    inside = tloop(tx, "threadIdx.x", 64, Allocate(S, seq(
        tloop(ty, "threadIdx.x", 16, seq(st(S, ty, E.FloatImm(1.0)), barrier())))))
    with pytest.raises(BarrierDivergenceError, match="16 of 64"):
        emulate(kernel("k", [], inside, {"threadIdx.x": 64}))
    out = Buffer("out", (c(64),), "float32")
    after = tloop(tx, "threadIdx.x", 64, Allocate(S, seq(
        tloop(ty, "threadIdx.x", 16, st(S, ty, E.Cast("float32", ty))),
        barrier(),
        st(out, tx, ld(S, tx % 16)))))
    o = np.zeros(64, "float32")
    emulate(kernel("k", [out], after, {"threadIdx.x": 64}), o)
    np.testing.assert_array_equal(o, np.arange(64) % 16)


def test_barrier_in_a_loop_with_per_thread_trip_counts_diverges() -> None:
    k = Var("k")
    f = one_block(lambda tx: loop(k, tx % 4 + 1, barrier()))
    with pytest.raises(BarrierDivergenceError, match=r"(?s)for k in range"):
        emulate(f)
    # equal trip counts in every thread are fine, even if the bound is computed per thread
    emulate(one_block(lambda tx: loop(k, tx - tx + 3, barrier())))


# (f) out-of-bounds accesses -------------------------------------------------------------------


def test_out_of_bounds_shared_access_in_a_ragged_tile() -> None:
    A = Buffer("A", (c(20),), "float32")
    S = shared("tile", 16)
    f = one_block(lambda tx: Allocate(S, st(S, tx, ld(A, tx))), threads=20, params=[A])
    where = r"thread \(16, 0, 0\) of block \(0, 0, 0\) in `tile\[tx\] = A\[tx\]`"
    with pytest.raises(IndexError, match=r"shared buffer 'tile'.*index 16 .*" + where):
        emulate(f, np.zeros(20, "float32"))


def test_out_of_bounds_global_access_names_thread_and_block() -> None:
    A, B = Buffer("A", (c(100),), "float32"), Buffer("B", (c(100),), "float32")
    bx, tx = Var("bx"), Var("tx")
    i = bx * 32 + tx
    body = tloop(bx, "blockIdx.x", 4, tloop(tx, "threadIdx.x", 32, st(B, i, ld(A, i))))  # no tail guard
    f = kernel("k", [A, B], body, {"blockIdx.x": 4, "threadIdx.x": 32})
    with pytest.raises(IndexError, match=r"global buffer 'A'.*index 100 .*thread \(4, 0, 0\) of block \(3, 0, 0\)"):
        emulate(f, np.zeros(100, "float32"), np.zeros(100, "float32"))


# (g) symbolic dims ----------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1000, 77, 128])
def test_symbolic_dim_bound_from_the_arrays(n: int) -> None:
    nv = Var("n")
    f = vector_add(nv)
    a, b = rng.random(n, "float32"), rng.random(n, "float32")
    out = np.zeros(n, "float32")
    emulate(f, a, b, out)
    np.testing.assert_array_equal(out, a + b)


# (h) seeds ------------------------------------------------------------------------------------


def test_race_free_kernels_give_the_same_result_for_every_seed() -> None:
    a, b, _ = gemm_inputs(32)
    results = []
    for seed in range(4):
        out = np.zeros((32, 32), "float32")
        emulate(simt_gemm(32), a, b, out, seed=seed)
        t = np.zeros(8, "float32")
        emulate(tree_sum(8), np.arange(8 * 256, dtype="float32") / 7, t, seed=seed)
        results.append((out, t))
    for out, t in results[1:]:
        np.testing.assert_array_equal(out, results[0][0])
        np.testing.assert_array_equal(t, results[0][1])


def test_seed_decides_which_racing_store_lands() -> None:
    out = Buffer("out", (c(1),), "int32")
    f = one_block(lambda tx: st(out, c(0), tx), threads=64, params=[out])
    seen = set()
    for seed in range(8):
        o = np.zeros(1, "int32")
        emulate(f, o, seed=seed, race_check=False)
        seen.add(int(o[0]))
    assert len(seen) > 1
    with pytest.raises(RaceError, match=r"global buffer 'out', element 0"):
        emulate(f, np.zeros(1, "int32"))


# (i) vector (float4) accesses -----------------------------------------------------------------


def test_float4_loads_and_stores_through_shared_and_local() -> None:
    n = 4 * 64 * 2
    A, B = Buffer("A", (c(n),), "float32"), Buffer("B", (c(n),), "float32")
    S, R = shared("S", 4 * 64), local("R", 4)
    bx, tx = Var("bx"), Var("tx")
    g = (bx * 64 + tx) * 4
    body = tloop(bx, "blockIdx.x", 2, Allocate(S, tloop(tx, "threadIdx.x", 64, Allocate(R, seq(
        st(S, E.Ramp(tx * 4, c(1), 4), ld(A, E.Ramp(g, c(1), 4))),
        barrier(),
        # each thread takes its neighbour's float4 (through shared memory) into registers
        st(R, E.Ramp(c(0), c(1), 4), ld(S, E.Ramp((63 - tx) * 4, c(1), 4)) * E.Broadcast(E.FloatImm(2.0), 4)),
        st(B, E.Ramp(g, c(1), 4), ld(R, E.Ramp(c(0), c(1), 4)),
           pred=E.Broadcast(tx < 60, 4)),
    )))))
    f = kernel("v4", [A, B], body, {"blockIdx.x": 2, "threadIdx.x": 64})
    a = rng.random(n, "float32")
    out = np.full(n, -1.0, "float32")
    emulate(f, a, out)
    want = (a.reshape(2, 64, 4)[:, ::-1, :] * 2).copy()
    want[:, 60:, :] = -1.0
    np.testing.assert_array_equal(out, want.reshape(-1))


def test_vector_select_masks_loads_per_lane() -> None:
    # lanes past the end are neither loaded (no IndexError) nor stored
    n = 30
    A, B = Buffer("A", (c(n),), "float32"), Buffer("B", (c(32),), "float32")
    tx = Var("tx")
    idx = E.Ramp(tx * 4, c(1), 4)
    inside = idx < E.Broadcast(c(n), 4)
    body = tloop(tx, "threadIdx.x", 8, st(B, idx, E.Select(inside, ld(A, idx), E.Broadcast(E.FloatImm(-1.0), 4))))
    a = rng.random(n, "float32")
    out = np.zeros(32, "float32")
    emulate(kernel("k", [A, B], body, {"threadIdx.x": 8}), a, out)
    np.testing.assert_array_equal(out, np.concatenate([a, [-1.0, -1.0]]).astype("float32"))


# races: more shapes ---------------------------------------------------------------------------


def test_two_lanes_of_one_store_race_and_own_writes_do_not() -> None:
    S = shared("S", 32)
    out = Buffer("out", (c(32),), "float32")
    racy = one_block(lambda tx: Allocate(S, st(S, tx // 2, E.FloatImm(1.0))))
    with pytest.raises(RaceError, match=r"(?s)shared buffer 'S', element 0.*\(0, 0, 0\).*\(1, 0, 0\)") as info:
        emulate(racy)
    assert set(info.value.threads) == {(0, 0, 0), (1, 0, 0)}
    own = one_block(lambda tx: Allocate(S, seq(
        st(S, tx, E.Cast("float32", tx)), st(S, tx, ld(S, tx) + 1.0), st(out, tx, ld(S, tx)))), params=[out])
    o = np.zeros(32, "float32")
    emulate(own, o)
    np.testing.assert_array_equal(o, np.arange(32) + 1)


def test_global_races_within_and_across_blocks() -> None:
    A, C = Buffer("A", (c(64),), "float32"), Buffer("C", (c(32),), "float32")
    bx, tx = Var("bx"), Var("tx")
    # every block writes C[tx]: blocks of a launch are unordered
    across = kernel("k", [A, C], tloop(bx, "blockIdx.x", 2, tloop(tx, "threadIdx.x", 32,
                    st(C, tx, ld(A, bx * 32 + tx)))), {"blockIdx.x": 2, "threadIdx.x": 32})
    with pytest.raises(RaceError, match=r"global buffer 'C', element \d+, between blocks") as info:
        emulate(across, np.zeros(64, "float32"), np.zeros(32, "float32"))
    assert info.value.blocks[0] != info.value.blocks[1]
    # a thread reading what its neighbour wrote, without a barrier
    within = kernel("k", [A, C], tloop(tx, "threadIdx.x", 32, seq(
        st(C, tx, E.FloatImm(1.0)), st(C, tx, ld(C, (tx + 1) % 32)))), {"threadIdx.x": 32})
    with pytest.raises(RaceError, match="global buffer 'C'"):
        emulate(within, np.zeros(64, "float32"), np.zeros(32, "float32"))


def test_exceeding_the_arch_limits_is_an_error() -> None:
    f = one_block(lambda tx: seq(barrier()), threads=2048)
    with pytest.raises(Exception, match="2048 threads per block"):
        emulate(f)


# parity with the reference interpreter --------------------------------------------------------


def test_expression_semantics_match_the_interpreter() -> None:
    """A kernel without shared memory or barriers means the same run thread by thread, so the
    interpreter (thread loops run as serial loops) is its oracle, bit for bit."""
    n = 64
    Ai, Bi = Buffer("Ai", (c(n),), "int32"), Buffer("Bi", (c(n),), "int32")
    Af = Buffer("Af", (c(n),), "float32")
    Oi, Of = Buffer("Oi", (c(n * 8),), "int32"), Buffer("Of", (c(n * 8),), "float32")
    Ou = Buffer("Ou", (c(n),), "uint8")
    tx, j = Var("tx"), Var("j")
    x, y, f = ld(Ai, tx), ld(Bi, tx), ld(Af, tx)
    nz = y != 0
    ints = [
        x * y + x, E.Select(nz, E.Div(x, y), c(7)), E.Select(nz, x // y, c(-7)), E.Select(nz, x % y, c(3)),
        E.Min(x, y) - E.Max(x, y), E.Cast("int32", f * 1e9), E.Cast("int32", E.Cast("int8", x)),
        E.Select(x < y, x, y) * 3,
    ]
    floats = [
        f * 2.5 - f, E.Call("float32", "exp", (f,)), E.Min(f, f * f), E.Max(f, E.FloatImm(float("nan"))),
        E.Cast("float32", x) / E.Cast("float32", y), E.Call("float32", "sqrt", (f,)),
        E.Select(f > 0.5, f // 0.25, f % 0.25), E.Call("float32", "fma", (f, f, f)),
    ]
    body_s = seq(*[st(Oi, tx * 8 + k, v) for k, v in enumerate(ints)],
                 *[st(Of, tx * 8 + k, v) for k, v in enumerate(floats)],
                 st(Ou, tx, E.Cast("uint8", f * -300.0 + 200.0)))
    body = tloop(tx, "threadIdx.x", n, seq(body_s, loop(j, tx % 3, st(Oi, tx * 8, ld(Oi, tx * 8) + j))))
    fn = kernel("parity", [Ai, Bi, Af, Oi, Of, Ou], body, {"threadIdx.x": n})
    ai = rng.integers(-2**31, 2**31, n, dtype="int64").astype("int32")
    ai[:4] = [-2**31, -2**31, 5, -7]
    bi = rng.integers(-3, 4, n).astype("int32")
    bi[:4] = [-1, 0, 0, 2]
    af = (rng.standard_normal(n) * 3).astype("float32")
    af[:3] = [np.nan, np.inf, -0.0]
    outs_e = [np.zeros(n * 8, "int32"), np.zeros(n * 8, "float32"), np.zeros(n, "uint8")]
    outs_i = [o.copy() for o in outs_e]
    emulate(fn, ai, bi, af, *outs_e)
    run(fn, ai, bi, af, *outs_i)
    for e_, i_ in zip(outs_e, outs_i, strict=True):
        np.testing.assert_array_equal(e_, i_)


def test_integer_division_by_zero_names_the_thread() -> None:
    A, B = Buffer("A", (c(32),), "int32"), Buffer("B", (c(32),), "int32")
    f = one_block(lambda tx: st(B, tx, E.Div(c(10), ld(A, tx))), params=[A, B])
    a = np.ones(32, "int32")
    a[5] = 0
    with pytest.raises(ZeroDivisionError, match=r"thread \(5, 0, 0\)"):
        emulate(f, a, np.zeros(32, "int32"))


def test_vectors_locals_and_masked_control_flow_match_the_interpreter() -> None:
    """Vector values per thread, local memory at per-thread indices, loops with per-thread
    bounds, lets, uniform loads under a thread mask: again bit for bit against the interpreter."""
    n = 48
    A = Buffer("A", (c(n * 4),), "float32")
    I = Buffer("I", (c(n * 4),), "int32")
    O = Buffer("O", (c(n * 8),), "float32")
    P = Buffer("P", (c(n * 4),), "int32")
    R = local("R", 8)
    tx, j, k, x = Var("tx"), Var("j"), Var("k"), Var("x", "float32")
    v4 = E.Ramp(tx * 4, c(1), 4)
    fa, ia = ld(A, v4), ld(I, v4)
    nz = ia != E.Broadcast(c(0), 4)
    body = tloop(tx, "threadIdx.x", n, Allocate(R, seq(
        # float4 arithmetic, a reduction, and a vector select whose other side would fail
        st(O, E.Ramp(tx * 8, c(1), 4), fa * fa - E.Broadcast(E.VectorReduce("add", fa), 4)),
        st(P, v4, E.Select(nz, E.Div(E.Broadcast(c(1000), 4), ia), E.Broadcast(c(-1), 4))),
        # local memory at a per-thread index, in a loop whose bounds depend on the thread
        loop(j, 8, st(R, c(0) + j, E.Cast("float32", j))),
        For(k, tx % 3, tx % 5 + 1, ForKind.SERIAL, st(R, (tx + k) % 8, ld(R, (tx + k) % 8) + 10.0)),
        LetStmt(x, ld(A, tx) * 2.0, IfThenElse(
            tx % 2 == 0,
            st(O, tx * 8 + 4, x + ld(A, c(7))),  # a uniform load under a thread mask
            st(O, tx * 8 + 4, E.Select(x > 1.0, ld(R, tx % 8), ld(R, c(3)))))),
        st(O, tx * 8 + 5, ld(R, (tx * 3) % 8)),
        st(O, E.Ramp(tx * 8 + 6, c(1), 2), E.Cast("float32x2", E.Ramp(tx, c(2), 2)),
           pred=E.Broadcast(tx < 40, 2)),
    )))
    fn = kernel("vparity", [A, I, O, P], body, {"threadIdx.x": n})
    a = (rng.standard_normal(n * 4) * 2).astype("float32")
    i = rng.integers(-5, 6, n * 4).astype("int32")
    outs_e = [np.zeros(n * 8, "float32"), np.zeros(n * 4, "int32")]
    outs_i = [o.copy() for o in outs_e]
    emulate(fn, a, i, *outs_e)
    run(fn, a, i, *outs_i)
    for e_, i_ in zip(outs_e, outs_i, strict=True):
        np.testing.assert_array_equal(e_, i_)


def test_more_race_shapes_and_messages() -> None:
    S, out = shared("tile", 16), Buffer("out", (c(32),), "float32")
    # one thread writes what all then read at one (uniform) address
    f = one_block(lambda tx: Allocate(S, seq(
        IfThenElse(E.EQ(tx, c(0)), st(S, c(0), E.FloatImm(1.0))), st(out, tx, ld(S, c(0))))), params=[out])
    with pytest.raises(RaceError, match=r"(?s)'tile', element 0.*\(0, 0, 0\) writes: tile\[0\].*\(1, 0, 0\) reads"):
        emulate(f, np.zeros(32, "float32"))
    # ... fine with a barrier between
    g = one_block(lambda tx: Allocate(S, seq(
        IfThenElse(E.EQ(tx, c(0)), st(S, c(0), E.FloatImm(1.0))), barrier(), st(out, tx, ld(S, c(0))))), params=[out])
    o = np.zeros(32, "float32")
    emulate(g, o)
    np.testing.assert_array_equal(o, 1.0)
    # one block reads what another writes
    C, bx = Buffer("C", (c(8),), "float32"), Var("bx")
    h = kernel("k", [C], tloop(bx, "blockIdx.x", 2, IfThenElse(
        E.EQ(bx, c(0)), st(C, c(3), E.FloatImm(1.0)), st(C, c(4), ld(C, c(3))))), {"blockIdx.x": 2})
    for seed in range(3):
        with pytest.raises(RaceError, match=r"(?s)global buffer 'C', element 3, between blocks"):
            emulate(h, np.zeros(8, "float32"), seed=seed)


def test_local_and_shared_limits() -> None:
    R = local("R", 4)
    with pytest.raises(IndexError, match=r"local buffer 'R': index 4 .*thread \(4, 0, 0\).*`R\[tx % 5\] = 1.0f`"):
        emulate(one_block(lambda tx: Allocate(R, st(R, tx % 5, E.FloatImm(1.0)))))
    big = shared("big", 50000)
    with pytest.raises(TecompError, match="shared memory of block .* 200000 bytes with big"):
        emulate(one_block(lambda tx: Allocate(big, st(big, tx, E.FloatImm(1.0)))))


def test_poison_shows_reads_of_uninitialised_shared_memory() -> None:
    S, out = shared("S", 32), Buffer("out", (c(32),), "float32")
    f = one_block(lambda tx: Allocate(S, st(out, tx, ld(S, tx))), params=[out])
    o = np.ones(32, "float32")
    emulate(f, o)
    np.testing.assert_array_equal(o, 0.0)
    emulate(f, o, poison=True)
    assert np.isnan(o).all()


def test_multi_dimensional_accesses_are_checked_per_axis() -> None:
    """Accesses not yet flattened (one index per axis) work too, each axis bounds-checked."""
    n = 32
    A, B = Buffer("A", (c(n), c(n)), "float32"), Buffer("B", (c(n), c(n)), "float32")
    T = Buffer("T", (c(16), c(17)), "float32", scope="shared")
    bx, by, tx, ty = (Var(x) for x in ("bx", "by", "tx", "ty"))

    def build(col: E.Expr) -> PrimFunc:
        body = tloop(by, "blockIdx.y", 2, tloop(bx, "blockIdx.x", 2, Allocate(T,
            tloop(ty, "threadIdx.y", 16, tloop(tx, "threadIdx.x", 16, seq(
                BufferStore(T, E.BufferLoad(A, (by * 16 + ty, bx * 16 + tx)), (ty, col)),
                barrier(),
                BufferStore(B, E.BufferLoad(T, (tx, ty)), (bx * 16 + ty, by * 16 + tx)),
            ))))))
        return kernel("t2", [A, B], body, {"blockIdx.x": 2, "blockIdx.y": 2, "threadIdx.x": 16, "threadIdx.y": 16})

    a = rng.random((n, n), "float32")
    out = np.zeros((n, n), "float32")
    emulate(build(tx), a, out)
    np.testing.assert_array_equal(out, a.T)
    # column 17 is inside T's storage (16 * 17) but not inside its axis 1
    with pytest.raises(IndexError, match=r"shared buffer 'T': index 17 on axis 1 not in \[0, 17\) by thread \(15, 0, 0\)"):
        emulate(build(tx + 2), a, out)


# a Select on a block-uniform condition (bug A of tests/DIFFERENTIAL.md) ------------------------


def _uniform_select_kernel(use: str) -> PrimFunc:
    """Per block and serial iteration, ``Select(u, <uniform>, <per-thread load>)`` where ``u``
    is the same for every thread (it alternates with the block and the loop counter), used by
    the consumer ``use``: each one indexes the value by thread, so the uniform side taken must
    come out as a per-thread value too."""
    A, F = Buffer("A", (c(64),), "int32"), Buffer("F", (c(256),), "float32")
    O, G = Buffer("O", (c(128),), "int32"), Buffer("G", (c(128),), "float32")
    U, R = Buffer("U", (c(4),), "int32"), local("R", 2, "int32")
    bx, tx, k, x = Var("bx"), Var("tx"), Var("k"), Var("x")
    u = E.EQ(E.FloorMod(bx + k, c(2)), c(0))  # block-uniform, different per block and k
    a = ld(A, bx * 32 + tx)
    pick = E.Select(u, c(7), a)
    out = (bx * 2 + k) * 32 + tx
    bodies: dict[str, Stmt] = {
        # a store to local memory at a constant index, then loads of it
        "local": seq(st(R, k, pick), st(O, out, ld(R, k) + ld(R, c(0)))),
        # a masked store at a per-thread offset
        "masked": IfThenElse(tx < 16, st(O, out, pick)),
        # a store of the value at one address (by one thread)
        "uniform_address": IfThenElse(E.EQ(tx, c(3)), st(U, bx * 2 + k, pick)),
        # through a let (with arithmetic on uniform values only), and a let statement
        "let": seq(st(R, k, E.Let(x, pick, x * 2 + bx)), IfThenElse(tx < 16, st(O, out, ld(R, k)))),
        "let_stmt": LetStmt(x, pick, IfThenElse(tx < 16, st(O, out, x - k))),
        # a vector Select with a scalar uniform condition, reduced across its lanes
        "vector": st(G, out, E.VectorReduce("add", E.Select(
            u, E.Broadcast(E.FloatImm(0.5), 4), ld(F, E.Ramp((bx * 32 + tx) * 4, c(1), 4))))),
        # nested in a Select on a per-thread condition, and the other way round
        "nested": seq(st(R, k, E.Select(u, c(1), E.Select(tx < 5, a, c(2)))),
                      st(O, out, ld(R, k) + E.Select(tx % 3 == 0, pick, E.Select(u, a, c(-5))))),
    }
    body = tloop(bx, "blockIdx.x", 2, tloop(tx, "threadIdx.x", 32, Allocate(R, seq(
        st(R, c(0), c(0)), st(R, c(1), c(0)), loop(k, 2, bodies[use])))))
    return kernel("uselect", [A, F, O, G, U], body, {"blockIdx.x": 2, "threadIdx.x": 32})


@pytest.mark.parametrize("use", ["local", "masked", "uniform_address", "let", "let_stmt", "vector", "nested"])
def test_select_on_a_block_uniform_condition_gives_per_thread_values(use: str) -> None:
    f = _uniform_select_kernel(use)
    a = rng.integers(-100, 100, 64).astype("int32")
    fl = rng.random(256, "float32")
    outs_e = [np.full(128, -9, "int32"), np.zeros(128, "float32"), np.full(4, -9, "int32")]
    outs_i = [o.copy() for o in outs_e]
    emulate(f, a, fl, *outs_e)
    run(f, a, fl, *outs_i)
    for e_, i_ in zip(outs_e, outs_i, strict=True):
        np.testing.assert_array_equal(e_, i_)
    o = outs_e[0].reshape(2, 2, 32)
    if use == "masked":  # the numpy reference: 7 where (bx + k) is even, A otherwise
        want = np.where(((np.arange(2)[:, None] + np.arange(2)[None, :]) % 2 == 0)[..., None], 7,
                        a.reshape(2, 1, 32))
        np.testing.assert_array_equal(o[..., :16], want[..., :16])
        np.testing.assert_array_equal(o[..., 16:], -9)


# warp shuffles: Call(dtype, "shfl_xor_sync", (mask, value, lane_mask, width)) -----------------

FULL = E.IntImm(-1, "int32")  # member mask 0xffffffff as an int32


def shfl_xor(value: E.Expr, lane_mask: int, width: int = 32, mask: E.Expr = FULL) -> E.Call:
    return E.Call(value.dtype, "shfl_xor_sync", (mask, value, c(lane_mask), c(width)))


def _butterfly(v: np.ndarray, lane_masks: list[int], width: int) -> np.ndarray:
    """numpy model over a [..., 32] array of warps: the same float ops in the same order."""
    lane = np.arange(32)
    for b in lane_masks:
        j = lane ^ b
        v = v + v[..., np.where(j <= (lane | (width - 1)), j, lane)]
    return v


def shuffle_sum(dtype: str, bx: int, tx: int, ty: int, width: int) -> PrimFunc:
    """Each thread loads one element, then an xor butterfly over segments of ``width`` lanes
    (lane = linear thread id % 32, linear id = x + X * y) leaves every lane with its segment's
    sum, kept in a register (local) between the steps."""
    n = bx * tx * ty
    A, O = Buffer("A", (c(n),), dtype), Buffer("O", (c(n),), dtype)
    R = local("R", 1, dtype)
    vb, vx, vy = Var("bx"), Var("tx"), Var("ty")
    i = (vb * ty + vy) * tx + vx
    steps = [st(R, c(0), ld(R, c(0)) + shfl_xor(ld(R, c(0)), b, width))
             for b in (16, 8, 4, 2, 1) if b < width]
    body = tloop(vb, "blockIdx.x", bx, tloop(vy, "threadIdx.y", ty, tloop(vx, "threadIdx.x", tx, Allocate(R, seq(
        st(R, c(0), ld(A, i)), *steps, st(O, i, ld(R, c(0))))))))
    return kernel("shfl_sum", [A, O], body, {"blockIdx.x": bx, "threadIdx.x": tx, "threadIdx.y": ty})


@pytest.mark.parametrize(("tx", "ty", "width"), [(32, 4, 32), (8, 16, 8), (64, 2, 16), (16, 4, 32)])
def test_xor_butterfly_sums_warps_and_segments(tx: int, ty: int, width: int) -> None:
    f32, i32 = shuffle_sum("float32", 3, tx, ty, width), shuffle_sum("int32", 3, tx, ty, width)
    a = rng.standard_normal(3 * tx * ty).astype("float32")
    ai = rng.integers(-1000, 1000, 3 * tx * ty).astype("int32")
    masks = [b for b in (16, 8, 4, 2, 1) if b < width]
    for seed in range(3):  # other lane orders: lanes come from thread ids, not array positions
        out, outi = np.zeros_like(a), np.zeros_like(ai)
        emulate(f32, a, out, seed=seed)
        emulate(i32, ai, outi, seed=seed)
        # every lane holds its segment's sum: exactly for ints, bit for bit the butterfly's
        # float ops, and close to numpy's own sum
        seg = ai.reshape(-1, width).sum(axis=1, dtype="int32")
        np.testing.assert_array_equal(outi, np.repeat(seg, width))
        np.testing.assert_array_equal(out, _butterfly(a.reshape(-1, 32), masks, width).reshape(-1))
        np.testing.assert_allclose(out, np.repeat(a.reshape(-1, width).sum(axis=1), width), rtol=1e-4, atol=1e-5)


def test_shuffle_reads_earlier_segments_but_not_later_ones() -> None:
    """With width 8 and lane mask 8, lanes 8-15 read lanes 0-7 (an earlier segment) while lanes
    0-7 would read a later one and keep their own value; a uniform value is every lane's."""
    A, O = Buffer("A", (c(64),), "float32"), Buffer("O", (c(128),), "float32")
    tx, ty = Var("tx"), Var("ty")
    i = ty * 32 + tx
    body = tloop(ty, "threadIdx.y", 2, tloop(tx, "threadIdx.x", 32, seq(
        st(O, i, shfl_xor(ld(A, i), 8, 8)),
        st(O, i + 64, shfl_xor(E.FloatImm(2.5), 3) + shfl_xor(ld(A, i), 35)))))  # 35: low 5 bits (3)
    f = kernel("k", [A, O], body, {"threadIdx.x": 32, "threadIdx.y": 2})
    a = rng.random(64, "float32")
    out = np.zeros(128, "float32")
    emulate(f, a, out, seed=5)
    lane = np.arange(64) % 32
    src = np.where((lane ^ 8) <= (lane | 7), lane ^ 8, lane) + np.arange(64) // 32 * 32
    np.testing.assert_array_equal(out[:64], a[src])
    np.testing.assert_array_equal(out[64:], np.float32(2.5) + a[np.arange(64) ^ 3])


def test_shuffle_under_a_thread_dependent_if_diverges() -> None:
    A, O = Buffer("A", (c(64),), "int32"), Buffer("O", (c(64),), "int32")
    tx, ty = Var("tx"), Var("ty")
    i = ty * 32 + tx
    body = tloop(ty, "threadIdx.y", 2, tloop(tx, "threadIdx.x", 32,
                 IfThenElse(tx < 16, st(O, i, shfl_xor(ld(A, i), 1)))))
    f = kernel("k", [A, O], body, {"threadIdx.x": 32, "threadIdx.y": 2})
    for seed in range(3):  # the lowest warp and thread, whatever the lane order
        with pytest.raises(ShuffleDivergenceError,
                           match=r"(?s)shfl_xor_sync.*member mask 0xffffffff .*warp 0 .*lanes 16-31 are "
                                 r"inactive \(thread \(16, 0, 0\).*if tx < 16"):
            emulate(f, np.zeros(64, "int32"), np.zeros(64, "int32"), seed=seed)
    # with the member mask naming only the lanes that take the branch it is fine
    half = tloop(ty, "threadIdx.y", 2, tloop(tx, "threadIdx.x", 32, IfThenElse(
        tx < 16, st(O, i, shfl_xor(ld(A, i), 1, 16, E.IntImm(0xFFFF, "uint32"))))))
    a, out = rng.integers(0, 100, 64).astype("int32"), np.full(64, -1, "int32")
    emulate(kernel("k", [A, O], half, {"threadIdx.x": 32, "threadIdx.y": 2}), a, out)
    want = np.where(np.arange(64) % 32 < 16, a[np.arange(64) ^ 1], -1)
    np.testing.assert_array_equal(out, want)
    # ... but not if a lane reads one outside the mask (lane 15 would read lane 16)
    low = E.IntImm(0xFFFF, "uint32")
    bad = tloop(tx, "threadIdx.x", 32, IfThenElse(tx < 16, st(O, tx, shfl_xor(ld(A, tx), 31, 32, low))))
    with pytest.raises(ShuffleDivergenceError, match=r"lanes 0-15 read lanes 16-31, which are not in the mask"):
        emulate(kernel("k", [A, O], bad, {"threadIdx.x": 32}), a, out)


def test_shuffle_in_an_incomplete_warp_diverges() -> None:
    A, O = Buffer("A", (c(48),), "float32"), Buffer("O", (c(48),), "float32")
    f = one_block(lambda tx: st(O, tx, shfl_xor(ld(A, tx), 1)), threads=48, params=[A, O])
    with pytest.raises(ShuffleDivergenceError, match=r"warp 1 .*lanes 16-31 are missing \(the block has 48 threads"):
        emulate(f, np.zeros(48, "float32"), np.zeros(48, "float32"))
    # a per-thread trip count also leaves lanes behind
    k = Var("k")
    g = one_block(lambda tx: loop(k, tx % 2 + 1, st(O, tx, shfl_xor(ld(A, tx), 2))), params=[A, O])
    with pytest.raises(ShuffleDivergenceError, match=r"lanes 0, 2, 4, .*, 30 are inactive"):
        emulate(g, np.zeros(48, "float32"), np.zeros(48, "float32"))

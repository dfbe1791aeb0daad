"""``s[AA].double_buffer()`` on cuda targets (passes/inject_double_buffer.py, TVM's
InjectDoubleBuffer): the tiled SIMT GEMM with its shared A and B tiles double-buffered, emulated
against numpy (with and without a ragged last k tile, with virtual threads; a symbolic K and a
single k tile stay single-buffered),
assembled by ptxas for sm_80 and sm_90, with twice the shared memory of the single-buffered
kernel, one barrier per k step (the emulator's race detector catches either one removed), and
the load of the next tile issued before the computation on the current one."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from test_gpu_operators import F32, _rand, build, check_ptx, tiled_gemm  # same directory
from test_gpu_operators import emulate as emulate_out

import tecomp as tc
from tecomp import te
from tecomp.codegen.ptxas import ptxas_resources
from tecomp.ir.expr import IntImm
from tecomp.ir.functor import StmtMutator, StmtVisitor
from tecomp.ir.stmt import Evaluate, For, PrimFunc, SeqStmt, Stmt, is_barrier, seq, thread_tag
from tecomp.lowering import lower
from tecomp.runtime.gpu_emulator import RaceError, emulate

M = N = 64
K_TILE = 8


def db_gemm(K: int | te.Var, *, vthread: bool = False) -> tuple[te.Schedule, list[te.Tensor]]:
    """`tiled_gemm` (32 x 32 blocks, 8 x 8 threads, k tiles of 8) with A_shared and B_shared
    double-buffered."""
    s, args = tiled_gemm(M, N, K, vthread=vthread, k_tile=K_TILE)  # type: ignore[arg-type]
    for st in s.stages:
        if st.scope == "shared":
            st.double_buffer()
    return s, args


def _main_loop(f: PrimFunc) -> For:
    """The pipelined loop (``k.outer.db``)."""
    found: list[For] = []

    class V(StmtVisitor):
        def visit_For(self, s: For) -> None:
            if s.var.name.endswith(".db"):
                found.append(s)
            super().visit_For(s)

    V().visit_stmt(f.body)
    assert found, "no pipelined loop"
    return found[0]


def _barriers_run(s: Stmt) -> int:
    """Barriers one thread passes running ``s`` (constant trip counts)."""
    if is_barrier(s):
        return 1
    if isinstance(s, SeqStmt):
        return sum(_barriers_run(x) for x in s.seq)
    if isinstance(s, For):
        inner = _barriers_run(s.body)
        if not inner or thread_tag(s) is not None:  # a thread loop does not iterate
            return inner
        assert isinstance(s.extent, IntImm), s.extent
        return s.extent.value * inner
    body = getattr(s, "body", None)
    if body is not None:
        return _barriers_run(body)
    then = getattr(s, "then_case", None)
    return _barriers_run(then) if then is not None else 0


def _barriers_in(s: Stmt) -> int:
    class V(StmtVisitor):
        n = 0

        def visit_Evaluate(self, e: Evaluate) -> None:
            V.n += is_barrier(e)

    V().visit_stmt(s)
    return V.n


@pytest.mark.parametrize("K, vthread", [
    pytest.param(64, False, id="8-tiles"),
    pytest.param(36, False, id="k-tail"),  # 5 tiles, the last one ragged
    pytest.param(72, True, id="vthread"),  # 9 tiles (odd: the tail is one computation)
    pytest.param(16, False, id="2-tiles"),  # no main loop: prologue, one step, tail
])
def test_double_buffered_gemm_matches_numpy_and_assembles(K: int, vthread: bool) -> None:
    s, args = db_gemm(K, vthread=vthread)
    f = build(s, args)
    a, b = _rand(M, K), _rand(K, N, seed=1)
    np.testing.assert_allclose(emulate_out(f, [a, b], (M, N)), a @ b, **F32)
    ptx = check_ptx(f, s, args, registers_only=True)
    assert "bar.sync" in ptx["sm_80"] and "ld.shared" in ptx["sm_80"]


def test_a_symbolic_trip_count_stays_single_buffered() -> None:
    """The pipelined form needs the trip count (see passes/inject_double_buffer.py): with a
    symbolic K the kernel is the single-buffered one, and correct."""
    K = te.var("K")
    f = build(*db_gemm(K))
    text = f.get_source("tir")
    assert ".db" not in text and "double_buffer_scope" not in text
    assert ptxas_resources(f.get_source("ptx"), "sm_80")["main"].shared_bytes == 2 * 32 * K_TILE * 4
    for k in (8, 20):
        a, b = _rand(M, k), _rand(k, N, seed=1)
        np.testing.assert_allclose(emulate_out(f, [a, b], (M, N)), a @ b, **F32)


@pytest.mark.parametrize("K", [64, 36])
def test_shared_memory_is_twice_the_single_buffered_kernel(K: int) -> None:
    single = ptxas_resources(build(*tiled_gemm(M, N, K)).get_source("ptx"), "sm_80")["main"]
    double = ptxas_resources(build(*db_gemm(K)).get_source("ptx"), "sm_80")["main"]
    tile = 2 * 32 * K_TILE * 4  # a 32 x 8 float tile of A and one of B
    if K == 64:
        assert single.shared_bytes == tile
    assert double.shared_bytes == 2 * tile
    text = tc.lower(*db_gemm(K), target="cuda")
    assert re.search(r"allocate A_shared: float32\[512\] \(shared\)", str(text))


def test_one_tile_leaves_the_loop_single_buffered() -> None:
    f = tc.lower(*db_gemm(K_TILE), target="cuda")  # one k tile: nothing to overlap
    text = str(f)
    assert "allocate A_shared: float32[256] (shared)" in text and ".db" not in text
    assert "double_buffer_scope" not in text


@pytest.mark.parametrize("K", [64, 36, 72])
def test_one_barrier_per_k_tile(K: int) -> None:
    """Single-buffered, a k step needs two barriers (after the load, before the next load);
    double-buffered, the load of the next tile goes to the other half, so one is enough."""
    tiles = -(-K // K_TILE)
    f = tc.lower(*db_gemm(K), target="cuda")
    assert _barriers_run(f.body) == tiles
    single = tc.lower(*tiled_gemm(M, N, K), target="cuda")
    assert _barriers_run(single.body) >= 2 * tiles - 1
    if K == 64:
        assert _barriers_in(_main_loop(f).body) == 2  # the body is two k steps


class _DropBarrier(StmtMutator):
    """Remove the ``which``-th barrier of the pipelined loop's body."""

    def __init__(self, which: int) -> None:
        self.which = which

    def visit_For(self, s: For) -> Stmt:
        if not s.var.name.endswith(".db"):
            return super().visit_For(s)
        assert isinstance(s.body, SeqStmt)
        at = [i for i, x in enumerate(s.body.seq) if is_barrier(x)][self.which]
        body = seq(*s.body.seq[:at], *s.body.seq[at + 1:])
        return For(s.var, s.min, s.extent, s.kind, body, s.annotations)


@pytest.mark.parametrize("which", [0, 1], ids=["mid-body", "end-of-body"])
def test_race_detector_catches_a_removed_barrier(which: int) -> None:
    """Each barrier of the pipelined body is needed: without the first, the load of tile k+2
    overwrites half 0 while other threads still compute on tile k there; without the second,
    the same happens to half 1 one step later."""
    K = 64
    f = tc.lower(*db_gemm(K), target="cuda")
    a, b = _rand(M, K), _rand(K, N, seed=1)
    out = np.zeros((M, N), np.float32)
    emulate(f, a, b, out)
    np.testing.assert_allclose(out, a @ b, **F32)
    g = PrimFunc(f.name, f.params, _DropBarrier(which).visit_stmt(f.body), f.dim_vars, f.attrs)
    assert _barriers_in(g.body) == _barriers_in(f.body) - 1
    with pytest.raises(RaceError, match=r"shared buffer '(A|B)_shared'"):
        emulate(g, a, b, np.zeros((M, N), np.float32))


def test_lowered_ir_loads_the_next_tile_before_computing_on_this_one() -> None:
    text = str(tc.lower(*db_gemm(64), target="cuda"))
    lines = text.splitlines()
    start = next(i for i, x in enumerate(lines) if "for k.outer.db in range(3)" in x)
    depth = len(lines[start]) - len(lines[start].lstrip())
    body = []
    for x in lines[start + 1:]:
        if len(x) - len(x.lstrip()) <= depth:
            break
        body.append(x.strip())
    # the first step: store tile 2*k.outer.db + 1 into half 1 (offset 256) of A_shared and
    # B_shared, then compute on half 0, then (after the barrier) the second step the other way
    store_h1 = next(i for i, x in enumerate(body) if re.match(r"A_shared\[.* \+ 256\] = A\[", x))
    read_h0 = next(i for i, x in enumerate(body) if re.match(r"A_shared_local\[ax0\] = A_shared\[[^\]]*k\.inner\]", x))
    bar = body.index("syncthreads()")
    store_h0 = next(i for i, x in enumerate(body) if x.startswith("A_shared[") and "] = A[" in x
                    and "+ 256] = " not in x)
    read_h1 = next(i for i, x in enumerate(body) if re.match(r"A_shared_local\[ax0\] = A_shared\[.* \+ 256\]", x))
    assert store_h1 < read_h0 < bar < store_h0 < read_h1
    assert body[-1] == "syncthreads()"
    # the tile loaded first is the next one: A's k offset is 16 * k.outer.db + 8
    assert re.search(r"k\.outer\.db \* 16 .*\+ 8\]", body[store_h1])
    # the raw loop nest carries the marker the pass consumes
    raw = str(lower(*db_gemm(64), passes=False, target="cuda"))
    assert "# double_buffer_scope = A_shared" in raw and "# double_buffer_scope = B_shared" in raw


def _cpu_schedule() -> tuple[te.Schedule, list[te.Tensor], Any]:
    A = te.placeholder((64,), name="A")
    B = te.compute((64,), lambda i: A[i] * 2.0, name="B")
    C = te.compute((64,), lambda i: B[i] + 1.0, name="C")
    s = te.create_schedule(C.op)
    return s, [A, C], B


def test_cpu_targets_refuse_double_buffer() -> None:
    s, args, B = _cpu_schedule()
    s[B].double_buffer()
    with pytest.raises(tc.LoweringError, match="stage B: double_buffer .*CPU builds have no such stage"):
        tc.lower(s, args)


def test_double_buffer_on_a_stage_that_is_not_shared_is_refused_by_name() -> None:
    s, args = tiled_gemm(M, N, 64)
    local = next(st for st in s.stages if st.scope == "local" and "shared" in st.name)
    local.double_buffer()
    with pytest.raises(tc.LoweringError, match=rf"stage {re.escape(local.name)}: double_buffer "
                       r"applies to shared-memory stages .* has scope 'local'"):
        tc.lower(s, args, target="cuda")


def test_double_buffer_on_a_shared_stage_outside_any_serial_loop_is_refused() -> None:
    A = te.placeholder((64, 64), name="A")
    B = te.compute((64, 64), lambda i, j: A[i, j] + 1.0, name="B")
    s = te.create_schedule(B.op)
    AS = s.cache_read(A, "shared", [B])
    bx, xi = s[B].split(s[B].op.axis[0], factor=8)
    tx, _ = s[B].split(s[B].op.axis[1], factor=64)
    s[B].bind(bx, te.thread_axis("blockIdx.x"))
    s[B].bind(xi, te.thread_axis("threadIdx.y"))
    s[AS].compute_at(s[B], bx)
    s[AS].double_buffer()
    with pytest.raises(tc.LoweringError, match=r"stage A.shared: double_buffer needs the stage "
                       r"computed at a serial loop; .* is bound to blockIdx.x"):
        tc.lower(s, [A, B], target="cuda")

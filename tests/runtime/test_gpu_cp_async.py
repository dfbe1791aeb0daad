"""``s[AA].pipeline(depth)`` on cuda targets (passes/inject_software_pipeline.py, TVM's
InjectSoftwarePipeline + cp.async): the tiled SIMT GEMM with its shared A and B tiles loaded by
cp.async into rings of 2-4 tiles, emulated against numpy (with a ragged last k tile, scalar
4-byte .ca and vectorised 16-byte .cg copies, float16), assembled by ptxas for sm_80 and sm_90
(0 spills, shared memory = depth x tile), the commit/wait placement in the lowered IR, a
misplaced or missing wait caught by the emulator (the destination is poison until its group is
retired), alignment, and sm_75 refused. Guarded copies (a zero-padded input, a ragged last
tile, M/N tails) are the zero-filling ``cp.async [dst], [src], size, src_size`` form."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np
import pytest
from test_gpu_operators import F32, _rand, check_ptx, tiled_gemm  # same directory
from test_gpu_operators import emulate as emulate_out

import tecomp as tc
from tecomp import te
from tecomp.codegen.ptxas import ptxas_resources
from tecomp.errors import LoweringError
from tecomp.ir import Allocate, AttrStmt, Buffer, For, ForKind, Var
from tecomp.ir.expr import BufferLoad, Call, IntImm, Select, const
from tecomp.ir.functor import StmtMutator, StmtVisitor
from tecomp.ir.stmt import (
    ASYNC_COPY_SCOPE,
    CP_ASYNC_COMMIT,
    CP_ASYNC_WAIT,
    BufferStore,
    Evaluate,
    IfThenElse,
    PrimFunc,
    SeqStmt,
    Stmt,
    barrier,
    is_barrier,
    seq,
)
from tecomp.passes.inject_software_pipeline import commit_group, wait_group
from tecomp.runtime.gpu_async import AsyncCopyError
from tecomp.runtime.gpu_emulator import RaceError, emulate

M = N = 64
K_TILE = 8
TILE_BYTES = 2 * 32 * K_TILE * 4  # a 32 x 8 float tile of A and one of B


def pipe_gemm(K: int, depth: int, **kw: Any) -> tuple[te.Schedule, list[te.Tensor]]:
    s, args = tiled_gemm(M, N, K, k_tile=K_TILE, **kw)
    for st in s.stages:
        if st.scope == "shared":
            st.pipeline(depth)
    return s, args


def vec_gemm(K: int, depth: int, dtype: str = "float32", vec: int = 4, k_tile: int = K_TILE
             ) -> tuple[te.Schedule, list[te.Tensor]]:
    """The same GEMM with the cooperative fetch vectorised by ``vec`` (16-byte copies), fp32
    accumulation of ``dtype`` inputs."""
    A = te.placeholder((M, K), dtype, name="A")
    B = te.placeholder((K, N), dtype, name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k].astype("float32") * B[k, j].astype("float32"),
                                               axis=k), name="C")
    s = te.create_schedule(C.op)
    _pipelined_tiles(s, C, A, B, k_tile, depth, vec)
    return s, [A, B, C]


def _pipelined_tiles(s: te.Schedule, C: te.Tensor, A: te.Tensor, B: te.Tensor, k_tile: int, depth: int,
                     vec: int | None) -> None:
    """The GEMM schedule these tests share: 32 x 32 blocks of 8 x 8 threads, a local
    accumulator, A and B tiles in shared memory fetched cooperatively (as ``vec``-element
    vectors along their rows, or element by element for None) and pipelined ``depth`` deep."""
    AS, BS = s.cache_read(A, "shared", [C]), s.cache_read(B, "shared", [C])
    AL, BL = s.cache_read(AS, "local", [C]), s.cache_read(BS, "local", [C])
    CL = s.cache_write(C, "local")
    tx, ty = te.thread_axis((0, 8), "threadIdx.x"), te.thread_axis((0, 8), "threadIdx.y")
    i, j = s[C].op.axis
    by, yi = s[C].split(i, factor=32)
    bx, xi = s[C].split(j, factor=32)
    ty_, yi = s[C].split(yi, nparts=8)
    tx_, xi = s[C].split(xi, nparts=8)
    s[C].reorder(by, bx, ty_, tx_, yi, xi)
    s[C].bind(by, te.thread_axis("blockIdx.y"))
    s[C].bind(bx, te.thread_axis("blockIdx.x"))
    s[C].bind(ty_, ty)
    s[C].bind(tx_, tx)
    s[CL].compute_at(s[C], tx_)
    ko, ki = s[CL].split(s[CL].op.reduce_axis[0], factor=k_tile)
    ci, cj = s[CL].op.axis
    s[CL].reorder(ko, ki, ci, cj)
    s[AL].compute_at(s[CL], ki)
    s[BL].compute_at(s[CL], ki)
    for X in (AS, BS):
        s[X].compute_at(s[CL], ko)
        if vec is None:
            _, flat = s[X].split(s[X].fuse(*s[X].op.axis), factor=64)
        else:
            # the vector along the tile's rows, so its index stays one unit-stride Ramp
            r, col = s[X].op.axis
            co, vi = s[X].split(col, factor=vec)
            _, flat = s[X].split(s[X].fuse(r, co), factor=64)
            s[X].vectorize(vi)
        fy, fx = s[X].split(flat, factor=8)
        s[X].bind(fy, ty)
        s[X].bind(fx, tx)
        s[X].pipeline(depth)


def _calls(s: Stmt) -> list[str]:
    """commit / wait(n) / barrier in program order (loop bodies once)."""
    out: list[str] = []

    class V(StmtVisitor):
        def visit_Evaluate(self, e: Evaluate) -> None:
            v = e.value
            if is_barrier(e):
                out.append("sync")
            elif isinstance(v, Call) and v.name == CP_ASYNC_COMMIT:
                out.append("commit")
            elif isinstance(v, Call) and v.name == CP_ASYNC_WAIT:
                assert isinstance(v.args[0], IntImm)
                out.append(f"wait{v.args[0].value}")

    V().visit_stmt(s)
    return out


@pytest.mark.parametrize("depth", [2, 3, 4])
@pytest.mark.parametrize("K", [64, 36, 16, 8], ids=["8-tiles", "k-tail", "2-tiles", "1-tile"])
def test_pipelined_gemm_matches_numpy(K: int, depth: int) -> None:
    f = tc.build(*pipe_gemm(K, depth), target="cuda")
    a, b = _rand(M, K), _rand(K, N, seed=1)
    np.testing.assert_allclose(emulate_out(f, [a, b], (M, N)), a @ b, **F32)
    ptx = f.get_source("ptx")
    assert ("cp.async.ca.shared.global" in ptx) == (K > K_TILE)  # one tile: nothing to overlap


def test_pipelined_gemm_with_virtual_threads() -> None:
    f = tc.build(*pipe_gemm(72, 3, vthread=True), target="cuda")
    a, b = _rand(M, 72), _rand(72, N, seed=1)
    np.testing.assert_allclose(emulate_out(f, [a, b], (M, N)), a @ b, **F32)


@pytest.mark.parametrize("depth", [2, 3, 4])
def test_vectorised_copies_are_16_byte_cg(depth: int) -> None:
    s, args = vec_gemm(64, depth)
    f = tc.build(s, args, target="cuda")
    a, b = _rand(M, 64), _rand(64, N, seed=1)
    np.testing.assert_allclose(emulate_out(f, [a, b], (M, N)), a @ b, **F32)
    ptx = check_ptx(f, s, args)
    for arch in ("sm_80", "sm_90"):
        copies = [ln for ln in ptx[arch].splitlines() if "cp.async.cg.shared.global" in ln]
        assert len(copies) >= 2 * depth and all(ln.rstrip().endswith(", 16;") for ln in copies)
        assert "cp.async.ca" not in ptx[arch] and "ld.global" not in ptx[arch]  # A and B both
        assert "cp.async.commit_group" in ptx[arch] and "cp.async.wait_group" in ptx[arch]
        r = ptxas_resources(ptx[arch], arch)["main"]
        assert r.spill_stores == r.spill_loads == 0
        assert r.shared_bytes == depth * TILE_BYTES


@pytest.mark.parametrize("depth", [2, 3, 4])
def test_ptxas_reports_depth_times_tile(depth: int) -> None:
    s, args = pipe_gemm(64, depth)
    f = tc.build(s, args, target="cuda")
    ptx = check_ptx(f, s, args, registers_only=True)
    for arch in ("sm_80", "sm_90"):
        assert ptxas_resources(ptx[arch], arch)["main"].shared_bytes == depth * TILE_BYTES


def test_float16_tiles() -> None:
    s, args = vec_gemm(64, 3, dtype="float16", vec=8)
    f = tc.build(s, args, target="cuda")
    a = _rand(M, 64).astype("float16")
    b = _rand(64, N, seed=1).astype("float16")
    ref = a.astype("float32") @ b.astype("float32")
    np.testing.assert_allclose(emulate_out(f, [a, b], (M, N)), ref, rtol=1e-3, atol=1e-3)
    ptx = f.get_source("ptx")
    assert "cp.async.cg.shared.global" in ptx
    assert ptxas_resources(ptx, "sm_80")["main"].shared_bytes == 3 * TILE_BYTES // 2


@pytest.mark.parametrize("depth, golden", [
    # prologue: depth-1 tiles; one wait + barrier per tile, then the next load; the epilogue
    # drains with smaller waits (5 tiles of K=36)
    (2, "commit | wait0 sync commit | wait0 sync commit | wait0 sync commit | "
        "wait0 sync commit | wait0 sync"),
    (3, "commit commit | wait1 sync commit | wait1 sync commit | wait1 sync commit | "
        "wait1 sync | wait0 sync"),
    (4, "commit commit commit | wait2 sync commit | wait2 sync commit | wait2 sync | "
        "wait1 sync | wait0 sync"),
])
def test_lowered_ir_places_commit_and_wait(depth: int, golden: str) -> None:
    f = tc.lower(*pipe_gemm(36, depth), target="cuda")
    got = " ".join(_calls(f.body)).replace(" wait", " | wait")
    assert got == golden
    text = str(f)
    assert f"allocate A_shared: float32[{depth * 256}] (shared)" in text
    assert "async_copy_scope" in text and "async_pipeline_scope" not in text


class _EditWait(StmtMutator):
    """Test-only IR mutation of the ``which``-th cp_async_wait_group: drop it, change its
    count, or move it after the barrier that follows it."""

    def __init__(self, which: int, mode: str) -> None:
        self.which, self.mode, self.seen = which, mode, -1

    def visit_SeqStmt(self, s: SeqStmt) -> Stmt:
        items = [self.visit_stmt(x) for x in s.seq]
        out: list[Stmt] = []
        i = 0
        while i < len(items):
            x = items[i]
            v = x.value if isinstance(x, Evaluate) else None
            if isinstance(v, Call) and v.name == CP_ASYNC_WAIT:
                self.seen += 1
                if self.seen == self.which:
                    if self.mode == "drop":
                        i += 1
                        continue
                    if self.mode == "later":
                        n = v.args[0]
                        assert isinstance(n, IntImm)
                        out.append(Evaluate(Call("int32", CP_ASYNC_WAIT, (const(n.value + 1),))))
                        i += 1
                        continue
                    if self.mode == "after_barrier":
                        assert is_barrier(items[i + 1])
                        out += [items[i + 1], x]
                        i += 2
                        continue
            out.append(x)
            i += 1
        return seq(*out)


def _mutated(K: int, depth: int, which: int, mode: str) -> PrimFunc:
    f = tc.lower(*pipe_gemm(K, depth), target="cuda")
    body = _EditWait(which, mode).visit_stmt(f.body)
    return PrimFunc(f.name, f.params, body, f.dim_vars, dict(f.attrs))


def _emulate(f: PrimFunc, K: int) -> None:
    emulate(f, _rand(M, K), _rand(K, N, seed=1), np.zeros((M, N), np.float32))


@pytest.mark.parametrize("depth, which, mode", [
    (2, 0, "drop"), (3, 1, "drop"), (3, 4, "drop"),  # 4: the epilogue's final wait_group(0)
    (3, 0, "later"), (4, 2, "later"),  # waiting for one group too few
])
def test_a_missing_or_short_wait_reads_poison(depth: int, which: int, mode: str) -> None:
    f = _mutated(36, depth, which, mode)
    with pytest.raises(AsyncCopyError) as err:
        _emulate(f, 36)
    msg = str(err.value)
    assert "still in flight" in msg and "_shared" in msg and "thread (" in msg
    assert err.value.buffer in ("A_shared", "B_shared") and err.value.element >= 0
    assert "in ``" not in msg and re.search(r"in `[^`]*_shared\[", msg)  # the statement


def test_a_wait_after_the_barrier_is_a_race() -> None:
    """The wait retires this thread's copies, but other threads read them: without a barrier
    between the wait and the reads, the race detector reports it."""
    with pytest.raises(RaceError):
        _emulate(_mutated(64, 3, 1, "after_barrier"), 64)


def test_unmutated_kernel_passes_the_checks() -> None:
    _emulate(_mutated(36, 3, 99, "drop"), 36)


def test_misaligned_16_byte_copies_are_caught_by_the_emulator() -> None:
    """K = 34: rows of A start 136 bytes apart, so a 16-byte copy at an odd row is misaligned;
    codegen cannot prove it either way (it emits cp.async), the emulator catches it."""
    f = tc.build(*vec_gemm(34, 2), target="cuda")
    with pytest.raises(AsyncCopyError, match="not 16-byte aligned"):
        emulate_out(f, [_rand(M, 34), _rand(34, N, seed=1)], (M, N))


def test_sm75_is_refused() -> None:
    with pytest.raises(LoweringError, match=r"cp.async.*sm_80.*sm_75.*double_buffer"):
        tc.build(*pipe_gemm(64, 2), target="cuda -arch=sm_75")


def test_bad_uses_are_refused() -> None:
    s, args = pipe_gemm(64, 2)
    with pytest.raises(tc.ScheduleError, match="depth"):
        s.stages[1].pipeline(5)
    with pytest.raises(LoweringError, match="pipeline.*CPU|CPU.*pipeline|GPU"):
        tc.lower(s, args, target="llvm")
    s2, args2 = pipe_gemm(64, 2)
    for st in s2.stages:
        if st.scope == "shared":
            st.double_buffer()
    with pytest.raises(LoweringError, match="pipeline\\(\\) and double_buffer\\(\\)"):
        tc.lower(s2, args2, target="cuda")


# zero-filling cp.async: guarded copies (padded inputs, ragged tiles) ------------------------------


def padded_gemm(M: int, N: int, K: int, depth: int, *, vec: int | None = None,
                k_valid: int | None = None) -> tuple[te.Schedule, list[te.Tensor]]:
    """C = Ap @ Bp over zero-padded copies of A (M x K) and B (K x N): ``Ap[i, k] =
    if_then_else(i < M && k < k_valid, A[i, k], 0)`` (rows and k rounded up to whole 32-row /
    ``K_TILE`` tiles), B likewise; the padding stages are inlined into the shared tiles, whose
    copies are then ``select(cond, A[..], 0)``: zero-filling cp.async. ``vec``: the tiles'
    rows fetched as ``vec``-element vectors (the guard lane-uniform, or a live prefix when
    ``k_valid`` is not a multiple of ``vec``)."""
    kv = K if k_valid is None else k_valid
    Mp, Np, Kp = -(-M // 32) * 32, -(-N // 32) * 32, -(-kv // K_TILE) * K_TILE
    A = te.placeholder((M, K), name="A")
    B = te.placeholder((K, N), name="B")
    Ap = te.compute((Mp, Kp), lambda i, k: te.if_then_else(te.all(i < M, k < kv), A[i, k], 0.0),
                    name="Ap")
    Bp = te.compute((Kp, Np), lambda k, j: te.if_then_else(te.all(k < kv, j < N), B[k, j], 0.0),
                    name="Bp")
    k = te.reduce_axis((0, Kp), name="k")
    C = te.compute((Mp, Np), lambda i, j: te.sum(Ap[i, k] * Bp[k, j], axis=k), name="C")
    s = te.create_schedule(C.op)
    s[Ap].compute_inline()
    s[Bp].compute_inline()
    _pipelined_tiles(s, C, Ap, Bp, K_TILE, depth, vec)
    return s, [A, B, C]


def _padded_ref(a: np.ndarray, b: np.ndarray, kv: int) -> np.ndarray:
    M, N = a.shape[0], b.shape[1]
    out = np.zeros((-(-M // 32) * 32, -(-N // 32) * 32), np.float32)
    out[:M, :N] = a[:, :kv] @ b[:kv]
    return out


def _zero_fill_copies(ptx: str, nbytes: int) -> list[str]:
    """The cp.async lines of the src-size form (a fourth operand, a register)."""
    return [ln.strip() for ln in ptx.splitlines()
            if re.search(rf"cp\.async\.c[ag]\.shared\.global \[[^]]+\], \[[^]]+\], {nbytes}, %r\d+;", ln)]


@pytest.mark.parametrize("depth", [2, 3])
@pytest.mark.parametrize("M, N, K, vec, kv", [
    (64, 64, 36, None, None),   # K = 36: a ragged fifth k tile of 4 (scalar 4-byte copies)
    (60, 44, 20, None, None),   # M and N tails as well
    (64, 64, 36, 4, None),      # 16-byte copies: the k guard is uniform over each vector
    (60, 60, 36, 4, 35),        # k < 35: the last vector of a row is a live prefix of 3 lanes
], ids=["k-tail", "mnk-tails", "vec-k-tail", "vec-prefix"])
def test_guarded_tiles_are_zero_filling_copies(M: int, N: int, K: int, vec: int | None, kv: int | None,
                                               depth: int) -> None:
    s, args = padded_gemm(M, N, K, depth, vec=vec, k_valid=kv)
    f = tc.build(s, args, target="cuda")
    a, b = _rand(M, K), _rand(K, N, seed=1)
    if kv is not None:  # what the guards keep out is NaN: a lane read instead of zero-filled shows
        a[:, kv:] = np.nan
        b[kv:] = np.nan
    got = emulate_out(f, [a, b], (-(-M // 32) * 32, -(-N // 32) * 32))
    np.testing.assert_allclose(got, _padded_ref(a, b, K if kv is None else kv), **F32)
    ptx = check_ptx(f, s, args)  # ptxas, sm_80 and sm_90, no spills
    nbytes = 4 if vec is None else 16
    for arch in ("sm_80", "sm_90"):
        assert _zero_fill_copies(ptx[arch], nbytes), arch
        # every element of both tiles goes through cp.async, the guarded ones too
        assert "ld.global" not in ptx[arch] and "cp.async.wait_group" in ptx[arch]


def test_the_guard_reaches_the_lowered_copies_as_selects() -> None:
    f = tc.lower(*padded_gemm(64, 64, 36, 2), target="cuda")
    text = str(f)
    assert "async_copy_scope" in text
    assert re.search(r"Ap_shared\[[^\n]*\] = select\([^\n]* < 20, A\[[^\n]*\], 0\.0f\)", text)


def _zero_fill_kernel(wait: bool) -> PrimFunc:
    """64 threads: ``S[tx] = select(tx < 10, A[tx], 0)`` as one cp.async each (a guarded copy,
    src-size 0 from thread 10 on), committed, waited for (or not), then ``out[tx] = S[63 - tx]``."""
    A = Buffer("A", (const(64),), "float32")
    out = Buffer("out", (const(64),), "float32")
    S = Buffer("S", (const(64),), "float32", scope="shared")
    tx = Var("tx")
    copy = BufferStore(S, Select(tx < 10, BufferLoad(A, (tx,)), const(0.0, "float32")), (tx,))
    body = seq(AttrStmt(ASYNC_COPY_SCOPE, 1, copy), commit_group(),
               *([wait_group(0)] if wait else []), barrier(),
               BufferStore(out, BufferLoad(S, (63 - tx,)), (tx,)))
    loop = For(tx, const(0), const(64), ForKind.THREAD_BINDING, body, (("thread_tag", "threadIdx.x"),))
    f = PrimFunc("k", [A, out], Allocate(S, loop))
    f.attrs["launch"] = {"threadIdx.x": const(64)}
    return f


def test_a_zero_filled_copy_writes_zeros_once_waited_for() -> None:
    a = _rand(64)
    out = np.full(64, np.nan, np.float32)
    emulate(_zero_fill_kernel(wait=True), a, out, poison=True)  # shared memory starts as NaN
    want = np.where(np.arange(64) < 10, a, 0.0).astype(np.float32)[::-1]
    np.testing.assert_array_equal(out, want)


def test_a_zero_filled_copy_is_poison_until_its_wait() -> None:
    with pytest.raises(AsyncCopyError, match="still in flight") as err:
        emulate(_zero_fill_kernel(wait=False), _rand(64), np.zeros(64, np.float32))
    # thread 0 reads S[63]: a copy that read nothing (src-size 0) but still lands at the wait
    assert err.value.buffer == "S" and err.value.element == 63


@pytest.mark.parametrize("vec", [None, 4], ids=["4-byte", "16-byte"])
def test_removing_any_wait_of_a_zero_filling_pipeline_reads_poison(vec: int | None) -> None:
    s, args = padded_gemm(64, 64, 36, 3, vec=vec)
    f = tc.lower(s, args, target="cuda")
    waits = sum(c.startswith("wait") for c in _calls(f.body))
    assert waits >= 3
    a, b = _rand(64, 36), _rand(36, 64, seed=1)
    emulate(f, a, b, np.zeros((64, 64), np.float32))  # as lowered: fine
    for which in range(waits):
        body = _EditWait(which, "drop").visit_stmt(f.body)
        g = PrimFunc(f.name, f.params, body, f.dim_vars, dict(f.attrs))
        with pytest.raises(AsyncCopyError, match="still in flight"):
            emulate(g, a, b, np.zeros((64, 64), np.float32))


class _AsIfElse(StmtMutator):
    """Test-only: ``AA[i] = select(c, A[j], 0)`` -> ``if c: AA[i] = A[j] else: AA[i] = 0``."""

    def __init__(self) -> None:
        self.rewritten = 0

    def visit_BufferStore(self, s: BufferStore) -> Stmt:
        v = s.value
        if s.buffer.scope == "shared" and isinstance(v, Select) and isinstance(v.t, BufferLoad):
            self.rewritten += 1
            return IfThenElse(v.cond, BufferStore(s.buffer, v.t, s.indices),
                              BufferStore(s.buffer, v.f, s.indices))
        return s


def test_an_if_else_zero_guard_is_the_same_zero_filling_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    # the guarded copy written as a branch with a zero store in the other arm (before
    # inject_software_pipeline runs) becomes the same cp.async with src-size
    from tecomp.passes import pipeline

    edit = _AsIfElse()
    before = ("as_if_else", lambda f: dataclasses.replace(f, body=edit.visit_stmt(f.body)))
    at = [n for n, _ in pipeline.GPU_PIPELINE].index("inject_software_pipeline")
    monkeypatch.setattr(pipeline, "GPU_PIPELINE",
                        [*pipeline.GPU_PIPELINE[:at], before, *pipeline.GPU_PIPELINE[at:]])
    s, args = padded_gemm(64, 64, 36, 2)
    f = tc.build(s, args, target="cuda")
    assert edit.rewritten >= 2  # the A and B tiles' guarded copies
    a, b = _rand(64, 36), _rand(36, 64, seed=1)
    np.testing.assert_allclose(emulate_out(f, [a, b], (64, 64)), a @ b, **F32)
    ptx = f.get_source("ptx")
    assert _zero_fill_copies(ptx, 4) and "ld.global" not in ptx

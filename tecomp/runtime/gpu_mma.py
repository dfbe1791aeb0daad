"""Tensor cores in the GPU emulator: ``ldmatrix`` and ``mma.sync.m16n8k16`` per warp and lane.

The fragment layouts below are transcribed from the PTX ISA ("Matrix Fragments for
mma.m16n8k16 with floating point type", "Warp-level matrix load instruction: ldmatrix"),
independently of the intrinsics that address them (`tecomp.te.intrin_cuda`) and of the
hardware the codegen targets: a layout bug on either side makes the emulated GEMM disagree
with numpy. In the ISA's terms, for a lane ``l``: ``groupID = l >> 2``,
``threadID_in_group = l % 4``.

A fragment buffer (scope in `FRAGMENT_SCOPES`) is per-lane local memory of ``size / 32``
elements (a list of ``[T]`` arrays, as the emulator's other local buffers). Both operations are
warp-collective: every lane of each warp that executes one must be active, and the block must
consist of whole warps (`WarpDivergenceError` otherwise), as ``.sync.aligned`` requires.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import TecompError
from ..ir import dtype as dt
from ..ir import expr as E  # noqa: N812
from ..ir import stmt as S  # noqa: N812
from ..te.intrin_cuda import FRAGMENT_SCOPES, LDMATRIX, MMA, WARP_SIZE, fragment_elements
from . import interp as I  # noqa: N812
from . import interp_ops as ops

if TYPE_CHECKING:
    from .gpu_simt import SimtCompiler

Env = I.Env
StmtFn = I.StmtFn


class WarpDivergenceError(TecompError):
    """A warp-collective tensor-core instruction (ldmatrix, mma.sync) executed by only some
    lanes of a warp, or in a block that is not a whole number of warps."""


# ---- fragment tables (PTX ISA) ----------------------------------------------------------------
def _mma_a_table() -> np.ndarray:
    """[lane, i] -> (row, col) of A (16x16, .row) held in a_i, i = 0..7 (4 .f16x2 registers).

    ISA: row = groupID for a0, a1, a4, a5 and groupID + 8 for a2, a3, a6, a7;
    col = threadID_in_group * 2 + (i & 1) for a0..a3, + 8 for a4..a7."""
    t = np.zeros((WARP_SIZE, 8, 2), np.int64)
    for lane in range(WARP_SIZE):
        group, tig = lane >> 2, lane % 4
        for i in range(8):
            row = group + 8 if i in (2, 3, 6, 7) else group
            col = tig * 2 + (i & 1) + (8 if i >= 4 else 0)
            t[lane, i] = (row, col)
    return t


def _mma_b_table() -> np.ndarray:
    """[lane, i] -> (k, n) of B (16x8, .col) held in b_i, i = 0..3 (2 .f16x2 registers).

    ISA: row (k) = threadID_in_group * 2 + (i & 1) for b0, b1, + 8 for b2, b3; col (n) = groupID."""
    t = np.zeros((WARP_SIZE, 4, 2), np.int64)
    for lane in range(WARP_SIZE):
        group, tig = lane >> 2, lane % 4
        for i in range(4):
            t[lane, i] = (tig * 2 + (i & 1) + (8 if i >= 2 else 0), group)
    return t


def _mma_c_table() -> np.ndarray:
    """[lane, i] -> (row, col) of C/D (16x8, .f32) held in c_i, i = 0..3.

    ISA: row = groupID for c0, c1 and groupID + 8 for c2, c3; col = threadID_in_group * 2 + (i & 1)."""
    t = np.zeros((WARP_SIZE, 4, 2), np.int64)
    for lane in range(WARP_SIZE):
        group, tig = lane >> 2, lane % 4
        for i in range(4):
            t[lane, i] = (group + (8 if i >= 2 else 0), tig * 2 + (i & 1))
    return t


def _ldmatrix_table() -> np.ndarray:
    """[lane, e] -> (row, col) of an 8x8 b16 matrix that ``ldmatrix`` (no .trans) puts in the
    lane's register for that matrix, element e = 0, 1 (low, high half).

    ISA: "each thread receives two elements of a row": lane l holds row l >> 2, elements
    2 * (l % 4) and 2 * (l % 4) + 1. Row r of matrix j is read from the address lane 8j + r
    supplies (lanes 0-7: matrix 0, 8-15: 1, 16-23: 2, 24-31: 3)."""
    t = np.zeros((WARP_SIZE, 2, 2), np.int64)
    for lane in range(WARP_SIZE):
        for e in range(2):
            t[lane, e] = (lane >> 2, 2 * (lane % 4) + e)
    return t


MMA_A = _mma_a_table()
MMA_B = _mma_b_table()
MMA_C = _mma_c_table()
LDMATRIX_FRAGMENT = _ldmatrix_table()


# ---- warp-level semantics on numpy arrays (by lane: axis 1 is the lane in the warp) ------------
def ldmatrix_warp(rows: np.ndarray, num: int, trans: bool) -> np.ndarray:
    """``ldmatrix.sync.aligned.m8n8.x{num}[.trans].b16`` for ``W`` warps: ``rows[w, l]`` are the 8
    elements at the row address lane ``l`` supplied; returns ``[W, 32, 2 * num]``, lane ``l``'s
    registers (register j = elements 2j, 2j + 1: matrix j)."""
    W = rows.shape[0]
    mats = rows[:, : 8 * num].reshape(W, num, 8, 8)  # [w, matrix, row (supplying lane % 8), col]
    if trans:
        mats = mats.transpose(0, 1, 3, 2)
    r, c = LDMATRIX_FRAGMENT[..., 0], LDMATRIX_FRAGMENT[..., 1]  # [32, 2]
    out = mats[:, :, r, c]  # [W, num, 32, 2]
    return out.transpose(0, 2, 1, 3).reshape(W, WARP_SIZE, 2 * num)


def mma_warp(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``mma.m16n8k16.row.col.f32.*.*.f32`` for ``W`` warps on per-lane fragments (float32
    values): ``a`` [W, 32, 8], ``b`` [W, 32, 4], ``c`` [W, 32, 4] -> ``d`` [W, 32, 4]."""
    W = a.shape[0]
    A = np.zeros((W, 16, 16), np.float64)
    B = np.zeros((W, 16, 8), np.float64)
    C = np.zeros((W, 16, 8), np.float64)
    A[:, MMA_A[..., 0], MMA_A[..., 1]] = a
    B[:, MMA_B[..., 0], MMA_B[..., 1]] = b
    C[:, MMA_C[..., 0], MMA_C[..., 1]] = c
    # products of 16-bit floats are exact in float64; the sum is rounded once to float32 (the
    # hardware's internal order and precision are unspecified: tests allow for that)
    D = (np.matmul(A, B) + C).astype(np.float32)
    return D[:, MMA_C[..., 0], MMA_C[..., 1]]


def matrix_a_from_fragments(a: np.ndarray) -> np.ndarray:
    """[32, 8] per-lane A registers -> the 16x16 matrix (tests)."""
    A = np.zeros((16, 16), a.dtype)
    A[MMA_A[..., 0], MMA_A[..., 1]] = a
    return A


# ---- compiling the IR calls ------------------------------------------------------------------
def _by_warp(state: Any, x: np.ndarray) -> np.ndarray:
    """[T, ...] values by array position -> [W, 32, ...] by thread id."""
    out = np.empty_like(x)
    out[state.lin] = x
    return out.reshape(state.T // WARP_SIZE, WARP_SIZE, *x.shape[1:])


def _by_position(state: Any, x: np.ndarray) -> np.ndarray:
    """[W, 32, ...] by thread id -> [T, ...] by array position."""
    return x.reshape(state.T, *x.shape[2:])[state.lin]


def _check_warps(state: Any, what: str, path: str) -> None:
    T = state.T
    if T % WARP_SIZE:
        raise WarpDivergenceError(f"{what}: the block has {T} threads, not a whole number of warps "
                                  f"of {WARP_SIZE} ({state.where()}). It is inside:\n{path}")
    m = state.mask
    if m is None:
        return
    act = np.zeros(T, bool)
    act[state.lin[m]] = True
    w = act.reshape(-1, WARP_SIZE)
    part = w.any(axis=1) & ~w.all(axis=1)
    if part.any():
        k = int(np.flatnonzero(part)[0])
        lanes = np.flatnonzero(~w[k])
        raise WarpDivergenceError(
            f"warp divergence: {what} is warp-collective but lanes {lanes.tolist()} of warp {k} of "
            f"block {state.block} do not execute it (threadIdx.x must be the lane: launch 32 "
            f"threadIdx.x, and no thread-dependent condition around it). It is inside:\n{path}")


def _address(e: E.Expr, what: str) -> E.BufferLoad:
    if not (isinstance(e, E.Call) and e.name == "address_of" and len(e.args) == 1
            and isinstance(e.args[0], E.BufferLoad)):
        raise TecompError(f"{what}: operand must be address_of(buffer[index]), got {e}")
    return e.args[0]


def _fragment(c: SimtCompiler, load: E.BufferLoad, what: str, dtypes: tuple[str, ...]) -> tuple[Any, Any]:
    """(cells of the fragment buffer, uniform per-lane offset) of a fragment operand."""
    buf = load.buffer
    if buf.scope not in FRAGMENT_SCOPES:
        raise TecompError(f"{what}: {buf.name} is not a tensor-core fragment (scope {buf.scope!r})")
    if dt.element(buf.dtype) not in dtypes:
        raise TecompError(f"{what}: fragment {buf.name} has dtype {buf.dtype}, expected {dtypes}")
    (idx,) = load.indices
    if c.varies(idx):
        raise TecompError(f"{what}: the fragment offset {idx} differs between the lanes of a warp")
    off = c.expr(idx)
    data, by_name = buf.data, c.by_name

    def cells(env: Env) -> list[np.ndarray]:
        p = env.get(data) or by_name.get(buf.name)
        if p is None:
            raise TecompError(f"fragment {buf.name} is not allocated")
        return p  # type: ignore[return-value]

    return cells, off


def _take(cells: list[np.ndarray], off: int, n: int, name: str, where: str) -> list[np.ndarray]:
    if off < 0 or off + n > len(cells):
        raise IndexError(f"fragment {name}: per-lane elements [{off}, {off + n}) outside its "
                         f"{len(cells)} elements ({where})")
    return cells[off:off + n]


def compile_warp_call(c: SimtCompiler, call: E.Call) -> StmtFn:
    """Compile an ``Evaluate`` of `LDMATRIX` or `MMA` (docs/gpu-ir.md, "Tensor cores")."""
    path = "\n".join(f"  {'  ' * k}{h}" for k, h in enumerate([*c._path, c._where]))
    if call.name == LDMATRIX:
        return _ldmatrix(c, call, path)
    assert call.name == MMA
    return _mma(c, call, path)


def _ldmatrix(c: SimtCompiler, call: E.Call, path: str) -> StmtFn:
    what = f"ldmatrix `{call}`"
    if len(call.args) != 4:
        raise TecompError(f"{what}: expected (trans, num, dst, src)")
    a_trans, a_num, a_dst, a_src = call.args
    if not (isinstance(a_trans, E.IntImm) and isinstance(a_num, E.IntImm) and a_num.value in (1, 2, 4)):
        raise TecompError(f"{what}: trans and num (1, 2 or 4) must be constants")
    trans, num = bool(a_trans.value), a_num.value
    src = _address(a_src, what)
    if not src.buffer.scope.startswith("shared") or dt.bits(src.buffer.dtype) != 16:
        raise TecompError(f"{what}: ldmatrix reads 16-bit elements of shared memory, not "
                          f"{src.buffer.scope} {src.buffer.dtype} ({src.buffer.name})")
    dst_load = _address(a_dst, what)
    cells_of, off_fn = _fragment(c, dst_load, what, (dt.element(src.buffer.dtype),))
    (sidx,) = src.indices
    # each lane reads the 16-byte row at its address: a vector load, bounds-checked and seen by
    # the race detector like any other shared read
    row_load = E.BufferLoad(src.buffer, (E.Ramp(sidx, E.IntImm(1, sidx.dtype), 8),))
    from .gpu_memory import compile_varying_load

    if not c.varies(sidx):
        raise TecompError(f"{what}: every lane supplies the same row address; ldmatrix needs "
                          "one row per lane (lane-dependent addresses)")
    rows_fn = compile_varying_load(c, row_load)
    checked = getattr(c, "_async_checked", None)
    if checked is not None:  # a row still in flight from a cp.async is an error
        rows_fn = checked(row_load, rows_fn)
    state, name, n = c.state, dst_load.buffer.name, 2 * num

    def run(env: Env) -> None:
        _check_warps(state, "ldmatrix", path)
        rows = np.asarray(rows_fn(env))  # [T, 8] storage dtype (float16 / bfloat16 bits)
        regs = _by_position(state, ldmatrix_warp(_by_warp(state, rows), num, trans))
        cells = cells_of(env)
        off = int(off_fn(env))
        _take(cells, off, n, name, state.where())
        for j in range(n):
            cells[off + j] = np.ascontiguousarray(regs[:, j])

    return run


def _values(x: list[np.ndarray], dtype: str) -> np.ndarray:
    a = np.stack(x, axis=1)
    if dt.element(dtype) == "bfloat16":
        return dt.bf16_bits_to_f32(a)
    return a.astype(np.float32)


def _mma(c: SimtCompiler, call: E.Call, path: str) -> StmtFn:
    what = f"mma `{call}`"
    if len(call.args) != 5 or not all(isinstance(x, E.StringImm) for x in call.args[:2]):
        raise TecompError(f"{what}: expected (\"m16n8k16\", input dtype, a, b, c)")
    shape, dtype = call.args[0].value, call.args[1].value  # type: ignore[attr-defined]
    if shape != "m16n8k16" or dtype not in ("float16", "bfloat16"):
        raise TecompError(f"{what}: only m16n8k16 with float16/bfloat16 inputs is supported")
    la, lb, lc = (_address(x, what) for x in call.args[2:])
    fa, oa = _fragment(c, la, what, (dtype,))
    fb, ob = _fragment(c, lb, what, (dtype,))
    fc, oc = _fragment(c, lc, what, ("float32",))
    state = c.state
    names = (la.buffer.name, lb.buffer.name, lc.buffer.name)

    def run(env: Env) -> None:
        _check_warps(state, "mma.sync", path)
        where = state.where()
        ca, cb, cc = fa(env), fb(env), fc(env)
        ia, ib, ic = int(oa(env)), int(ob(env)), int(oc(env))
        a = _by_warp(state, _values(_take(ca, ia, 8, names[0], where), dtype))
        b = _by_warp(state, _values(_take(cb, ib, 4, names[1], where), dtype))
        acc = _by_warp(state, _values(_take(cc, ic, 4, names[2], where), "float32"))
        d = _by_position(state, mma_warp(a, b, acc))
        for j in range(4):
            cc[ic + j] = np.ascontiguousarray(d[:, j])

    return run


def compile_fragment_alloc(c: SimtCompiler, s: S.Allocate) -> StmtFn:
    """A fragment buffer: ``size / 32`` per-lane elements (see the module docstring)."""
    buf = s.buffer
    dims = [x for x in buf.shape]
    if not all(isinstance(d, E.IntImm) for d in dims):
        raise TecompError(f"fragment {buf.name} must have a constant shape, got {buf.shape}")
    logical = int(np.prod([d.value for d in dims], dtype=np.int64))  # type: ignore[attr-defined]
    size = fragment_elements(buf.scope, logical, buf.name)
    npd, body, state, by_name = dt.storage_numpy(buf.dtype), c.stmt(s.body), c.state, c.by_name
    poison, data = c.poison, buf.data

    def run_fragment(env: Env) -> None:
        init = np.zeros(state.T, npd)
        if poison:
            init.view(np.uint8 if npd.kind in "iu" else npd).fill(ops.POISON[npd.kind])
        cells = [init] * size
        old, old_name = env.get(data, I._MISSING), by_name.get(buf.name, I._MISSING)
        env[data] = by_name[buf.name] = cells  # type: ignore[assignment]
        body(env)
        I._restore(env, data, old)
        I._restore(by_name, buf.name, old_name)

    return run_fragment


__all__ = ["LDMATRIX_FRAGMENT", "MMA_A", "MMA_B", "MMA_C", "WarpDivergenceError",
           "compile_fragment_alloc", "compile_warp_call", "ldmatrix_warp", "mma_warp"]

"""Tensor-core intrinsics for NVIDIA GPUs (sm_80+), ready for ``s[X].tensorize(axis, intrin)``.

Warp-level ``mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32`` with operand
fragments loaded from shared memory by ``ldmatrix`` (TVM's python/tvm/tir/tensor_intrin/cuda.py,
adapted to te-level tensorize). A fragment is a stage whose storage scope is one of
`FRAGMENT_SCOPES` (docs/gpu-ir.md, "Tensor cores"): the IR buffer has the *logical* shape of
the warp's tiles, but each thread holds only its lane's share: ``prod(shape) / 32`` elements,
tile after tile (tile ``t`` of ``tile_rows x tile_cols`` elements occupies per-lane elements
``[t * per_lane, (t + 1) * per_lane)``, tiles numbered row-major over the logical buffer). Every
access to a fragment buffer (the intrinsics' operands, the accumulator's reset and store) uses
that per-lane ("physical") offset.

* `ldmatrix_a` - a 16x16 A tile (row-major in shared memory) -> an A fragment
  (``ldmatrix.x4``).
* `ldmatrix_b` - a 16x8 (``n=8``, ``.x2.trans``) or 16x16 (``n=16``, two fragments,
  ``.x4.trans``) tile of B (row-major ``[k, n]`` in shared memory) -> B fragments (``.col``).
* `mma_sync` - ``c[i, j] += sum_k float32(a[i, k]) * float32(b[k, j])`` on a 16x8x16 tile; its
  reset zeroes the accumulator fragment (used as the reduction's initialisation).
* `mma_sync_gather` - the mma of a conv's implicit GEMM: A read straight from a shared input
  tile by ``ldmatrix`` with one address per output pixel (``pixel * stride``), so the im2col
  matrix exists nowhere; the tile's 16 rows may span several dimensions (output rows x
  columns), as may `store_c`'s.
* `store_c` - an accumulator fragment -> a float32 buffer (shared or global), ``float2`` stores.

The lane a thread plays is ``threadIdx.x``: the intrinsics wrap their per-lane code in a loop
bound to ``threadIdx.x`` of extent 32, so the kernel must launch exactly 32 ``threadIdx.x``
(warps are then indexed by ``threadIdx.y``/``z``), and the fragment stages must not be inside
a ``threadIdx.x`` loop of their own: the whole warp executes each intrinsic.

The fragment layouts used here (which lane supplies which row address to ``ldmatrix``, which
lane holds which accumulator element) are written from the PTX ISA; the emulator
(`tecomp.runtime.gpu_mma`) has its own tables, so a mistake in either shows up as a mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..arith.simplify import simplify
from ..errors import TecompError
from ..ir.buffer import Buffer
from ..ir.expr import BufferLoad, Call, Expr, FloorDiv, FloorMod, IntImm, Ramp, StringImm, Var, const
from ..ir.stmt import THREAD_TAG, Allocate, BufferStore, Evaluate, For, ForKind, Stmt, seq
from .reduction import sum as te_sum
from .tensor import compute, placeholder, reduce_axis
from .tensor_intrin import TensorIntrin, TensorRegion, decl_tensor_intrin

WARP_SIZE = 32
# Evaluate(Call("int32", LDMATRIX, (IntImm trans, IntImm num, address_of(frag[off]),
#                                   address_of(shared[row_address_of_this_lane]))))
LDMATRIX = "ptx_ldmatrix"
# Evaluate(Call("int32", MMA, (StringImm "m16n8k16", StringImm input dtype,
#                              address_of(a_frag[off]), address_of(b_frag[off]),
#                              address_of(c_frag[off])))): c += a @ b
MMA = "ptx_mma"
MMA_CALLS = (LDMATRIX, MMA)
MIN_CC = (8, 0)  # mma.m16n8k16 with bf16 and f32 accumulation needs sm_80
INPUT_DTYPES = ("float16", "bfloat16")


@dataclass(frozen=True)
class FragmentScope:
    """A tensor-core fragment storage scope: tiles of ``rows x cols`` elements, each spread
    over the 32 lanes of a warp, ``per_lane`` elements per lane."""

    name: str
    rows: int
    cols: int
    dtypes: tuple[str, ...]

    @property
    def per_lane(self) -> int:
        return self.rows * self.cols // WARP_SIZE


MATRIX_A = "local.m16n8k16.matrixA"
MATRIX_B = "local.m16n8k16.matrixB"
ACCUMULATOR = "local.m16n8k16.accumulator"
FRAGMENT_SCOPES: dict[str, FragmentScope] = {
    MATRIX_A: FragmentScope(MATRIX_A, 16, 16, INPUT_DTYPES),  # [m, k], 8 per lane
    MATRIX_B: FragmentScope(MATRIX_B, 16, 8, INPUT_DTYPES),  # [k, n], 4 per lane
    ACCUMULATOR: FragmentScope(ACCUMULATOR, 16, 8, ("float32",)),  # [m, n], 4 per lane
}


def fragment_elements(scope: str, logical_size: int, name: str = "") -> int:
    """Elements per lane of a fragment buffer of ``logical_size`` elements (whole tiles)."""
    fs = FRAGMENT_SCOPES[scope]
    if logical_size % (fs.rows * fs.cols):
        raise TecompError(f"fragment buffer {name!r} of scope {scope} has {logical_size} elements, "
                          f"not a whole number of {fs.rows}x{fs.cols} tiles")
    return logical_size // WARP_SIZE


def _const(e: Expr) -> int | None:
    s = simplify(e)
    return s.value if isinstance(s, IntImm) else None


def _require_stride(r: TensorRegion, dim: int, value: int | None, intrin: str) -> int:
    s = _const(r.strides[dim])
    if s is None or (value is not None and s != value):
        want = f"stride {value}" if value is not None else "a constant stride"
        raise TecompError(f"{intrin}: {r.name} must have {want} in dimension {dim} of the tile, "
                          f"got {simplify(r.strides[dim])}")
    return s


def _row_stride(r: TensorRegion, intrin: str) -> int:
    """The stride of the tile's rows. A tile of more than two dimensions (the rows of a
    conv's implicit GEMM: ``(rows of the output, columns)``, then the columns of the matrix)
    must lay its rows out as one run of equally spaced rows: each leading dimension's stride
    is the next one's extent times its stride."""
    nd = len(r.shape)
    _require_stride(r, nd - 1, 1, intrin)
    ld = _require_stride(r, nd - 2, None, intrin)
    for d in range(nd - 3, -1, -1):
        ext = _const(r.shape[d + 1])
        want = None if ext is None else ext * _const(r.strides[d + 1])  # type: ignore[operator]
        if _const(r.shape[d]) != 1:
            _require_stride(r, d, want, intrin)
    return ld


def fragment_offset(r: TensorRegion, intrin: str) -> Expr:
    """The per-lane offset of the fragment tile ``r`` (a tile-aligned region of a fragment
    buffer): its tile number times the tile's elements per lane."""
    scope = FRAGMENT_SCOPES.get(r.buffer.scope)
    if scope is None:
        raise TecompError(f"{intrin}: {r.name} must be a tensor-core fragment (scope one of "
                          f"{', '.join(FRAGMENT_SCOPES)}), got scope {r.buffer.scope!r}; "
                          "create it with cache_read/cache_write to that scope")
    ld = _row_stride(r, intrin)
    if ld % scope.cols:
        raise TecompError(f"{intrin}: fragment {r.name} has rows of {ld} elements, not a multiple "
                          f"of the {scope.cols}-column tiles of {scope.name}")
    off = r.elem_offset
    tile = (FloorDiv(FloorDiv(off, const(ld)), const(scope.rows)) * const(ld // scope.cols)
            + FloorDiv(FloorMod(off, const(ld)), const(scope.cols)))
    return simplify(tile * const(scope.per_lane))


def _frag_ptr(r: TensorRegion, off: Expr) -> Expr:
    return Call("handle", "address_of", (BufferLoad(r.buffer, (off,)),))


def _lane_loop(body_of: object) -> Stmt:
    """``body_of(lane)`` in a loop bound to threadIdx.x of extent 32: ``lane`` is the thread's
    lane in its warp (the kernel launches 32 threadIdx.x)."""
    lane = Var("lane", "int32")
    body = body_of(lane)  # type: ignore[operator]
    return For(lane, const(0), const(WARP_SIZE), ForKind.THREAD_BINDING, body,
               ((THREAD_TAG, "threadIdx.x"),))


def _check_dtype(dtype: str, intrin: str) -> None:
    if dtype not in INPUT_DTYPES:
        raise TecompError(f"{intrin}: tensor-core inputs are float16 or bfloat16, got {dtype}")


def ldmatrix_a(dtype: str = "float16") -> TensorIntrin:
    """A 16x16 tile of A (``[m, k]``, rows contiguous in shared memory) -> an A fragment."""
    name = f"ldmatrix_a_16x16_{dtype}"
    _check_dtype(dtype, name)
    a = placeholder((16, 16), dtype, name="a_shared")
    frag = compute((16, 16), lambda i, k: a[i, k], name="a_frag")

    def impl(ins: list[TensorRegion], outs: list[TensorRegion]) -> Stmt:
        src, dst = ins[0], outs[0]
        _require_stride(src, 1, 1, name)
        off = fragment_offset(dst, name)
        # ISA: lanes 8j..8j+7 give the rows of 8x8 matrix j; matrices (rows, cols) 0: (0-7, 0-7),
        # 1: (8-15, 0-7), 2: (0-7, 8-15), 3: (8-15, 8-15) are registers a0a1, a2a3, a4a5, a6a7
        return _lane_loop(lambda lane: Evaluate(Call("int32", LDMATRIX, (
            const(0), const(4), _frag_ptr(dst, off),
            src.access_ptr("r", [FloorMod(lane, const(16)), FloorDiv(lane, const(16)) * 8])))))

    return decl_tensor_intrin(frag.op, impl, name=name)


def ldmatrix_b(dtype: str = "float16", n: int = 8) -> TensorIntrin:
    """A ``16 x n`` tile of B (``[k, n]``, rows contiguous in shared memory) -> ``n / 8`` B
    fragments (``.col`` operands: ldmatrix transposes the 8x8 pieces on the way)."""
    if n not in (8, 16):
        raise TecompError(f"ldmatrix_b: n must be 8 or 16, got {n}")
    name = f"ldmatrix_b_16x{n}_{dtype}"
    _check_dtype(dtype, name)
    b = placeholder((16, n), dtype, name="b_shared")
    frag = compute((16, n), lambda k, j: b[k, j], name="b_frag")

    def impl(ins: list[TensorRegion], outs: list[TensorRegion]) -> Stmt:
        src, dst = ins[0], outs[0]
        _require_stride(src, 1, 1, name)
        off = fragment_offset(dst, name)
        # matrices 0: k 0-7, 1: k 8-15 (b0b1, b2b3 of the first n8 fragment), then the same for
        # columns 8-15 (the next fragment, the next tile of the buffer: its registers follow)
        return _lane_loop(lambda lane: Evaluate(Call("int32", LDMATRIX, (
            const(1), const(n // 4), _frag_ptr(dst, off),
            src.access_ptr("r", [FloorMod(lane, const(16)), FloorDiv(lane, const(16)) * 8
                                 if n == 16 else const(0)])))))

    return decl_tensor_intrin(frag.op, impl, name=name)


def mma_sync(dtype: str = "float16") -> TensorIntrin:
    """``c[i, j] += sum_k float32(a[i, k]) * float32(b[k, j])``, 16x8x16, on fragments."""
    name = f"mma_m16n8k16_{dtype}_f32"
    _check_dtype(dtype, name)
    a = placeholder((16, 16), dtype, name="a")
    b = placeholder((16, 8), dtype, name="b")
    k = reduce_axis((0, 16), name="k")
    c = compute((16, 8), lambda i, j: te_sum(a[i, k].astype("float32") * b[k, j].astype("float32"),
                                             axis=k), name="c")

    def impl(ins: list[TensorRegion], outs: list[TensorRegion]) -> tuple[Stmt, Stmt, Stmt]:
        ra, rb = ins
        rc = outs[0]
        pa, pb, pc = (fragment_offset(r, name) for r in (ra, rb, rc))
        for r, want in ((ra, MATRIX_A), (rb, MATRIX_B), (rc, ACCUMULATOR)):
            if r.buffer.scope != want:
                raise TecompError(f"{name}: {r.name} must be in scope {want}, not {r.buffer.scope}")
        update = Evaluate(Call("int32", MMA, (StringImm("m16n8k16"), StringImm(dtype),
                                              _frag_ptr(ra, pa), _frag_ptr(rb, pb), _frag_ptr(rc, pc))))
        # the same for every lane: no lane loop needed
        reset = seq(*[BufferStore(rc.buffer, const(0.0, "float32"), (simplify(pc + i),))
                      for i in range(FRAGMENT_SCOPES[ACCUMULATOR].per_lane)])
        return seq(reset, update), reset, update

    return decl_tensor_intrin(c.op, impl, name=name)


def _check_rows(rows: tuple[int, ...], intrin: str) -> tuple[int, ...]:
    rows = tuple(int(x) for x in rows)
    if not rows or any(x < 1 for x in rows) or _prod(rows) != 16:
        raise TecompError(f"{intrin}: the 16 rows of an mma tile must be split into positive "
                          f"extents whose product is 16, got {rows}")
    return rows


def _prod(xs: tuple[int, ...]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def _row_index(row: Expr, rows: tuple[int, ...]) -> list[Expr]:
    """Row ``row`` (0-15) of a tile whose rows span dimensions of extents ``rows``."""
    idx: list[Expr] = []
    for ext in reversed(rows[1:]):
        idx.append(FloorMod(row, const(ext)) if ext > 1 else const(0))
        row = FloorDiv(row, const(ext)) if ext > 1 else row
    return [row, *idx[::-1]]


def mma_sync_gather(dtype: str = "float16", rows: tuple[int, ...] = (16,), stride: int = 1) -> TensorIntrin:
    """``c[*r, j] += sum_k float32(a[*r * stride, k]) * float32(b[k, j])``: the mma of a conv's
    implicit GEMM, the A operand read straight from shared memory.

    The 16 rows of the tile are output pixels spanning dimensions of extents ``rows`` (e.g.
    ``(2, 8)``: two output rows of eight pixels), and row ``r`` of A is input pixel ``r *
    stride`` (plus the filter tap, in the tile's origin) of the shared input tile: the im2col
    gather is in the address each lane gives ``ldmatrix`` (lanes 0-15 the rows' first 8
    channels, 16-31 the next 8), so no im2col buffer exists anywhere. The A fragment is a
    temporary of the intrinsic; B is a B fragment (`ldmatrix_b`), c an accumulator."""
    rows = _check_rows(rows, "mma_sync_gather")
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise TecompError(f"mma_sync_gather: stride must be a positive int, got {stride!r}")
    name = f"mma_gather_m{'x'.join(map(str, rows))}s{stride}n8k16_{dtype}_f32"
    _check_dtype(dtype, name)
    a = placeholder(tuple((x - 1) * stride + 1 for x in rows) + (16,), dtype, name="a_shared")
    b = placeholder((16, 8), dtype, name="b")
    k = reduce_axis((0, 16), name="k")

    def body(*ax: Var) -> Expr:
        *r, j = ax
        return te_sum(a[(*[x * stride for x in r], k)].astype("float32") * b[k, j].astype("float32"), axis=k)

    c = compute(rows + (8,), body, name="c")

    def impl(ins: list[TensorRegion], outs: list[TensorRegion]) -> tuple[Stmt, Stmt, Stmt]:
        ra, rb = ins
        rc = outs[0]
        if not ra.buffer.scope.startswith("shared"):
            raise TecompError(f"{name}: {ra.name} must be in shared memory (ldmatrix reads it), "
                              f"not {ra.buffer.scope}")
        _require_stride(ra, len(ra.shape) - 1, 1, name)
        for r, want in ((rb, MATRIX_B), (rc, ACCUMULATOR)):
            if r.buffer.scope != want:
                raise TecompError(f"{name}: {r.name} must be in scope {want}, not {r.buffer.scope}")
        pb, pc = fragment_offset(rb, name), fragment_offset(rc, name)
        frag = Buffer(f"{name}_a", (const(16), const(16)), dtype, scope=MATRIX_A)
        fptr = Call("handle", "address_of", (BufferLoad(frag, (const(0),)),))

        def lane_body(lane: Var) -> Stmt:
            # the ldmatrix_a layout (lanes 8j..8j+7: rows of 8x8 matrix j), each row an output
            # pixel: its address is that of input pixel row * stride
            pix = [x * stride for x in _row_index(FloorMod(lane, const(16)), rows)]
            return Evaluate(Call("int32", LDMATRIX, (const(0), const(4), fptr,
                                                     ra.access_ptr("r", [*pix, FloorDiv(lane, const(16)) * 8]))))

        update = Allocate(frag, seq(_lane_loop(lane_body), Evaluate(Call("int32", MMA, (
            StringImm("m16n8k16"), StringImm(dtype), fptr, _frag_ptr(rb, pb), _frag_ptr(rc, pc))))))
        reset = seq(*[BufferStore(rc.buffer, const(0.0, "float32"), (simplify(pc + i),))
                      for i in range(FRAGMENT_SCOPES[ACCUMULATOR].per_lane)])
        return seq(reset, update), reset, update

    return decl_tensor_intrin(c.op, impl, name=name)


def store_c(rows: tuple[int, ...] = (16,)) -> TensorIntrin:
    """An accumulator fragment (16x8, float32) -> a ``16 x 8`` float32 tile of any buffer;
    ``rows`` splits its 16 rows over several dimensions (as `mma_sync_gather`'s)."""
    rows = _check_rows(rows, "store_c")
    name = "store_c_16x8_float32" if rows == (16,) else f"store_c_{'x'.join(map(str, rows))}x8_float32"
    frag = placeholder(rows + (8,), "float32", name="c_frag")
    out = compute(rows + (8,), lambda *ax: frag[ax], name="c_out")

    def impl(ins: list[TensorRegion], outs: list[TensorRegion]) -> Stmt:
        src, dst = ins[0], outs[0]
        if src.buffer.scope != ACCUMULATOR:
            raise TecompError(f"{name}: {src.name} must be in scope {ACCUMULATOR}")
        off = fragment_offset(src, name)
        _require_stride(dst, len(rows), 1, name)

        def lane_body(lane: Var) -> Stmt:
            # ISA (accumulator of m16n8k16): c0, c1 at row groupID, columns 2 * (lane % 4) + 0/1;
            # c2, c3 eight rows further down: one float2 store each
            group, pair = FloorDiv(lane, const(4)), FloorMod(lane, const(4)) * 2
            return seq(*[dst.vstore([*_row_index(group + 8 * h, rows), pair],
                                    BufferLoad(src.buffer, (Ramp(simplify(off + 2 * h), const(1), 2),)))
                         for h in range(2)])

        return _lane_loop(lane_body)

    return decl_tensor_intrin(out.op, impl, name=name)


__all__ = ["ACCUMULATOR", "FRAGMENT_SCOPES", "LDMATRIX", "MATRIX_A", "MATRIX_B", "MIN_CC", "MMA",
           "MMA_CALLS", "WARP_SIZE", "FragmentScope", "fragment_elements", "fragment_offset",
           "ldmatrix_a", "ldmatrix_b", "mma_sync", "mma_sync_gather", "store_c"]

"""The tensor-core sketches of the GPU space: GEMM, batch matmul and conv2d (implicit GEMM)
on mma.sync.m16n8k16 (sm_80+, fp16/bf16 in, fp32 accumulated).

The schedule lives here (not in tecomp: tecomp never imports tuning) so that the benchmark
(benchmarks/gpu_gemm.py) and the tuner's tensor-core sketch build the very same kernel.

A stage is taken when its compute *is* a (batched) GEMM with fp16/bf16 inputs and fp32
accumulation, read off the expression (`tc_gemm_operands`), whatever the stages are called:

* ``C[i, j] = sum_k float32(A[i, k]) * float32(B[k, j])``;
* ``C[b, i, j] = sum_k float32(A[b, i, k]) * float32(B[b, k, j])``: batch matmul, the batch
  axis bound to ``blockIdx.z`` and each batch's GEMM scheduled as the plain one.

A and B are placeholders of one dtype, and m, n, k are multiples of 16: tensorized tiles
cannot be guarded, and padding them would need a padded copy of the operands in global
memory, so a task whose shapes are not multiples is not offered the sketch at all (it keeps
the SIMT sketches). The conv2d sketch (NHWC x HWIO, its own section below) follows the same
rule, and has no pipeline-depth knob: its shared input patch computes the zero padding while
it loads, which a cp.async copy cannot.

Shared memory: the sketches bound a block's tiles (times the pipeline's slots) by the target's
opt-in maximum per block (`GPULimits.max_dynamic_smem`: 163 KiB on sm_80, 99 KiB on sm_86/89,
227 KiB on sm_90), not by the static 48 KiB: above that codegen puts the kernel's shared
buffers in dynamic shared memory and the runtime opts the function in
(`tecomp.codegen.gpu_shared`), so the 128x256 / 256x128 tiles of 3-4 stages that CUTLASS and
cuBLAS use on A100 / H100 are in the space.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from tecomp.codegen.target import GPULimits
from tecomp.te.tensor import ComputeOp

from .space import _extent
from .steps import State, Step

if TYPE_CHECKING:
    from .gpu_space import _GpuBuilder

TC_DTYPES = ("float16", "bfloat16")
TC_BLOCKS = (16, 32, 64, 128, 256)  # per spatial dimension of the block tile
TC_WARPS = (1, 2, 4)  # per spatial dimension (threadIdx.y, threadIdx.z)
TC_KSTEPS = (16, 32, 64)
TC_DEPTHS = (1, 2, 3, 4)  # 1: loaded synchronously (no pipeline); 2-4: cp.async ring
TC_PADS = (0, 8)  # elements appended to each shared row (storage_align): 16 bytes
TC_MIN_ARCH = 80
TC_VEC = 8  # elements per thread and copy: 16 bytes of fp16/bf16
TC_KNOBS = ("block_m", "block_n", "warps_m", "warps_n", "kstep", "depth", "pad")
# what `tc_config_problems` allows without a target: sm_80's opt-in maximum per block
TC_SMEM_LIMIT = GPULimits("sm_80", (8, 0)).max_dynamic_smem


def tc_shared_bytes(block: tuple[int, int], kstep: int, depth: int, pad: int, itemsize: int = 2) -> int:
    """Shared memory of the A and B tiles: ``max(depth, 1)`` slots of ``block_m x (kstep +
    pad)`` and ``kstep x (block_n + pad)`` elements (what codegen declares, rows padded)."""
    bm, bn = block
    return max(depth, 1) * (bm * (kstep + pad) + kstep * (bn + pad)) * itemsize


def tc_config_problems(m: int, n: int, k: int, block: tuple[int, int], warps: tuple[int, int],
                       kstep: int, depth: int, pad: int, smem_limit: int = TC_SMEM_LIMIT) -> list[str]:
    """Why this configuration does not fit a ``m x n x k`` GEMM (empty: it does): the tiles
    divide the problem exactly (no tails: tensorized tiles cannot be guarded), each warp's
    tile is whole 16x16 fragments, every thread copies whole 16-byte vectors of each shared
    tile, and the ring fits ``smem_limit``: the shared memory a block may use (the target's
    ``max_dynamic_smem``; by default sm_80's, 163 KiB)."""
    bm, bn = block
    wy, wz = warps
    out = []
    if m % bm or n % bn or k % kstep:
        out.append(f"tiles {bm}x{bn}x{kstep} do not divide {m}x{n}x{k}")
    if bm % (16 * wy) or bn % (16 * wz) or kstep % 16:
        out.append(f"warp tiles {bm}/{wy} x {bn}/{wz} (k {kstep}) are not multiples of 16")
    threads = 32 * wy * wz
    for rows, cols in ((bm, kstep), (kstep, bn)):
        if (rows * cols) % (TC_VEC * threads) or cols % TC_VEC:
            out.append(f"a {rows}x{cols} shared tile is not whole 16-byte copies for {threads} threads")
    if depth not in TC_DEPTHS or pad not in TC_PADS:
        out.append(f"depth {depth} / pad {pad} not in {TC_DEPTHS} / {TC_PADS}")
    smem = tc_shared_bytes(block, kstep, depth, pad)
    if smem > smem_limit:
        out.append(f"{smem} bytes of shared memory exceed the {smem_limit} bytes a block may use")
    return out


def schedule_tensor_core_gemm(s: Any, C: Any, block: tuple[int, int] = (128, 128),
                              warps: tuple[int, int] = (2, 2), kstep: int = 32, depth: int = 1,
                              pad: int = 0) -> None:
    """Schedule ``C[i, j] = sum_k float32(A[i, k]) * float32(B[k, j])`` (A, B float16 or
    bfloat16 placeholders) in ``s`` on tensor cores (mma.sync.m16n8k16 + ldmatrix, sm_80+);
    a batch matmul ``C[b, i, j] = sum_k float32(A[b, i, k]) * float32(B[b, k, j])`` is
    scheduled the same way per batch, the batch bound to ``blockIdx.z``.

    A ``block`` tile of C per thread block, ``warps`` warps (threadIdx.y, threadIdx.z) each
    owning a ``block / warps`` tile held in accumulator fragments; per ``kstep`` slice of k,
    the block's tiles of A and B are staged in shared memory by all threads (16 bytes per
    thread and copy), then each warp loads its A (ldmatrix.x4) and B (ldmatrix.x4.trans)
    fragments 16 deep and issues one mma.m16n8k16 per 16x8 tile of its C tile; the fragments
    are stored to C directly. threadIdx.x is the lane (32), as the intrinsics require.

    ``depth`` 2-4 software-pipelines the shared tiles (``pipeline(depth)``: a ring of
    ``depth`` slots filled by 16-byte ``cp.async.cg``, ``depth - 1`` tiles in flight while the
    warps compute; 1 loads synchronously). ``pad`` (0 or a multiple of 8) pads every shared
    row by that many elements (``storage_align``): ldmatrix's 8 row addresses then fall in
    different banks (rows of 64 or 256 bytes would put 2-8 of them in the same bank)."""
    from tecomp import te
    from tecomp.te import intrin_cuda as tci

    A, B = C.op.input_tensors
    dtype = A.dtype
    batched = len(C.op.axis) == 3
    AS = s.cache_read(A, "shared", [C])
    BS = s.cache_read(B, "shared", [C])
    AF = s.cache_read(AS, tci.MATRIX_A, [C])
    BF = s.cache_read(BS, tci.MATRIX_B, [C])
    CF = s.cache_write(C, tci.ACCUMULATOR)
    bm, bn = block
    wy, wz = warps
    wm, wn = bm // wy, bn // wz
    # the output stage: (batch,) blocks, warps, then 16x8 tiles stored from the fragments
    *batch, i, j = s[C].op.axis
    bi, i = s[C].split(i, factor=bm)
    bj, j = s[C].split(j, factor=bn)
    wi, i = s[C].split(i, factor=wm)
    wj, j = s[C].split(j, factor=wn)
    mi, i16 = s[C].split(i, factor=16)
    nj, j8 = s[C].split(j, factor=8)
    s[C].reorder(*batch, bi, bj, wi, wj, mi, nj, i16, j8)
    if batched:
        s[C].bind(batch[0], te.thread_axis("blockIdx.z"))
    s[C].bind(bi, te.thread_axis("blockIdx.y"))
    s[C].bind(bj, te.thread_axis("blockIdx.x"))
    s[C].bind(wi, te.thread_axis("threadIdx.y"))
    s[C].bind(wj, te.thread_axis("threadIdx.z"))
    s[C].unroll(mi)
    s[C].unroll(nj)
    s[C].tensorize(i16, tci.store_c())
    # the warp's accumulators (one batch: its batch axis has extent 1 under wj)
    s[CF].compute_at(s[C], wj)
    *cb, ci, cj = s[CF].op.axis
    (ck,) = s[CF].op.reduce_axis
    ko, ck = s[CF].split(ck, factor=kstep)
    ki, k16 = s[CF].split(ck, factor=16)
    cmi, ci16 = s[CF].split(ci, factor=16)
    cnj, cj8 = s[CF].split(cj, factor=8)
    s[CF].reorder(*cb, ko, ki, cmi, cnj, ci16, cj8, k16)
    s[CF].unroll(ki)
    s[CF].unroll(cmi)
    s[CF].unroll(cnj)
    s[CF].tensorize(ci16, tci.mma_sync(dtype))
    # fragments, 16 deep in k
    s[AF].compute_at(s[CF], ki)
    s[BF].compute_at(s[CF], ki)
    *ab, ai, ak = s[AF].op.axis
    ami, ai16 = s[AF].split(ai, factor=16)
    s[AF].reorder(*ab, ami, ai16, ak)
    s[AF].unroll(ami)
    s[AF].tensorize(ai16, tci.ldmatrix_a(dtype))
    *bb, bk, bjj = s[BF].op.axis
    bnj, bj16 = s[BF].split(bjj, factor=16)
    s[BF].reorder(*bb, bnj, bk, bj16)
    s[BF].unroll(bnj)
    s[BF].tensorize(bk, tci.ldmatrix_b(dtype, n=16))
    # shared tiles: 8 elements (16 bytes) per thread and copy
    for X, row_len in ((AS, kstep), (BS, bn)):
        s[X].compute_at(s[CF], ko)
        *xb, row, col = s[X].op.axis
        if pad:  # rows of row_len + pad elements (row_len is the tile's, not the tensor's)
            s[X].storage_align(row, row_len, pad)
        col, vec = s[X].split(col, factor=TC_VEC)  # split before fusing: the 8 stay contiguous
        fo = s[X].fuse(*xb, row, col)  # the batch axis has extent 1 here
        fo, tx = s[X].split(fo, factor=32)
        fo, ty = s[X].split(fo, factor=wy)
        fo, tz = s[X].split(fo, factor=wz)
        s[X].reorder(fo, tz, ty, tx, vec)
        s[X].bind(tx, te.thread_axis("threadIdx.x"))
        s[X].bind(ty, te.thread_axis("threadIdx.y"))
        s[X].bind(tz, te.thread_axis("threadIdx.z"))
        s[X].vectorize(vec)
        if depth > 1:
            s[X].pipeline(depth)


def tensor_core_gemm_schedule(m: int, n: int, k: int, dtype: str = "float16",
                              block: tuple[int, int] = (128, 128), warps: tuple[int, int] = (2, 2),
                              kstep: int = 32, depth: int = 1, pad: int = 0,
                              batch: int | None = None) -> tuple[Any, list]:
    """``C[m, n] = sum_k float32(A[m, k]) * float32(B[k, n])`` (with ``batch``: ``C[batch, m,
    n]`` from ``A[batch, m, k]`` and ``B[batch, k, n]``) scheduled by
    `schedule_tensor_core_gemm` (its knobs); returns ``(schedule, [A, B, C])``."""
    from tecomp import te

    r = te.reduce_axis((0, k), name="k")
    if batch is None:
        A = te.placeholder((m, k), dtype, name="A")
        B = te.placeholder((k, n), dtype, name="B")
        C = te.compute((m, n), lambda i, j: te.sum(A[i, r].astype("float32") * B[r, j].astype("float32"),
                                                   axis=r), name="C")
    else:
        A = te.placeholder((batch, m, k), dtype, name="A")
        B = te.placeholder((batch, k, n), dtype, name="B")
        C = te.compute((batch, m, n), lambda x, i, j: te.sum(
            A[x, i, r].astype("float32") * B[x, r, j].astype("float32"), axis=r), name="C")
    s = te.create_schedule(C.op)
    schedule_tensor_core_gemm(s, C, block, warps, kstep, depth, pad)
    return s, [A, B, C]


@dataclass(frozen=True)
class TcGemm:
    """A (batched) GEMM the tensor-core sketch takes: ``batch`` 0 for a plain GEMM."""

    A: Any
    B: Any
    batch: int
    m: int
    n: int
    k: int


def _f32_sum_of_products(op: ComputeOp) -> tuple[Any, Any] | None:
    """The two loads of ``op`` when its one float32 output is ``sum(float32(X[..]) *
    float32(Y[..]))`` (what a tensor-core mma computes), else None."""
    from tecomp.ir.expr import Cast, Mul, ProducerLoad, Reduce

    if op.num_outputs != 1 or op.output(0).dtype != "float32" or len(op.body) != 1:
        return None
    red = op.body[0]
    if not (isinstance(red, Reduce) and getattr(red.combiner, "name", "") == "sum" and len(red.source) == 1):
        return None
    mul = red.source[0]
    if not isinstance(mul, Mul):
        return None
    loads = []
    for e in (mul.a, mul.b):
        if not (isinstance(e, Cast) and e.dtype == "float32" and isinstance(e.value, ProducerLoad)):
            return None
        loads.append(e.value)
    return loads[0], loads[1]


def tc_gemm_operands(op: Any) -> TcGemm | None:
    """The GEMM of ``op`` when it is ``C[i, j] = sum_k float32(A[i, k]) * float32(B[k, j])``
    or ``C[b, i, j] = sum_k float32(A[b, i, k]) * float32(B[b, k, j])`` with A and B float16
    or bfloat16 placeholders of one dtype and m, n, k multiples of 16 (exactly: the
    tensor-core sketch does not pad); else None."""
    from tecomp.ir.expr import Var
    from tecomp.te.tensor import PlaceholderOp

    if not isinstance(op, ComputeOp) or len(op.axis) not in (2, 3) or len(op.reduce_axis) != 1:
        return None
    loads = _f32_sum_of_products(op)
    if loads is None:
        return None
    la, lb = loads
    *batch, i, j = (a.var for a in op.axis)
    r = op.reduce_axis[0].var

    def are_vars(idx: Any, want: list[Any]) -> bool:
        return len(idx) == len(want) and all(isinstance(e, Var) and e is v for e, v in zip(idx, want))

    A, B = la.producer, lb.producer
    if not (are_vars(la.indices, [*batch, i, r]) and are_vars(lb.indices, [*batch, r, j])):
        return None
    if not (isinstance(A.op, PlaceholderOp) and isinstance(B.op, PlaceholderOp)):
        return None
    if A.dtype != B.dtype or A.dtype not in TC_DTYPES or list(op.input_tensors) != [A, B]:
        return None
    nb = _extent(op.axis[0]) if batch else 0
    m, n, k = _extent(op.axis[-2]), _extent(op.axis[-1]), _extent(op.reduce_axis[0])
    if m % 16 or n % 16 or k % 16:
        return None
    return TcGemm(A, B, nb, m, n, k)


@dataclass(frozen=True)
class TensorCoreStep(Step):
    """Schedule stage ``stage`` (a GEMM `tc_gemm_operands` accepts) on tensor cores with
    `schedule_tensor_core_gemm`: one step, since the schedule's tensorize, storage_align and
    pipeline have no step of their own; its fields are the knobs."""

    KIND: ClassVar[str] = "tensor_core"
    block_m: int
    block_n: int
    warps_m: int
    warps_n: int
    kstep: int
    depth: int
    pad: int

    def apply(self, state: State) -> None:
        C = state.stage(self.stage).op.output(0)
        schedule_tensor_core_gemm(state.sch, C, (self.block_m, self.block_n), (self.warps_m, self.warps_n),
                                  self.kstep, self.depth, self.pad)


def _tc_threads_fit(bm: int, bn: int, wy: int, wz: int, kstep: int) -> bool:
    threads = 32 * wy * wz
    return (bm * kstep) % (TC_VEC * threads) == 0 and (kstep * bn) % (TC_VEC * threads) == 0


def tc_build(b: _GpuBuilder, name: str) -> None:
    """The knobs of a tensor-core sketch, each drawn from the values that fit the ones drawn
    before it (a mutated or given value that no longer fits is redrawn), then the step. The
    ring (tiles x depth, rows padded) fits the target's opt-in shared memory per block."""
    g = tc_gemm_operands(b._op(name))
    if g is None:
        conv = tc_conv_operands(b._op(name))
        assert conv is not None
        tc_conv_build(b, name, conv)
        return
    m, n, k = g.m, g.n, g.k
    limit = b.limits.max_dynamic_smem  # above static_smem the kernel's shared memory is dynamic
    bm = b.choice(f"{name}/tc_block_m", tuple(x for x in TC_BLOCKS if m % x == 0))
    bn = b.choice(f"{name}/tc_block_n", tuple(x for x in TC_BLOCKS if n % x == 0))
    wy = b.choice(f"{name}/tc_warps_m", tuple(w for w in TC_WARPS if bm % (16 * w) == 0))

    def ksteps(wz: int) -> tuple[int, ...]:
        return tuple(x for x in TC_KSTEPS if k % x == 0 and _tc_threads_fit(bm, bn, wy, wz, x)
                     and tc_shared_bytes((bm, bn), x, 1, 0) <= limit)

    wz = b.choice(f"{name}/tc_warps_n", tuple(w for w in TC_WARPS if bn % (16 * w) == 0 and ksteps(w)) or (1,))
    kstep = b.choice(f"{name}/tc_kstep", ksteps(wz) or (16,))
    depth = b.choice(f"{name}/tc_depth", tuple(d for d in TC_DEPTHS
                                               if tc_shared_bytes((bm, bn), kstep, d, 0) <= limit) or (1,))
    pad = b.choice(f"{name}/tc_pad", tuple(p for p in TC_PADS
                                           if tc_shared_bytes((bm, bn), kstep, depth, p) <= limit) or (0,))
    b.apply(TensorCoreStep(name, bm, bn, wy, wz, kstep, depth, pad))



# conv2d via implicit GEMM ----------------------------------------------------------------------
#
# ``out[n, oh, ow, co] = sum_{kh, kw, ci} float32(P[n, oh*s + kh, ow*s + kw, ci]) *
# float32(W[kh, kw, ci, co])``: NHWC input (P: the input, or a zero-padding stage of it that the
# sketch inlines), HWIO weights, fp32 output. As a GEMM: M = N*OH*OW output pixels, N = CO, K =
# KH*KW*CI. A block owns ``block_rows`` output rows x ``rows_x`` output columns of one image
# and ``block_n`` output channels; per ``kstep`` slice of the input channels it stages in
# shared memory the *input patch* those pixels read (``((block_rows - 1) * s + KH) x ((rows_x
# - 1) * s + KW)`` pixels, the zero padding computed on the way) and the weights of every tap;
# then for each tap (kh, kw) and 16 channels each warp issues one mma per 16 pixels x 8
# channels, its A rows gathered from the patch by the ldmatrix addresses
# (`tecomp.te.intrin_cuda.mma_sync_gather`): the im2col matrix exists in no memory. 16 pixels
# of a tile are ``16 / rows_x`` output rows of ``rows_x`` columns: so OW must be a multiple of
# ``rows_x`` and OH of ``16 / rows_x``, CI and CO multiples of 16 (no guarded tiles); a conv
# that does not fit is not offered the sketch.

TC_CONV_ROWS_X = (16, 8, 4, 2)  # output columns per 16-pixel tile (its rows: 16 / that)
TC_CONV_BLOCK_N = (16, 32, 64, 128)
TC_CONV_KNOBS = ("rows_x", "block_rows", "warps_m", "block_n", "warps_n", "kstep", "pad")


@dataclass(frozen=True)
class TcConv:
    """A conv2d the tensor-core sketch takes (see the section's comment)."""

    P: Any
    W: Any
    stride: int
    n: int
    oh: int
    ow: int
    co: int
    kh: int
    kw: int
    ci: int
    reduce: tuple[Any, Any, Any]  # the op's (kh, kw, ci) reduce IterVars


def tc_conv_operands(op: Any) -> TcConv | None:
    """The conv of ``op`` when it is an NHWC x HWIO conv2d with fp16/bf16 operands of one
    dtype, fp32 accumulation, one stride for both spatial axes, and shapes the sketch's tiles
    divide (CI, CO multiples of 16; OW a multiple of 2 and OH of 16 / the largest power of two
    up to 16 dividing OW); else None."""
    from tecomp.arith.simplify import simplify
    from tecomp.ir.expr import IntImm, Var, const
    from tecomp.ir.functor import substitute
    from tecomp.te.tensor import PlaceholderOp

    if not isinstance(op, ComputeOp) or len(op.axis) != 4 or len(op.reduce_axis) != 3:
        return None
    loads = _f32_sum_of_products(op)
    if loads is None:
        return None
    lp, lw = loads
    n, oh, ow, co = (a.var for a in op.axis)
    rvars = {r.var: r for r in op.reduce_axis}
    # the weights: W[kh, kw, ci, co], every index one of the axes
    if len(lw.indices) != 4 or not all(isinstance(e, Var) for e in lw.indices) or lw.indices[3] is not co:
        return None
    kh, kw, ci = (e for e in lw.indices[:3] if isinstance(e, Var))
    if not all(v in rvars for v in (kh, kw, ci)) or len({kh, kw, ci}) != 3:
        return None
    if len(lp.indices) != 4 or lp.indices[0] is not n or lp.indices[3] is not ci:
        return None
    every = [n, oh, ow, co, kh, kw, ci]
    zero: dict[Var, Any] = {v: const(0, v.dtype) for v in every}

    def stride_of(e: Any, out_v: Any, tap: Any) -> int | None:
        c = simplify(substitute(e, {**zero, out_v: const(1, out_v.dtype)}))
        if not isinstance(c, IntImm) or c.value < 1:
            return None
        diff = simplify(e - (out_v * c.value + tap))
        return c.value if isinstance(diff, IntImm) and diff.value == 0 else None

    s_h, s_w = stride_of(lp.indices[1], oh, kh), stride_of(lp.indices[2], ow, kw)
    if s_h is None or s_h != s_w:
        return None
    P, W = lp.producer, lw.producer
    if not isinstance(W.op, PlaceholderOp) or P.dtype != W.dtype or P.dtype not in TC_DTYPES:
        return None
    if not (isinstance(P.op, PlaceholderOp) or (isinstance(P.op, ComputeOp) and not P.op.reduce_axis)):
        return None
    e_n, e_oh, e_ow, e_co = (_extent(a) for a in op.axis)
    g = TcConv(P, W, s_h, e_n, e_oh, e_ow, e_co, _extent(rvars[kh]), _extent(rvars[kw]), _extent(rvars[ci]),
               (rvars[kh], rvars[kw], rvars[ci]))
    if g.ci % 16 or g.co % 16 or not tc_conv_rows_x(g.oh, g.ow):
        return None
    return g


def tc_conv_rows_x(oh: int, ow: int) -> tuple[int, ...]:
    """The ``rows_x`` (output columns of a 16-pixel tile) that an ``oh x ow`` output allows."""
    return tuple(x for x in TC_CONV_ROWS_X if ow % x == 0 and oh % (16 // x) == 0)


def tc_conv_shared_bytes(g: TcConv, rows_x: int, block_rows: int, block_n: int, kstep: int, pad: int,
                         itemsize: int = 2) -> int:
    """Shared memory of the input patch and the weight tile (rows padded by ``pad``)."""
    ph = (block_rows - 1) * g.stride + g.kh
    pw = (rows_x - 1) * g.stride + g.kw
    return (ph * pw * (kstep + pad) + g.kh * g.kw * kstep * (block_n + pad)) * itemsize


def schedule_tensor_core_conv(s: Any, C: Any, g: TcConv, rows_x: int, block_rows: int,
                              warps_m: int, block_n: int, warps_n: int, kstep: int, pad: int) -> None:
    """Schedule the conv ``C`` (``g``, from `tc_conv_operands`) as an implicit GEMM on tensor
    cores (the section's comment): blockIdx.z the image, blockIdx.y the block's output rows and
    columns, blockIdx.x its channels; ``warps_m`` warps (threadIdx.y) along the rows, ``warps_n``
    (threadIdx.z) along the channels, threadIdx.x the lane."""
    from tecomp import te
    from tecomp.te import intrin_cuda as tci

    my = 16 // rows_x
    rows = (my, rows_x) if my > 1 else (rows_x,)
    dtype = g.P.dtype
    AS = s.cache_read(g.P, "shared", [C])
    BS = s.cache_read(g.W, "shared", [C])
    BF = s.cache_read(BS, tci.MATRIX_B, [C])
    CF = s.cache_write(C, tci.ACCUMULATOR)
    # the output: image, block of rows x columns, channels; warps; 16-pixel x 8-channel tiles
    n, oh, ow, co = s[C].op.axis
    boh, oh = s[C].split(oh, factor=block_rows)
    bow, ow = s[C].split(ow, factor=rows_x)
    bco, co = s[C].split(co, factor=block_n)
    woh, oh = s[C].split(oh, factor=block_rows // warps_m)
    wco, co = s[C].split(co, factor=block_n // warps_n)
    mi, y = s[C].split(oh, factor=my)
    nj, j8 = s[C].split(co, factor=8)
    s[C].reorder(n, boh, bow, bco, woh, wco, mi, nj, y, ow, j8)
    s[C].bind(n, te.thread_axis("blockIdx.z"))
    s[C].bind(s[C].fuse(boh, bow), te.thread_axis("blockIdx.y"))
    s[C].bind(bco, te.thread_axis("blockIdx.x"))
    s[C].bind(woh, te.thread_axis("threadIdx.y"))
    s[C].bind(wco, te.thread_axis("threadIdx.z"))
    s[C].unroll(mi)
    s[C].unroll(nj)
    s[C].tensorize(y if my > 1 else ow, tci.store_c(rows))
    # the warp's accumulators: per k-step slice of channels, every tap, 16 channels at a time
    s[CF].compute_at(s[C], wco)
    cn, coh, cow, cco = s[CF].op.axis
    rkh, rkw, rci = (next(r for r in s[CF].op.reduce_axis if r.var.name == x.var.name) for x in g.reduce)
    ko, rci = s[CF].split(rci, factor=kstep)
    ki, k16 = s[CF].split(rci, factor=16)
    cmi, cy = s[CF].split(coh, factor=my)
    cnj, c8 = s[CF].split(cco, factor=8)
    s[CF].reorder(cn, ko, rkh, rkw, ki, cmi, cnj, cy, cow, c8, k16)
    s[CF].unroll(ki)
    s[CF].unroll(cmi)
    s[CF].unroll(cnj)
    s[CF].tensorize(cy if my > 1 else cow, tci.mma_sync_gather(dtype, rows, g.stride))
    # B fragments of the tap, 16 channels deep
    s[BF].compute_at(s[CF], ki)
    bkh, bkw, bci, bco2 = s[BF].op.axis
    bnj, b16 = s[BF].split(bco2, factor=16)
    s[BF].reorder(bkh, bkw, bnj, bci, b16)
    s[BF].unroll(bnj)
    s[BF].tensorize(bci, tci.ldmatrix_b(dtype, n=16))
    # shared: the input patch (padding computed here) and the weights, 16 bytes per copy
    for X, row_dim, row_len in ((AS, 2, kstep), (BS, 2, block_n)):
        s[X].compute_at(s[CF], ko)
        axes = list(s[X].op.axis)
        if pad:
            s[X].storage_align(axes[row_dim], row_len, pad)
        col, vec = s[X].split(axes[3], factor=TC_VEC)
        fo = s[X].fuse(*axes[:3], col)
        fo, tx = s[X].split(fo, factor=32)
        fo, ty = s[X].split(fo, factor=warps_m)
        fo, tz = s[X].split(fo, factor=warps_n)
        s[X].reorder(fo, tz, ty, tx, vec)
        s[X].bind(tx, te.thread_axis("threadIdx.x"))
        s[X].bind(ty, te.thread_axis("threadIdx.y"))
        s[X].bind(tz, te.thread_axis("threadIdx.z"))
        s[X].vectorize(vec)


@dataclass(frozen=True)
class TensorCoreConvStep(Step):
    """Schedule stage ``stage`` (a conv `tc_conv_operands` accepts) as an implicit GEMM on
    tensor cores with `schedule_tensor_core_conv`; its fields are the knobs."""

    KIND: ClassVar[str] = "tensor_core_conv"
    rows_x: int
    block_rows: int
    warps_m: int
    block_n: int
    warps_n: int
    kstep: int
    pad: int

    def apply(self, state: State) -> None:
        from tecomp.errors import ScheduleError

        op = state.stage(self.stage).op
        g = tc_conv_operands(op)
        if g is None:
            raise ScheduleError(f"stage {self.stage}: not a conv2d the tensor-core conv schedule takes "
                                "(NHWC x HWIO, fp16/bf16 in, fp32 out, CI and CO multiples of 16)")
        schedule_tensor_core_conv(state.sch, op.output(0), g, self.rows_x, self.block_rows, self.warps_m,
                                  self.block_n, self.warps_n, self.kstep, self.pad)


def tc_conv_build(b: _GpuBuilder, name: str, g: TcConv) -> None:
    """The knobs of the conv sketch, each drawn from the values that fit those before it
    (the patch and weight tiles within the target's opt-in shared memory per block)."""
    limit = b.limits.max_dynamic_smem
    rx = b.choice(f"{name}/tc_rows_x", tc_conv_rows_x(g.oh, g.ow))
    my = 16 // rx
    grid_y = b.limits.max_grid_dims[1]  # blockIdx.y counts the blocks of rows x columns
    bhs = tuple(r for r in (my, 2 * my, 4 * my, 8 * my) if g.oh % r == 0)
    bh = b.choice(f"{name}/tc_block_rows",
                  tuple(r for r in bhs if (g.oh // r) * (g.ow // rx) <= grid_y) or bhs[-1:])
    wy = b.choice(f"{name}/tc_warps_m", tuple(w for w in TC_WARPS if bh % (w * my) == 0))
    bn = b.choice(f"{name}/tc_block_n", tuple(x for x in TC_CONV_BLOCK_N if g.co % x == 0))

    def ksteps(wz: int) -> tuple[int, ...]:
        return tuple(k for k in TC_KSTEPS if g.ci % k == 0
                     and tc_conv_shared_bytes(g, rx, bh, bn, k, 0) <= limit)

    wz = b.choice(f"{name}/tc_warps_n", tuple(w for w in TC_WARPS if bn % (16 * w) == 0 and ksteps(w)) or (1,))
    kstep = b.choice(f"{name}/tc_kstep", ksteps(wz) or (16,))
    pad = b.choice(f"{name}/tc_pad", tuple(p for p in TC_PADS
                                           if tc_conv_shared_bytes(g, rx, bh, bn, kstep, p) <= limit) or (0,))
    b.apply(TensorCoreConvStep(name, rx, bh, wy, bn, wz, kstep, pad))


__all__ = ["TC_DTYPES", "TC_MIN_ARCH", "TC_SMEM_LIMIT", "TcConv", "TcGemm", "TensorCoreConvStep", "TensorCoreStep",
           "schedule_tensor_core_conv", "schedule_tensor_core_gemm", "tc_build", "tc_config_problems",
           "tc_conv_operands", "tc_conv_rows_x", "tc_conv_shared_bytes", "tc_gemm_operands", "tc_shared_bytes",
           "tensor_core_gemm_schedule"]

"""Tensor intrinsics for x86 CPUs, ready for ``s[C].tensorize(axis, intrin)``.

* `gemm_fma` - an ``mr x nr`` register-tile GEMM update ``C += A[:, k] * B[k, :]`` over ``kc``
  steps, written with explicit ``nr``-lane vectors so each row is ``nr/16`` zmm FMAs per step on
  AVX-512 (``nr/8`` ymm on AVX2).
* `dot_u8s8_vnni` - the AVX512-VNNI int8 dot product: 16 int32 lanes each accumulate a 4-element
  uint8 x int8 dot product with one ``vpdpbusd``; the kernel must be packed so that the 16x4 int8
  tile is contiguous (layout ``[..., 16, 4]``).
* `dot_u8s8s32(target)` - the same dot product on the best instruction the target has
  (`u8s8_dot_kind`): vpdpbusd (AVX512-VNNI, AVX-VNNI), else vpmaddubsw + vpmaddwd (AVX-512BW,
  AVX2; int16 saturation, see there), or exact int16 vpmaddwd; `dense_u8s8s32` schedules a
  uint8 x int8 -> int32 GEMM on it (TVM's topi x86 ``dense_int8``).
* `dot_bf16_f32(target)` - a bfloat16 pair dot product into float32 with AVX512-BF16 vdpbf16ps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..arith.simplify import simplify
from ..codegen.target import Target
from ..errors import TecompError
from ..ir.expr import Broadcast, Call, Cast, Expr, IntImm, Var, const
from ..ir.stmt import For, ForKind, Stmt, seq
from .intrin import all as te_all
from .intrin import if_then_else
from .reduction import sum as te_sum
from .schedule import Schedule, create_schedule
from .tensor import ComputeOp, Tensor, compute, placeholder, reduce_axis
from .tensor_intrin import TensorIntrin, TensorRegion, decl_tensor_intrin


def _require_stride(r: TensorRegion, dim: int, value: int, intrin: str) -> None:
    s = simplify(r.strides[dim])
    if not (isinstance(s, IntImm) and s.value == value):
        raise TecompError(
            f"{intrin}: {r.name} must have stride {value} in dimension {dim} of the tile, got {s}; "
            "pack the tensor (a layout stage or cache_read) so the tile is contiguous"
        )


def gemm_fma(mr: int, nr: int, kc: int, dtype: str = "float32") -> TensorIntrin:
    """``c[i, j] += sum_k a[i, k] * b[k, j]`` on an ``mr x nr`` tile, ``kc`` reduction steps."""
    a = placeholder((mr, kc), dtype, name="a")
    b = placeholder((kc, nr), dtype, name="b")
    k = reduce_axis((0, kc), name="k")
    c = compute((mr, nr), lambda i, j: te_sum(a[i, k] * b[k, j], axis=k), name="c")
    name = f"gemm_fma_{mr}x{nr}x{kc}_{dtype}"

    def impl(ins: list[TensorRegion], outs: list[TensorRegion]) -> Stmt:
        ra, rb = ins
        rc = outs[0]
        _require_stride(rb, 1, 1, name)
        _require_stride(rc, 1, 1, name)
        kk = Var("kk")
        rows = []
        for i in range(mr):
            acc = rc.vload([i, 0], nr)
            rows.append(rc.vstore([i, 0], acc + Broadcast(ra.vload([i, kk]), nr) * rb.vload([kk, 0], nr)))
        return For(kk, const(0), const(kc), ForKind.SERIAL, seq(*rows))

    return decl_tensor_intrin(c.op, impl, name=name)


def dot_u8s8_vnni() -> TensorIntrin:
    """``c[i] += sum_{k<4} int32(data[k]) * int32(kernel[i, k])`` for 16 lanes (``vpdpbusd``)."""
    data = placeholder((4,), "uint8", name="data")
    kernel = placeholder((16, 4), "int8", name="kernel")
    k = reduce_axis((0, 4), name="k")
    c = compute((16,), lambda i: te_sum(data[k].astype("int32") * kernel[i, k].astype("int32"), axis=k),
                name="c")
    name = "dot_u8s8_vnni"

    def impl(ins: list[TensorRegion], outs: list[TensorRegion]) -> Stmt:
        rd, rk = ins
        rc = outs[0]
        _require_stride(rd, 0, 1, name)
        _require_stride(rk, 0, 4, name)
        _require_stride(rk, 1, 1, name)
        _require_stride(rc, 0, 1, name)
        a32: Expr = Call("int32", "reinterpret", (rd.vload([0], 4),))
        b32: Expr = Call("int32x16", "reinterpret", (rk.vload([0, 0], 64),))
        acc = rc.vload([0], 16)
        res = Call("int32x16", "llvm.x86.avx512.vpdpbusd.512", (acc, Broadcast(a32, 16), b32), extern=True)
        return rc.vstore([0], res)

    return decl_tensor_intrin(c.op, impl, name=name)


# ---------------------------------------------------------------------------------------------
# uint8 x int8 -> int32 dot products chosen by the target, and a dense (GEMM) schedule on them
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class U8S8Dot:
    """How `dot_u8s8s32` computes on a target.

    Each call of the intrinsic updates ``lanes`` int32 accumulators, each with a ``group``-long
    uint8 x int8 dot product: ``c[i] += sum_{k<group} data[k] * kernel[i, k]``. The kernel must
    be packed as ``[n / lanes, k / group, lanes, group]`` (`pack_u8s8_kernel`).
    ``exact`` is False for the vpmaddubsw paths, whose int16 pair sums saturate (see
    `dot_u8s8s32`).
    """

    isa: str  # "avx512vnni", "avxvnni", "avx512bw", "avx2", "avx512bw-exact", "avx2-exact"
    lanes: int
    group: int
    instructions: tuple[str, ...]
    exact: bool
    vector_bits: int


def u8s8_dot_kind(target: str | Target | None = None, exact: bool = False) -> U8S8Dot:
    """The best uint8 x int8 -> int32 dot product ``target`` has (the host when None).

    VNNI (``vpdpbusd``) is exact and preferred, 512-bit before AVX-VNNI's 256-bit. Without it,
    ``vpmaddubsw`` + ``vpmaddwd`` (AVX-512BW, else AVX2), which saturates unless ``exact``: then
    the operands are widened to int16 and multiplied with ``vpmaddwd`` alone (exact, about half
    the throughput).
    """
    t = Target.parse(target)
    if t.has_feature("avx512vnni"):
        return U8S8Dot("avx512vnni", 16, 4, ("vpdpbusd",), True, 512)
    if t.has_feature("avxvnni"):
        return U8S8Dot("avxvnni", 8, 4, ("vpdpbusd",), True, 256)
    wide = t.has_feature("avx512bw")
    if not (wide or t.has_feature("avx2")):
        raise TecompError(f"dot_u8s8s32: target '{t}' has neither AVX2 nor AVX-512BW")
    lanes, bits = (16, 512) if wide else (8, 256)
    isa = "avx512bw" if wide else "avx2"
    if exact:
        return U8S8Dot(isa + "-exact", lanes, 2, ("vpmovsxbw", "vpmaddwd", "vpaddd"), True, bits)
    return U8S8Dot(isa, lanes, 4, ("vpmaddubsw", "vpmaddwd", "vpaddd"), False, bits)


def dot_u8s8s32(target: str | Target | None = None, exact: bool = False) -> TensorIntrin:
    """``c[i] += sum_{k<g} int32(data[k]) * int32(kernel[i, k])`` on the target's best
    instruction (`u8s8_dot_kind`), TVM's ``dot_16x1x16_uint8_int8_int32`` generalised.

    Saturation: on targets without VNNI (and ``exact=False``), ``vpmaddubsw`` adds the two
    products of each pair in int16 with signed saturation, so a result is exact only when every
    pair sum ``a0*b0 + a1*b1`` lies in [-32768, 32767]: guaranteed when the uint8 data is at most
    127 (PyTorch's ``reduce_range`` quantization) or the int8 kernel lies in [-64, 64]. TVM's and
    fbgemm's AVX2 paths have the same property. ``exact=True`` trades speed for exactness.
    """
    kind = u8s8_dot_kind(target, exact)
    L, G = kind.lanes, kind.group
    data = placeholder((G,), "uint8", name="data")
    kernel = placeholder((L, G), "int8", name="kernel")
    k = reduce_axis((0, G), name="k")
    c = compute((L,), lambda i: te_sum(data[k].astype("int32") * kernel[i, k].astype("int32"), axis=k),
                name="c")
    name = f"dot_u8s8s32_{kind.isa.replace('-', '_')}"

    def impl(ins: list[TensorRegion], outs: list[TensorRegion]) -> Stmt:
        rd, rk = ins
        rc = outs[0]
        _require_stride(rd, 0, 1, name)
        _require_stride(rk, 0, G, name)
        _require_stride(rk, 1, 1, name)
        _require_stride(rc, 0, 1, name)
        acc = rc.vload([0], L)
        i32 = f"int32x{L}"
        if kind.group == 2:
            # exact: int16 operands, vpmaddwd sums each pair in int32 (255*128*2 cannot overflow)
            a2: Expr = Call("int32", "reinterpret", (Cast("int16x2", rd.vload([0], 2)),))
            a16 = Call(f"int16x{2 * L}", "reinterpret", (Broadcast(a2, L),))
            b16 = Cast(f"int16x{2 * L}", rk.vload([0, 0], 2 * L))
            pmaddwd = "llvm.x86.avx512.pmaddw.d.512" if L == 16 else "llvm.x86.avx2.pmadd.wd"
            return rc.vstore([0], acc + Call(i32, pmaddwd, (a16, b16), extern=True))
        a32: Expr = Call("int32", "reinterpret", (rd.vload([0], 4),))  # the 4 bytes, broadcast
        b = rk.vload([0, 0], 4 * L)
        if kind.isa in ("avx512vnni", "avxvnni"):
            fn = "llvm.x86.avx512.vpdpbusd.512" if L == 16 else "llvm.x86.avx512.vpdpbusd.256"
            b32 = Call(i32, "reinterpret", (b,))
            return rc.vstore([0], Call(i32, fn, (acc, Broadcast(a32, L), b32), extern=True))
        # vpmaddubsw: u8*s8 pairs -> int16 (saturating); vpmaddwd by 1: pairs -> int32
        a8 = Call(f"uint8x{4 * L}", "reinterpret", (Broadcast(a32, L),))
        if L == 16:
            ub, wd = "llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512"
        else:
            ub, wd = "llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"
        pairs = Call(f"int16x{2 * L}", ub, (a8, b), extern=True)
        quads = Call(i32, wd, (pairs, Broadcast(const(1, "int16"), 2 * L)), extern=True)
        return rc.vstore([0], acc + quads)

    return decl_tensor_intrin(c.op, impl, name=name)


def pack_u8s8_kernel(b: np.ndarray, kind: U8S8Dot, nr: int | None = None) -> np.ndarray:
    """Pack an int8 ``(N, K)`` kernel as ``[Np / lanes, Kp / group, lanes, group]`` (zero padded
    to multiples of ``nr`` (default: lanes) and ``group``): `dense_u8s8s32`'s prepacked layout."""
    L, G = kind.lanes, kind.group
    n, k = b.shape
    np_, kp = _round_up(n, nr or L), _round_up(k, G)
    padded = np.zeros((np_, kp), np.int8)
    padded[:n, :k] = b
    return np.ascontiguousarray(padded.reshape(np_ // L, L, kp // G, G).transpose(0, 2, 1, 3))


def _cop(t: Tensor) -> ComputeOp:
    assert isinstance(t.op, ComputeOp)
    return t.op


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def dense_u8s8s32(
    m: int, n: int, k: int, target: str | Target | None = None, exact: bool = False,
    mr: int | None = None, nr: int | None = None, nb: int | None = None, prepacked: bool = False,
) -> tuple[Schedule, list[Tensor], U8S8Dot]:
    """``C[i, j] = sum_k int32(A[i, k]) * int32(B[j, k])`` (A uint8 ``(m, k)``, B int8
    ``(n, k)``, C int32 ``(m, n)``) scheduled on `dot_u8s8s32`, as TVM's ``dense_int8``.

    B is packed by a layout stage into the intrinsic's ``[n/L, k/G, L, G]`` tiles (or, with
    ``prepacked``, is that packed placeholder, made by `pack_u8s8_kernel`); an ``mr x nr``
    register tile of C accumulates in a local cache (``mr * nr / L`` vector registers), B is
    walked in ``nb``-column blocks that stay in L2 while all row blocks of A pass over them, and
    row blocks run in parallel. Sizes that are not multiples of the tile are zero-padded by
    layout stages (padding is exact for a sum of products) and C is sliced back.
    Returns the schedule, ``[A, B, C]`` and the dot product used.
    """
    kind = u8s8_dot_kind(target, exact)
    L, G = kind.lanes, kind.group
    if mr is None:
        mr = 4
    if nr is None:
        nr = 2 * L if L == 8 else 4 * L  # AVX2: 8 of 16 ymm accumulate; AVX-512: 16 of 32 zmm
    if nr % L:
        raise TecompError(f"dense_u8s8s32: nr={nr} must be a multiple of {L} lanes")
    mp, np_, kp = _round_up(m, mr), _round_up(n, nr), _round_up(k, G)
    if nb is None:
        nb = max(nr, min(np_, 256) // nr * nr)
    nb = nb // nr * nr
    while np_ % nb:  # the block must divide the padded columns, or tiles would be partial
        nb -= nr
    A = placeholder((m, k), "uint8", name="A")
    if prepacked:
        B = placeholder((np_ // L, kp // G, L, G), "int8", name="B")
        Bp = B
    else:
        B = placeholder((n, k), "int8", name="B")
        if np_ != n or kp != k:
            Bp = compute((np_ // L, kp // G, L, G), lambda x, y, z, w: if_then_else(
                te_all(x * L + z < n, y * G + w < k), B[x * L + z, y * G + w], const(0, "int8")),
                name="Bp")
        else:
            Bp = compute((np_ // L, kp // G, L, G), lambda x, y, z, w: B[x * L + z, y * G + w], name="Bp")
    Ap = A
    if mp != m or kp != k:
        Ap = compute((mp, kp), lambda i, r: if_then_else(te_all(i < m, r < k), A[i, r], const(0, "uint8")),
                     name="Ap")
    r = reduce_axis((0, kp), name="r")
    Cp = compute((mp, np_), lambda i, j: te_sum(
        Ap[i, r].astype("int32") * Bp[j // L, r // G, j % L, r % G].astype("int32"), axis=r), name="Cp")
    C = Cp if (mp, np_) == (m, n) else compute((m, n), lambda i, j: Cp[i, j], name="C")

    s = create_schedule(C.op)
    if Bp is not B:
        x, y, z, w = _cop(Bp).axis
        s[Bp].parallel(x)
        s[Bp].vectorize(s[Bp].fuse(z, w))
    if Ap is not A:
        s[Ap].parallel(_cop(Ap).axis[0])
        s[Ap].vectorize(_cop(Ap).axis[1])
    CC = s.cache_write(Cp, "local")
    i, j = _cop(Cp).axis
    jb, j = s[Cp].split(j, factor=nb)
    io, jo, ii, ji = s[Cp].tile(i, j, mr, nr)
    s[Cp].reorder(jb, io, jo, ii, ji)
    # one parallel loop over (column block, row block): each thread gets a contiguous run, so
    # it keeps its own B block in L2; and one fork per call rather than one per column block
    s[Cp].parallel(s[Cp].fuse(jb, io))
    s[Cp].vectorize(ji)
    s[CC].compute_at(s[Cp], jo)
    ci, cj = _cop(CC).axis
    ko, ki = s[CC].split(_cop(CC).reduce_axis[0], factor=G)
    cjo, cji = s[CC].split(cj, factor=L)
    s[CC].reorder(ko, ci, cjo, cji, ki)
    s[CC].unroll(ci)
    s[CC].unroll(cjo)
    s[CC].tensorize(cji, dot_u8s8s32(target, exact))
    if C is not Cp:
        s[Cp].compute_root()
        ci2, cj2 = _cop(C).axis
        s[C].parallel(ci2)
        s[C].vectorize(s[C].split(cj2, factor=L)[1])
    return s, [A, B, C], kind


def dot_bf16_f32(target: str | Target | None = None) -> TensorIntrin:
    """``c[i] += sum_{k<2} float32(data[k]) * float32(kernel[i, k])`` for 16 float32 lanes with
    one AVX512-BF16 ``vdpbf16ps`` (kernel packed ``[n/16, k/2, 16, 2]``, as `pack_u8s8_kernel`
    with lanes 16, group 2).

    The instruction flushes denormal inputs and outputs to zero and rounds its fused pair sum
    once (round to nearest even), so results agree with a float32 loop only to rounding; a
    target without AVX512-BF16 is refused (LLVM would abort on the intrinsic).
    """
    t = Target.parse(target)
    if not t.has_feature("avx512bf16"):
        raise TecompError(f"dot_bf16_f32: target '{t}' has no AVX512-BF16 (vdpbf16ps)")
    data = placeholder((2,), "bfloat16", name="data")
    kernel = placeholder((16, 2), "bfloat16", name="kernel")
    k = reduce_axis((0, 2), name="k")
    c = compute((16,), lambda i: te_sum(data[k].astype("float32") * kernel[i, k].astype("float32"),
                                        axis=k), name="c")
    name = "dot_bf16_f32_avx512bf16"

    def impl(ins: list[TensorRegion], outs: list[TensorRegion]) -> Stmt:
        rd, rk = ins
        rc = outs[0]
        _require_stride(rd, 0, 1, name)
        _require_stride(rk, 0, 2, name)
        _require_stride(rk, 1, 1, name)
        _require_stride(rc, 0, 1, name)
        a32: Expr = Call("int32", "reinterpret", (rd.vload([0], 2),))  # the bf16 pair, broadcast
        b32 = Call("int32x16", "reinterpret", (rk.vload([0, 0], 32),))
        acc = rc.vload([0], 16)
        res = Call("float32x16", "llvm.x86.avx512bf16.dpbf16ps.512", (acc, Broadcast(a32, 16), b32),
                   extern=True)
        return rc.vstore([0], res)

    return decl_tensor_intrin(c.op, impl, name=name)

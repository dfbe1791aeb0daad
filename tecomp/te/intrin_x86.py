"""Tensor intrinsics for x86 CPUs, ready for ``s[C].tensorize(axis, intrin)``.

* `gemm_fma` - an ``mr x nr`` register-tile GEMM update ``C += A[:, k] * B[k, :]`` over ``kc``
  steps, written with explicit ``nr``-lane vectors so each row is ``nr/16`` zmm FMAs per step on
  AVX-512 (``nr/8`` ymm on AVX2).
* `dot_u8s8_vnni` - the AVX512-VNNI int8 dot product: 16 int32 lanes each accumulate a 4-element
  uint8 x int8 dot product with one ``vpdpbusd``; the kernel must be packed so that the 16x4 int8
  tile is contiguous (layout ``[..., 16, 4]``).
"""

from __future__ import annotations

from ..arith.simplify import simplify
from ..errors import TecompError
from ..ir.expr import Broadcast, Call, Expr, IntImm, Var, const
from ..ir.stmt import For, ForKind, Stmt, seq
from .reduction import sum as te_sum
from .tensor import compute, placeholder, reduce_axis
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

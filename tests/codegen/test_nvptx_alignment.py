"""Alignment of GPU memory accesses: what `pow2_divisor` proves about an index, what NVPTX
codegen claims from it (shared arrays and allocas are 16-byte aligned, buffer arguments
``min(16, buffer.align)``), and that the CPU keeps claiming only the element size.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tecomp.arith.divisibility import pow2_divisor
from tecomp.arith.evaluate import evaluate
from tecomp.codegen.llvm_cpu import CodegenCPU
from tecomp.codegen.llvm_nvptx import CodegenNVPTX, _lane_align, emit_ptx
from tecomp.codegen.ptxas import find_ptxas
from tecomp.codegen.target import Target
from tecomp.ir import Allocate, Buffer, BufferStore, For, ForKind, PrimFunc, Var, seq
from tecomp.ir.expr import (
    BufferLoad,
    Cast,
    Expr,
    FloorDiv,
    FloorMod,
    Let,
    Max,
    Min,
    Ramp,
    Select,
    const,
)
from tecomp.ir.stmt import barrier

SM80 = Target.parse("cuda -arch=sm_80")

# pow2_divisor -------------------------------------------------------------------------------

tx, ty, k = Var("tx"), Var("ty"), Var("k")


@pytest.mark.parametrize("e, want", [
    (const(0), 1 << 16),
    (const(24), 8),
    (const(-12), 4),
    (tx, 1),
    (tx * 4, 4),
    (ty * 32 + tx * 4, 4),
    (ty * 32 + tx * 4 + 2, 2),
    (ty * 32 + tx * 4 + 1, 1),
    (tx * 2 + tx * 2, 4),  # the linear form: 4*tx
    ((tx + 1) * 8 - 8, 8),
    (tx * ty * 4, 4),
    ((tx * 4) * (ty * 2), 8),
    (FloorMod(tx * 8, const(32)), 8),
    (FloorMod(tx * 8, const(4)), 4),
    (FloorMod(tx * 8, const(12)), 4),
    (FloorDiv(tx * 16, const(4)), 4),
    (FloorDiv(tx * 16, const(16)), 1),
    (FloorDiv(tx * 16, const(32)), 1),
    (FloorDiv(tx * 16, const(12)), 1),
    (Min(tx * 8, ty * 4), 4),
    (Max(tx * 8, const(16)), 8),
    (Select(tx < ty, tx * 8, ty * 16), 8),
    (Let(k, tx * 4, k * 2 + 8), 8),
    (Cast("int64", tx * 16), 16),
])
def test_pow2_divisor(e: Expr, want: int) -> None:
    assert pow2_divisor(e) == want


def test_pow2_divisor_known_vars_and_cap() -> None:
    assert pow2_divisor(tx * 4 + ty, known={ty: 8}) == 4
    assert pow2_divisor(tx * 64, cap=16) == 16
    with pytest.raises(ValueError):
        pow2_divisor(tx, cap=12)


_VARS = [Var(n) for n in ("a", "b", "c")]


def _exprs() -> st.SearchStrategy[Expr]:
    leaf = st.one_of(st.sampled_from(_VARS), st.integers(-64, 64).map(const))

    def grow(sub: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
        c = st.integers(-64, 64).map(const)
        pos = st.sampled_from([1, 2, 3, 4, 6, 8, 16, 32]).map(const)
        return st.one_of(
            st.tuples(sub, sub).map(lambda p: p[0] + p[1]),
            st.tuples(sub, sub).map(lambda p: p[0] - p[1]),
            st.tuples(sub, c).map(lambda p: p[0] * p[1]),
            st.tuples(sub, sub).map(lambda p: p[0] * p[1]),
            st.tuples(sub, pos).map(lambda p: FloorDiv(p[0], p[1])),
            st.tuples(sub, pos).map(lambda p: FloorMod(p[0], p[1])),
            st.tuples(sub, sub).map(lambda p: Min(p[0], p[1])),
            st.tuples(sub, sub).map(lambda p: Max(p[0], p[1])),
        )

    return st.recursive(leaf, grow, max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(_exprs(), st.lists(st.integers(-1000, 1000), min_size=3, max_size=3))
def test_pow2_divisor_divides_every_value(e: Expr, values: list[int]) -> None:
    p = pow2_divisor(e)
    v = evaluate(e, dict(zip(_VARS, values, strict=True)))
    assert isinstance(v, int) and v % p == 0, (str(e), values, v, p)


# what NVPTX codegen claims per access -------------------------------------------------------


def _buf(name: str, scope: str, n: int = 256, dtype: str = "float32", align: int = 64) -> Buffer:
    return Buffer(name, (const(n),), dtype, scope=scope, align=align)


@pytest.mark.parametrize("scope, index, dtype, want", [
    ("shared", Ramp(ty * 32 + tx * 4, const(1), 4), "float32", 16),
    ("shared", Ramp(ty * 32 + tx * 4 + 2, const(1), 4), "float32", 8),
    ("shared", Ramp(tx * 4 + 1, const(1), 4), "float32", 4),
    ("shared", Ramp(tx * 8, const(1), 2), "float64", 16),
    ("shared", Ramp(tx * 4, const(2), 4), "float32", 4),  # strided: a gather, per element
    ("shared", tx * 4, "float32", 16),  # a scalar access may claim it too
    ("local", Ramp(const(8), const(1), 4), "float32", 16),
    ("global", Ramp(tx * 64, const(1), 4), "float32", 16),  # capped by the argument's 16
    ("shared", Ramp(tx * 4, const(1), 4), "int8", 4),
    ("shared", Ramp(tx * 16, const(1), 16), "int8", 16),
])
def test_access_align_of_nvptx(scope: str, index: Expr, dtype: str, want: int) -> None:
    cg = CodegenNVPTX(SM80)
    assert cg.access_align(_buf("X", scope, dtype=dtype), index, dtype) == want


def test_access_align_of_an_argument_follows_its_buffer_align() -> None:
    cg = CodegenNVPTX(SM80)
    assert cg.access_align(_buf("X", "global", align=8), Ramp(tx * 4, const(1), 4), "float32") == 8


def test_lanes_of_a_per_lane_access_get_their_own_alignment() -> None:
    from llvmlite import ir

    f32 = ir.FloatType()
    assert [_lane_align(16, i, f32) for i in range(4)] == [16, 4, 8, 4]
    assert [_lane_align(16, i, ir.DoubleType()) for i in range(2)] == [16, 8]
    assert [_lane_align(4, i, f32) for i in range(4)] == [4, 4, 4, 4]


# in the generated code ------------------------------------------------------------------------


def _bind(v: Var, tag: str, extent: int, body: object) -> For:
    return For(v, const(0), const(extent), ForKind.THREAD_BINDING, body,  # type: ignore[arg-type]
               (("thread_tag", tag),))


def float4_kernel() -> PrimFunc:
    """Each of 32 threads copies 4 floats A -> a shared tile -> B (its neighbour's 4), plus one
    float4 store at an offset of 2 floats (8-byte aligned only)."""
    A, B = _buf("A", "global", 128), _buf("B", "global", 136)
    tile = _buf("tile", "shared", 128)
    bx, t = Var("bx"), Var("tx")
    v4 = lambda base: Ramp(base, const(1), 4)  # noqa: E731
    body = seq(
        BufferStore(tile, BufferLoad(A, (v4(t * 4),)), (v4(t * 4),)),
        barrier(),
        BufferStore(B, BufferLoad(tile, (v4(FloorMod(t + 1, const(32)) * 4),)), (v4(t * 4),)),
        BufferStore(B, BufferLoad(tile, (v4(t * 4),)), (v4(t * 4 + 2),)),
    )
    f = PrimFunc("copy4", [A, B], _bind(bx, "blockIdx.x", 1, _bind(t, "threadIdx.x", 32, Allocate(tile, body))))
    f.attrs["launch"] = {"blockIdx.x": const(1), "threadIdx.x": const(32)}
    return f


def _accesses(ll: str) -> list[str]:
    return re.findall(r"(?:load <4 x float>, ptr %[\w.\"]+|store <4 x float> %[\w.\"]+, ptr %[\w.\"]+), align (\d+)", ll)



def test_nvptx_claims_the_proven_alignment_of_vector_accesses() -> None:
    cg = CodegenNVPTX(SM80)
    cg.add_function(float4_kernel())
    aligns = _accesses(str(cg.module))
    # A load, tile store, tile load, B store, tile load, B store at +2 floats
    assert aligns == ["16", "16", "16", "16", "16", "8"], aligns


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas (CUDA toolkit) not found")
def test_float4_shared_accesses_stay_float4_in_ptx() -> None:
    cg = CodegenNVPTX(SM80)
    cg.add_function(float4_kernel())
    ptx = emit_ptx(cg.module, SM80)
    assert len(re.findall(r"\bld\.shared\.v4\.(f32|b32)\b", ptx)) == 2
    assert len(re.findall(r"\bst\.shared\.v4\.(f32|b32)\b", ptx)) == 1
    assert not re.search(r"\b(ld|st)\.shared\.(f32|b32)\b", ptx)
    assert re.search(r"\bst\.global\.v2\.(f32|b32)\b", ptx)  # the 8-byte aligned one: 2 x v2


def test_cpu_vector_accesses_claim_only_the_element_size() -> None:
    # numpy arrays (CPU buffers) may start at any element of another array
    A, B = _buf("A", "global", 128), _buf("B", "global", 128)
    i = Var("i")
    body = For(i, const(0), const(32), ForKind.SERIAL,
               BufferStore(B, BufferLoad(A, (Ramp(i * 4, const(1), 4),)), (Ramp(i * 4, const(1), 4),)))
    cg = CodegenCPU(Target.parse("llvm"))
    cg.add_function(PrimFunc("copy", [A, B], body))
    assert _accesses(str(cg.module)) == ["4", "4"]

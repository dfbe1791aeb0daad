"""int8 GEMM (uint8 x int8 -> int32) tensorized onto the target's dot product (issue 15).

Exactness is checked against numpy's int32 matmul on inputs where the chosen instruction is
exact: vpdpbusd and the widened vpmaddwd path always; vpmaddubsw (AVX2 / AVX-512BW without
VNNI) while every int16 pair sum fits, i.e. uint8 data <= 127. Code generation for targets
this machine lacks (AVX512-VNNI, AVX-VNNI, AVX512-BF16) is checked by assembly only.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.codegen.llvm_cpu import codegen_cpu
from tecomp.codegen.llvm_jit import emit_assembly
from tecomp.codegen.target import Target
from tecomp.te import intrin_x86

RNG = np.random.default_rng(15)
HOST = Target.host()
HAS_INT8 = HOST.has_feature("avx2") or HOST.has_feature("avx512bw")
needs_int8 = pytest.mark.skipif(not HAS_INT8, reason="the host has neither AVX2 nor AVX-512BW")


def _asm(s, args, target):
    t = Target.parse(target)
    return emit_assembly(str(codegen_cpu([tc.lower(s, args, name="qgemm", target=t)], t)), t)


def _data(m, n, k, hi=256):
    a = RNG.integers(0, hi, (m, k)).astype(np.uint8)
    b = RNG.integers(-128, 128, (n, k)).astype(np.int8)
    return a, b, a.astype(np.int32) @ b.astype(np.int32).T


def _run(m, n, k, exact=False):
    s, args, kind = intrin_x86.dense_u8s8s32(m, n, k, exact=exact)
    f = tc.build(s, args, name="qgemm")
    a, b, ref = _data(m, n, k, 256 if kind.exact else 128)
    c = np.zeros((m, n), np.int32)
    f(a, b, c)
    return c, ref, kind, f


@needs_int8
@pytest.mark.parametrize("mnk", [(64, 64, 64), (128, 96, 256)])
def test_int8_gemm_exact_on_host(mnk):
    c, ref, kind, f = _run(*mnk)
    np.testing.assert_array_equal(c, ref)
    asm = f.get_source("asm")
    for ins in kind.instructions[:2]:
        assert ins in asm, f"{ins} missing from the {kind.isa} kernel"


@needs_int8
@pytest.mark.parametrize("mnk", [(37, 50, 29), (1, 17, 5), (65, 33, 130)])
def test_int8_gemm_tails(mnk):
    c, ref, _, _ = _run(*mnk)
    np.testing.assert_array_equal(c, ref)


@needs_int8
@pytest.mark.parametrize("mnk", [(64, 48, 64), (21, 40, 30)])
def test_int8_gemm_prepacked(mnk):
    m, n, k = mnk
    s, args, kind = intrin_x86.dense_u8s8s32(m, n, k, prepacked=True)
    f = tc.build(s, args)
    a, b, ref = _data(m, n, k, 256 if kind.exact else 128)
    nr = 2 * kind.lanes if kind.lanes == 8 else 4 * kind.lanes  # dense_u8s8s32's default tile
    bp = intrin_x86.pack_u8s8_kernel(b, kind, nr)
    assert bp.shape == tuple(int(x) for x in args[1].shape)
    c = np.zeros((m, n), np.int32)
    f(a, bp, c)
    np.testing.assert_array_equal(c, ref)


@needs_int8
def test_int8_gemm_exact_variant_full_range():
    # the widened vpmaddwd path (or VNNI) is exact for every uint8 x int8 input, extremes included
    m, n, k = 48, 40, 64
    s, args, kind = intrin_x86.dense_u8s8s32(m, n, k, exact=True)
    assert kind.exact
    f = tc.build(s, args)
    a = np.full((m, k), 255, np.uint8)
    b = np.full((n, k), -128, np.int8)
    b[::2] = 127
    c = np.zeros((m, n), np.int32)
    f(a, b, c)
    np.testing.assert_array_equal(c, a.astype(np.int32) @ b.astype(np.int32).T)
    a, b, ref = _data(m, n, k)
    f(a, b, c)
    np.testing.assert_array_equal(c, ref)


@pytest.mark.skipif(not HAS_INT8 or HOST.has_feature("avx512vnni") or HOST.has_feature("avxvnni"),
                    reason="vpmaddubsw saturation only exists without VNNI")
def test_vpmaddubsw_saturation_is_as_documented():
    # 255*127 + 255*127 = 64770 does not fit int16: vpmaddubsw clamps the pair to 32767, so the
    # fast path is documented exact only for data <= 127 (or |kernel| <= 64); exact=True is exact
    m, n, k = 8, 16, 8
    s, args, kind = intrin_x86.dense_u8s8s32(m, n, k)
    assert not kind.exact
    f = tc.build(s, args)
    a = np.full((m, k), 255, np.uint8)
    b = np.full((n, k), 127, np.int8)
    c = np.zeros((m, n), np.int32)
    f(a, b, c)
    assert (c == 4 * 32767).all()  # 4 saturated pairs, not 8 * 255 * 127
    a[:] = 127  # in the exact range
    f(a, b, c)
    assert (c == 8 * 127 * 127).all()
    b[:] = 64  # or the kernel within [-64, 64]
    a[:] = 255
    f(a, b, c)
    assert (c == 8 * 255 * 64).all()


@pytest.mark.parametrize("target,exact,isa,expect,reg", [
    ("llvm -mcpu=haswell", False, "avx2", ["vpmaddubsw", "vpmaddwd"], "ymm"),
    ("llvm -mcpu=haswell", True, "avx2-exact", ["vpmaddwd"], "ymm"),
    ("llvm -mcpu=skylake-avx512", False, "avx512bw", ["vpmaddubsw", "vpmaddwd"], "zmm"),
    ("llvm -mcpu=cascadelake", False, "avx512vnni", ["vpdpbusd"], "zmm"),
    ("llvm -mcpu=znver5", False, "avx512vnni", ["vpdpbusd"], "zmm"),
    ("llvm -mcpu=znver5 -mattr=-avx512f", False, "avxvnni", ["vpdpbusd"], "ymm"),
    ("llvm -mcpu=alderlake", True, "avxvnni", ["vpdpbusd"], "ymm"),
    ("llvm -mtriple=x86_64-linux-gnu -mattr=+avx2,+fma,+avx512f,+avx512bw,+avx512vnni", False,
     "avx512vnni", ["vpdpbusd"], "zmm"),
])
def test_intrinsic_chosen_per_target(target, exact, isa, expect, reg):
    kind = intrin_x86.u8s8_dot_kind(target, exact)
    assert kind.isa == isa
    s, args, _ = intrin_x86.dense_u8s8s32(40, 48, 36, target=target, exact=exact)
    asm = _asm(s, args, target)
    for ins in expect:
        assert ins in asm
    if "vpdpbusd" in expect:
        assert "vpmaddubsw" not in asm
    assert re.search(rf"%{reg}\d", asm)


def test_no_int8_dot_on_sse_target():
    with pytest.raises(tc.TecompError, match="neither AVX2"):
        intrin_x86.dot_u8s8s32("llvm -mtriple=x86_64-linux-gnu -mcpu=x86-64")


@pytest.mark.skipif(not HOST.has_feature("avx512vnni") and not HOST.has_feature("avxvnni"),
                    reason="the host CPU has no AVX512-VNNI / AVX-VNNI (vpdpbusd)")
def test_vnni_gemm_runs_exact_full_range():
    c, ref, kind, f = _run(96, 80, 100)
    assert kind.isa in ("avx512vnni", "avxvnni") and kind.exact
    assert "vpdpbusd" in f.get_source("asm")
    np.testing.assert_array_equal(c, ref)


def _bf16_matmul(n=4, m=32, k=64):
    A = te.placeholder((n, k), "bfloat16", name="A")
    Bp = te.placeholder((m // 16, k // 2, 16, 2), "bfloat16", name="Bp")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((n, m), lambda i, j: te.sum(
        A[i, r].astype("float32") * Bp[j // 16, r // 2, j % 16, r % 2].astype("float32"), axis=r),
        name="C")
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    jo, ji = s[C].split(j, factor=16)
    ko, ki = s[C].split(s[C].op.reduce_axis[0], factor=2)
    s[C].reorder(i, jo, ko, ji, ki)
    return s, [A, Bp, C], ji


@pytest.mark.parametrize("target", ["llvm -mcpu=cooperlake", "llvm -mcpu=znver5"])
def test_bf16_dot_codegen(target):
    s, args, ji = _bf16_matmul()
    s[args[2]].tensorize(ji, intrin_x86.dot_bf16_f32(target))
    assert "vdpbf16ps" in _asm(s, args, target)


def test_bf16_dot_refused_without_avx512bf16():
    with pytest.raises(tc.TecompError, match="AVX512-BF16"):
        intrin_x86.dot_bf16_f32("llvm -mcpu=skylake-avx512")


@pytest.mark.skipif(not HOST.has_feature("avx512bf16"), reason="the host CPU has no AVX512-BF16")
def test_bf16_dot_runs():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    n, m, k = 4, 32, 64
    s, args, ji = _bf16_matmul(n, m, k)
    s[args[2]].tensorize(ji, intrin_x86.dot_bf16_f32())
    f = tc.build(s, args)
    a = RNG.standard_normal((n, k)).astype(ml_dtypes.bfloat16)
    b = RNG.standard_normal((k, m)).astype(ml_dtypes.bfloat16)
    bp = np.ascontiguousarray(b.reshape(k // 2, 2, m // 16, 16).transpose(2, 0, 3, 1))
    c = np.zeros((n, m), np.float32)
    f(a, bp, c)
    np.testing.assert_allclose(c, a.astype(np.float32) @ b.astype(np.float32), rtol=1e-2, atol=1e-2)
    assert "vdpbf16ps" in f.get_source("asm")

"""tensorize: pattern matching, the shipped x86 intrinsics, extern C implementations."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.codegen.llvm_cpu import codegen_cpu
from tecomp.codegen.llvm_jit import emit_assembly
from tecomp.codegen.target import Target
from tecomp.te import intrin_x86

RNG = np.random.default_rng(3)
_VREG = {128: "xmm", 256: "ymm", 512: "zmm"}


def assert_host_vector_registers(asm):
    """Vector code uses the host's widest registers (ymm on AVX2, zmm on AVX-512), no wider."""
    bits = Target.host().vector_bits
    assert re.search(rf"%{_VREG[bits]}\d", asm), f"no {_VREG[bits]} register in the assembly"
    for wider in (b for b in _VREG if b > bits):
        assert not re.search(rf"%{_VREG[wider]}\d", asm), f"{_VREG[wider]} on a {bits}-bit host"


def _matmul(n, m, k, dtype="float32"):
    A = te.placeholder((n, k), dtype, name="A")
    B = te.placeholder((k, m), dtype, name="B")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    return A, B, C


@pytest.mark.parametrize("n,m,k,mr,nr,kc", [(24, 64, 32, 6, 32, 8), (12, 32, 16, 4, 16, 16)])
def test_gemm_fma_intrinsic(n, m, k, mr, nr, kc):
    A, B, C = _matmul(n, m, k)
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    io, jo, ii, ji = s[C].tile(i, j, mr, nr)
    ko, ki = s[C].split(s[C].op.reduce_axis[0], factor=kc)
    s[C].reorder(io, jo, ko, ii, ji, ki)
    s[C].tensorize(ii, intrin_x86.gemm_fma(mr, nr, kc))
    s[C].parallel(io)
    f = tc.build(s, [A, B, C])
    a = RNG.standard_normal((n, k)).astype("float32")
    b = RNG.standard_normal((k, m)).astype("float32")
    c = np.zeros((n, m), "float32")
    f(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    assert_host_vector_registers(f.get_source("asm"))
    text = str(tc.lower(s, [A, B, C]))
    assert "kk in range" in text  # the intrinsic's body replaced the inner loops


def test_tensorize_mismatch_raises():
    A, B, C = _matmul(16, 32, 16)
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    io, jo, ii, ji = s[C].tile(i, j, 4, 16)
    s[C].tensorize(ii, intrin_x86.gemm_fma(4, 32, 16))  # 16 columns in the loop, 32 in the intrinsic
    with pytest.raises(tc.ScheduleError, match=r"stage C.*'i.inner'.*gemm_fma"):
        tc.build(s, [A, B, C])


def test_tensorize_wrong_pattern_raises():
    A = te.placeholder((16, 16), name="A")
    B = te.placeholder((16, 16), name="B")
    r = te.reduce_axis((0, 16), name="r")
    C = te.compute((16, 16), lambda i, j: te.sum(A[i, r] + B[r, j], axis=r), name="C")  # + not *
    s = te.create_schedule(C.op)
    s[C].tensorize(s[C].op.axis[0], intrin_x86.gemm_fma(16, 16, 16))
    with pytest.raises(tc.ScheduleError, match="does not match"):
        tc.build(s, [A, B, C])


def _vnni_dot(n=8, m=32, k=64):
    A = te.placeholder((n, k), "uint8", name="A")
    # kernel packed as [m/16, k/4, 16, 4] so each 16x4 tile is contiguous
    Bp = te.placeholder((m // 16, k // 4, 16, 4), "int8", name="Bp")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((n, m), lambda i, j: te.sum(
        A[i, r].astype("int32") * Bp[j // 16, r // 4, j % 16, r % 4].astype("int32"), axis=r), name="C")
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    jo, ji = s[C].split(j, factor=16)
    ko, ki = s[C].split(s[C].op.reduce_axis[0], factor=4)
    s[C].reorder(i, jo, ko, ji, ki)
    s[C].tensorize(ji, intrin_x86.dot_u8s8_vnni())
    return s, [A, Bp, C]


def test_vnni_int8_dot_compiles_for_a_vnni_target():
    # compile only: hosts without AVX512-VNNI still check the instruction selection
    s, args = _vnni_dot()
    tgt = Target.parse("llvm -mcpu=cascadelake")
    asm = emit_assembly(str(codegen_cpu([tc.lower(s, args, name="vnni")], tgt)), tgt)
    assert "vpdpbusd" in asm and re.search(r"%zmm\d", asm)


@pytest.mark.skipif("avx512vnni" not in Target.host().feature_set, reason="needs AVX512-VNNI")
def test_vnni_int8_dot():
    n, m, k = 8, 32, 64
    s, args = _vnni_dot(n, m, k)
    f = tc.build(s, args)
    assert "vpdpbusd" in f.get_source("asm")
    a = RNG.integers(0, 256, (n, k)).astype("uint8")
    b = RNG.integers(-128, 128, (k, m)).astype("int8")
    bp = np.ascontiguousarray(b.reshape(k // 4, 4, m // 16, 16).transpose(2, 0, 3, 1))
    c = np.zeros((n, m), "int32")
    f(a, bp, c)
    np.testing.assert_array_equal(c, a.astype(np.int64) @ b.astype(np.int64))


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_tensorize_with_extern_c_function(tmp_path):
    src = tmp_path / "gemv.c"
    src.write_text(
        "void gemv_update(float *c, const float *a, const float *b, int m, int l, int stride) {\n"
        "  for (int i = 0; i < m; ++i) { float acc = 0.f;\n"
        "    for (int j = 0; j < l; ++j) acc += a[j] * b[i * stride + j];\n"
        "    c[i] += acc; } }\n")
    so = tmp_path / "libgemv.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
    tc.load_extern_library(str(so))

    def intrin_gemv(m, l):
        a = te.placeholder((l,), name="a")
        b = te.placeholder((m, l), name="b")
        k = te.reduce_axis((0, l), name="k")
        c = te.compute((m,), lambda i: te.sum(a[k] * b[i, k], axis=k), name="c")

        def impl(ins, outs):
            aa, bb = ins
            cc = outs[0]
            return te.call_extern("int32", "gemv_update", cc.access_ptr("w"), aa.access_ptr("r"),
                                  bb.access_ptr("r"), m, l, bb.strides[0])

        return te.decl_tensor_intrin(c.op, impl, name="gemv")

    N, M, L = 4, 32, 64
    A = te.placeholder((N, L), name="A")
    B = te.placeholder((M, L), name="B")
    k = te.reduce_axis((0, L), name="k")
    C = te.compute((N, M), lambda i, j: te.sum(A[i, k] * B[j, k], axis=k), name="C")
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    jo, ji = s[C].split(j, factor=16)
    s[C].tensorize(ji, intrin_gemv(16, L))
    f = tc.build(s, [A, B, C])
    a = RNG.standard_normal((N, L)).astype("float32")
    b = RNG.standard_normal((M, L)).astype("float32")
    c = np.zeros((N, M), "float32")
    f(a, b, c)
    np.testing.assert_allclose(c, a @ b.T, rtol=1e-4, atol=1e-4)
    assert ctypes.CDLL(str(so)).gemv_update  # the library really provides the symbol


def test_a_tail_of_an_outer_split_guards_the_tensorized_tiles():
    # 24 rows = 4 tiles of 6, the tile loop split by 3: the 6th (io.outer=1, io.inner=2) tile
    # does not exist; its condition is over outer loops only and was dropped (an out-of-range
    # write past C, found by a debug build)
    n, m, k, mr, nr, kc = 24, 64, 32, 6, 32, 8
    A, B, C = _matmul(n, m, k)
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    io, jo, ii, ji = s[C].tile(i, j, mr, nr)
    ioo, ioi = s[C].split(io, factor=3)
    ko, ki = s[C].split(s[C].op.reduce_axis[0], factor=kc)
    s[C].reorder(ioo, ioi, jo, ko, ii, ji, ki)
    s[C].tensorize(ii, intrin_x86.gemm_fma(mr, nr, kc))
    a = RNG.standard_normal((n, k)).astype("float32")
    b = RNG.standard_normal((k, m)).astype("float32")
    for debug in (True, False):
        c = np.zeros((n, m), "float32")
        tc.build(s, [A, B, C], debug=debug)(a, b, c)
        np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)

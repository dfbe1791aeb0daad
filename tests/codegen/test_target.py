"""Targets: parsing target strings, vector widths, cross-compilation and feature checks."""

from __future__ import annotations

import pytest

from tecomp.codegen.llvm_cpu import codegen_cpu
from tecomp.codegen.llvm_jit import emit_assembly, emit_object
from tecomp.codegen.target import Target
from tecomp.errors import TecompError
from tecomp.ir import Buffer, BufferStore, For, ForKind, PrimFunc, Var
from tecomp.ir.expr import BufferLoad, Expr, FloatImm, IntImm, Ramp
from tecomp.runtime.module import build_cpu


def buf(name: str, n: int) -> Buffer:
    return Buffer(name, (IntImm(n),), "float32")


def ld(b: Buffer, idx: Expr | int) -> BufferLoad:
    return BufferLoad(b, (IntImm(idx) if isinstance(idx, int) else idx,))


def st(b: Buffer, idx: Expr | int, value: Expr) -> BufferStore:
    return BufferStore(b, value, (IntImm(idx) if isinstance(idx, int) else idx,))


def loop(var: Var, extent: int, body: BufferStore) -> For:
    return For(var, IntImm(0), IntImm(extent), ForKind.SERIAL, body)


def test_target_parsing() -> None:
    t = Target.parse("llvm -mcpu=skylake-avx512 -mattr=+avx2,+fma")
    assert (t.cpu, t.features, t.vector_bits) == ("skylake-avx512", "+avx2,+fma", 512)
    assert Target.parse("llvm -mcpu=haswell").vector_bits == 256
    assert Target.parse("llvm -mcpu=x86-64").vector_bits == 128
    assert Target.parse("llvm -mattr=+avx512f,+avx512bw").vector_bits == 512
    assert Target.parse("llvm") == Target.host() == Target.parse(None)
    assert Target.parse(t) is t
    assert Target.parse(str(t)) == t
    arm = Target.parse("llvm -mtriple=aarch64-linux-gnu")
    assert arm.cpu == "generic" and not arm.is_host
    with pytest.raises(TecompError, match="unknown target option"):
        Target.parse("llvm -mfoo=bar")
    with pytest.raises(TecompError, match="unsupported target"):
        Target.parse("rocm")
    assert Target.parse("cuda").is_gpu and not Target.parse("cuda").is_host


def test_cross_target_codegen_and_object_emission() -> None:
    A = buf("A", 16)
    i = Var("i")
    funcs = [PrimFunc("k", [A], loop(i, 16, st(A, i, ld(A, i) + FloatImm(1.0))))]
    tgt = Target.parse("llvm -mcpu=haswell")
    mod = codegen_cpu(funcs, tgt)  # type: ignore[arg-type]
    assert '"prefer-vector-width"="256"' in str(mod)
    obj = emit_object(str(mod), tgt)
    assert obj[:4] == b"\x7fELF"


def test_jit_refuses_features_the_host_lacks() -> None:
    A = buf("A", 4)
    funcs = [PrimFunc("k", [A], st(A, 0, FloatImm(1.0)))]
    lacking = sorted({"amx-tile", "avx512fp16", "sse4a"} - Target.host().feature_set)
    if not lacking:
        pytest.skip("the host has every probe feature")
    with pytest.raises(TecompError, match="lacks"):
        build_cpu(funcs, target=f"llvm -mattr=+{lacking[0]}")  # type: ignore[arg-type]


def test_skylake_avx512_target_still_uses_512_bit_vectors() -> None:
    A, B = buf("A", 256), buf("B", 256)
    io = Var("io")
    r = Ramp(io * 16, IntImm(1), 16)
    funcs = [PrimFunc("k", [A, B], loop(io, 16, st(B, r, ld(A, r) * ld(A, r))))]
    tgt = Target.parse("llvm -mcpu=skylake-avx512")
    asm = emit_assembly(str(codegen_cpu(funcs, tgt)), tgt)  # type: ignore[arg-type]
    assert "zmm" in asm

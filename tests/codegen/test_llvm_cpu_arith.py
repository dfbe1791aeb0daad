"""The LLVM CPU backend's arithmetic: casts between every dtype (float -> int saturates, also
in exported libraries), floor/trunc division with negative operands, min/max/compare,
float16, vector reductions and random integer expression trees, each checked against numpy
or Python's own integer semantics."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st_

import tecomp as tc
from tecomp import te
from tecomp.arith.simplify import simplify
from tecomp.codegen.llvm_cpu import codegen_cpu
from tecomp.codegen.llvm_jit import emit_assembly
from tecomp.codegen.target import Target
from tecomp.ir import AttrStmt, Buffer, BufferStore, For, ForKind, IfThenElse, PrimFunc, Var, seq
from tecomp.ir.expr import (
    LT,
    Broadcast,
    BufferLoad,
    Cast,
    Div,
    Expr,
    FloatImm,
    FloorDiv,
    FloorMod,
    IntImm,
    Let,
    Max,
    Min,
    Ramp,
    Select,
    VectorReduce,
)
from tecomp.runtime import interp
from tecomp.runtime.loader import load_module
from tecomp.runtime.module import Module, build_cpu

rng = np.random.default_rng(0)


def buf(name: str, shape: tuple[int, ...], dtype: str = "float32") -> Buffer:
    return Buffer(name, tuple(IntImm(s) for s in shape), dtype)


def ld(b: Buffer, idx: Expr | int) -> BufferLoad:
    return BufferLoad(b, (IntImm(idx) if isinstance(idx, int) else idx,))


def st(b: Buffer, idx: Expr | int, value: Expr) -> BufferStore:
    return BufferStore(b, value, (IntImm(idx) if isinstance(idx, int) else idx,))


def loop(var: Var, extent: int, body: object, kind: ForKind = ForKind.SERIAL,
         start: int = 0) -> For:
    return For(var, IntImm(start), IntImm(extent), kind, body)  # type: ignore[arg-type]


def build(params: list[Buffer], body: object) -> Module:
    return build_cpu([PrimFunc("kernel", params, body)])  # type: ignore[arg-type]


# dtypes and arithmetic --------------------------------------------------------------------

DTYPES = ["float16", "float32", "float64", "int8", "uint8", "int32", "int64", "bool"]


def _sample(dtype: str, size: int) -> np.ndarray:
    if dtype == "bool":
        return rng.random(size) > 0.5
    if dtype.startswith("float"):
        return (rng.standard_normal(size) * 50).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -100), min(info.max, 100), size, dtype=dtype)


def saturating_cast_ref(a: np.ndarray, dst: str) -> np.ndarray:
    """Float -> int as tecomp defines it (docs/design.md), exactly, lane by lane in Python
    ints: truncate toward zero, clamp to ``dst``'s range (+-inf too), NaN -> 0."""
    info = np.iinfo(dst)
    lo, hi = int(info.min), int(info.max)
    out = []
    for x in a.astype(np.float64).tolist():  # exact for float16/32/64
        if math.isnan(x):
            out.append(0)
        elif x >= hi:  # Python compares floats and ints exactly
            out.append(hi)
        elif x <= lo:
            out.append(lo)
        else:
            out.append(math.trunc(x))
    return np.array(out, dst)


def cast_ref(a: np.ndarray, dst: str) -> np.ndarray:
    """What Cast(dst, a) computes: float -> int saturates; -> bool is != 0; otherwise numpy."""
    if dst == "bool":
        return a != 0
    if a.dtype.kind == "f" and np.dtype(dst).kind in "iu":
        return saturating_cast_ref(a, dst)
    return a.astype(dst)


@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("dst", DTYPES)
def test_casts_match_numpy(src: str, dst: str) -> None:
    A, B = buf("A", (24,), src), buf("B", (24,), dst)
    io, i = Var("io"), Var("i")
    r = Ramp(io * 8, IntImm(1), 8)
    body = seq(
        loop(i, 16, st(B, i, Cast(dst, ld(A, i)))),  # scalar casts
        loop(io, 1, st(B, r, Cast(f"{dst}x8", ld(A, r))), start=2),  # vector casts
    )
    f = build([A, B], body)
    a = _sample(src, 24)  # floats reach +-150: beyond int8, negative for unsigned
    b = np.zeros(24, dst)
    f(a, b)
    np.testing.assert_array_equal(b, cast_ref(a, dst))


FLOATS = ["float16", "float32", "float64"]
INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def cast_edge_values(src: str, dst: str, multiple: int = 16) -> np.ndarray:
    """NaN, +-inf, signed zeros, halves, powers of two and the floats at and next to each end
    of ``dst``'s range (as ``src`` rounds them), padded to a multiple of ``multiple``."""
    info = np.iinfo(dst)
    t = np.dtype(src).type
    vals = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 0.99, -0.99, 1.5, -1.5,
            -1.0, 2.0**31, -(2.0**31), 2.0**32, 2.0**63, -(2.0**63), 2.0**64, 1e30, -1e30]
    with np.errstate(over="ignore"):
        for limit in (info.min, info.max, info.max + 1, info.min - 1, info.max + 0.5,
                      info.min - 0.5):
            f = t(limit)  # float16: 2**31 is inf
            vals += [f, np.nextafter(f, t(-np.inf)), np.nextafter(f, t(np.inf))]
        a = np.array(vals, np.float64).astype(src)
    pad = -len(a) % multiple
    return np.concatenate([a, np.linspace(-3.75, 3.75, pad).astype(src)])


def _cast_kernel(src: str, dst: str, n: int) -> PrimFunc:
    """Cast A (n floats) into S lane by lane, into V8 8 lanes and into V16 16 lanes at a time."""
    A = buf("A", (n,), src)
    S, V8, V16 = buf("S", (n,), dst), buf("V8", (n,), dst), buf("V16", (n,), dst)
    i, io, jo = Var("i"), Var("io"), Var("jo")
    r8, r16 = Ramp(io * 8, IntImm(1), 8), Ramp(jo * 16, IntImm(1), 16)
    return PrimFunc("kernel", [A, S, V8, V16], seq(  # type: ignore[arg-type]
        loop(i, n, st(S, i, Cast(dst, ld(A, i)))),
        loop(io, n // 8, st(V8, r8, Cast(f"{dst}x8", ld(A, r8)))),
        loop(jo, n // 16, st(V16, r16, Cast(f"{dst}x16", ld(A, r16)))),
    ))


@pytest.mark.parametrize("dst", INTS)
@pytest.mark.parametrize("src", FLOATS)
def test_float_to_int_casts_saturate(src: str, dst: str) -> None:
    """Out-of-range float -> int casts give the same saturated values on every CPU, in
    scalar and vector code, in the JIT, in the interpreter (the IR's reference) and when the
    simplifier folds the cast of a constant."""
    a = cast_edge_values(src, dst)
    n = len(a)
    func = _cast_kernel(src, dst, n)
    want = saturating_cast_ref(a, dst)
    jit = [np.zeros(n, dst) for _ in range(3)]
    build_cpu([func])(a, *jit)
    ref = [np.zeros(n, dst) for _ in range(3)]
    interp.run(func, a, *ref)
    folded = [simplify(Cast(dst, FloatImm(v, src))) for v in a.tolist()]  # constant folding
    assert all(isinstance(f, IntImm) for f in folded)
    const = np.array([f.value for f in folded], dst)  # type: ignore[attr-defined]
    forms = ["JIT scalar", "JIT x8", "JIT x16", "interp scalar", "interp x8", "interp x16",
             "folded constant"]
    for got, form in zip([*jit, *ref, const], forms, strict=True):
        np.testing.assert_array_equal(got, want, err_msg=f"{form}: {src} -> {dst} of {a}")


def test_float_to_int_saturation_spot_values() -> None:
    """The semantics spelled out, independently of the reference function."""
    assert saturating_cast_ref(np.array([np.nan, np.inf, -np.inf, 300.0, -300.0, 127.9, -128.9,
                                         -0.0, 0.5, -0.5], np.float32), "int8").tolist() == \
        [0, 127, -128, 127, -128, 127, -128, 0, 0, 0]
    assert saturating_cast_ref(np.array([-1.0, -0.5, 2.0**32, 4294967040.0], np.float32),
                               "uint32").tolist() == [0, 0, 2**32 - 1, 4294967040]
    a = np.array([2.0**63, -(2.0**63), np.nextafter(2.0**63, 0.0), 2.0**64], np.float64)
    assert saturating_cast_ref(a, "int64").tolist() == \
        [2**63 - 1, -(2**63), 2**63 - 1024, 2**63 - 1]
    assert saturating_cast_ref(a, "uint64").tolist() == [2**63, 0, 2**63 - 1024, 2**64 - 1]


_VREG = {128: "xmm", 256: "ymm", 512: "zmm"}
_ANY_X86 = [("float32", "int32"), ("float32", "int8"), ("float32", "uint8"), ("float32", "uint32"),
            ("float64", "int32"), ("float64", "uint16"), ("float16", "int16")]
_AVX512DQ = [("float64", "int64"), ("float32", "uint64"), ("float64", "uint64")]


_SKX = "llvm -mcpu=skylake-avx512"
_VECTOR_CAST_CASES = [(t, s_, d) for t in ("host", "llvm -mcpu=haswell", _SKX) for s_, d in _ANY_X86]
_VECTOR_CAST_CASES += [(t, s_, d) for s_, d in _AVX512DQ for t in (
    [_SKX, "host"] if "avx512dq" in Target.host().feature_set else [_SKX])]


@pytest.mark.skipif(not Target.host().triple.startswith("x86_64"), reason="x86 assembly")
@pytest.mark.parametrize("target,src,dst", _VECTOR_CAST_CASES)
def test_vector_float_to_int_casts_stay_vector_code(target: str, src: str, dst: str) -> None:
    """Saturation must not split vector casts into one scalar conversion per lane (what LLVM
    does with the vector ``fptosi.sat`` intrinsic). Compile only, so the AVX-512 target is
    checked on AVX2 hosts too; 64-bit results need AVX512-DQ to be vector code at all."""
    tgt = Target.host() if target == "host" else Target.parse(target)
    A, B = buf("A", (256,), src), buf("B", (256,), dst)
    io = Var("io")
    r = Ramp(io * 16, IntImm(1), 16)
    func = PrimFunc("k", [A, B], loop(io, 16, st(B, r, Cast(f"{dst}x16", ld(A, r)))))
    asm = emit_assembly(str(codegen_cpu([func], tgt)), tgt)  # type: ignore[list-item]
    assert not re.search(r"cvtt(ss|sd)2u?si", asm), asm  # no scalar conversion
    reg = _VREG[tgt.vector_bits]
    assert re.search(rf"cvtt(ps|pd)2\w+\s[^\n]*%{reg}\d", asm), asm


def test_exported_library_casts_saturate(tmp_path: Path) -> None:
    """An exported library (same codegen) gives the same saturated values as the reference."""
    pairs = [("float32", "int8"), ("float32", "int32"), ("float32", "uint32"),
             ("float64", "int64"), ("float32", "uint64"), ("float16", "int16")]

    def kernel(src: str, dst: str, n: int) -> tuple[Any, list[Any], str]:
        A = te.placeholder((n,), src, name="A")
        V = te.compute((n,), lambda i: A[i].astype(dst), name="V")
        S = te.compute((n,), lambda i: A[i].astype(dst), name="S")
        s = te.create_schedule([V.op, S.op])
        _, vi = s[V].split(V.op.axis[0], factor=16)
        s[V].vectorize(vi)
        return s, [A, V, S], f"{src}_to_{dst}"

    kernels, inputs = [], {}
    for src, dst in pairs:
        a = cast_edge_values(src, dst)
        kernels.append(kernel(src, dst, len(a)))
        inputs[kernels[-1][2]] = (a, dst)
    files = tc.build(kernels, target="llvm").export_library(tmp_path / "casts.so")
    lib = load_module(files.library)
    for name, (a, dst) in inputs.items():
        v, s_ = np.zeros(len(a), dst), np.zeros(len(a), dst)
        lib[name](a, v, s_)
        want = saturating_cast_ref(a, dst)
        np.testing.assert_array_equal(v, want, err_msg=f"{name} vectorized")
        np.testing.assert_array_equal(s_, want, err_msg=f"{name} scalar")


INT_DIV_CASES = [("const", 4), ("const", 7), ("const", -3), ("const", 1), ("var", None)]


@pytest.mark.parametrize("dtype", ["int32", "int64", "int8"])
@pytest.mark.parametrize("kind,c", INT_DIV_CASES)
def test_floordiv_floormod_truncdiv_negative(dtype: str, kind: str, c: int | None) -> None:
    A, D = buf("A", (64,), dtype), buf("D", (64,), dtype)
    Q, R, T = buf("Q", (64,), dtype), buf("R", (64,), dtype), buf("T", (64,), dtype)
    i = Var("i")
    x = ld(A, i)
    d: Expr = ld(D, i) if kind == "var" else IntImm(c, dtype)  # type: ignore[arg-type]
    body = loop(i, 64, seq(st(Q, i, FloorDiv(x, d)), st(R, i, FloorMod(x, d)), st(T, i, Div(x, d))))
    f = build([A, D, Q, R, T], body)
    a = rng.integers(-100, 100, 64).astype(dtype)
    dv = rng.integers(1, 9, 64) * rng.choice([-1, 1], 64) if kind == "var" else np.full(64, c)
    dv = dv.astype(dtype)
    q, r, t = (np.zeros(64, dtype) for _ in range(3))
    f(a, dv, q, r, t)
    np.testing.assert_array_equal(q, np.floor_divide(a, dv))
    np.testing.assert_array_equal(r, np.mod(a, dv))
    np.testing.assert_array_equal(t, (np.sign(a) * np.sign(dv) * (np.abs(a) // np.abs(dv))).astype(dtype))


def test_vector_floordiv_floormod_and_float_versions() -> None:
    A, Q, R = buf("A", (32,), "int32"), buf("Q", (32,), "int32"), buf("R", (32,), "int32")
    F, FQ, FR = buf("F", (32,)), buf("FQ", (32,)), buf("FR", (32,))
    io = Var("io")
    r = Ramp(io * 16, IntImm(1), 16)
    five = Broadcast(IntImm(5), 16)
    fthree = Broadcast(FloatImm(-1.5), 16)
    body = loop(io, 2, seq(
        st(Q, r, FloorDiv(ld(A, r), five)), st(R, r, FloorMod(ld(A, r), five)),
        st(FQ, r, FloorDiv(ld(F, r), fthree)), st(FR, r, FloorMod(ld(F, r), fthree)),
    ))
    f = build([A, Q, R, F, FQ, FR], body)
    a = rng.integers(-50, 50, 32).astype(np.int32)
    fl = (rng.standard_normal(32) * 10).astype(np.float32)
    q, rr, fq, fr = (np.zeros(32, t) for t in ("int32", "int32", "float32", "float32"))
    f(a, q, rr, fl, fq, fr)
    np.testing.assert_array_equal(q, a // 5)
    np.testing.assert_array_equal(rr, a % 5)
    np.testing.assert_allclose(fq, np.floor(fl / np.float32(-1.5)))
    np.testing.assert_allclose(fr, fl - np.floor(fl / np.float32(-1.5)) * np.float32(-1.5),
                               rtol=1e-5, atol=1e-5)


def _int_exprs() -> st_.SearchStrategy[tuple[Expr, Any]]:
    """Random int64 expression trees over x and y, paired with their Python meaning."""
    X, Y = buf("X", (64,), "int64"), buf("Y", (64,), "int64")
    i = Var("i")
    leaves = st_.one_of(
        st_.just((ld(X, i), lambda x, y: x)),
        st_.just((ld(Y, i), lambda x, y: y)),
        st_.integers(-9, 9).map(lambda c: (IntImm(c, "int64"), lambda x, y, c=c: c)),
    )

    def nonzero(t: tuple[Expr, Any]) -> tuple[Expr, Any]:  # divisor >= 1 or <= -1
        e, f = t
        return Max(e, IntImm(1, "int64")), lambda x, y: max(f(x, y), 1)

    def combine(kids: st_.SearchStrategy[tuple[Expr, Any]]) -> st_.SearchStrategy[tuple[Expr, Any]]:
        def trunc_div(p: int, q: int) -> int:
            return abs(p) // abs(q) * (1 if (p < 0) == (q < 0) else -1)

        ops: dict[str, tuple[Any, Any]] = {
            "add": (lambda a, b: a + b, lambda p, q: p + q),
            "sub": (lambda a, b: a - b, lambda p, q: p - q),
            "mul": (lambda a, b: a * b, lambda p, q: p * q),
            "min": (Min, min), "max": (Max, max),
            "floordiv": (FloorDiv, lambda p, q: p // q),
            "floormod": (FloorMod, lambda p, q: p % q),
            "div": (Div, trunc_div),
        }

        def build(op: str, a: tuple[Expr, Any], b: tuple[Expr, Any], neg: bool,
                  sel: tuple[Expr, Any]) -> tuple[Expr, Any]:
            mk, ref = ops[op]
            if op in ("floordiv", "floormod", "div"):
                b = nonzero(b)
                if neg:
                    b = (IntImm(0, "int64") - b[0], lambda x, y, f=b[1]: -f(x, y))
            (ea, fa), (eb, fb) = a, b
            out: tuple[Expr, Any] = (mk(ea, eb), lambda x, y: ref(fa(x, y), fb(x, y)))
            if sel is not a:  # sometimes wrap in a lazy Select on the sign of another tree
                es, fs = sel
                out = (Select(LT(es, IntImm(0, "int64")), out[0], es),
                       lambda x, y, f=out[1]: f(x, y) if fs(x, y) < 0 else fs(x, y))
            return out

        return st_.builds(build, st_.sampled_from(sorted(ops)), kids, kids, st_.booleans(), kids)

    return st_.recursive(leaves, combine, max_leaves=6)


@settings(max_examples=int(os.environ.get("TECOMP_HYPOTHESIS_EXAMPLES", "40")), deadline=None)
@given(_int_exprs())
def test_random_integer_expressions_match_python(case: tuple[Expr, Any]) -> None:
    e, ref = case
    X, Y, Z = buf("X", (64,), "int64"), buf("Y", (64,), "int64"), buf("Z", (64,), "int64")
    i = Var("i")
    # the strategy's loads name other Buffer objects: rebind them to these params by data var
    from tecomp.ir import StmtMutator

    class Rebind(StmtMutator):
        def visit_BufferLoad(self, ld_: BufferLoad) -> Expr:  # type: ignore[override]
            target = X if ld_.buffer.name == "X" else Y
            return BufferLoad(target, (i,))

    body = loop(i, 64, st(Z, i, Rebind().visit(e)))
    f = build([X, Y, Z], body)
    x = np.arange(-32, 32, dtype=np.int64)
    y = np.arange(64, dtype=np.int64)[::-1] - 20
    z = np.zeros(64, np.int64)
    f(x, y, z)
    want = [ref(int(a), int(b)) for a, b in zip(x, y, strict=True)]
    np.testing.assert_array_equal(z, want)


@pytest.mark.parametrize("dtype", ["float32", "int32", "uint8"])
def test_min_max_compare(dtype: str) -> None:
    A, B = buf("A", (50,), dtype), buf("B", (50,), dtype)
    L, H, C = buf("L", (50,), dtype), buf("H", (50,), dtype), buf("C", (50,), "bool")
    i = Var("i")
    x, y = ld(A, i), ld(B, i)
    body = loop(i, 50, seq(st(L, i, Min(x, y)), st(H, i, Max(x, y)), st(C, i, x <= y)))
    f = build([A, B, L, H, C], body)
    a, b = _sample(dtype, 50), _sample(dtype, 50)
    b[:5] = a[:5]
    lo, hi, c = np.zeros(50, dtype), np.zeros(50, dtype), np.zeros(50, bool)
    f(a, b, lo, hi, c)
    np.testing.assert_array_equal(lo, np.minimum(a, b))
    np.testing.assert_array_equal(hi, np.maximum(a, b))
    np.testing.assert_array_equal(c, a <= b)


def test_float16_arithmetic() -> None:
    A, B = buf("A", (32,), "float16"), buf("B", (32,), "float16")
    io = Var("io")
    r = Ramp(io * 16, IntImm(1), 16)
    v = ld(A, r)
    f = build([A, B], loop(io, 2, st(B, r, v * v + Broadcast(FloatImm(0.5, "float16"), 16))))
    a = rng.random(32).astype(np.float16)
    b = np.zeros(32, np.float16)
    f(a, b)
    np.testing.assert_allclose(b.astype(np.float32), (a * a + np.float16(0.5)).astype(np.float32),
                               rtol=2e-3)


def test_let_expression_and_attr_stmt_and_if() -> None:
    A, B = buf("A", (20,), "int32"), buf("B", (20,), "int32")
    i, t = Var("i"), Var("t")
    val = Let(t, ld(A, i) * 2, t + t)
    body = loop(i, 20, AttrStmt("pragma", 1, IfThenElse(
        LT(i, IntImm(10)), st(B, i, val), st(B, i, IntImm(-1)))))
    f = build([A, B], body)
    a = rng.integers(0, 100, 20, dtype=np.int32)
    b = np.zeros(20, np.int32)
    f(a, b)
    np.testing.assert_array_equal(b, np.where(np.arange(20) < 10, 4 * a, -1))


@pytest.mark.parametrize("op", ["add", "mul", "min", "max"])
@pytest.mark.parametrize("dtype", ["float32", "int32", "uint8"])
def test_vector_reduce(op: str, dtype: str) -> None:
    A, B = buf("A", (64,), dtype), buf("B", (4,), dtype)
    io = Var("io")
    r = Ramp(io * 16, IntImm(1), 16)
    f = build([A, B], loop(io, 4, st(B, io, VectorReduce(op, ld(A, r)))))
    a = (rng.random(64) + 0.5).astype(dtype) if dtype == "float32" else _sample(dtype, 64) % 4
    a = a.astype(dtype)
    b = np.zeros(4, dtype)
    f(a, b)
    ref: Any = {"add": np.sum, "mul": np.prod, "min": np.min, "max": np.max}[op]
    want = ref(a.reshape(4, 16), axis=1).astype(dtype)
    if dtype == "float32":
        np.testing.assert_allclose(b, want, rtol=1e-5)
    else:
        np.testing.assert_array_equal(b, want)


def test_unrolled_loop_gets_metadata() -> None:
    A = buf("A", (8,), "int32")
    i = Var("i")
    f = build([A], loop(i, 8, st(A, i, i * i), ForKind.UNROLLED))
    a = np.zeros(8, np.int32)
    f(a)
    np.testing.assert_array_equal(a, np.arange(8) ** 2)
    assert "llvm.loop.unroll.full" in f.get_source("ll-unopt")

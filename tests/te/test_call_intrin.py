"""call_intrin / call_llvm_intrin / call_llvm_pure_intrin / call_pure_extern (TVM's names)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.errors import CodegenError, TecompError
from tecomp.lowering import lower
from tecomp.runtime import interp

N = 16


def _one(dtype: str, fn, in_dtype: str | None = None):  # noqa: ANN001, ANN202
    A = te.placeholder((N,), in_dtype or dtype, name="A")
    B = te.compute((N,), lambda i: fn(A[i]), name="B")
    return A, B


def _run_both(A, B, a: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001
    s = te.create_schedule(B.op)
    f = tc.build(s, [A, B], "llvm")
    out = np.zeros(N, dtype)
    f(a, out)
    ref = np.zeros(N, dtype)
    interp.run(lower(s, [A, B]), a, ref)
    return out, ref


INTS = np.array([0, 1, -1, 2**31 - 1, -(2**31), 255, 7, 1 << 20, 3, 5, -7, 12, 99, 1000, -2, 6],
                "int32")
FLOATS = np.array([0.0, -0.0, 1.5, -2.25, np.inf, -np.inf, np.nan, 1e-40, 3.0, 4.0, 0.5, -7.0,
                   1e30, -1e-30, 2.0, 9.0], "float32")


@pytest.mark.parametrize("name", ["llvm.ctpop", "llvm.ctpop.i32"])
@pytest.mark.parametrize("pure", [True, False])
def test_ctpop_jit_and_interp(name: str, pure: bool) -> None:
    call = tc.tir.call_llvm_pure_intrin if pure else tc.tir.call_llvm_intrin
    A, B = _one("int32", lambda x: call("int32", name, x))
    out, ref = _run_both(A, B, INTS, "int32")
    want = np.array([bin(int(v) & 0xFFFFFFFF).count("1") for v in INTS], "int32")
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(ref, want)


@pytest.mark.parametrize("name,ref", [
    ("llvm.fabs", np.abs), ("llvm.sqrt", np.sqrt), ("llvm.floor.f32", np.floor),
    ("llvm.copysign", None), ("llvm.fma", None),
])
def test_float_intrinsics_jit_and_interp(name: str, ref) -> None:  # noqa: ANN001
    if name == "llvm.copysign":
        fn = lambda x: te.call_llvm_pure_intrin("float32", name, x, tc.tir.const(-1.0, "float32"))  # noqa: E731
        want = np.copysign(FLOATS, np.float32(-1))
    elif name == "llvm.fma":
        fn = lambda x: te.call_llvm_pure_intrin("float32", name, x, x, tc.tir.const(1.0, "float32"))  # noqa: E731
        with np.errstate(over="ignore"):
            want = (FLOATS.astype(np.float64) ** 2 + 1).astype(np.float32)
    else:
        fn = lambda x: te.call_llvm_pure_intrin("float32", name, x)  # noqa: E731
        with np.errstate(invalid="ignore"):
            want = ref(FLOATS)
    A, B = _one("float32", fn)
    with np.errstate(all="ignore"):
        out, r = _run_both(A, B, FLOATS, "float32")
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(r, want)
    # sign of zero kept (fabs(-0) = +0, copysign(0, -1) = -0)
    assert np.array_equal(np.signbit(out), np.signbit(want))


def test_two_overloads_in_one_kernel_and_float64() -> None:
    A = te.placeholder((N,), "int32", name="A")
    D = te.placeholder((N,), "float64", name="D")
    B = te.compute((N,), lambda i: te.call_llvm_intrin("int32", "llvm.ctpop", A[i])
                   + te.call_llvm_intrin("int64", "llvm.ctpop", A[i].astype("int64")).astype("int32"),
                   name="B")
    C = te.compute((N,), lambda i: te.call_llvm_pure_intrin("float64", "llvm.sqrt", D[i]), name="C")
    s = te.create_schedule([B.op, C.op])
    s[B].vectorize(B.op.axis[0])  # an extern call: scalarized, still right
    f = tc.build(s, [A, D, B, C])
    d = np.arange(N, dtype="float64")
    b, c = np.zeros(N, "int32"), np.zeros(N, "float64")
    f(INTS, d, b, c)
    pc32 = np.array([bin(int(v) & 0xFFFFFFFF).count("1") for v in INTS])
    pc64 = np.array([bin(int(v) & (2**64 - 1)).count("1") for v in INTS])
    np.testing.assert_array_equal(b, pc32 + pc64)
    np.testing.assert_array_equal(c, np.sqrt(d))


def test_old_tvm_num_signature_operand_is_dropped() -> None:
    x = te.var("x")
    e = tc.tir.call_llvm_pure_intrin("int32", "llvm.ctpop", tc.tir.const(1, "uint32"), x)
    assert len(e.args) == 1 and e.args[0] is x
    e = tc.tir.call_llvm_pure_intrin("int32", "llvm.ctpop", 1, x)
    assert len(e.args) == 1 and e.args[0] is x
    e = tc.tir.call_llvm_pure_intrin("int32", "llvm.ctpop", x)
    assert len(e.args) == 1


def test_bad_names() -> None:
    with pytest.raises(TecompError, match="not an LLVM intrinsic name"):
        tc.tir.call_llvm_intrin("int32", "ctpop", te.var("x"))
    with pytest.raises(TecompError, match="unknown intrinsic 'tir.nosuch'"):
        tc.tir.call_intrin("float32", "tir.nosuch", te.var("x", "float32"))


@pytest.mark.parametrize("name,args,match", [
    ("llvm.nosuch.thing", 1, "does not know an intrinsic"),
    ("llvm.ctpop", 2, "LLVM"),  # wrong operand count: LLVM asserts/aborts on some such
    ("llvm.x86.avx512.vpdpbusd.512", 1, "LLVM"),  # a 3-operand vector intrinsic called wrongly
])
def test_bad_intrinsic_is_a_codegen_error_not_an_abort(name: str, args: int, match: str) -> None:
    A, B = _one("int32", lambda x: te.call_llvm_intrin("int32", name, *([x] * args)))
    s = te.create_schedule(B.op)
    with pytest.raises(CodegenError, match=match):
        tc.build(s, [A, B], "llvm")


def test_intrinsic_the_cpu_lacks_is_a_codegen_error() -> None:
    # AVX-512 VNNI on a CPU without it: LLVM's "Cannot select" would end the process
    A = te.placeholder((16,), "int32", name="A")

    def body(i):  # noqa: ANN001, ANN202
        v = A[i]
        return te.call_llvm_intrin("int32", "llvm.x86.sse42.crc32.32.32", v, v)

    B = te.compute((16,), body, name="B")
    s = te.create_schedule(B.op)
    with pytest.raises(CodegenError, match="LLVM"):
        tc.build(s, [A, B], "llvm -mcpu=x86-64 -mattr=-sse4.2")


def test_interpreter_refuses_unknown_llvm_intrinsic() -> None:
    A, B = _one("int32", lambda x: te.call_llvm_intrin("int32", "llvm.bitreverse", x))
    s = te.create_schedule(B.op)
    with pytest.raises(TecompError, match="interpreter cannot run the LLVM intrinsic 'llvm.bitreverse'"):
        interp.run(lower(s, [A, B]), INTS, np.zeros(N, "int32"))
    # ... but the CPU runs it
    out = np.zeros(N, "int32")
    tc.build(s, [A, B])(INTS, out)
    want = [int(f"{int(v) & 0xFFFFFFFF:032b}"[::-1], 2) for v in INTS]
    np.testing.assert_array_equal(out.view("uint32"), np.array(want, "uint32"))


@pytest.mark.parametrize("name,expect", [
    ("tir.exp", math.exp), ("exp", math.exp), ("tir.sqrt", math.sqrt), ("tir.fabs", abs),
    ("llvm.sqrt", math.sqrt),
])
def test_call_intrin_generic(name: str, expect) -> None:  # noqa: ANN001
    A, B = _one("float32", lambda x: tc.tir.call_intrin("float32", name, x))
    a = np.linspace(0.25, 4, N).astype("float32")
    out, ref = _run_both(A, B, a, "float32")
    want = np.array([expect(float(v)) for v in a], "float32")
    np.testing.assert_allclose(out, want, rtol=2e-7)
    np.testing.assert_allclose(ref, want, rtol=2e-7)
    assert te.call_intrin is tc.tir.call_intrin


def test_call_intrin_casts_to_dtype_and_fma() -> None:
    x = te.var("x", "float32")
    e = tc.tir.call_intrin("float64", "tir.exp", x)
    assert e.dtype == "float64"
    e = tc.tir.call_intrin("float32", "tir.fma", x, x, 1.0)
    assert e.dtype == "float32" and e.name == "fma"
    e = tc.tir.call_intrin("int32", "tir.call_pure_extern", "my_fn", x)
    assert e.extern and e.name == "my_fn" and len(e.args) == 1


def test_call_pure_extern_with_python_impl() -> None:
    te.register_extern("tecomp_test_twice", lambda v: 2 * v)
    A, B = _one("int32", lambda x: te.call_pure_extern("int32", "tecomp_test_twice", x))
    s = te.create_schedule(B.op)
    ref = np.zeros(N, "int32")
    interp.run(lower(s, [A, B]), INTS, ref)
    np.testing.assert_array_equal(ref, INTS * 2)


def test_gpu_emulator_and_nvptx() -> None:
    A = te.placeholder((64,), "float32", name="A")
    B = te.compute((64,), lambda i: te.call_llvm_pure_intrin("float32", "llvm.fabs", A[i]), name="B")
    s = te.create_schedule(B.op)
    bx, tx = s[B].split(B.op.axis[0], factor=32)
    s[B].bind(bx, te.thread_axis("blockIdx.x"))
    s[B].bind(tx, te.thread_axis("threadIdx.x"))
    f = tc.build(s, [A, B], target="cuda")
    a = np.linspace(-3, 3, 64).astype("float32")
    out = np.zeros(64, "float32")
    f.emulate(a, out)
    np.testing.assert_array_equal(out, np.abs(a))
    C = te.compute((64,), lambda i: te.call_llvm_pure_intrin("float32", "llvm.nvvm.nosuch.f", A[i]),
                   name="C")
    s = te.create_schedule(C.op)
    bx, tx = s[C].split(C.op.axis[0], factor=32)
    s[C].bind(bx, te.thread_axis("blockIdx.x"))
    s[C].bind(tx, te.thread_axis("threadIdx.x"))
    with pytest.raises(TecompError, match="llvm.nvvm.nosuch.f"):
        tc.build(s, [A, C], target="cuda")

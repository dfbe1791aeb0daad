"""Calls inside vectorized loops stay vector code (issue 15).

One extern call used to make `passes.vectorize` give up on the whole loop. Now an overloaded
LLVM intrinsic becomes one vector call (``llvm.fma.v8f32``), a C function is called once
per active lane inside the otherwise vector body, and ``fmod`` (float16/float32) has an
exact vector form instead of ``fmodf`` per lane. Results are checked against numpy and the
interpreter, the IR for the vector calls, and every te math function for libm calls.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.codegen.target import Target
from tecomp.runtime import interp
from tecomp.te.intrin import llvm_equivalent

N = 64


def _vectorized(out: te.Tensor, factor: int = 8) -> te.Schedule:
    s = te.create_schedule(out.op)
    _, xi = s[out].split(out.op.axis[0], factor=factor)
    s[out].vectorize(xi)
    return s


def _called(src: str) -> set[str]:
    return set(re.findall(r"call [^@\n]*@\"?([\w.]+)", src))


def test_issue_repro_stays_vector() -> None:
    A = te.placeholder((N,), name="A")
    B = te.compute((N,), lambda i: te.call_llvm_pure_intrin("float32", "llvm.fma", A[i], A[i], A[i])
                   + te.log1p(A[i]) + te.fmod(A[i], 0.3)
                   + te.call_pure_extern("float32", "expf", A[i]), name="B")
    s = _vectorized(B)
    assert "ramp(" in str(tc.lower(s, [A, B]))  # the loop was widened
    f = tc.build(s, [A, B])
    src = f.get_source()
    calls = _called(src)
    assert "llvm.fma.v8f32" in calls and "llvm.fma.f32" not in calls
    assert "fmodf" not in calls  # fmod's vector form
    assert len(re.findall(r"call [^\n]*@expf\(", src)) == 8  # the C function: once per lane
    a = np.random.default_rng(0).uniform(-0.9, 3.0, N).astype("float32")
    b = np.zeros(N, "float32")
    f(a, b)
    a64 = a.astype("float64")
    want = (a64 * a64 + a64) + np.log1p(a64) + np.fmod(a, np.float32(0.3)) + np.exp(a64)
    np.testing.assert_allclose(b, want.astype("float32"), rtol=2e-6, atol=1e-6)
    r = np.zeros(N, "float32")
    interp.run(tc.lower(s, [A, B]), a, r, externs={"expf": np.exp})
    np.testing.assert_allclose(r, b, rtol=2e-6, atol=1e-6)


_F32 = np.array([1.5, -2.25, 0.0, -0.0, np.inf, -np.inf, np.nan, 3e38, 1e-45, -7.0] * 7,
                "float32")[:N]
_I32 = np.random.default_rng(1).integers(-2**31, 2**31, N, dtype=np.int64).astype("int32")


@pytest.mark.parametrize(("name", "dtype", "nargs", "ref"), [
    ("llvm.fabs", "float32", 1, np.abs),
    ("llvm.fabs.f32", "float32", 1, np.abs),  # a scalar overload suffix is re-derived
    ("llvm.copysign", "float32", 2, np.copysign),
    ("llvm.minnum", "float32", 2, np.fmin),
    ("llvm.maxnum.f64", "float64", 2, np.fmax),
    ("llvm.sqrt", "float64", 1, np.sqrt),
    ("llvm.ctpop", "int32", 1, lambda a: np.array([bin(int(v) & 0xFFFFFFFF).count("1")
                                                     for v in a], "int32")),
    ("llvm.smax", "int32", 2, np.maximum),
])
def test_overloaded_intrinsic_is_one_vector_call(name: str, dtype: str, nargs: int,
                                                 ref: Callable[..., np.ndarray]) -> None:
    A = te.placeholder((N,), dtype, name="A")
    C = te.placeholder((N,), dtype, name="C")
    ops = (lambda i: (A[i],)) if nargs == 1 else (lambda i: (A[i], C[i]))
    B = te.compute((N,), lambda i: te.call_llvm_pure_intrin(dtype, name, *ops(i)), name="B")
    s = _vectorized(B)
    args = [A, B] if nargs == 1 else [A, C, B]
    f = tc.build(s, args)
    base = re.sub(r"\.(f32|f64)$", "", name)
    el = {"float32": "f32", "float64": "f64", "int32": "i32"}[dtype]
    assert f"{base}.v8{el}" in _called(f.get_source())
    if dtype == "int32":
        a, c = _I32, _I32[::-1].copy()
    else:
        a = _F32.astype(dtype)
        c = np.roll(a, 3)
    b = np.zeros(N, dtype)
    ins = [a] if nargs == 1 else [a, c]
    f(*ins, b)
    with np.errstate(invalid="ignore"):
        want = ref(*ins)
    np.testing.assert_array_equal(b, want)
    if "fabs" in name or "copysign" in name:  # the sign of zero and NaN too (minnum's is open)
        np.testing.assert_array_equal(np.signbit(b), np.signbit(want))
    if llvm_equivalent(name) is None:
        return  # the interpreter runs only LLVM intrinsics with a tecomp equivalent
    r = np.zeros(N, dtype)
    with np.errstate(invalid="ignore"):
        interp.run(tc.lower(s, args), *ins, r)
    np.testing.assert_array_equal(r, b)


def test_intrinsic_with_scalar_operands() -> None:
    """Lane-invariant operands: splatted for fma, an immarg (ctlz's i1) stays scalar."""
    A = te.placeholder((N,), name="A")
    I = te.placeholder((N,), "int32", name="I")
    B = te.compute((N,), lambda i: te.call_llvm_pure_intrin("float32", "llvm.fma", A[i], 2.0, 1.0),
                   name="B")
    C = te.compute((N,), lambda i: te.call_llvm_pure_intrin(
        "int32", "llvm.ctlz", I[i], tc.const(0, "bool")), name="C")
    s = te.create_schedule([B.op, C.op])
    for t in (B, C):
        _, xi = s[t].split(t.op.axis[0], factor=8)
        s[t].vectorize(xi)
    f = tc.build(s, [A, I, B, C])
    calls = _called(f.get_source())
    assert {"llvm.fma.v8f32", "llvm.ctlz.v8i32"} <= calls
    a = np.linspace(-3, 3, N, dtype="float32")
    iv = np.arange(1, N + 1, dtype="int32") << 3
    b, c = np.zeros(N, "float32"), np.zeros(N, "int32")
    f(a, iv, b, c)
    np.testing.assert_array_equal(b, a * 2 + 1)
    np.testing.assert_array_equal(c, [32 - int(v).bit_length() for v in iv])


def test_target_intrinsic_without_vector_form_runs_per_lane() -> None:
    """``llvm.x86.bmi.pdep.32`` only takes i32: called once per lane, still correct."""
    tgt = Target.host()
    if "+bmi2" not in tgt.features.split(","):
        pytest.skip("the host has no BMI2")
    A = te.placeholder((N,), "int32", name="A")
    M = te.placeholder((N,), "int32", name="M")
    B = te.compute((N,), lambda i: te.call_llvm_pure_intrin("int32", "llvm.x86.bmi.pdep.32",
                                                            A[i], M[i]), name="B")
    s = _vectorized(B)
    f = tc.build(s, [A, M, B])
    assert "ramp(" in str(tc.lower(s, [A, M, B]))
    rng = np.random.default_rng(3)
    a = rng.integers(0, 2**32, N, dtype=np.uint64).astype("uint32")
    m = rng.integers(0, 2**32, N, dtype=np.uint64).astype("uint32")
    b = np.zeros(N, "int32")
    f(a.view("int32"), m.view("int32"), b)

    def pdep(x: int, mask: int) -> int:
        out, k = 0, 0
        for bit in range(32):
            if mask >> bit & 1:
                out |= (x >> k & 1) << bit
                k += 1
        return out

    np.testing.assert_array_equal(b.view("uint32"), [pdep(int(x), int(y)) for x, y in zip(a, m)])


_COUNT_C = """
static long calls;
float tc_vc_twice(float x) { calls++; return 2.0f * x; }
long tc_vc_calls(void) { return calls; }
void tc_vc_reset(void) { calls = 0; }
"""


@pytest.fixture(scope="module")
def count_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    d = tmp_path_factory.mktemp("vcalls")
    src, lib = Path(d) / "count.c", Path(d) / "libtcvc.so"
    src.write_text(_COUNT_C)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    tc.load_extern_library(str(lib))
    cdll = ctypes.CDLL(str(lib))
    cdll.tc_vc_calls.restype = ctypes.c_long
    return cdll


@pytest.mark.parametrize("n", [64, 60])
def test_extern_per_lane_in_vector_loop(count_lib: ctypes.CDLL, n: int) -> None:
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: te.call_extern("float32", "tc_vc_twice", A[i]) + A[i], name="B")
    s = _vectorized(B)
    f = tc.build(s, [A, B])
    a = np.arange(n, dtype="float32")
    b = np.zeros(n, "float32")
    count_lib.tc_vc_reset()
    f(a, b)
    np.testing.assert_array_equal(b, 3 * a)
    assert count_lib.tc_vc_calls() == n  # every element once, none for lanes past the end
    r = np.zeros(n, "float32")
    interp.run(tc.lower(s, [A, B]), a, r, externs={"tc_vc_twice": lambda x: 2 * x})
    np.testing.assert_array_equal(r, b)


def test_extern_under_lane_mask_calls_active_lanes_only(count_lib: ctypes.CDLL) -> None:
    A = te.placeholder((N,), name="A")
    B = te.compute((N,), lambda i: te.if_then_else(A[i] > 0, te.call_extern(
        "float32", "tc_vc_twice", A[i]), -1.0), name="B")
    s = _vectorized(B)
    f = tc.build(s, [A, B])
    assert "ramp(" in str(tc.lower(s, [A, B]))
    a = np.random.default_rng(5).normal(size=N).astype("float32")
    b = np.zeros(N, "float32")
    count_lib.tc_vc_reset()
    f(a, b)
    np.testing.assert_array_equal(b, np.where(a > 0, 2 * a, -1))
    assert count_lib.tc_vc_calls() == int((a > 0).sum())


# fmod ----------------------------------------------------------------------------------------
def _fmod_kernel(dtype: str, n: int) -> Callable[..., None]:
    A = te.placeholder((n,), dtype, name="A")
    C = te.placeholder((n,), dtype, name="C")
    B = te.compute((n,), lambda i: te.fmod(A[i], C[i]), name="B")
    s = _vectorized(B)
    f = tc.build(s, [A, C, B])
    assert not {"fmod", "fmodf"} & _called(f.get_source())
    return f  # type: ignore[no-any-return]


def _edge_f32() -> np.ndarray:
    u = [0x7FC00000, 0xFFC00000, 0x7FA00001, 0x7F800000, 0xFF800000, 0, 0x80000000, 1,
         0x80000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0xBF800000,
         0x3E99999A, 0x40490FDB, 0xC0800000, 0x40000000, 0x00000003, 0x4B800001]
    return np.array(u, "uint32").view("float32")


_HAS_FMA = "+fma" in Target.host().features.split(",")


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_fmod_vector_exact(dtype: str) -> None:
    if dtype == "float64" and not _HAS_FMA:
        pytest.skip("the float64 vector fmod needs FMA (libm per lane without it)")
    rng = np.random.default_rng(11)
    with np.errstate(all="ignore"):
        edge = _edge_f32().astype(dtype)
    if dtype == "float64":  # float64's own subnormals and extremes
        extra = np.array([1, 0x800FFFFFFFFFFFFF, 0x7FEFFFFFFFFFFFFF, 0x0010000000000000,
                          0x3FF0000000000001], "uint64").view("float64")
        edge = np.concatenate([edge, extra])
    ex, ey = (g.ravel() for g in np.meshgrid(edge, edge))
    nrand = 1 << 14
    width = {"float16": 16, "float32": 32, "float64": 64}[dtype]
    rx = rng.integers(0, 2**width, nrand, dtype=np.uint64).astype(f"uint{width}").view(dtype)
    ry = rng.integers(0, 2**width, nrand, dtype=np.uint64).astype(f"uint{width}").view(dtype)
    with np.errstate(all="ignore"):  # small divisors: the widest exponent gaps
        ry[:512] = np.abs(ry[:512]) * np.asarray(2.0 ** (-10 if width == 16 else -60), dtype)
    # near-multiples: exercise the one-too-large quotient fix-up
    base = rng.uniform(0.1, 10, 2048).astype(dtype)
    k = rng.integers(1, 1 << {"float16": 10, "float32": 20, "float64": 50}[dtype], 2048)
    k = k.astype(dtype)
    with np.errstate(over="ignore"):
        x = np.concatenate([ex, rx, base * k, -base * k]).astype(dtype)
    y = np.concatenate([ey, ry, base, base]).astype(dtype)
    n = len(x) - len(x) % 8
    x, y = x[:n], y[:n]
    f = _fmod_kernel(dtype, n)
    out = np.zeros(n, dtype)
    f(x, y, out)
    with np.errstate(all="ignore"):
        want = np.fmod(x, y)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(out), nan)
    uint = f"uint{width}"
    np.testing.assert_array_equal(out[~nan].view(uint), want[~nan].view(uint))  # exact, -0 too
    if dtype != "float16":  # NaN sign: propagated operand / x86's default NaN, like glibc
        np.testing.assert_array_equal(np.signbit(out[nan]), np.signbit(want[nan]))
    r = np.zeros(n, dtype)
    A = te.placeholder((n,), dtype, name="A")
    C = te.placeholder((n,), dtype, name="C")
    B = te.compute((n,), lambda i: te.fmod(A[i], C[i]), name="B")
    with np.errstate(all="ignore"):
        interp.run(tc.lower(_vectorized(B), [A, C, B]), x, y, r)
    np.testing.assert_array_equal(np.isnan(r), nan)
    np.testing.assert_array_equal(r[~nan].view(uint), out[~nan].view(uint))


def test_ldexp_float64_vector_exact() -> None:
    n = 1 << 14
    A = te.placeholder((n,), "float64", name="A")
    E = te.placeholder((n,), "int32", name="E")
    B = te.compute((n,), lambda i: te.ldexp(A[i], E[i]), name="B")
    s = _vectorized(B)
    f = tc.build(s, [A, E, B])
    assert "ldexp" not in _called(f.get_source())
    rng = np.random.default_rng(2)
    x = rng.integers(0, 2**64, n, dtype=np.uint64).view("float64")
    x[:2000] = rng.integers(0, 2**52, 2000, dtype=np.uint64).view("float64")  # subnormals
    x[2000:2010] = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 5e-324, -5e-324,
                    np.finfo("float64").max, np.finfo("float64").tiny]
    e = rng.integers(-2300, 2300, n).astype("int32")
    e[::3] = rng.integers(-80, 80, len(e[::3]))  # results around the subnormal boundary
    e[2010:2020] = [2**31 - 1, -2**31, 0, 1, -1, 1074, -1074, 2098, -2098, -1075]
    out = np.zeros(n)
    f(x, e, out)
    with np.errstate(all="ignore"):
        want = np.ldexp(x, e)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(out), nan)
    np.testing.assert_array_equal(out[~nan].view("uint64"), want[~nan].view("uint64"))
    np.testing.assert_array_equal(np.signbit(out[nan]), np.signbit(want[nan]))
    r = np.zeros(n)
    with np.errstate(all="ignore"):
        interp.run(tc.lower(s, [A, E, B]), x, e, r)
    np.testing.assert_array_equal(r[~nan].view("uint64"), want[~nan].view("uint64"))


# every te math function in a vectorized loop -------------------------------------------------
_UNARY = ["exp", "exp2", "exp10", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "sin", "cos",
          "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf",
          "sigmoid", "floor", "ceil", "trunc", "round", "nearbyint", "abs", "isnan", "isinf",
          "isfinite"]
_BINARY = ["atan2", "pow", "hypot", "copysign", "nextafter", "fmod", "ldexp"]
# still one libm call per lane: sin/cos/tan only in the branch for finite |x| >= 2^30 (exact
# argument reduction), float64 fmod on a CPU without FMA (the exact vector algorithm needs it)
_PER_LANE = {} if _HAS_FMA else {("float64", "fmod"): "fmod"}
_HUGE_BRANCH = {"sin", "cos", "tan"}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_math_functions_stay_vector(dtype: str) -> None:
    libm = re.compile(r"\bcall[lq]?\s+\*?(\w+)")
    for name in _UNARY + _BINARY:
        A = te.placeholder((N,), dtype, name="A")
        C = te.placeholder((N,), dtype, name="C")

        def body(i: te.Expr) -> te.Expr:
            if name == "ldexp":
                return te.ldexp(A[i], C[i].astype("int32"))
            if name in _BINARY:
                return getattr(te, name)(A[i], C[i])  # type: ignore[no-any-return]
            v = getattr(te, name)(A[i] + C[i])
            return te.if_then_else(v, A[i], C[i]) if v.dtype == "bool" else v  # type: ignore[no-any-return]

        B = te.compute((N,), body, name="B")  # noqa: B023 (compute calls body right away)
        s = _vectorized(B)
        f = tc.build(s, [A, C, B])
        assert "ramp(" in str(tc.lower(s, [A, C, B])), name
        calls = set(libm.findall(f.get_source("asm")))
        allowed = {_PER_LANE.get((dtype, name), "")} | (
            {name, name + "f"} if name in _HUGE_BRANCH else set())
        assert calls <= allowed | {""}, (dtype, name, calls)


def test_gpu_kernels_keep_extern_loops_scalar() -> None:
    """NVPTX codegen has no per-lane calls: on a GPU target the loop stays scalar."""
    import dataclasses

    from tecomp.lowering import lower
    from tecomp.passes.flatten import flatten
    from tecomp.passes.vectorize import vectorize

    A = te.placeholder((N,), name="A")
    B = te.compute((N,), lambda i: te.call_pure_extern("float32", "__nv_expf", A[i]), name="B")
    raw = flatten(lower(_vectorized(B), [A, B], passes=False))
    assert "ramp(" in str(vectorize(raw))
    gpu = dataclasses.replace(raw, attrs={**raw.attrs, "target": Target.parse("cuda -arch=sm_80")})
    assert "ramp(" not in str(vectorize(gpu))


def test_interpreter_calls_a_scalar_python_extern_per_lane() -> None:
    # the vectorizer widens a call of a scalar C function; its Python implementation for the
    # interpreter (te.register_extern) still gets one scalar per call, as the C function does
    import math

    seen: list[type] = []

    def scalar_exp(x: float) -> float:
        seen.append(type(x))
        return math.exp(x)  # math.exp refuses arrays

    te.register_extern("tecomp_test_scalar_exp", scalar_exp)
    A = te.placeholder((20,), name="A")
    B = te.compute((20,), lambda i: te.call_pure_extern("float32", "tecomp_test_scalar_exp", A[i]) + 1,
                   name="B")
    s = te.create_schedule(B.op)
    _, xi = s[B].split(B.op.axis[0], factor=8)
    s[B].vectorize(xi)
    a = np.random.default_rng(0).random(20).astype("float32")
    b = np.zeros(20, "float32")
    interp.run(tc.lower(s, [A, B]), a, b)
    np.testing.assert_allclose(b, np.exp(a) + 1, rtol=1e-6)
    assert seen and all(not issubclass(t, np.ndarray) for t in seen)

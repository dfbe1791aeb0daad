"""TVM's math, bit and division intrinsics in CUDA kernels: the emulator evaluates them with
the interpreter's numpy semantics (compared with numpy here), and the PTX, which calls
libdevice (``__nv_sinhf``, ``__nv_ldexpf``...) or native instructions, assembles with ptxas for
sm_80 and sm_90 without spills. On a real GPU (``gpu`` marker) the device results are also
compared with numpy, to the accuracy libdevice documents (a few ulp).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.codegen.ptxas import ptxas_resources

N = 256
ARCHS = ("sm_80", "sm_90")

FLOAT_FNS: dict[str, tuple[Callable[..., Any], Callable[..., np.ndarray]]] = {
    "exp10": (lambda x, y, k: te.exp10(x), lambda x, y, k: np.power(10.0, x.astype("f8"))),
    "log1p": (lambda x, y, k: te.log1p(x), lambda x, y, k: np.log1p(x)),
    "tan": (lambda x, y, k: te.tan(x), lambda x, y, k: np.tan(x)),
    "sinh": (lambda x, y, k: te.sinh(x), lambda x, y, k: np.sinh(x)),
    "cosh": (lambda x, y, k: te.cosh(x), lambda x, y, k: np.cosh(x)),
    "asin": (lambda x, y, k: te.asin(x), lambda x, y, k: np.arcsin(x)),
    "acos": (lambda x, y, k: te.acos(x), lambda x, y, k: np.arccos(x)),
    "atan": (lambda x, y, k: te.atan(x), lambda x, y, k: np.arctan(x)),
    "asinh": (lambda x, y, k: te.asinh(x), lambda x, y, k: np.arcsinh(x)),
    "acosh": (lambda x, y, k: te.acosh(x), lambda x, y, k: np.arccosh(x)),
    "atanh": (lambda x, y, k: te.atanh(x), lambda x, y, k: np.arctanh(x)),
    "atan2": (lambda x, y, k: te.atan2(x, y), lambda x, y, k: np.arctan2(x, y)),
    "hypot": (lambda x, y, k: te.hypot(x, y), lambda x, y, k: np.hypot(x, y)),
    "copysign": (lambda x, y, k: te.copysign(x, y), lambda x, y, k: np.copysign(x, y)),
    "nextafter": (lambda x, y, k: te.nextafter(x, y), lambda x, y, k: np.nextafter(x, y)),
    "fmod": (lambda x, y, k: te.fmod(x, y), lambda x, y, k: np.fmod(x, y)),
    "ldexp": (lambda x, y, k: te.ldexp(x, k), lambda x, y, k: np.ldexp(x, k)),
    "nearbyint": (lambda x, y, k: te.nearbyint(x), lambda x, y, k: np.rint(x)),
    "isnan": (lambda x, y, k: te.if_then_else(te.isnan(x) | te.isinf(y), tc.const(1, x.dtype),
                                              tc.const(0, x.dtype)),
              lambda x, y, k: (np.isnan(x) | np.isinf(y)).astype(x.dtype)),
}


def _inputs(dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(N) * 2).astype(dtype)
    y = (rng.standard_normal(N) * 2).astype(dtype)
    edges = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40 if dtype == "float32" else 1e-310,
             1.0, -1.0, 0.5]
    x[: len(edges)] = edges
    y[len(edges): 2 * len(edges)] = edges
    k = rng.integers(-300, 300, N).astype("int32")
    return x, y, k


def _gpu_schedule(C: te.Tensor) -> te.Schedule:
    s = te.create_schedule(C.op)
    bx, tx = s[C].split(C.op.axis[0], factor=64)
    s[C].bind(bx, te.thread_axis("blockIdx.x"))
    s[C].bind(tx, te.thread_axis("threadIdx.x"))
    return s


def _build(dtype: str) -> tuple[dict[str, Any], dict[str, Any], list[te.Tensor]]:
    X = te.placeholder((N,), dtype, name="X")
    Y = te.placeholder((N,), dtype, name="Y")
    K = te.placeholder((N,), "int32", name="K")
    kernels, scheds = {}, {}
    for name, (body, _) in FLOAT_FNS.items():
        C = te.compute((N,), (lambda f: lambda i: f(X[i], Y[i], K[i]))(body), name="C")
        text = str(C.op.body)
        args = [t for t in (X, Y, K) if f"{t.name}[" in text] + [C]
        s = _gpu_schedule(C)
        kernels[name] = (tc.build(s, args, target="cuda -arch=sm_80", name=f"k_{name}"), args)
        scheds[name] = s
    return kernels, scheds, [X, Y, K]


def _ins(args: list[te.Tensor], x: np.ndarray, y: np.ndarray, k: np.ndarray) -> list[np.ndarray]:
    by = {"X": x, "Y": y, "K": k}
    return [by[t.name] for t in args[:-1]]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_math_intrinsics_emulate_and_assemble(dtype: str) -> None:
    kernels, scheds, _ = _build(dtype)
    x, y, k = _inputs(dtype)
    for name, (f, args) in kernels.items():
        with np.errstate(all="ignore"):
            want = np.asarray(FLOAT_FNS[name][1](x, y, k)).astype(dtype)
        out = np.full(N, np.nan, dtype)
        f.emulate(*_ins(args, x, y, k), out)
        np.testing.assert_array_equal(np.isnan(out), np.isnan(want), err_msg=name)
        ok = ~np.isnan(want)
        np.testing.assert_allclose(out[ok], want[ok], rtol=1e-6 if dtype == "float32" else 1e-14,
                                   err_msg=name)
        zero = ok & (want == 0)
        np.testing.assert_array_equal(np.signbit(out[zero]), np.signbit(want[zero]), err_msg=name)
    for arch in ARCHS:  # every kernel through ptxas, per arch
        for name, (f, args) in kernels.items():
            ptx = (f if arch == "sm_80" else tc.build(scheds[name], args, target=f"cuda -arch={arch}",
                                                     name=f"k_{name}")).get_source("ptx")
            assert f".target {arch}" in ptx and ".extern .func" not in ptx
            for kernel, r in ptxas_resources(ptx, arch).items():
                assert r.spill_stores == 0 and r.spill_loads == 0, (name, kernel, r)


@pytest.mark.parametrize("dtype", ["int32", "uint32", "int64"])
def test_bit_and_division_intrinsics_emulate_and_assemble(dtype: str) -> None:
    A = te.placeholder((N,), dtype, name="A")
    B = te.placeholder((N,), dtype, name="B")
    bits = np.dtype(dtype).itemsize * 8
    C = te.compute((N,), lambda i: (
        (A[i] & B[i]) ^ (A[i] | 5) ^ ~B[i] ^ (A[i] << (B[i] & (bits - 1))) ^ (A[i] >> 3)
        ^ te.popcount(A[i]) ^ te.clz(B[i]).astype(dtype) ^ te.truncdiv(A[i], B[i])
        ^ te.truncmod(A[i], B[i]) ^ te.ceildiv(A[i], B[i]) ^ te.floormod(A[i], 7)
        ^ te.shift_right(B[i], (A[i] & 0) + (bits + 3))), name="C")  # amount mod bits: 3
    info = np.iinfo(dtype)
    rng = np.random.default_rng(1)
    a = rng.integers(max(info.min, -10**9), min(info.max, 10**9), N, dtype=dtype)
    b = rng.integers(1, 1000, N, dtype=dtype)
    if info.min < 0:
        b[::2] = -b[::2]
    s = _gpu_schedule(C)
    f = tc.build(s, [A, B, C], target="cuda")
    out = np.zeros(N, dtype)
    f.emulate(a, b, out)
    a64, b64 = a.astype(object), b.astype(object)  # exact Python ints

    def wrap(v: Any) -> Any:
        return np.array([int(t) & ((1 << bits) - 1) for t in v], dtype=f"uint{bits}").view(dtype)

    trunc = [abs(p) // abs(q) * (1 if (p < 0) == (q < 0) else -1) for p, q in zip(a64, b64)]
    want = (wrap(a64 & b64) ^ wrap(a64 | 5) ^ wrap([~t for t in b64])
            ^ wrap([p << (int(q) & (bits - 1)) for p, q in zip(a64, b64)]) ^ (a >> 3)
            ^ np.bitwise_count(a.view(f"uint{bits}")).astype(dtype)
            ^ np.array([bits - (int(q) & ((1 << bits) - 1)).bit_length() for q in b64], dtype)
            ^ wrap(trunc) ^ wrap([p - t * q for p, q, t in zip(a64, b64, trunc)])
            ^ wrap([-(-p // q) for p, q in zip(a64, b64)]) ^ wrap(a64 % 7)
            ^ (b >> 3))
    np.testing.assert_array_equal(out, want)
    for arch in ARCHS:
        g = f if arch == "sm_80" else tc.build(s, [A, B, C], target=f"cuda -arch={arch}")
        for r in ptxas_resources(g.get_source("ptx"), arch).values():
            assert r.spill_stores == 0 and r.spill_loads == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_math_intrinsics_on_the_device(dtype: str) -> None:
    kernels, _, _ = _build(dtype)
    x, y, k = _inputs(dtype)
    for name, (f, args) in kernels.items():
        with np.errstate(all="ignore"):
            want = np.asarray(FLOAT_FNS[name][1](x, y, k)).astype(dtype)
        out = np.full(N, np.nan, dtype)
        f(*_ins(args, x, y, k), out)
        np.testing.assert_array_equal(np.isnan(out), np.isnan(want), err_msg=name)
        ok = ~np.isnan(want)
        np.testing.assert_allclose(out[ok], want[ok], rtol=4e-7 if dtype == "float32" else 1e-15,
                                   err_msg=name)

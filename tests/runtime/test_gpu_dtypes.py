"""float16/bfloat16 in cuda kernels: half loads/stores and conversions in the PTX (checked by
ptxas for sm_75/80/90), and the emulator computing in float32 and rounding on store, bit for
bit what the CPU reference (float32 math, one RNE rounding) gives."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tecomp as tc
from tecomp import te

NP = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_kernel_ptx_and_emulation(dtype: str, arch: str) -> None:
    n = 1000  # a partial last block
    A = te.placeholder((n,), dtype, name="A")
    B = te.placeholder((n,), dtype, name="B")
    C = te.compute((n,), lambda i: A[i] * B[i] + A[i] / B[i], name="C")
    D = te.compute((n,), lambda i: C[i].astype("float32"), name="D")
    s = te.create_schedule(D.op)
    for T in (C, D):
        bx, tx = s[T].split(T.op.axis[0], 128)
        s[T].bind(bx, te.thread_axis("blockIdx.x"))
        s[T].bind(tx, te.thread_axis("threadIdx.x"))
    f = tc.build(s, [A, B, C, D], target=f"cuda -arch={arch}")
    ptx = f.get_source("ptx")
    assert "cvt.f32.f16" in ptx or dtype == "bfloat16"
    if dtype == "float16":
        assert "cvt.rn.f16.f32" in ptx
    elif arch != "sm_75":
        assert "cvt.rn.bf16.f32" in ptx  # sm_80+ (before: exact integer rounding)
    assert f.resources is not None  # ptxas accepted it
    rng = np.random.default_rng(0)
    a = rng.standard_normal(n).astype(NP[dtype])
    b = rng.standard_normal(n).astype(NP[dtype])
    b[:4] = [0.0, -0.0, np.inf, np.nan]
    c, d = np.zeros(n, NP[dtype]), np.zeros(n, np.float32)
    f.emulate(a, b, c, d)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    with np.errstate(all="ignore"):
        want = (a32 * b32 + a32 / b32).astype(NP[dtype])
    nan = np.isnan(want.astype(np.float32))
    assert (np.isnan(c.astype(np.float32)) == nan).all()
    assert (c.view(np.uint16)[~nan] == want.view(np.uint16)[~nan]).all()
    np.testing.assert_array_equal(d, c.astype(np.float32))


@pytest.mark.parametrize("dtype, cvt", [("float16", "cvt.rn.f16.f32"), ("bfloat16", "cvt.rn.bf16.f32")])
def test_half_math_is_float32_math_rounded_once_on_store(dtype: str, cvt: str) -> None:
    # libdevice has no 16-bit functions: exp runs in float32 and its result feeds the multiply
    # unrounded, as on the CPU and in the emulator; the only rounding is the store's
    A = te.placeholder((256,), dtype, name="A")
    B = te.compute((256,), lambda i: te.exp(A[i]) * 3.0, name="B")
    s = te.create_schedule(B.op)
    bo, bi = s[B].split(B.op.axis[0], factor=64)
    s[B].bind(bo, te.thread_axis("blockIdx.x"))
    s[B].bind(bi, te.thread_axis("threadIdx.x"))
    f = tc.build(s, [A, B], target="cuda -arch=sm_80")
    assert f.get_source("ptx").count(cvt) == 1
    npd = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    a = np.linspace(-3, 3, 256).astype(npd)
    b = np.zeros(256, npd)
    f.emulate(a, b)
    ref = (np.exp(a.astype(np.float32)) * np.float32(3)).astype(npd)
    np.testing.assert_array_equal(b.astype(np.float32), ref.astype(np.float32))

"""tc.build(..., target="cuda") end to end without a GPU: the lowered kernel emulated against
numpy, its PTX accepted by ptxas for sm_80 and sm_90, and a call that says why it cannot run."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.codegen.ptxas import find_ptxas
from tecomp.errors import TecompError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "te"))
from test_gpu_lowering import simt_gemm, vector_add  # noqa: E402

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas (CUDA toolkit) not installed")
ARCHS = ["sm_80", "sm_90"]


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def test_vector_add_emulates_and_refuses_to_run_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    s, args = vector_add()
    f = tc.build(s, args, target="cuda")
    a, b = _rand(1000), _rand(1000, seed=1)
    c = np.zeros(1000, np.float32)
    f.emulate(a, b, c)
    np.testing.assert_array_equal(c, a + b)
    from tecomp.runtime.cuda import cuda_available

    if not cuda_available()[0]:
        with pytest.raises(TecompError, match=r"emulate\(\*numpy_arrays\)"):
            f(a, b, c)
    monkeypatch.setenv("TECOMP_CUDA_EMULATE", "1")
    c[:] = 0
    f(a, b, c)  # ordinary calls emulate
    np.testing.assert_array_equal(c, a + b)
    with pytest.raises(TypeError, match="argument"):
        f.emulate(a, b)  # the same argument checks as a real call
    with pytest.raises(TypeError, match="argument"):
        f(a, b)


def test_simt_gemm_emulates_against_numpy_for_any_thread_order() -> None:
    s, args = simt_gemm(n=64, tile=16)
    f = tc.build(s, args, target="cuda")
    a, b = _rand(64, 64), _rand(64, 64, seed=1)
    ref = a @ b
    for seed in (0, 1):
        c = np.zeros((64, 64), np.float32)
        f.emulate(a, b, c, seed=seed)
        np.testing.assert_allclose(c, ref, rtol=1e-4, atol=1e-4)


def test_a_missing_barrier_is_a_race(monkeypatch: pytest.MonkeyPatch) -> None:
    # the test-only hook: lower without the thread-sync pass
    from tecomp.passes import pipeline

    monkeypatch.setattr(pipeline, "GPU_PIPELINE", [p for p in pipeline.GPU_PIPELINE if p[0] != "thread_sync"])
    s, args = simt_gemm(n=32, tile=16)
    f = tc.build(s, args, target="cuda")
    assert "syncthreads" not in f.get_source("tir")
    from tecomp.runtime.gpu_race import RaceError

    with pytest.raises(RaceError, match="A_shared|B_shared"):
        f.emulate(_rand(32, 32), _rand(32, 32), np.zeros((32, 32), np.float32))


def test_ragged_tiles_read_out_of_bounds_are_reported() -> None:
    # 40 is not a multiple of the 16-wide tile: the shared loads are guarded by the lowering,
    # and the result is exact; the emulator checks every access on the way
    s, args = simt_gemm(n=40, tile=16)
    f = tc.build(s, args, target="cuda")
    a, b = _rand(40, 40), _rand(40, 40, seed=2)
    c = np.zeros((40, 40), np.float32)
    f.emulate(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS)
def test_ptx_of_the_simt_gemm_passes_ptxas(arch: str) -> None:
    s, args = simt_gemm(n=256, tile=16)
    f = tc.build(s, args, target=f"cuda -arch={arch}")
    ptx = f.get_source("ptx")
    assert f".target {arch}" in ptx and ".extern .func llvm." not in ptx and "bar.sync" in ptx
    r = f.resources
    assert r is not None and r.registers > 0 and r.spill_stores == 0 and r.spill_loads == 0
    assert r.shared_bytes == 2 * 16 * 16 * 4  # the two tiles, nothing else


@needs_ptxas
def test_elementwise_math_through_libdevice() -> None:
    n = 300
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: te.exp(A[i]) * te.tanh(A[i]) + te.sqrt(te.abs(A[i])), name="B")
    s = te.create_schedule(B.op)
    xo, xi = s[B].split(B.op.axis[0], factor=64)
    s[B].bind(xo, te.thread_axis("blockIdx.x"))
    s[B].bind(xi, te.thread_axis("threadIdx.x"))
    f = tc.build(s, [A, B], target="cuda")
    a = _rand(n)
    b = np.zeros(n, np.float32)
    f.emulate(a, b)
    np.testing.assert_allclose(b, np.exp(a) * np.tanh(a) + np.sqrt(np.abs(a)), rtol=1e-5, atol=1e-6)
    assert f.resources is not None and f.resources.spill_stores == 0

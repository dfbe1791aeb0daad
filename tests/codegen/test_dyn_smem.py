"""Dynamic shared memory (tecomp/codegen/gpu_shared.py): a kernel whose shared memory exceeds the
static 48 KiB puts every shared buffer at a 16-byte aligned offset of one
``extern .shared .align 16 .b8 __tecomp_dyn_smem[]``, up to the arch's opt-in maximum (163 KiB
on sm_80, 227 KiB on sm_90); its launch passes the size as ``sharedMemBytes``. Checked here
without a GPU: the emulator against numpy, ptxas for sm_80 and sm_90, the launch plan and the
tuner's launch filter. The runtime's opt-in and the manifest: tests/runtime/test_dyn_smem_runtime.py.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import tecomp as tc
import tuning
from tecomp import te
from tecomp.codegen.gpu_shared import (
    DYNAMIC_SHARED_SYMBOL,
    dynamic_shared_bytes,
    shared_bytes,
    static_shared_bytes,
)
from tecomp.codegen.llvm_nvptx import CodegenNVPTX, emit_ptx
from tecomp.codegen.ptxas import find_ptxas, ptxas_resources
from tecomp.codegen.target import Target
from tecomp.errors import CodegenError, LoweringError, ScheduleError
from tecomp.ir import Allocate, Buffer, BufferStore, Expr, For, ForKind, IfThenElse, PrimFunc, Var, seq
from tecomp.ir.expr import BufferLoad, FloatImm, IntImm, Ramp
from tecomp.ir.stmt import barrier
from tecomp.runtime.gpu_emulator import emulate
from tuning.gpu_measure import gpu_build_job, launch_problems, ptxas_problems
from tuning.gpu_tensor_core import TensorCoreStep, tc_shared_bytes, tensor_core_gemm_schedule
from tuning.measure import MeasureErrorNo
from tuning.task import SearchTask

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas (CUDA toolkit) not found")
ARCHS = ["sm_80", "sm_90"]
KIB = 1024


# a copy kernel through shared memory, built by hand (docs/gpu-ir.md) -----------------------------

def _f32(name: str, n: int, scope: str = "global") -> Buffer:
    return Buffer(name, (IntImm(n),), "float32", scope=scope)


def _loop(v: Var, extent: int, body: Any, tag: str | None = None) -> For:
    if tag is None:
        return For(v, IntImm(0), IntImm(extent), ForKind.SERIAL, body)
    return For(v, IntImm(0), IntImm(extent), ForKind.THREAD_BINDING, body, (("thread_tag", tag),))


def reverse_kernel(nbytes: int, arch: str = "sm_80", threads: int = 256, small: bool = True) -> PrimFunc:
    """``B = A[::-1]`` for ``nbytes`` of float32 staged in one shared buffer with float4 copies
    (each thread 4 elements per step), plus (``small``) a 3-element shared buffer of zeros
    allocated first and added to every element (12 bytes, so the big one sits at offset 16:
    the alignment of the float4 accesses must survive it)."""
    n = nbytes // 4
    assert n % (4 * threads) == 0
    A, B = _f32("A", n), _f32("B", n)
    big, zeros = _f32("big", n, "shared"), _f32("zeros", 3, "shared")
    tx, k = Var("tx"), Var("k")
    steps = n // (4 * threads)

    def vec(i: Expr) -> Ramp:
        return Ramp(i, IntImm(1), 4)

    first = (k * threads + tx) * 4
    value: Expr = BufferLoad(big, ((n - 1) - (k * threads + tx),))
    if small:
        value = value + BufferLoad(zeros, (tx % 3,))
    body = seq(
        _loop(k, steps, BufferStore(big, BufferLoad(A, (vec(first),)), (vec(first),))),
        *([IfThenElse(tx < 3, BufferStore(zeros, FloatImm(0.0), (tx,)))] if small else []),
        barrier(),
        # B[i] = big[n - 1 - i] (+ zeros[i % 3]), scalar (a reversed float4 would be a shuffle)
        _loop(k, n // threads, BufferStore(B, value, (k * threads + tx,))),
    )
    root = Allocate(big, _loop(tx, threads, body, "threadIdx.x"))
    if small:
        root = Allocate(zeros, root)
    return PrimFunc("reverse", [A, B], root, [],
                    {"launch": {"threadIdx.x": IntImm(threads)}, "target": Target.parse(f"cuda -arch={arch}")})


def _ptx(f: PrimFunc, arch: str) -> tuple[CodegenNVPTX, str]:
    cg = CodegenNVPTX(Target.parse(f"cuda -arch={arch}"))
    cg.add_function(f)
    return cg, emit_ptx(cg.module, cg.target)


def _run_reverse(f: PrimFunc, nbytes: int) -> None:
    a = np.random.default_rng(0).standard_normal(nbytes // 4).astype("float32")
    b = np.zeros_like(a)
    emulate(f, a, b)
    np.testing.assert_array_equal(b, a[::-1])


@pytest.mark.parametrize("arch", ARCHS)
def test_a_96_kib_kernel_uses_the_dynamic_area(arch: str) -> None:
    f = reverse_kernel(96 * KIB, arch)
    total = 96 * KIB + 16  # the 12-byte buffer takes 16
    assert (shared_bytes(f), dynamic_shared_bytes(f), static_shared_bytes(f)) == (total, total, 0)
    cg, ptx = _ptx(f, arch)
    info = cg.kernels["reverse"]
    assert (info.shared_bytes, info.dynamic_shared_bytes) == (0, total)
    assert f".extern .shared .align 16 .b8 {DYNAMIC_SHARED_SYMBOL}[];" in ptx
    assert not re.search(r"^\s*\.shared\b", ptx, re.M)  # no static shared array
    assert re.search(r"st\.shared\.v4\.[bf]32", ptx), "the float4 stores kept their alignment"
    _run_reverse(f, 96 * KIB)


@needs_ptxas
@pytest.mark.parametrize("arch", ARCHS)
def test_ptxas_assembles_the_96_kib_kernel(arch: str) -> None:
    _, ptx = _ptx(reverse_kernel(96 * KIB, arch), arch)
    r = ptxas_resources(ptx, arch)["reverse"]
    assert r.shared_bytes == 0 and not r.spills and r.registers > 0  # dynamic: not in "smem"


@pytest.mark.parametrize("arch", ARCHS)
def test_a_kernel_under_48_kib_stays_static(arch: str) -> None:
    f = reverse_kernel(32 * KIB, arch)
    cg, ptx = _ptx(f, arch)
    info = cg.kernels["reverse"]
    assert (info.shared_bytes, info.dynamic_shared_bytes) == (32 * KIB + 16, 0)
    assert dynamic_shared_bytes(f) == 0 and DYNAMIC_SHARED_SYMBOL not in ptx
    if find_ptxas() is not None:
        assert ptxas_resources(ptx, arch)["reverse"].shared_bytes == 32 * KIB + 16
    _run_reverse(f, 32 * KIB)


def test_exactly_48_kib_is_static_and_one_more_granule_is_dynamic() -> None:
    at = reverse_kernel(48 * KIB, small=False)  # 49152 bytes exactly: static
    assert (shared_bytes(at), dynamic_shared_bytes(at), static_shared_bytes(at)) == (48 * KIB, 0, 48 * KIB)
    over = reverse_kernel(48 * KIB)  # + the small buffer's 16
    assert (dynamic_shared_bytes(over), static_shared_bytes(over)) == (48 * KIB + 16, 0)
    for f in (at, over):
        _run_reverse(f, 48 * KIB)


def test_the_opt_in_maximum_of_each_arch() -> None:
    # 200 KiB: fine on sm_90 (227 KiB = 232448 B), not on sm_80 (163 KiB = 166912 B)
    cg, _ = _ptx(reverse_kernel(200 * KIB, "sm_90"), "sm_90")
    assert cg.kernels["reverse"].dynamic_shared_bytes == 200 * KIB + 16
    with pytest.raises(CodegenError, match=r"declares 204816 bytes of shared memory .*sm_80 allows "
                                           r"166912 bytes per block \(49152 static"):
        _ptx(reverse_kernel(200 * KIB, "sm_80"), "sm_80")
    with pytest.raises(CodegenError, match="sm_90 allows 232448 bytes per block"):
        _ptx(reverse_kernel(228 * KIB, "sm_90"), "sm_90")
    assert (Target.parse("cuda -arch=sm_80").gpu.max_dynamic_smem,
            Target.parse("cuda -arch=sm_90").gpu.max_dynamic_smem) == (166912, 232448)


def test_lowering_accepts_up_to_the_opt_in_maximum() -> None:
    """Lowering's check (before pipelining: one slot per shared stage) takes a kernel over
    48 KiB up to the arch's maximum, and refuses one past it naming both limits."""
    def lower(kstep: int, arch: str) -> PrimFunc:
        s, args = tensor_core_gemm_schedule(256, 256, 256, block=(256, 256), warps=(4, 4),
                                            kstep=kstep)
        return tc.lower(s, args, target=f"cuda -arch={arch}")

    f = lower(128, "sm_80")  # (256 x 128 + 128 x 256) fp16: 128 KiB
    assert dynamic_shared_bytes(f) == 128 * KIB
    with pytest.raises((ScheduleError, LoweringError),
                       match=r"262144 bytes of shared memory .* exceed the 232448 bytes a block may "
                             r"use on sm_90 \(49152 static"):
        lower(256, "sm_90")


# a pipelined tensor-core GEMM over 48 KiB ----------------------------------------------------------

TC_BLOCK, TC_KSTEP, TC_DEPTH = (256, 128), 32, 4  # 4 slots of (256 x 32 + 32 x 128) fp16: 96 KiB


@pytest.fixture(scope="module")
def tc_gemm() -> dict[str, Any]:
    m, n, k = 256, 128, 128
    out: dict[str, Any] = {"shape": (m, n, k)}
    for arch in ARCHS:
        s, args = tensor_core_gemm_schedule(m, n, k, block=TC_BLOCK, warps=(4, 2), kstep=TC_KSTEP,
                                            depth=TC_DEPTH)
        out[arch] = tc.build(s, args, target=f"cuda -arch={arch}")
    return out


def test_tensor_core_gemm_with_96_kib_of_shared_memory(tc_gemm: dict[str, Any]) -> None:
    smem = tc_shared_bytes(TC_BLOCK, TC_KSTEP, TC_DEPTH, 0)
    assert smem == 96 * KIB
    m, n, k = tc_gemm["shape"]
    for arch in ARCHS:
        f = tc_gemm[arch]
        (fn,) = f._functions.values()
        assert [kl.shared_mem for kl in fn.plan.kernels] == [smem]  # what the launch passes
        ptx = f.get_source("ptx")
        assert f".extern .shared .align 16 .b8 {DYNAMIC_SHARED_SYMBOL}[];" in ptx
        assert "cp.async.cg.shared.global" in ptx and "ldmatrix.sync.aligned" in ptx
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k)).astype("float16")
    b = rng.standard_normal((k, n)).astype("float16")
    c = np.zeros((m, n), "float32")
    tc_gemm["sm_90"].emulate(a, b, c)
    np.testing.assert_allclose(c, a.astype("float32") @ b.astype("float32"), rtol=1e-4, atol=1e-3)


@needs_ptxas
def test_ptxas_assembles_the_tensor_core_gemm(tc_gemm: dict[str, Any]) -> None:
    for arch in ARCHS:
        r = tc_gemm[arch].resources
        assert r.shared_bytes == 0 and not r.spills and 0 < r.registers <= 255, (arch, r)


# the tuner's launch filter -----------------------------------------------------------------------

@tuning.register_workload
def dyn_smem_matmul_tc(m: int, n: int, k: int) -> list[te.Tensor]:
    A = te.placeholder((m, k), "float16", name="A")
    B = te.placeholder((k, n), "float16", name="B")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r].astype("float32") * B[r, j].astype("float32"),
                                               axis=r), name="C")
    return [A, B, C]


SM90 = "cuda -arch=sm_90"
STEP_114K = TensorCoreStep("C", 256, 128, 4, 2, 32, 4, 8)  # 4 padded slots: 116736 B
STEP_256K = TensorCoreStep("C", 256, 256, 4, 4, 64, 4, 0)  # 4 slots of 64 KiB: 262144 B


def test_launch_filter_accepts_up_to_the_opt_in_maximum() -> None:
    assert tc_shared_bytes((256, 128), 32, 4, 8) == 116736
    assert tc_shared_bytes((256, 256), 64, 4, 0) == 262144
    task = SearchTask(dyn_smem_matmul_tc, (256, 256, 256), target=SM90)
    tgt = Target.parse(SM90)
    sch, args = task.apply_steps((STEP_114K,))
    assert launch_problems(sch, args, tgt) == []
    assert launch_problems(sch, args, Target.parse("cuda -arch=sm_80")) == []  # 114 KiB < 163 KiB
    sch, args = task.apply_steps((STEP_256K,))
    (why,) = launch_problems(sch, args, tgt)
    assert why.startswith("kernel of C: 262144 bytes of shared memory exceed the 232448 bytes")


def test_ptxas_filter_counts_the_dynamic_part() -> None:
    tgt = Target.parse(SM90)

    def k(static: int, dynamic: int) -> dict[str, dict[str, int]]:
        return {"k": {"threads": 256, "registers": 64, "shared_bytes": static,
                      "dynamic_shared_bytes": dynamic}}

    assert ptxas_problems(k(0, 100 * KIB), tgt, False) == []
    assert ptxas_problems(k(48 * KIB, 0), tgt, False) == []
    (why,) = ptxas_problems(k(0, 240 * KIB), tgt, False)
    assert "245760 bytes of shared memory (0 static, 245760 dynamic) exceed the 232448" in why
    (why,) = ptxas_problems(k(49 * KIB, 0), tgt, False)
    assert "50176 bytes of static shared memory exceed 49152" in why


def test_a_candidate_over_the_maximum_is_a_resource_limit_and_one_under_builds() -> None:
    task = SearchTask(dyn_smem_matmul_tc, (256, 256, 256), target=SM90)
    over = gpu_build_job(task, (STEP_256K,), "over")
    assert over.artifact is None and over.error == MeasureErrorNo.RESOURCE_LIMIT
    assert over.error_msg.startswith("cannot launch: kernel of C: 262144 bytes of shared memory exceed")
    ok = gpu_build_job(task, (STEP_114K,), "ok")
    assert ok.error == MeasureErrorNo.NO_ERROR, ok.error_msg
    (kern,) = ok.info["kernels"].values()
    assert kern["dynamic_shared_bytes"] == 116736
    if find_ptxas() is not None:
        assert kern["shared_bytes"] == 0  # ptxas's static count

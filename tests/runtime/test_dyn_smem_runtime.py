"""Launching kernels with dynamic shared memory (tecomp/runtime/cuda.py) without a GPU: a
stand-in ``cuda.bindings.driver`` records the calls, so the launch path is checked for what it
asks the driver: above 48 KiB ``cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)`` once per
function before the first launch, ``sharedMemBytes`` on every ``cuLaunchKernel``, a clear error
past the device's opt-in maximum. A built function and the same function exported and loaded
again (the manifest's ``dynamic_shared_bytes``) launch with the size codegen put in the dynamic
area. The ``gpu`` test runs such a kernel on a real device."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tecomp as tc
from tecomp.errors import TecompError
from tecomp.runtime import cuda
from tecomp.runtime.args import ParamSpec
from tecomp.runtime.loader import load_module
from tuning.gpu_tensor_core import tc_shared_bytes, tensor_core_gemm_schedule

KIB = 1024
OPTIN = {"sm_80": 166912, "sm_90": 232448}
DYN_ATTR = "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES"


class _CUresult(IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1


class _Names:
    """An enum namespace whose members are their own names (``a.CU_X == "CU_X"``)."""

    def __getattr__(self, name: str) -> str:
        if name.startswith("CU_"):
            return name
        raise AttributeError(name)


class FakeDriver(types.ModuleType):
    """Enough of ``cuda.bindings.driver`` for one device (``arch``), recording each call."""

    def __init__(self, arch: str = "sm_90") -> None:
        super().__init__("cuda.bindings.driver")
        self.calls: list[tuple[Any, ...]] = []
        self.CUresult = _CUresult
        self.CUdevice_attribute = _Names()
        self.CUfunction_attribute = _Names()
        major, minor = int(arch[3]), int(arch[4])
        self.attrs = {
            "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR": major,
            "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR": minor,
            "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK": 1024,
            "CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X": 1024, "CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y": 1024,
            "CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z": 64,
            "CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X": 2**31 - 1, "CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y": 65535,
            "CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z": 65535,
            "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK": 48 * KIB,
            "CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": OPTIN[arch],
            "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT": 132,
        }
        self._next_ptr = 0x7F0000000000
        ok = _CUresult.CUDA_SUCCESS
        simple = {
            "cuInit": lambda flags: (ok,),
            "cuDeviceGetCount": lambda: (ok, 1),
            "cuDeviceGet": lambda ordinal: (ok, ordinal),
            "cuDeviceGetName": lambda n, dev: (ok, b"Fake GPU\0"),
            "cuDriverGetVersion": lambda: (ok, 13000),
            "cuDevicePrimaryCtxRetain": lambda dev: (ok, "ctx"),
            "cuCtxPushCurrent": lambda ctx: (ok,),
            "cuCtxPopCurrent": lambda: (ok, "ctx"),
            "cuModuleLoadData": lambda image: (ok, "module"),
            "cuModuleUnload": lambda mod: (ok,),
            "cuMemcpyHtoD": lambda dst, src, n: (ok,),
            "cuMemcpyDtoH": lambda dst, src, n: (ok,),
            "cuMemFree": lambda p: (ok,),
            "cuStreamSynchronize": lambda stream: (ok,),
            "cuGetErrorString": lambda code: (ok, b"fake error"),
        }
        for name, fn in simple.items():
            setattr(self, name, fn)

    def cuDeviceGetAttribute(self, attr: str, dev: int) -> tuple[Any, int]:  # noqa: N802
        return _CUresult.CUDA_SUCCESS, self.attrs[attr]

    def cuModuleGetFunction(self, mod: Any, name: bytes) -> tuple[Any, Any]:  # noqa: N802
        return _CUresult.CUDA_SUCCESS, ("function", name.decode())

    def cuMemAlloc(self, n: int) -> tuple[Any, int]:  # noqa: N802
        self._next_ptr += -(-n // 256) * 256 + 256
        return _CUresult.CUDA_SUCCESS, self._next_ptr

    def cuFuncSetAttribute(self, fn: Any, attr: str, value: int) -> tuple[Any]:  # noqa: N802
        self.calls.append(("cuFuncSetAttribute", fn[1], attr, value))
        return (_CUresult.CUDA_SUCCESS,)

    def cuLaunchKernel(self, fn: Any, gx: int, gy: int, gz: int, bx: int, by: int, bz: int,  # noqa: N802
                       smem: int, stream: Any, params: Any, extra: Any) -> tuple[Any]:
        self.calls.append(("cuLaunchKernel", fn[1], (gx, gy, gz), (bx, by, bz), smem))
        return (_CUresult.CUDA_SUCCESS,)

    def launches(self) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == "cuLaunchKernel"]

    def opt_ins(self) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == "cuFuncSetAttribute"]


def _install(monkeypatch: pytest.MonkeyPatch, arch: str) -> FakeDriver:
    drv = FakeDriver(arch)
    pkg = types.ModuleType("cuda.bindings")
    pkg.driver = drv  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cuda.bindings", pkg)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", drv)
    cuda._reset_for_tests()
    return drv


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDriver]:
    drv = _install(monkeypatch, "sm_90")
    yield drv
    cuda._reset_for_tests()


@pytest.fixture
def fake_sm80(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDriver]:
    drv = _install(monkeypatch, "sm_80")
    yield drv
    cuda._reset_for_tests()


COPY_PARAMS = [ParamSpec("A", "float32", ("n",)), ParamSpec("B", "float32", ("n",), output=True)]
COPY_LAUNCH: dict[str, int | str] = {"blockIdx.x": "(n + 255) // 256", "threadIdx.x": 256}


def _kernel(shared_mem: int, name: str = "copy") -> cuda.CudaKernel:
    return cuda.CudaModule(".version 7.0\n").kernel(name, COPY_PARAMS, ["n"], COPY_LAUNCH,
                                                    shared_mem=shared_mem)


def test_above_48_kib_the_function_opts_in_once_before_its_first_launch(fake: FakeDriver) -> None:
    k = _kernel(96 * KIB)
    a = np.zeros(1000, "float32")
    k(a, np.empty_like(a))
    k(a, np.empty_like(a))
    assert [c[0] for c in fake.calls] == ["cuFuncSetAttribute", "cuLaunchKernel", "cuLaunchKernel"]
    assert fake.opt_ins() == [("cuFuncSetAttribute", "copy", DYN_ATTR, 96 * KIB)]
    assert [c[4] for c in fake.launches()] == [96 * KIB, 96 * KIB]  # sharedMemBytes
    assert fake.launches()[0][2:4] == ((4, 1, 1), (256, 1, 1))


def test_another_kernel_object_of_the_function_keeps_the_larger_opt_in(fake: FakeDriver) -> None:
    mod = cuda.CudaModule(".version 7.0\n")
    big = mod.kernel("copy", COPY_PARAMS, ["n"], COPY_LAUNCH, shared_mem=200 * KIB)
    small = mod.kernel("copy", COPY_PARAMS, ["n"], COPY_LAUNCH, shared_mem=64 * KIB)
    a = np.zeros(10, "float32")
    big(a, np.empty_like(a))
    small(a, np.empty_like(a))  # 200 KiB covers it: no call that would shrink the opt-in
    big(a, np.empty_like(a))
    assert [c[3] for c in fake.opt_ins()] == [200 * KIB]
    assert [c[4] for c in fake.launches()] == [200 * KIB, 64 * KIB, 200 * KIB]


@pytest.mark.parametrize("smem", [0, 40 * KIB, 48 * KIB])
def test_up_to_48_kib_no_opt_in(fake: FakeDriver, smem: int) -> None:
    a = np.zeros(10, "float32")
    _kernel(smem)(a, np.empty_like(a))
    assert fake.opt_ins() == [] and [c[4] for c in fake.launches()] == [smem]


def test_past_the_opt_in_maximum_is_a_clear_error(fake_sm80: FakeDriver) -> None:
    a = np.zeros(10, "float32")
    with pytest.raises(TecompError) as e:
        _kernel(200 * KIB, "too_big")(a, np.empty_like(a))
    msg = str(e.value)
    assert "kernel too_big" in msg and "sm_80" in msg
    assert "204800 B of dynamic shared memory" in msg and "166912 B per block" in msg
    assert fake_sm80.calls == []  # nothing opted in, nothing launched


# a built tensor-core GEMM with 96 KiB, and the same exported and loaded ---------------------------

M, N, K = 256, 128, 64
SMEM = tc_shared_bytes((256, 128), 32, 4, 0)  # 4 slots of 24 KiB


@pytest.fixture(scope="module")
def gemm() -> Any:
    s, args = tensor_core_gemm_schedule(M, N, K, block=(256, 128), warps=(4, 2), kstep=32, depth=4)
    return tc.build(s, args, target="cuda -arch=sm_80", name="gemm96")  # runs on sm_80+


def _gemm_args() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal((M, K)).astype("float16"), rng.standard_normal((K, N)).astype("float16"),
            np.zeros((M, N), "float32")]


def test_a_built_function_launches_with_its_dynamic_shared_memory(fake: FakeDriver, gemm: Any) -> None:
    assert SMEM == 96 * KIB
    gemm["gemm96"](*_gemm_args())
    assert fake.opt_ins() == [("cuFuncSetAttribute", "gemm96", DYN_ATTR, SMEM)]
    ((_, name, grid, block, smem),) = fake.launches()
    assert (name, grid, block, smem) == ("gemm96", (1, 1, 1), (32, 4, 2), SMEM)


def test_the_manifest_round_trip_keeps_the_size(fake: FakeDriver, gemm: Any, tmp_path: Path) -> None:
    files = gemm.export_library(tmp_path / "lib.so")
    man = json.loads(files.manifest.read_text())
    (entry,) = [k for k in man["kernels"] if k["name"] == "gemm96"]
    (launch,) = entry["launches"]
    assert (launch["shared_bytes"], launch["dynamic_shared_bytes"]) == (0, SMEM)
    for b in man["cuda"]["cubins"]:  # ptxas: nothing static
        assert b["resources"]["gemm96"]["shared_bytes"] == 0
    assert f"{SMEM} B dynamic" in files.header.read_text()
    lib = load_module(files.library)
    f = lib["gemm96"]
    assert [k.shared_mem for k in f.plan.kernels] == [SMEM]  # type: ignore[attr-defined]
    f(*_gemm_args())
    assert fake.opt_ins() == [("cuFuncSetAttribute", "gemm96", DYN_ATTR, SMEM)]
    assert [c[4] for c in fake.launches()] == [SMEM]


@pytest.mark.gpu
def test_gpu_gemm_with_96_kib_of_shared_memory(gemm: Any) -> None:
    a, b, c = _gemm_args()
    gemm["gemm96"](a, b, c)
    np.testing.assert_allclose(c, a.astype("float32") @ b.astype("float32"), rtol=1e-3, atol=1e-2)

"""CUDA runtime (tecomp/runtime/cuda.py).

Without a GPU (always run): the "no cuda-bindings / no driver / no device" errors, argument
conversion for host arrays, ``__cuda_array_interface__`` and DLPack objects (same checks and
texts as CPU calls), launch shapes, and, when gcc and cuda-bindings are here, the whole driver
path against a stand-in libcuda (tests/runtime/fake_libcuda.c) in a subprocess.
With a GPU (``-m gpu``, skipped otherwise with cuda_available()'s reason): hand-written and
llvmlite-generated PTX, a cubin, dynamic shared memory, device arrays, time_evaluator.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import types
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tecomp.errors import TecompError
from tecomp.runtime import cuda
from tecomp.runtime.args import ArgChecker, KernelSpec, ParamSpec
from tecomp.runtime.cpu import BenchmarkResult

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# B[i] = A[i] + 1 (i < n); reverse_blocks: each block of T threads reverses its T elements
# through T * 4 bytes of dynamic shared memory. Both checked by ptxas below.
PTX = r"""
.version 7.0
.target sm_75
.address_size 64

.visible .entry add_one(.param .u64 pA, .param .u64 pB, .param .u64 pn)
{
    .reg .pred %p;
    .reg .b32 %r<4>;
    .reg .b64 %rd<8>;
    .reg .f32 %f<3>;
    ld.param.u64 %rd1, [pA];
    ld.param.u64 %rd2, [pB];
    ld.param.u64 %rd3, [pn];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.s64 %rd4, %rd4, %rd5;
    setp.ge.s64 %p, %rd4, %rd3;
    @%p bra DONE;
    shl.b64 %rd4, %rd4, 2;
    cvta.to.global.u64 %rd6, %rd1;
    cvta.to.global.u64 %rd7, %rd2;
    add.s64 %rd6, %rd6, %rd4;
    add.s64 %rd7, %rd7, %rd4;
    ld.global.f32 %f1, [%rd6];
    add.f32 %f2, %f1, 0f3F800000;
    st.global.f32 [%rd7], %f2;
DONE:
    ret;
}

.extern .shared .align 4 .b8 dyn_smem[];

.visible .entry reverse_blocks(.param .u64 pA, .param .u64 pB, .param .u64 pn)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    .reg .f32 %f1;
    ld.param.u64 %rd1, [pA];
    ld.param.u64 %rd2, [pB];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mul.wide.u32 %rd3, %r1, %r2;
    cvt.u64.u32 %rd4, %r3;
    add.s64 %rd5, %rd3, %rd4;
    shl.b64 %rd5, %rd5, 2;
    cvta.to.global.u64 %rd6, %rd1;
    add.s64 %rd6, %rd6, %rd5;
    ld.global.f32 %f1, [%rd6];
    mov.u32 %r4, dyn_smem;
    shl.b32 %r5, %r3, 2;
    add.u32 %r6, %r4, %r5;
    st.shared.f32 [%r6], %f1;
    bar.sync 0;
    sub.u32 %r7, %r2, %r3;
    sub.u32 %r7, %r7, 1;
    shl.b32 %r7, %r7, 2;
    add.u32 %r7, %r4, %r7;
    ld.shared.f32 %f1, [%r7];
    cvta.to.global.u64 %rd7, %rd2;
    add.s64 %rd7, %rd7, %rd5;
    st.global.f32 [%rd7], %f1;
    ret;
}
"""

# the same add_one, from LLVM IR through llvmlite's NVPTX backend
ADD_ONE_LL = r"""
target triple = "nvptx64-nvidia-cuda"
target datalayout = "e-i64:64-i128:128-v16:16-v32:32-n16:32:64"
declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
declare i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
define ptx_kernel void @add_one(ptr %A, ptr %B, i64 %n) {
entry:
  %t = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %c = call i32 @llvm.nvvm.read.ptx.sreg.ctaid.x()
  %d = call i32 @llvm.nvvm.read.ptx.sreg.ntid.x()
  %t64 = zext i32 %t to i64
  %c64 = zext i32 %c to i64
  %d64 = zext i32 %d to i64
  %m = mul i64 %c64, %d64
  %i = add i64 %m, %t64
  %in = icmp slt i64 %i, %n
  br i1 %in, label %body, label %done
body:
  %pa = getelementptr float, ptr %A, i64 %i
  %pb = getelementptr float, ptr %B, i64 %i
  %x = load float, ptr %pa
  %y = fadd float %x, 1.0
  store float %y, ptr %pb
  br label %done
done:
  ret void
}
"""

ADD_ONE_PARAMS = [ParamSpec("A", "float32", ("n",)), ParamSpec("B", "float32", ("n",), output=True)]
ADD_ONE_LAUNCH: dict[str, int | str] = {"blockIdx.x": "(n + 127) // 128", "threadIdx.x": 128}


def llvm_ptx(arch: str = "sm_80") -> str:
    import llvmlite.binding as llvm

    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    mod = llvm.parse_assembly(ADD_ONE_LL)
    mod.verify()
    tm = llvm.Target.from_triple("nvptx64-nvidia-cuda").create_target_machine(cpu=arch)
    return str(tm.emit_assembly(mod))


def add_one(image: str | bytes = PTX) -> cuda.CudaKernel:
    return cuda.CudaModule(image).kernel("add_one", ADD_ONE_PARAMS, ["n"], ADD_ONE_LAUNCH)


@pytest.fixture
def fresh() -> Any:
    """Forget the cached driver state before and after (tests that fake the environment)."""
    cuda._reset_for_tests()
    yield
    cuda._reset_for_tests()


# -- without cuda-bindings, a driver or a device ----------------------------------------------

def test_tecomp_imports_without_loading_cuda_bindings() -> None:
    code = textwrap.dedent("""
        import sys, numpy as np
        import tecomp
        from tecomp.runtime import cuda
        from tecomp.runtime.args import ParamSpec
        k = cuda.CudaModule(".version 7.0").kernel(
            "f", [ParamSpec("A", "float32", ("n",))], ["n"], {"blockIdx.x": "n"})
        k.prepare(np.zeros(3, "float32"))
        assert "cuda.bindings" not in sys.modules, "cuda.bindings imported eagerly"
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       timeout=120)
    assert r.returncode == 0, r.stderr


def test_not_installed(monkeypatch: pytest.MonkeyPatch, fresh: Any) -> None:
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # "import cuda.bindings" fails
    k = add_one()
    a = np.zeros(4, "float32")
    with pytest.raises(cuda.CudaUnavailable) as e:
        k(a, np.empty_like(a))
    msg = str(e.value)
    assert isinstance(e.value, TecompError) and e.value.kind == "not-installed"
    assert "'add_one'" in msg and "cuda-bindings is not installed" in msg
    assert "pip install" in msg and "f.emulate(*arrays)" in msg
    with pytest.raises(cuda.CudaUnavailable, match="not installed"):  # the same again, no crash
        k.time_evaluator()(a, np.empty_like(a))
    ok, reason = cuda.cuda_available()
    assert not ok and "cuda-bindings is not installed" in reason


def test_real_bindings_without_driver(fresh: Any) -> None:
    """This machine's case: cuda-bindings installed, no libcuda (or a driver, no GPU)."""
    pytest.importorskip("cuda.bindings.driver")
    ok, reason = cuda.cuda_available()
    if ok:
        pytest.skip(f"a GPU is present ({reason})")
    a = np.zeros(4, "float32")
    with pytest.raises(cuda.CudaUnavailable) as e:
        add_one()(a, np.empty_like(a))
    assert e.value.kind in ("no-driver", "no-device"), e.value
    assert "f.emulate(*arrays)" in str(e.value)
    if e.value.kind == "no-driver":
        assert "no NVIDIA driver" in str(e.value) and "libcuda" in str(e.value)
    with pytest.raises(cuda.CudaUnavailable):
        cuda.get_device(0)


class _CUresult(IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_NO_DEVICE = 100
    CUDA_ERROR_UNKNOWN = 999


def _fake_bindings(monkeypatch: pytest.MonkeyPatch, init: Any, count: int = 1) -> None:
    drv = types.ModuleType("cuda.bindings.driver")
    drv.CUresult = _CUresult  # type: ignore[attr-defined]
    drv.cuInit = init  # type: ignore[attr-defined]
    drv.cuDeviceGetCount = lambda: (_CUresult.CUDA_SUCCESS, count)  # type: ignore[attr-defined]
    drv.cuGetErrorString = lambda code: (_CUresult.CUDA_SUCCESS, b"something broke")  # type: ignore[attr-defined]
    pkg = types.ModuleType("cuda.bindings")
    pkg.driver = drv  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cuda.bindings", pkg)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", drv)


def _raise_dlopen(flags: int) -> Any:
    raise RuntimeError('"cuda" is an NVIDIA driver library and can only be found via system search')


@pytest.mark.parametrize("init, count, kind, text", [
    (_raise_dlopen, 1, "no-driver", "no NVIDIA driver on this machine"),
    (lambda f: (_CUresult.CUDA_ERROR_NO_DEVICE,), 1, "no-device", "CUDA_ERROR_NO_DEVICE"),
    (lambda f: (_CUresult.CUDA_SUCCESS,), 0, "no-device", "found no CUDA device"),
    (lambda f: (_CUresult.CUDA_ERROR_UNKNOWN,), 1, "init-failed",
     "CUDA_ERROR_UNKNOWN: something broke"),
])
def test_simulated_driver_states(monkeypatch: pytest.MonkeyPatch, fresh: Any, init: Any,
                                 count: int, kind: str, text: str) -> None:
    _fake_bindings(monkeypatch, init, count)
    a = np.zeros(4, "float32")
    for _ in range(2):
        with pytest.raises(cuda.CudaUnavailable) as e:
            add_one()(a, np.empty_like(a))
        assert e.value.kind == kind and text in str(e.value), e.value
        assert "f.emulate(*arrays)" in str(e.value)
    ok, reason = cuda.cuda_available()
    assert not ok and text in reason


# -- host arrays: the CPU runtime's checks and texts --------------------------------------------

def test_host_arrays_prepared() -> None:
    k = add_one()
    a, b = np.arange(1000, dtype="float32"), np.zeros(1000, "float32")
    call = k.prepare(a, b)
    assert call.host[0] is a and call.host[1] is b and call.device == [None, None]
    assert call.dims == (1000,) and call.grid == (8, 1, 1) and call.block == (128, 1, 1)
    assert call.shared_mem == 0


def _error(fn: Any, *args: object) -> tuple[type, str]:
    with pytest.raises((TypeError, ValueError)) as e:
        fn(*args)
    return type(e.value), str(e.value)


def test_host_argument_errors_match_cpu() -> None:
    k = add_one()
    chk = ArgChecker("add_one", ADD_ONE_PARAMS, ["n"])
    a = np.zeros(8, "float32")
    ro = np.zeros(8, "float32")
    ro.flags.writeable = False
    big = np.zeros(16, "float32")
    cases = [
        (a,),                                              # count
        (a.astype("float64"), a),                          # dtype
        (a, np.zeros(9, "float32")),                       # dim n disagrees
        (np.zeros((2, 4), "float32"), a),                  # rank
        (big[::2], a),                                     # not contiguous
        (a, ro),                                           # read-only output
        (big[:8], big[4:12]),                              # overlapping output
    ]
    for args in cases:
        want = _error(chk.convert, list(args))
        assert _error(k.prepare, *args) == want, args


def test_unknown_argument_type() -> None:
    with pytest.raises(TypeError, match=r"argument 1 \('B'\) of add_one: expected a numpy "
                                        "array or a CUDA array .*got list"):
        add_one().prepare(np.zeros(3, "float32"), [0.0, 0.0, 0.0])


# -- __cuda_array_interface__ --------------------------------------------------------------------

class FakeCudaArray:
    """Exposes only __cuda_array_interface__ (the pointer is never dereferenced here)."""

    def __init__(self, shape: tuple[int, ...], typestr: str = "<f4", ptr: int = 0x7F0000100000,
                 version: int = 3, readonly: bool = False, **extra: Any) -> None:
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr,
                                         "data": (ptr, readonly), "version": version, **extra}


def test_cai_parsed() -> None:
    x = FakeCudaArray((4, 5), strides=None, stream=None)
    d = cuda.as_device_array(x)
    assert d is not None and d.ptr == 0x7F0000100000 and d.shape == (4, 5)
    assert d.dtype == np.float32 and not d.readonly and d.stream is None and d.owner is x
    assert d.nbytes == 80
    # explicit C strides (v2), any stride on extent-1 axes, other dtypes
    d = cuda.from_cuda_array_interface(FakeCudaArray((3, 1, 2), "<i8", version=2,
                                                     strides=(16, 999, 8)))
    assert d.shape == (3, 1, 2) and d.dtype == np.int64
    assert cuda.from_cuda_array_interface(FakeCudaArray((2,), "|b1")).dtype == np.bool_
    assert cuda.from_cuda_array_interface(FakeCudaArray((2,), "|u1")).dtype == np.uint8
    # streams: 1 and 2 (legacy/per-thread default) need nothing, others are waited on
    assert cuda.from_cuda_array_interface(FakeCudaArray((2,), stream=1)).stream is None
    assert cuda.from_cuda_array_interface(FakeCudaArray((2,), stream=2)).stream is None
    assert cuda.from_cuda_array_interface(FakeCudaArray((2,), stream=0xABC0)).stream == 0xABC0
    assert cuda.from_cuda_array_interface(FakeCudaArray((2,), version=2, stream=7)).stream is None
    # empty arrays may have a NULL pointer
    assert cuda.from_cuda_array_interface(FakeCudaArray((0, 3), ptr=0)).ptr == 0


@pytest.mark.parametrize("kwargs, exc, text", [
    ({"shape": (4, 5), "strides": (4, 16)}, ValueError, "must be C-contiguous"),
    ({"shape": (4, 5), "strides": (40, 8)}, ValueError, "must be C-contiguous"),
    ({"shape": (4,), "strides": (4, 4)}, TypeError, "'strides' must be None or 1 ints"),
    ({"shape": (4,), "typestr": ">f4"}, TypeError, "byte-swapped"),
    ({"shape": (4,), "typestr": "<c8"}, TypeError, "not a bool/int/uint/float"),
    ({"shape": (4,), "typestr": "<q9"}, TypeError, "unknown typestr"),
    ({"shape": (4,), "version": 4}, TypeError, "version 4 is not supported"),
    ({"shape": (4,), "mask": object()}, TypeError, "masked"),
    ({"shape": (4,), "ptr": 0}, ValueError, "NULL pointer"),
    ({"shape": (4, -1)}, TypeError, "shape must be"),
    ({"shape": (4,), "stream": "s"}, TypeError, "'stream' must be None or an int"),
])
def test_cai_rejected(kwargs: dict[str, Any], exc: type, text: str) -> None:
    x = FakeCudaArray(**kwargs)
    with pytest.raises(exc, match=text):
        cuda.from_cuda_array_interface(x)
    if "shape" in kwargs and len(kwargs["shape"]) == 1:  # through a call, the argument is named
        with pytest.raises(exc, match=rf"argument 0 \('A'\) of add_one: .*{text}"):
            add_one().prepare(x, np.zeros(4, "float32"))


def test_cai_bad_data_field() -> None:
    x = FakeCudaArray((4,))
    x.__cuda_array_interface__["data"] = 1234
    with pytest.raises(TypeError, match=r"'data' must be \(pointer, read_only\)"):
        cuda.from_cuda_array_interface(x)


def test_cai_arguments_checked_like_cpu() -> None:
    k = add_one()
    dev_a = FakeCudaArray((100,), ptr=0x7F0000100000)
    dev_b = FakeCudaArray((100,), ptr=0x7F0000200000)
    call = k.prepare(dev_a, dev_b)
    assert call.host == [None, None] and call.dims == (100,) and call.grid == (1, 1, 1)
    assert [d.ptr for d in call.device] == [0x7F0000100000, 0x7F0000200000]  # type: ignore[union-attr]
    # mixing: a device input, a host output
    host_b = np.zeros(100, "float32")
    call = k.prepare(dev_a, host_b)
    assert call.device[0] is not None and call.host[1] is host_b and call.device[1] is None
    # the checker's errors, for device arrays too
    with pytest.raises(TypeError, match=r"argument 0 \('A'\) of add_one: expected dtype "
                                        "float32, got float64"):
        k.prepare(FakeCudaArray((100,), "<f8"), host_b)
    with pytest.raises(ValueError, match=r"argument 1 \('B'\) of add_one: axis 0 has extent 99, "
                                         "but n = 100"):
        k.prepare(dev_a, FakeCudaArray((99,), ptr=0x7F0000200000))
    with pytest.raises(ValueError, match="the kernel writes this argument, but the array is "
                                         "read-only"):
        k.prepare(dev_a, FakeCudaArray((100,), readonly=True, ptr=0x7F0000200000))
    with pytest.raises(ValueError, match="overlaps the memory of"):
        k.prepare(dev_a, FakeCudaArray((100,), ptr=0x7F0000100000 + 40))
    # an empty device array with a NULL pointer binds n = 0 and launches nothing
    call = k.prepare(FakeCudaArray((0,), ptr=0), FakeCudaArray((0,), ptr=0))
    assert call.dims == (0,) and call.grid == (0, 1, 1)


# -- DLPack ------------------------------------------------------------------------------------

_get_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_get_ptr.restype, _get_ptr.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


class FakeDLPackCuda:
    """A DLPack-only producer claiming its (numpy) memory is on ``device``: numpy's capsule
    with the device field rewritten. Records the ``stream`` it was asked for."""

    def __init__(self, a: np.ndarray, device: tuple[int, int] = (2, 0),
                 versioned: bool = True) -> None:
        self.a, self.device, self.versioned = a, device, versioned
        self.streams: list[object] = []

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device

    def __dlpack__(self, *, stream: object = None, max_version: object = None) -> object:
        self.streams.append(stream)
        if self.versioned:
            if max_version is None:
                raise AssertionError("tecomp should ask for DLPack 1.x")
            capsule = self.a.__dlpack__(max_version=(1, 0))
            mt = cuda._DLManagedTensorVersioned.from_address(
                _get_ptr(capsule, b"dltensor_versioned"))
        else:
            if max_version is not None:  # an old producer
                raise TypeError("unexpected keyword argument 'max_version'")
            capsule = self.a.__dlpack__()
            mt = cuda._DLManagedTensor.from_address(_get_ptr(capsule, b"dltensor"))  # type: ignore[assignment]
        mt.dl_tensor.device.device_type, mt.dl_tensor.device.device_id = self.device
        return capsule


@pytest.mark.parametrize("versioned", [True, False])
def test_dlpack_cuda_parsed(versioned: bool) -> None:
    a = np.arange(12, dtype="float32").reshape(3, 4)
    x = FakeDLPackCuda(a, versioned=versioned)
    d = cuda.as_device_array(x)
    assert d is not None and d.source == "__dlpack__"
    assert d.ptr == a.ctypes.data and d.shape == (3, 4) and d.dtype == np.float32
    assert d.device == 0 and not d.readonly and x.streams == ([1] if versioned else [1, 1])
    # a view with an offset: byte_offset or a moved data pointer, either way the right address
    d = cuda.as_device_array(FakeDLPackCuda(a[1:], versioned=versioned))
    assert d is not None and d.ptr == a.ctypes.data + 16 and d.shape == (2, 4)
    for dt in ("int8", "uint16", "int64", "float16", "float64", "bool"):
        d = cuda.as_device_array(FakeDLPackCuda(np.zeros(3, dt), versioned=versioned))
        assert d is not None and d.dtype == np.dtype(dt)


def test_dlpack_cuda_rejected() -> None:
    a = np.zeros((4, 6), "float32")
    with pytest.raises(ValueError, match="must be C-contiguous"):
        cuda.as_device_array(FakeDLPackCuda(a[:, ::2]))
    with pytest.raises(TypeError, match="on a ROCm device, not a CUDA one"):
        cuda.from_dlpack(FakeDLPackCuda(a, device=(10, 0)))
    with pytest.raises(TypeError, match="not a bool/int/uint/float"):
        cuda.as_device_array(FakeDLPackCuda(np.zeros(3, "complex64")))
    ro = np.zeros(8, "float32")
    ro.flags.writeable = False
    d = cuda.as_device_array(FakeDLPackCuda(ro))
    assert d is not None and d.readonly  # DLPack 1.0's read-only flag
    with pytest.raises(ValueError, match=r"argument 1 \('B'\) of add_one: the kernel writes "
                                         "this argument, but the array is read-only"):
        add_one().prepare(np.zeros(8, "float32"), FakeDLPackCuda(ro))
    with pytest.raises(TypeError, match=r"argument 0 \('A'\) of add_one: the DLPack tensor is "
                                        "on a Metal device"):
        add_one().prepare(FakeDLPackCuda(np.zeros(8, "float32"), device=(8, 0)),
                          np.zeros(8, "float32"))


def test_dlpack_pinned_host_and_managed() -> None:
    a = np.zeros(5, "int32")
    d = cuda.as_device_array(FakeDLPackCuda(a, device=(3, 0)))  # kDLCUDAHost
    assert d is not None and d.any_device and d.device is None
    d = cuda.as_device_array(FakeDLPackCuda(a, device=(13, 1)))  # kDLCUDAManaged on device 1
    assert d is not None and d.device == 1 and not d.any_device


class CpuDLPack:
    """A CPU tensor seen only through DLPack (like a CPU torch.Tensor)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __dlpack__(self, **kw: Any) -> object:
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


def test_dlpack_cpu_objects_are_host_arrays() -> None:
    a, b = np.arange(10, dtype="float32"), np.zeros(10, "float32")
    call = add_one().prepare(CpuDLPack(a), CpuDLPack(b))
    assert call.device == [None, None]
    assert call.host[0] is not None and call.host[0].ctypes.data == a.ctypes.data
    assert call.host[1] is not None and call.host[1].ctypes.data == b.ctypes.data  # copied back here
    # a device array and a CPU DLPack one in one call
    call = add_one().prepare(FakeDLPackCuda(a), CpuDLPack(b))
    assert call.device[0] is not None and call.host[1] is not None


# -- launch shapes, modules --------------------------------------------------------------------

def test_launch_spec() -> None:
    m = cuda.CudaModule(PTX)
    k = m.kernel("k", [ParamSpec("A", "float32", ("n", "m"))], ["n", "m"],
                 {"blockIdx.x": "(m + 31) // 32", "blockIdx.y": "n", "threadIdx.x": 32,
                  "threadIdx.y": 4}, shared_mem=512)
    assert k.launch_dims((5, 100)) == ((4, 5, 1), (32, 4, 1))
    call = k.prepare(np.zeros((5, 100), "float32"))
    assert (call.grid, call.block, call.shared_mem) == ((4, 5, 1), (32, 4, 1), 512)
    assert m["k"] is k and "k" in m and m.function_names == ["k"]
    with pytest.raises(KeyError, match="no kernel 'x' in this CUDA module; it has k"):
        m["x"]
    with pytest.raises(ValueError, match="unknown launch tags"):
        m.kernel("k", [], [], {"blockIdx.w": 1})
    with pytest.raises(ValueError, match="launch extent of threadIdx.x must be"):
        m.kernel("k", [], [], {"threadIdx.x": "__import__('os')"})
    with pytest.raises(ValueError, match="shared_mem must be"):
        m.kernel("k", [], [], {}, shared_mem=-1)
    neg = m.kernel("k", [ParamSpec("A", "float32", ("n",))], ["n"], {"blockIdx.x": "n - 5"})
    with pytest.raises(ValueError, match=r"launch extent of blockIdx.x \(n - 5\) is -2"):
        neg.prepare(np.zeros(3, "float32"))


def test_launch_spec_from_ir() -> None:
    from tecomp.ir import Var
    from tecomp.ir.expr import IntImm

    n = Var("n")
    spec = cuda.launch_spec_of({"blockIdx.x": (n + 127) // 128, "threadIdx.x": IntImm(128)},
                               {n: "n"})
    assert spec["threadIdx.x"] == 128
    k = cuda.CudaModule(PTX).kernel("add_one", ADD_ONE_PARAMS, ["n"], spec)
    assert k.launch_dims((1000,)) == ((8, 1, 1), (128, 1, 1))
    assert k.launch_dims((1024,)) == ((8, 1, 1), (128, 1, 1))
    m = cuda.CudaModule(PTX)
    k = m.kernel_for(KernelSpec("add_one", tuple(ADD_ONE_PARAMS), ("n",), False), spec, 64)
    assert m["add_one"] is k and k.shared_mem == 64 and not k.checker.check_overlap
    assert k.prepare(np.zeros(300, "float32"), np.zeros(300, "float32")).grid == (3, 1, 1)


def test_module_without_gpu() -> None:
    m = cuda.CudaModule(PTX)
    assert m.is_ptx and m.image.endswith(b"\0") and m.get_source().strip() == PTX.strip()
    assert cuda.CudaModule(PTX.encode()).image == m.image
    cubin = cuda.CudaModule(b"\x7fELF" + b"\x00" * 16)
    assert not cubin.is_ptx and cubin.image == b"\x7fELF" + b"\x00" * 16
    with pytest.raises(ValueError, match="binary image"):
        cubin.get_source()
    assert "PTX" in repr(m) and repr(add_one()).startswith("<tecomp.CudaKernel add_one(A: float32")


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not on PATH")
def test_test_kernels_assemble(tmp_path: Path) -> None:
    """The GPU tests' PTX is valid even where they cannot run."""
    for name, text in [("hand", PTX), ("llvm", llvm_ptx("sm_80"))]:
        src = tmp_path / f"{name}.ptx"
        src.write_text(text)
        r = subprocess.run(["ptxas", "-arch=sm_80", str(src), "-o", str(tmp_path / f"{name}.cubin")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr


# -- the driver path against a stand-in libcuda -------------------------------------------------

FAKE_SCRIPT = r"""
import ctypes, json, sys
import numpy as np
from tecomp.errors import TecompError
from tecomp.runtime import cuda
from tecomp.runtime.args import ParamSpec

out = {}
def err(fn):
    try:
        fn()
    except Exception as e:
        return [type(e).__name__, str(e), getattr(e, "name", None)]
    return None

lib = ctypes.CDLL("libcuda.so.1")
class Last(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3),
                ("shared", ctypes.c_uint32), ("nparams", ctypes.c_int),
                ("params", ctypes.c_uint64 * 8), ("launches", ctypes.c_int),
                ("allocs_live", ctypes.c_int), ("depth", ctypes.c_int)]
last = Last.in_dll(lib, "fake_last")

out["available"] = cuda.cuda_available()
if sys.argv[1] != "full":
    out["call"] = err(lambda: cuda.CudaModule("x").kernel("add_one", [], [], {})())
    print(json.dumps(out)); sys.exit()

P = [ParamSpec("A", "float32", ("n",)), ParamSpec("B", "float32", ("n",), True)]
k = cuda.CudaModule("// ptx").kernel("add_one", P, ["n"], {"blockIdx.x": "(n + 127) // 128",
                                                         "threadIdx.x": 128})
a = np.arange(1000, dtype="float32"); b = np.zeros_like(a)
k(a, b)
out["add_one"] = bool(np.array_equal(b, a + 1))
out["launch"] = [list(last.grid), list(last.block), last.shared, last.depth, last.allocs_live,
                 lib.fake_ctx_depth()]

rec = cuda.CudaModule("// ptx").kernel(
    "record", [ParamSpec("X", "int32", ("m", "k")), ParamSpec("Y", "int8", ("k",), True)],
    ["m", "k"], {"blockIdx.x": "m", "blockIdx.z": 3, "threadIdx.y": "k"}, shared_mem=100)
x, y = np.zeros((5, 7), "int32"), np.zeros(7, "int8")
rec(x, y)
p = list(last.params)
out["record"] = [list(last.grid), list(last.block), last.shared, p[2], p[3],
                 p[0] not in (0, x.ctypes.data), p[1] not in (0, y.ctypes.data, p[0])]

# device memory, as a producer's __cuda_array_interface__
dev = cuda.get_device(0)
drv = dev.drv
with dev.activate():
    err_, dptr = drv.cuMemAlloc(4000)
    drv.cuMemcpyHtoD(dptr, a.ctypes.data, 4000)
class DevArray:
    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (ptr, False),
                                         "version": 3, "strides": None, "stream": None}
da = DevArray(int(dptr), 1000)
b2 = np.zeros_like(a)
k(da, b2)  # device input, host output
out["device_in"] = bool(np.array_equal(b2, a + 1))
db = DevArray(int(dptr), 1000)
db.__cuda_array_interface__["shape"] = (10, 100)
rec2 = cuda.CudaModule("// ptx").kernel(
    "record", [ParamSpec("X", "float32", ("m", "k")), ParamSpec("Y", "float32", ("k",), True)],
    ["m", "k"], {"blockIdx.x": 1})
rec2(db, np.zeros(100, "float32"))
out["device_ptr_passed"] = last.params[0] == int(dptr)
foreign = DevArray(a.ctypes.data, 1000)
out["foreign"] = err(lambda: k(foreign, b2))
with dev.activate():
    drv.cuMemFree(dptr)

t = k.time_evaluator(number=3, repeat=4)(a, b)
out["timing"] = [list(t.results), t.number, type(t).__name__]
t = k.time_evaluator(number=1, repeat=2, min_repeat_ms=2)(a, b)
out["timing_grown"] = [list(t.results), t.number]

# a function of two kernels: A -> T -> B, T in device memory of the call, A copied in once
mod2 = cuda.CudaModule("// ptx")
host = mod2.kernel("twice", P, ["n"], {})  # checks the call's arguments; never launched
k1 = mod2.kernel("add_one", P, ["n"], {"blockIdx.x": "(n + 127) // 128", "threadIdx.x": 128})
sq = cuda.KernelSequence(host, [(k1, [0, 2], [0]), (k1, [2, 1], [0])], [("float32", lambda d: (d[0],))])
b3, l0 = np.zeros_like(a), last.launches
sq(a, b3)
out["sequence"] = [bool(np.array_equal(b3, a + 2)), last.launches - l0, last.allocs_live]
t = sq.time_evaluator(number=2, repeat=3)(a, b3)
out["sequence_timing"] = [len(t.results), t.number, last.allocs_live, bool(np.array_equal(b3, a + 2))]
out["sequence_bad"] = err(lambda: sq(a))
before = last.launches
k(np.zeros(0, "float32"), np.zeros(0, "float32"))
out["empty_launches"] = last.launches - before

out["too_many_threads"] = err(lambda: k.launch(a, b, grid=(1,), block=(2048,)))
out["bad_ptx"] = err(lambda: cuda.CudaModule("INVALID").kernel("add_one", P, ["n"], {})(a, b))
out["missing"] = err(lambda: cuda.CudaModule("ok").kernel("nope", P, ["n"], {})(a, b))
out["bad_device"] = err(lambda: cuda.CudaModule("ok", device=3).kernel("add_one", P, ["n"], {})(a, b))
out["fault"] = err(lambda: cuda.CudaModule("ok").kernel("fault", P, ["n"], {})(a, b))
out["after"] = [lib.fake_ctx_depth(), last.allocs_live]
print(json.dumps(out))
"""


def _fake_driver(tmp_path: Path, mode: str, **env: str) -> dict[str, Any]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the stand-in libcuda")
    pytest.importorskip("cuda.bindings.driver")
    lib = tmp_path / "libcuda.so.1"
    if not lib.exists():
        r = subprocess.run(["gcc", "-O1", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o",
                            str(lib), str(HERE / "fake_libcuda.c")], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    e = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path), **env)
    r = subprocess.run([sys.executable, "-c", FAKE_SCRIPT, mode], capture_output=True, text=True,
                       cwd=REPO, env=e, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_driver_path_with_stand_in_libcuda(tmp_path: Path) -> None:
    out = _fake_driver(tmp_path, "full")
    assert out["available"] == [True, "device 0: Fake GPU (sm_80), driver 13.0"]
    assert out["add_one"]
    # grid/block from the launch spec; the context was current at the launch; copies freed
    assert out["launch"] == [[8, 1, 1], [128, 1, 1], 0, 1, 0, 0]
    grid, block, shared, m, k, x_dev, y_dev = out["record"]
    assert (grid, block, shared, m, k) == ([5, 1, 3], [1, 7, 1], 100, 5, 7)
    assert x_dev and y_dev  # host arrays were replaced by fresh device copies
    assert out["device_in"] and out["device_ptr_passed"]
    assert out["foreign"][0] == "ValueError" and "is not CUDA memory" in out["foreign"][1]
    results, number, cls = out["timing"]
    assert cls == "BenchmarkResult" and number == 3 and len(results) == 4
    assert all(r > 0 for r in results)
    results, number = out["timing_grown"]
    assert number > 1 and len(results) == 2
    assert out["empty_launches"] == 0
    assert out["too_many_threads"][0] == "TecompError"
    assert "has 2048 threads; the device allows 1024 per block" in out["too_many_threads"][1]
    name, msg, code = out["bad_ptx"]
    assert (name, code) == ("CudaError", "CUDA_ERROR_INVALID_PTX")
    assert "cuModuleLoadData failed with CUDA_ERROR_INVALID_PTX" in msg and "ptxas" in msg
    assert out["missing"][2] == "CUDA_ERROR_NOT_FOUND" and "'nope'" in out["missing"][1]
    assert out["bad_device"][:2] == ["TecompError", "CUDA device 3 requested, but this machine "
                                                    "has 1 CUDA device"]
    name, msg, code = out["fault"]
    assert code == "CUDA_ERROR_ILLEGAL_ADDRESS" and "f.emulate(*arrays)" in msg
    assert "running kernel fault" in msg
    assert out["sequence"] == [True, 2, 0]  # two launches, T and the copies freed
    assert out["sequence_timing"] == [3, 2, 0, True]
    assert out["sequence_bad"][0] == "TypeError" and "twice" in out["sequence_bad"][1]
    assert out["after"] == [0, 0]  # every push popped, every device copy freed, even on errors


@pytest.mark.parametrize("env, text", [
    ({"FAKE_CUDA_DEVICES": "0"}, "found no CUDA device"),
    ({"FAKE_CUDA_INIT": "100"}, "CUDA_ERROR_NO_DEVICE"),
])
def test_no_device_with_stand_in_libcuda(tmp_path: Path, env: dict[str, str], text: str) -> None:
    out = _fake_driver(tmp_path, "nodevice", **env)
    assert out["available"][0] is False and text in out["available"][1]
    name, msg, _ = out["call"]
    assert name == "CudaUnavailable" and text in msg and "f.emulate(*arrays)" in msg


# -- on a GPU ----------------------------------------------------------------------------------

class DeviceBuffer:
    """Device memory with __cuda_array_interface__, made with the driver (no cupy needed)."""

    def __init__(self, host: np.ndarray) -> None:
        self.dev = cuda.get_device(0)
        self.shape, self.dtype, self.nbytes = host.shape, host.dtype, host.nbytes
        with self.dev.activate():
            self.ptr = cuda._call(self.dev.drv, "cuMemAlloc", max(host.nbytes, 1))
            cuda._call(self.dev.drv, "cuMemcpyHtoD", self.ptr, host.ctypes.data, host.nbytes)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (int(self.ptr), False),
                "version": 3, "strides": None, "stream": None}

    def get(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        with self.dev.activate():
            cuda._call(self.dev.drv, "cuMemcpyDtoH", out.ctypes.data, self.ptr, self.nbytes)
        return out

    def __del__(self) -> None:
        with self.dev.activate():
            self.dev.drv.cuMemFree(self.ptr)


@pytest.mark.gpu
@pytest.mark.parametrize("source", ["hand", "llvm"])
def test_gpu_add_one_host_arrays(source: str) -> None:
    dev = cuda.get_device(0)
    k = add_one(PTX if source == "hand" else llvm_ptx(dev.arch if dev.compute_capability < (10, 0)
                                                      else "sm_90"))
    a = np.random.default_rng(0).random(1000, dtype="float32")  # not a multiple of 128
    b = np.full_like(a, -7)
    k(a, b)
    np.testing.assert_array_equal(b, a + 1)


@pytest.mark.gpu
def test_gpu_device_arrays_in_place_and_mixed() -> None:
    k = add_one()
    a = np.arange(3000, dtype="float32")
    da, db = DeviceBuffer(a), DeviceBuffer(np.zeros_like(a))
    k(da, db)
    np.testing.assert_array_equal(db.get(), a + 1)
    hb = np.zeros_like(a)
    k(da, hb)  # device in, host out
    np.testing.assert_array_equal(hb, a + 1)
    k(a + 10, db)  # host in, device out
    np.testing.assert_array_equal(db.get(), a + 11)


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not on PATH")
def test_gpu_cubin(tmp_path: Path) -> None:
    dev = cuda.get_device(0)
    (tmp_path / "k.ptx").write_text(PTX)
    r = subprocess.run(["ptxas", f"-arch={dev.arch}", str(tmp_path / "k.ptx"), "-o",
                        str(tmp_path / "k.cubin")], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"ptxas cannot build for {dev.arch}: {r.stderr.strip()}")
    k = add_one((tmp_path / "k.cubin").read_bytes())
    a = np.arange(10, dtype="float32")
    b = np.zeros_like(a)
    k(a, b)
    np.testing.assert_array_equal(b, a + 1)


@pytest.mark.gpu
def test_gpu_dynamic_shared_memory() -> None:
    t = 256
    k = cuda.CudaModule(PTX).kernel("reverse_blocks", ADD_ONE_PARAMS, ["n"],
                                    {"blockIdx.x": f"n // {t}", "threadIdx.x": t}, shared_mem=t * 4)
    a = np.arange(t * 5, dtype="float32")
    b = np.zeros_like(a)
    k(a, b)
    np.testing.assert_array_equal(b, a.reshape(5, t)[:, ::-1].ravel())


@pytest.mark.gpu
def test_gpu_time_evaluator() -> None:
    k = add_one()
    a = np.arange(1 << 20, dtype="float32")
    b = np.zeros_like(a)
    res = k.time_evaluator(number=5, repeat=3)(a, b)
    assert isinstance(res, BenchmarkResult) and len(res.results) == 3 and res.number == 5
    assert all(r > 0 for r in res.results) and res.median < 0.1
    np.testing.assert_array_equal(b, a + 1)  # outputs copied back after timing
    res = k.time_evaluator(number=1, repeat=2, min_repeat_ms=5)(DeviceBuffer(a), DeviceBuffer(b))
    assert res.number > 1 and all(r > 0 for r in res.results)


@pytest.mark.gpu
def test_gpu_driver_errors() -> None:
    a = np.zeros(4, "float32")
    with pytest.raises(cuda.CudaError) as e:
        add_one(".version 7.0\n.target sm_75\n.address_size 64\nthis is not ptx\n")(a, a.copy())
    assert e.value.name == "CUDA_ERROR_INVALID_PTX" and "ptxas" in str(e.value)
    with pytest.raises(cuda.CudaError) as e:
        cuda.CudaModule(PTX).kernel("missing", ADD_ONE_PARAMS, ["n"], {})(a, a.copy())
    assert e.value.name == "CUDA_ERROR_NOT_FOUND"
    with pytest.raises(TecompError, match="per block"):
        add_one().launch(a, a.copy(), grid=(1,), block=(4096,))


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


@pytest.mark.gpu
def test_gpu_cupy_and_torch() -> None:
    k = add_one()
    ran = 0
    cupy = _optional("cupy")
    if cupy is not None:
        a = cupy.arange(500, dtype=cupy.float32)
        b = cupy.zeros_like(a)
        k(a, b)
        assert bool((b == a + 1).all())
        ran += 1
    torch = _optional("torch")
    if torch is not None and torch.cuda.is_available():
        a = torch.arange(500, dtype=torch.float32, device="cuda")
        b = torch.zeros_like(a)
        k(a, b)
        assert bool((b == a + 1).all())
        ran += 1
    if not ran:
        pytest.skip("neither cupy nor torch with CUDA is installed")

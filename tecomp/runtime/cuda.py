"""Running GPU kernels through the CUDA driver API (NVIDIA's ``cuda-bindings`` wheels).

``cuda.bindings`` is imported the first time something needs the driver, never at import, so
tecomp (and building, printing or emulating GPU kernels) works on machines without it.

Pieces:

* `CudaModule`: a PTX text or a cubin/fatbin image, loaded with ``cuModuleLoadData`` into the
  primary context of its device on first use; ``mod.kernel(...)`` / ``mod[name]`` give kernels.
  Given ``cubins`` by arch too (an exported library), it loads the one the device runs
  (`pick_cubin`), else the PTX.
* `LaunchPlan`: a cuda function (one kernel, or several launched in order with intermediate
  tensors) as plain data; ``plan.launcher(mod)`` is what built (`GpuFunction`) and loaded
  (`tecomp.runtime.loader`) functions call, through `call_or_explain`.
* `CudaKernel`: one ``.entry`` with tecomp's calling convention, the CPU kernels' one: the
  device pointers of the buffers in parameter order, then the symbolic dims as int64, then
  the scalar parameters (``te.var`` arguments that are no dim) by value in their own C type
  (the kernel reads pointers as 8-byte ``.u64`` params, dims as ``.s64``/``.u64``, a float32
  scalar as ``.f32``; `pack_params` builds the kernelParams array). Arguments
  go through `tecomp.runtime.args.ArgChecker`, so a GPU call checks count, dtype, rank,
  shape, contiguity, read-only outputs and overlap with the same error texts as a CPU call.
  The launch shape comes from ``launch``: ``{"blockIdx.x": "(n + 127) // 128",
  "threadIdx.x": 128}`` (ints, or Python expressions over the dim names as in `ParamSpec`
  shapes; tags left out have extent 1), plus ``shared_mem`` bytes of dynamic shared memory.
* `time_evaluator`: CUDA events around ``number`` back-to-back launches, per repeat; returns
  the CPU runtime's `BenchmarkResult`.
* `cuda_available()`: ``(True, description)`` or ``(False, reason)``; ``gpu`` tests skip on it.

Arrays a kernel accepts (one call may mix them):

* **Host arrays** (numpy, or anything numpy imports through ``__dlpack__`` from the CPU, e.g.
  a CPU torch tensor): every host argument is copied to fresh device memory before the
  launch (outputs too, so elements the kernel does not write keep their values), and the
  outputs (``ParamSpec.output``) are copied back into the same host arrays after it; the
  device copies are freed before the call returns. ``time_evaluator`` copies once, times
  only the launches, and copies outputs back at the end.
* **Device arrays**, used in place, no copy:
  - objects with ``__cuda_array_interface__`` (cupy, numba, pycuda ``GPUArray``, CUDA torch
    tensors), versions 0-3: ``data`` (pointer, read-only flag), ``shape``, ``typestr`` (a
    native-endian bool/int/uint/float), ``strides`` (None, or C-contiguous byte strides; axes
    of extent 1 may have any stride); ``mask`` must be absent/None; a v3 ``stream`` other
    than None/1/2 (legacy / per-thread default) is synchronized before the launch;
  - objects with ``__dlpack__`` whose ``__dlpack_device__`` is CUDA (2), CUDA managed (13) or
    CUDA pinned host memory (3): the capsule is read, not consumed (DLPack 1.x
    "dltensor_versioned" and the older "dltensor"; dtype int/uint/float/bool with one lane;
    strides NULL or compact row-major), it is asked for the legacy default stream
    (``stream=1``) so the producer orders its pending work before our launch, and it is kept
    alive during the call; its ``device_id`` must be the kernel's device.
  ``__cuda_array_interface__`` is preferred when an object has both.

Launches go to the legacy default stream of the device's primary context (retained lazily,
never released: the driver tears it down at exit) and are synchronized before a call returns,
so a fault surfaces in the call that caused it. Every driver error is a `TecompError` naming
the ``CUresult`` with a sentence on what it means. Without cuda-bindings, without an NVIDIA
driver, or without a device, a call raises `CudaUnavailable` (a TecompError) saying which,
and pointing at the CPU emulator, ``f.emulate(*arrays)``.

Do not fork a process after it used CUDA (the child cannot); tuning workers must start
fresh (spawn) processes.
"""

from __future__ import annotations

import ctypes
import math
import re
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

import numpy as np

from ..errors import TecompError
from .args import _SHAPE_EXPR, _SHAPE_NS, ArgChecker, KernelSpec, ParamSpec, scalar_ctype
from .cpu import BenchmarkResult

# CUDA arrays (__cuda_array_interface__, DLPack) live in their own module; re-exported here
from .cuda_arrays import (  # noqa: F401
    KDL_CPU,
    KDL_CUDA,
    KDL_CUDA_HOST,
    KDL_CUDA_MANAGED,
    DeviceArray,
    _DLManagedTensor,
    _DLManagedTensorVersioned,
    _DLTensor,
    as_device_array,
    dlpack_device,
    from_cuda_array_interface,
    from_dlpack,
    from_dlpack_capsule,
)

EMULATOR_HINT = "to run it without a GPU, use the CPU emulator: f.emulate(*arrays)"
INSTALL_HINT = ("install NVIDIA's cuda-bindings wheels with pip install 'tecomp[cuda]' "
                "(or pip install cuda-bindings)")

LAUNCH_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z",
               "threadIdx.x", "threadIdx.y", "threadIdx.z")

# CUresult codes given their own explanation (names come from the bindings' enum)
_SUCCESS = 0
_ERR_NO_DEVICE = 100
_FAULTS = {700, 715, 716, 717, 719}  # illegal address/instruction, misaligned, bad pc, launch failed
_HINTS = {
    2: "the device is out of memory",
    35: "the installed NVIDIA driver is older than these CUDA bindings need; update the "
        "driver or install an older cuda-bindings",
    209: "the image has no code for this device's architecture (a cubin built for another "
         "sm_XX); load PTX, or build the cubin for this GPU",
    218: "the driver's JIT rejected the PTX; ptxas -arch=<the device's sm_XY> says why",
    222: "the PTX .version is newer than this driver supports; emit an older PTX ISA "
         "(or update the driver)",
    500: "no such name in the module",
    701: "the launch needs more registers or shared memory per block than the device has; "
         "use fewer threads per block",
}
_FAULT_HINT = ("the kernel faulted on the device; the CUDA context is now unusable until the "
               "process exits; run f.emulate(*arrays) on the CPU to find the bad access")


class CudaError(TecompError):
    """A CUDA driver call failed: ``code`` is the CUresult value, ``name`` its name."""

    def __init__(self, message: str, code: int, name: str) -> None:
        super().__init__(message)
        self.code, self.name = code, name


class CudaUnavailable(TecompError):
    """CUDA cannot be used here. ``kind``: "not-installed" (no cuda-bindings), "no-driver"
    (libcuda cannot be loaded), "no-device" (a driver but no GPU) or "init-failed"."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# driver state -------------------------------------------------------------------------------

_lock = threading.RLock()
# None: not tried yet; a module: cuInit succeeded; a (kind, reason) pair: unavailable
_state: Any = None
_devices: dict[int, CudaDevice] = {}
_available: tuple[bool, str] | None = None


def _init_driver() -> Any:
    """Import cuda-bindings and cuInit; the driver module, or (kind, reason)."""
    try:
        from cuda.bindings import driver as drv
    except ImportError as e:
        return ("not-installed", f"NVIDIA's cuda-bindings is not installed ({e}); {INSTALL_HINT}")
    except Exception as e:  # a broken install: report it rather than crash
        return ("not-installed", f"cuda-bindings cannot be imported ({type(e).__name__}: {e}); "
                                 f"{INSTALL_HINT}")
    try:
        res = drv.cuInit(0)
    except Exception as e:  # DynamicLibNotFoundError (RuntimeError) when libcuda is absent
        return ("no-driver", "no NVIDIA driver on this machine: cuda-bindings could not load "
                             f"libcuda ({type(e).__name__}: {e})")
    err = int(res[0])
    if err == _ERR_NO_DEVICE:
        return ("no-device", "the NVIDIA driver found no CUDA device (cuInit: CUDA_ERROR_NO_DEVICE)")
    if err != _SUCCESS:
        return ("init-failed", f"cuInit failed: {_describe(drv, err)}")
    try:
        err, count = drv.cuDeviceGetCount()
    except Exception as e:
        return ("init-failed", f"cuDeviceGetCount raised {type(e).__name__}: {e}")
    if int(err) != _SUCCESS:
        return ("init-failed", f"cuDeviceGetCount failed: {_describe(drv, int(err))}")
    if count == 0:
        return ("no-device", "the NVIDIA driver found no CUDA device (cuDeviceGetCount: 0)")
    return drv


def _driver() -> Any:
    """The initialized ``cuda.bindings.driver`` module; raises `CudaUnavailable`."""
    global _state
    st = _state
    if st is None:
        with _lock:
            if _state is None:
                _state = _init_driver()
            st = _state
    if isinstance(st, tuple):
        raise CudaUnavailable(st[0], f"CUDA is unavailable: {st[1]}; {EMULATOR_HINT}")
    return st


def _reset_for_tests() -> None:
    """Forget the driver state (tests that fake a missing install or driver)."""
    global _state, _available
    with _lock:
        _state = _available = None
        _devices.clear()


def cuda_available() -> tuple[bool, str]:
    """``(True, "device 0: <name> (sm_XY), driver X.Y")`` when kernels can run here, else
    ``(False, reason)``. Does not create a context; the answer is kept for the process."""
    global _available
    if _available is None:
        _available = _probe()
    return _available


def _probe() -> tuple[bool, str]:
    try:
        drv = _driver()
        name = _call(drv, "cuDeviceGetName", 256, _call(drv, "cuDeviceGet", 0),
                     what="reading the device name")
        name = bytes(name).split(b"\0", 1)[0].decode(errors="replace")
        major, minor = _compute_capability(drv, _call(drv, "cuDeviceGet", 0))
        ver = int(_call(drv, "cuDriverGetVersion", what="reading the driver version"))
    except CudaUnavailable:
        return False, _state[1]  # the reason alone, without the emulator hint of a call's error
    except TecompError as e:
        return False, str(e)
    return True, f"device 0: {name} (sm_{major}{minor}), driver {ver // 1000}.{ver % 1000 // 10}"


def _describe(drv: Any, code: int) -> str:
    try:
        name = drv.CUresult(code).name
    except Exception:
        name = f"CUresult {code}"
    sentence = ""
    try:
        err, s = drv.cuGetErrorString(code)
        if int(err) == _SUCCESS and s:
            sentence = bytes(s).decode(errors="replace").rstrip(".")
    except Exception:
        pass
    return f"{name}: {sentence}" if sentence else name


def _raise_cuda(drv: Any, code: int, fn: str, what: str) -> CudaError:
    msg = f"{what}: {fn} failed with {_describe(drv, code)}" if what else \
        f"{fn} failed with {_describe(drv, code)}"
    hint = _FAULT_HINT if code in _FAULTS else _HINTS.get(code)
    if hint:
        msg += f" ({hint})"
    try:
        name = drv.CUresult(code).name
    except Exception:
        name = f"CUresult {code}"
    return CudaError(msg, code, name)


def _call(drv: Any, fn: str, *args: Any, what: str = "") -> Any:
    """Call ``drv.fn(*args)``; raise `CudaError` on a CUresult other than success, a
    `TecompError` if the binding itself raises. Returns the outputs (one value, a tuple of
    several, or None)."""
    try:
        res = getattr(drv, fn)(*args)
    except Exception as e:
        pre = f"{what}: " if what else ""
        raise TecompError(f"{pre}{fn} raised {type(e).__name__}: {e}") from e
    code = int(res[0])
    if code != _SUCCESS:
        raise _raise_cuda(drv, code, fn, what)
    if len(res) == 1:
        return None
    return res[1] if len(res) == 2 else tuple(res[1:])


def _compute_capability(drv: Any, dev: Any) -> tuple[int, int]:
    a = drv.CUdevice_attribute
    return (int(_call(drv, "cuDeviceGetAttribute",
                      a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)),
            int(_call(drv, "cuDeviceGetAttribute",
                      a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)))


class _Active:
    """``with device.activate():`` pushes the device's primary context on this thread."""

    __slots__ = ("_dev",)

    def __init__(self, dev: CudaDevice) -> None:
        self._dev = dev

    def __enter__(self) -> CudaDevice:
        _call(self._dev.drv, "cuCtxPushCurrent", self._dev.context, what="making the context current")
        return self._dev

    def __exit__(self, typ: object, *exc: object) -> None:
        if typ is None:
            _call(self._dev.drv, "cuCtxPopCurrent", what="releasing the context")
        else:  # keep the exception in flight; a dead context may fail this too
            try:
                self._dev.drv.cuCtxPopCurrent()
            except Exception:
                pass


class CudaDevice:
    """One GPU and its primary context (retained on first use). Get it with `get_device`."""

    def __init__(self, drv: Any, ordinal: int) -> None:
        self.drv, self.ordinal = drv, ordinal
        self.handle = _call(drv, "cuDeviceGet", ordinal, what=f"opening CUDA device {ordinal}")
        name = _call(drv, "cuDeviceGetName", 256, self.handle, what="reading the device name")
        self.name = bytes(name).split(b"\0", 1)[0].decode(errors="replace")
        self.compute_capability = _compute_capability(drv, self.handle)
        a = drv.CUdevice_attribute

        def attr(n: str) -> int:
            return int(_call(drv, "cuDeviceGetAttribute", getattr(a, n), self.handle,
                             what=f"reading {n}"))

        self.max_threads_per_block = attr("CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK")
        self.max_block_dim = (attr("CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X"),
                              attr("CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y"),
                              attr("CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z"))
        self.max_grid_dim = (attr("CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X"),
                             attr("CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y"),
                             attr("CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z"))
        self.max_shared_per_block = attr("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK")
        self.max_shared_per_block_optin = attr("CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN")
        self.multiprocessor_count = attr("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT")
        self.context = _call(drv, "cuDevicePrimaryCtxRetain", self.handle,
                             what=f"retaining the primary context of device {ordinal}")

    @property
    def arch(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    def activate(self) -> _Active:
        return _Active(self)

    def synchronize(self) -> None:
        with self.activate():
            _call(self.drv, "cuCtxSynchronize", what=f"synchronizing device {self.ordinal}")

    def __repr__(self) -> str:
        return f"<CudaDevice {self.ordinal}: {self.name} ({self.arch})>"


def get_device(ordinal: int = 0) -> CudaDevice:
    """The `CudaDevice` ``ordinal`` with its primary context; raises `CudaUnavailable`."""
    drv = _driver()
    dev = _devices.get(ordinal)
    if dev is not None:
        return dev
    with _lock:
        dev = _devices.get(ordinal)
        if dev is None:
            count = int(_call(drv, "cuDeviceGetCount", what="counting CUDA devices"))
            if not 0 <= ordinal < count:
                raise TecompError(f"CUDA device {ordinal} requested, but this machine has "
                                  f"{count} CUDA device{'s' if count != 1 else ''}")
            dev = _devices[ordinal] = CudaDevice(drv, ordinal)
    return dev


# kernels ------------------------------------------------------------------------------------

def _image_bytes(image: str | bytes | bytearray | memoryview) -> bytes:
    if isinstance(image, str):
        return image.encode() + b"\0"
    data = bytes(image)
    if data[:4] == b"\x7fELF" or data[:4] == b"\x50\xed\x55\xba":  # cubin, fatbin
        return data
    return data if data.endswith(b"\0") else data + b"\0"  # PTX must be NUL-terminated


class CudaModule:
    """A PTX text or cubin/fatbin image for one device; loaded into the device's primary
    context on first use (constructing one needs no GPU).

    >>> mod = CudaModule(ptx)                                               # doctest: +SKIP
    >>> k = mod.kernel("add_one", [ParamSpec("A", "float32", ("n",)),
    ...                            ParamSpec("B", "float32", ("n",), output=True)], ["n"],
    ...                launch={"blockIdx.x": "(n + 127) // 128", "threadIdx.x": 128})
    >>> k(a, b)                                                             # doctest: +SKIP
    """

    def __init__(self, image: str | bytes | bytearray | memoryview, device: int = 0,
                 cubins: Mapping[str, bytes] | None = None) -> None:
        self.image = _image_bytes(image)
        self.device_ordinal = device
        # binary images by arch ("sm_80"), preferred over ``image`` on a device they run on:
        # no JIT at load, and no dependence on the driver's PTX ISA version
        self.cubins = dict(cubins or {})
        self.loaded_from: str | None = None  # "cubin sm_80" / "PTX" once loaded
        self._handle: Any = None
        self._device: CudaDevice | None = None
        self._functions: dict[str, Any] = {}
        self._kernels: dict[str, CudaKernel] = {}
        # per function name: the dynamic shared memory its CUfunction is opted in to (bytes)
        self._smem_optin: dict[str, int] = {}

    @property
    def is_ptx(self) -> bool:
        return self.image[:4] not in (b"\x7fELF", b"\x50\xed\x55\xba")

    def get_source(self) -> str:
        """The PTX text (ValueError for a binary image)."""
        if not self.is_ptx:
            raise ValueError("this module was loaded from a binary image (cubin/fatbin), not PTX")
        return self.image.rstrip(b"\0").decode()

    # driver side
    def load(self) -> CudaDevice:
        """Load the image now (else on the first launch); returns its device."""
        if self._handle is not None:
            return self._device  # type: ignore[return-value]
        dev = get_device(self.device_ordinal)
        with _lock:
            if self._handle is None:
                with dev.activate():
                    self._handle = self._load_image(dev)
                self._device = dev
        return dev

    def _load_image(self, dev: CudaDevice) -> Any:
        arch = pick_cubin(self.cubins, dev.compute_capability)
        where = f"on device {dev.ordinal} ({dev.name}, {dev.arch})"
        if arch is not None:
            try:
                handle = _call(dev.drv, "cuModuleLoadData", self.cubins[arch],
                               what=f"loading the {arch} cubin {where}")
                self.loaded_from = f"cubin {arch}"
                return handle
            except CudaError:
                # e.g. a driver older than the ptxas that made the cubin: the PTX may still JIT
                if not self.is_ptx:
                    raise
        what = f"loading a {'PTX' if self.is_ptx else 'cubin'} module {where}"
        handle = _call(dev.drv, "cuModuleLoadData", self.image, what=what)
        self.loaded_from = "PTX" if self.is_ptx else "cubin"
        return handle

    def get_function(self, name: str) -> Any:
        """The driver's ``CUfunction`` for the ``.entry`` named ``name``."""
        fn = self._functions.get(name)
        if fn is None:
            dev = self.load()
            with dev.activate():
                fn = _call(dev.drv, "cuModuleGetFunction", self._handle, name.encode(),
                           what=f"looking up kernel '{name}' in the module")
            self._functions[name] = fn
        return fn

    def kernel(self, name: str, params: Sequence[ParamSpec], dims: Sequence[str] = (),
               launch: Mapping[str, int | str] | None = None, shared_mem: int = 0,
               check_overlap: bool = True) -> CudaKernel:
        """Describe (and register under ``name``) the ``.entry name``; see `CudaKernel`."""
        k = CudaKernel(self, name, params, dims, launch or {}, shared_mem, check_overlap)
        self._kernels[name] = k
        return k

    def kernel_for(self, spec: KernelSpec, launch: Mapping[str, int | str],
                   shared_mem: int = 0) -> CudaKernel:
        """`kernel` from a `KernelSpec` (e.g. ``KernelSpec.of(primfunc)``); ``launch`` as in
        `launch_spec_of`."""
        return self.kernel(spec.name, spec.params, spec.dims, launch, shared_mem,
                           spec.check_overlap)

    def __getitem__(self, name: str) -> CudaKernel:
        try:
            return self._kernels[name]
        except KeyError:
            raise KeyError(f"no kernel {name!r} in this CUDA module; it has "
                           f"{', '.join(self._kernels) or 'none described'}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._kernels

    @property
    def function_names(self) -> list[str]:
        return list(self._kernels)

    def __del__(self) -> None:
        handle, dev = getattr(self, "_handle", None), getattr(self, "_device", None)
        if handle is None or dev is None or sys.is_finalizing():
            return
        try:
            with dev.activate():
                dev.drv.cuModuleUnload(handle)
        except Exception:
            pass  # a dead context (after a fault) or a driver already torn down

    def __repr__(self) -> str:
        kind = "PTX" if self.is_ptx else "cubin"
        return f"<tecomp.CudaModule {kind}, {len(self.image)} bytes, device {self.device_ordinal}>"


def pick_cubin(cubins: Mapping[str, bytes], capability: tuple[int, int]) -> str | None:
    """The arch of the cubin in ``cubins`` that runs on a device of compute ``capability``:
    its own arch (``sm_90``, else ``sm_90a``), else the newest of the same major version with
    a minor not above the device's (cubins run on later minors, never across majors;
    ``sm_XYa`` ones only on X.Y itself), else None (load the PTX)."""
    major, minor = capability
    for exact in (f"sm_{major}{minor}", f"sm_{major}{minor}a"):
        if exact in cubins:
            return exact
    best: tuple[int, str] | None = None
    for arch in cubins:
        m = re.fullmatch(r"sm_(\d+)(\d)", arch)
        if m and int(m.group(1)) == major and int(m.group(2)) <= minor:
            if best is None or int(m.group(2)) > best[0]:
                best = (int(m.group(2)), arch)
    return best[1] if best else None


def launch_spec_of(launch: Mapping[str, Any], dim_names: Mapping[Any, str]) -> dict[str, int | str]:
    """A ``launch`` dict of `CudaModule.kernel` from a GPU PrimFunc's ``attrs["launch"]``
    (tag -> Expr over dim vars); ``dim_names`` maps each dim Var to its name in the spec
    (``dict(zip(func.dim_vars, KernelSpec.of(func).dims))``)."""
    from ..ir import expr as E  # noqa: N812
    from .args import _py_expr

    out: dict[str, int | str] = {}
    for tag, e in launch.items():
        out[tag] = e.value if isinstance(e, E.IntImm) else (
            int(e) if isinstance(e, int) else _py_expr(e, dict(dim_names)))
    return out


@dataclass
class PreparedCall:
    """Checked arguments of one call, before any driver work.

    ``host[i]``: the host array to copy in (None for a device argument); ``device[i]``: the
    `DeviceArray` used in place (None for a host one; both None for a scalar parameter);
    ``dims``: the int64 dim values; ``grid``/``block``/``shared_mem``: the launch shape and
    dynamic shared memory bytes; ``scalars``: the value of each scalar parameter by its
    argument position (checked for its dtype; one that names a dim is also in ``dims``).
    """

    host: list[np.ndarray | None]
    device: list[DeviceArray | None]
    dims: tuple[int, ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int = 0
    scalars: dict[int, int | float] = field(default_factory=dict)


class CudaKernel:
    """A GPU kernel ``k(*arrays)`` with tecomp's calling convention (buffers, then int64
    dims, then scalars by value), launched with the grid/block that ``launch`` gives for the
    call's dims."""

    def __init__(self, module: CudaModule, name: str, params: Sequence[ParamSpec],
                 dims: Sequence[str] = (), launch: Mapping[str, int | str] | None = None,
                 shared_mem: int = 0, check_overlap: bool = True) -> None:
        self.module, self.name = module, name
        self.checker = ArgChecker(name, params, dims, check_overlap)
        if not isinstance(shared_mem, int) or shared_mem < 0:
            raise ValueError(f"kernel {name}: shared_mem must be a non-negative int, got {shared_mem!r}")
        self.shared_mem = shared_mem
        self.launch_spec: dict[str, int | str] = dict(launch or {})
        self._extents: list[int | CodeType] = []
        for tag in LAUNCH_TAGS:
            v = self.launch_spec.get(tag, 1)
            if isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0:
                self._extents.append(int(v))
            elif isinstance(v, str) and _SHAPE_EXPR.match(v):
                self._extents.append(compile(v, f"<launch extent {tag} of {name}>", "eval"))
            else:
                raise ValueError(f"kernel {name}: launch extent of {tag} must be a non-negative "
                                 f"int or an expression over dim names, got {v!r}")
        unknown = set(self.launch_spec) - set(LAUNCH_TAGS)
        if unknown:
            raise ValueError(f"kernel {name}: unknown launch tags {sorted(unknown)}; expected "
                             f"some of {', '.join(LAUNCH_TAGS)}")
        chk = self.checker
        # the kernel's parameters (tecomp's calling convention, the CPU one): buffer pointers,
        # the int64 dims, then the scalar parameters that are no dim, by value in their type
        self._c_scalars = [(i, scalar_ctype(chk.params[i]))
                           for i, d in chk._scalars.items() if d is None]
        self._n_args = len(chk._buf_pos) + len(chk.dim_names) + len(self._c_scalars)

    @property
    def params(self) -> tuple[ParamSpec, ...]:
        return self.checker.params

    @property
    def dim_names(self) -> tuple[str, ...]:
        return self.checker.dim_names

    def __repr__(self) -> str:
        sig = ", ".join(f"{p.name}: {p.dtype}{list(p.shape)}" for p in self.params)
        return f"<tecomp.CudaKernel {self.name}({sig})>"

    # argument side (no driver) ---------------------------------------------------------------
    def launch_dims(self, dims: Sequence[int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """``(grid, block)`` for dim values ``dims`` (in `dim_names` order)."""
        env = dict(zip(self.checker.dim_names, dims, strict=True))
        vals = []
        for tag, e in zip(LAUNCH_TAGS, self._extents, strict=True):
            v = e if isinstance(e, int) else eval(e, _SHAPE_NS, env)
            if not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"kernel {self.name}: launch extent of {tag} "
                                 f"({self.launch_spec[tag]}) is {v!r} for {env}")
            vals.append(int(v))
        return (vals[0], vals[1], vals[2]), (vals[3], vals[4], vals[5])

    def prepare(self, *args: object) -> PreparedCall:
        """Check ``args`` like a call does (same errors as the CPU runtime) and classify them
        as host arrays (copied) or device arrays (used in place); needs no GPU."""
        chk = self.checker
        if len(args) != len(chk.params):
            raise chk._count_error(len(args))
        standins: list[object] = []
        device: list[DeviceArray | None] = []
        scalar_pos = chk._scalars
        for i, a in enumerate(args):
            info: DeviceArray | None = None
            if i in scalar_pos:
                pass  # a scalar parameter: the checker checks its value
            elif not isinstance(a, np.ndarray):
                if not hasattr(a, "__dlpack__") and not hasattr(a, "__cuda_array_interface__"):
                    raise TypeError(
                        f"{chk._who(i)}: expected a numpy array or a CUDA array (an object "
                        "with __cuda_array_interface__ or __dlpack__: cupy, numba, torch), "
                        f"got {type(a).__name__}")
                try:
                    info = as_device_array(a)
                except (TypeError, ValueError) as e:
                    raise type(e)(f"{chk._who(i)}: {e}") from None
                except (BufferError, RuntimeError) as e:  # raised by the producer
                    raise TypeError(f"{chk._who(i)}: cannot use it as a CUDA array: "
                                    f"{type(e).__name__}: {e}") from None
            device.append(info)
            standins.append(info.standin() if info is not None else a)
        arrays, cargs = chk.convert(standins)
        index = chk._arr_index
        host: list[np.ndarray | None] = [
            None if d is not None or i in scalar_pos else arrays[index[i]]
            for i, d in enumerate(device)]
        nb = len(arrays)
        dims = tuple(int(d) for d in cargs[nb:nb + len(chk.dim_names)])
        by_value = iter(cargs[nb + len(dims):])
        scalars: dict[int, int | float] = {i: (dims[d] if d is not None else next(by_value))
                                           for i, d in scalar_pos.items()}
        grid, block = self.launch_dims(dims)
        return PreparedCall(host, device, dims, grid, block, self.shared_mem, scalars)

    # driver side ---------------------------------------------------------------------------
    def __call__(self, *args: object) -> None:
        """Run the kernel on ``args`` and wait for it; host outputs are copied back."""
        self._run(self.prepare(*args))

    def launch(self, *args: object, grid: Sequence[int], block: Sequence[int],
               shared_mem: int | None = None) -> None:
        """Run on ``args`` with an explicit grid/block (each 1-3 extents) and dynamic shared
        memory (default: the kernel's), instead of what ``launch`` gives."""
        call = self.prepare(*args)
        call.grid, call.block = _dim3(grid, "grid"), _dim3(block, "block")
        if shared_mem is not None:
            if not isinstance(shared_mem, int) or shared_mem < 0:
                raise ValueError(f"shared_mem must be a non-negative int, got {shared_mem!r}")
            call.shared_mem = shared_mem
        self._run(call)

    def _run(self, call: PreparedCall) -> None:
        dev, fn = self._function()
        with dev.activate():
            bound = _Bound(self, dev, call)
            try:
                bound.copy_in()
                if self._ready(dev, fn, call):
                    self._launch(dev, fn, call, bound.params_address)
                    _call(dev.drv, "cuStreamSynchronize", 0, what=self._what("running", call))
                bound.copy_out()
            finally:
                bound.free()

    def time_evaluator(self, number: int = 10, repeat: int = 3, min_repeat_ms: float = 0,
                       warmup: int = 1) -> Callable[..., BenchmarkResult]:
        """A function that times this kernel on given arguments with CUDA events.

        Host arrays are copied to the device once (outputs back at the end); each repeat
        records an event, launches the kernel ``number`` times back to back, records another
        and reads the time between them (seconds per launch; the events' resolution is about
        0.5 us). A repeat shorter than ``min_repeat_ms`` grows ``number`` and is redone, as in
        the CPU runtime. ``warmup`` launches run first, untimed. An empty launch (a zero grid
        extent) times as 0.

        >>> k.time_evaluator(number=100, repeat=5)(a, b).median                # doctest: +SKIP
        """
        if number < 1 or repeat < 1:
            raise ValueError("number and repeat must be at least 1")

        def evaluate(*args: object) -> BenchmarkResult:
            call = self.prepare(*args)
            dev, fn = self._function()
            drv = dev.drv
            what = self._what("timing", call)
            n = number
            results: list[float] = []
            with dev.activate():
                bound = _Bound(self, dev, call)
                events: list[Any] = []
                try:
                    bound.copy_in()
                    addr = bound.params_address
                    if not self._ready(dev, fn, call):
                        results = [0.0] * repeat
                    for _ in range(warmup if not results else 0):
                        self._launch(dev, fn, call, addr)
                    _call(drv, "cuStreamSynchronize", 0, what=what)
                    if not results:
                        for _ in range(2):
                            events.append(_call(drv, "cuEventCreate", 0,
                                                what="creating a CUDA event"))
                    while len(results) < repeat:
                        start, end = events
                        _call(drv, "cuEventRecord", start, 0, what=what)
                        for _ in range(n):
                            self._launch(dev, fn, call, addr)
                        _call(drv, "cuEventRecord", end, 0, what=what)
                        _call(drv, "cuEventSynchronize", end, what=what)
                        ms = float(_call(drv, "cuEventElapsedTime", start, end, what=what))
                        if ms < min_repeat_ms:
                            per_call = max(ms / n, 1e-6)
                            n = max(int(math.ceil(min_repeat_ms / per_call * 1.2)), n * 2)
                            continue
                        results.append(ms / 1e3 / n)
                    bound.copy_out()
                finally:
                    for ev in events:
                        drv.cuEventDestroy(ev)
                    bound.free()
            return BenchmarkResult(tuple(results), n)

        return evaluate

    def _function(self) -> tuple[CudaDevice, Any]:
        try:
            fn = self.module.get_function(self.name)
        except CudaUnavailable as e:
            raise CudaUnavailable(e.kind, f"cannot run CUDA kernel '{self.name}': {e}") from None
        return self.module._device, fn  # type: ignore[return-value]

    def _what(self, doing: str, call: PreparedCall) -> str:
        return (f"{doing} kernel {self.name} (grid {call.grid}, block {call.block}, "
                f"{call.shared_mem} B dynamic shared memory)")

    def _ready(self, dev: CudaDevice, fn: Any, call: PreparedCall) -> bool:
        """Check the launch shape against the device once per call; False: nothing to launch."""
        grid, block, smem = call.grid, call.block, call.shared_mem
        if 0 in grid or 0 in block:
            return False  # an empty launch: nothing to compute (the driver would reject it)
        pre = f"kernel {self.name} on {dev.name} ({dev.arch})"
        if math.prod(block) > dev.max_threads_per_block:
            raise TecompError(f"{pre}: block {block} has {math.prod(block)} threads; the device "
                              f"allows {dev.max_threads_per_block} per block")
        for ax, g, m in zip("xyz", grid, dev.max_grid_dim, strict=True):
            if g > m:
                raise TecompError(f"{pre}: grid extent {g} on {ax} exceeds the device's {m}")
        for ax, b, m in zip("xyz", block, dev.max_block_dim, strict=True):
            if b > m:
                raise TecompError(f"{pre}: block extent {b} on {ax} exceeds the device's {m}")
        if smem > dev.max_shared_per_block_optin:
            raise TecompError(f"{pre}: {smem} B of dynamic shared memory requested; the device "
                              f"allows {dev.max_shared_per_block_optin} B per block (opt-in; "
                              f"{dev.max_shared_per_block} B without it)")
        optin = self.module._smem_optin
        if smem > dev.max_shared_per_block and smem > optin.get(self.name, 0):
            # above the default 48 KB a kernel must opt in (static + dynamic <= the opt-in max);
            # the attribute belongs to the CUfunction, which every CudaKernel of this name in
            # the module shares: it only ever grows, so no launch undoes another's opt-in
            _call(dev.drv, "cuFuncSetAttribute", fn,
                  dev.drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                  smem, what=self._what("opting in to dynamic shared memory for", call))
            optin[self.name] = smem
        return True

    def _launch(self, dev: CudaDevice, fn: Any, call: PreparedCall, params_address: int) -> None:
        _call(dev.drv, "cuLaunchKernel", fn, *call.grid, *call.block, call.shared_mem, 0,
              params_address, 0, what=self._what("launching", call))


class KernelSequence:
    """A function made of several kernels launched in order (one per stage computed at root),
    called like one kernel: ``seq(*arrays)``.

    Host arrays are copied to the device once, before the first kernel, and the outputs back
    after the last; device arrays are used in place. The tensors passed from kernel to kernel
    (``intermediates``: dtype and a shape function of the dims) live in device memory
    allocated for the call. ``steps``: each kernel with, per parameter, its index in the
    arguments followed by the intermediates (a scalar parameter: the position of the scalar
    argument giving its value), and per dim its index in the function's dims.
    """

    def __init__(self, host: CudaKernel, steps: Sequence[tuple[CudaKernel, Sequence[int], Sequence[int]]],
                 intermediates: Sequence[tuple[str, Callable[[Sequence[int]], tuple[int, ...]]]]) -> None:
        self.host, self.steps, self.intermediates = host, list(steps), list(intermediates)
        self.name = host.name

    def prepare(self, *args: object) -> PreparedCall:
        """The argument checks of a call (no driver needed)."""
        return self.host.prepare(*args)

    def _stage(self, call: PreparedCall, dev: CudaDevice,
               allocs: list[Any]) -> list[DeviceArray | None]:
        """Device memory for every argument (host ones copied in; None for a scalar) and every
        intermediate."""
        drv = dev.drv

        def alloc(nbytes: int, what: str) -> int:
            if nbytes == 0:
                return 0
            p = _call(drv, "cuMemAlloc", nbytes, what=f"allocating {nbytes} B for {what}")
            allocs.append(p)
            return int(p)

        arrays: list[DeviceArray | None] = []
        for i, (h, d) in enumerate(zip(call.host, call.device)):
            if d is not None or h is None:  # in place, or a scalar (passed by value)
                arrays.append(d)
                continue
            who = self.host.checker._who(i)
            ptr = alloc(h.nbytes, who)
            if h.nbytes:
                _call(drv, "cuMemcpyHtoD", ptr, h.ctypes.data, h.nbytes, what=f"copying {who} to the device")
            arrays.append(DeviceArray(ptr, h.shape, h.dtype, device=dev.ordinal))
        for dtype, shape_of in self.intermediates:
            shape = shape_of(call.dims)
            npd = np.dtype(dtype)
            arrays.append(DeviceArray(alloc(math.prod(shape) * npd.itemsize, "an intermediate tensor"),
                                      shape, npd, device=dev.ordinal))
        return arrays

    def _calls(self, call: PreparedCall,
               arrays: list[DeviceArray | None]) -> list[tuple[CudaKernel, PreparedCall]]:
        out = []
        for kernel, idx, dim_idx in self.steps:
            dims = tuple(call.dims[j] for j in dim_idx)
            grid, block = kernel.launch_dims(dims)
            scalars = {p: call.scalars[j] for p, j in enumerate(idx) if kernel.params[p].scalar}
            out.append((kernel, PreparedCall([None] * len(idx), [arrays[j] for j in idx], dims, grid,
                                             block, kernel.shared_mem, scalars)))
        return out

    def _copy_out(self, call: PreparedCall, arrays: list[DeviceArray | None], drv: Any) -> None:
        what = f"copying outputs of {self.name} back to the host"
        for i, h in enumerate(call.host):
            d = arrays[i]
            if h is not None and d is not None and h.nbytes and self.host.params[i].output:
                _call(drv, "cuMemcpyDtoH", h.ctypes.data, d.ptr, h.nbytes, what=what)

    @staticmethod
    def _free(drv: Any, allocs: list[Any]) -> None:
        for p in allocs:
            try:
                drv.cuMemFree(p)
            except Exception:
                pass

    def __call__(self, *args: object) -> None:
        call = self.host.prepare(*args)
        dev = self.host.module.load()
        with dev.activate():
            allocs: list[Any] = []
            try:
                arrays = self._stage(call, dev, allocs)
                for kernel, sub in self._calls(call, arrays):
                    kernel._run(sub)
                self._copy_out(call, arrays, dev.drv)
            finally:
                self._free(dev.drv, allocs)

    def time_evaluator(self, number: int = 10, repeat: int = 3, min_repeat_ms: float = 0,
                       warmup: int = 1) -> Callable[..., BenchmarkResult]:
        """Like `CudaKernel.time_evaluator`, timing all the kernels back to back (seconds per
        run of the whole sequence); copies between host and device are not timed."""
        if number < 1 or repeat < 1:
            raise ValueError("number and repeat must be at least 1")

        def evaluate(*args: object) -> BenchmarkResult:
            call = self.host.prepare(*args)
            dev = self.host.module.load()
            drv = dev.drv
            results: list[float] = []
            n = number
            with dev.activate():
                allocs: list[Any] = []
                bounds: list[_Bound] = []
                try:
                    arrays = self._stage(call, dev, allocs)
                    runs = []
                    for kernel, sub in self._calls(call, arrays):
                        _, fn = kernel._function()
                        b = _Bound(kernel, dev, sub)
                        b.copy_in()  # no host arrays: builds the parameter block only
                        bounds.append(b)
                        if kernel._ready(dev, fn, sub):
                            runs.append((kernel, fn, sub, b.params_address))

                    def once() -> None:
                        for kernel, fn, sub, addr in runs:
                            kernel._launch(dev, fn, sub, addr)

                    what = f"timing {self.name}"
                    for _ in range(warmup):
                        once()
                    _call(drv, "cuStreamSynchronize", 0, what=what)
                    start = _call(drv, "cuEventCreate", 0, what="creating a CUDA event")
                    end = _call(drv, "cuEventCreate", 0, what="creating a CUDA event")
                    try:
                        while len(results) < repeat:
                            _call(drv, "cuEventRecord", start, 0, what=what)
                            for _ in range(n):
                                once()
                            _call(drv, "cuEventRecord", end, 0, what=what)
                            _call(drv, "cuEventSynchronize", end, what=what)
                            ms = float(_call(drv, "cuEventElapsedTime", start, end, what=what))
                            if ms < min_repeat_ms:
                                n = max(int(math.ceil(min_repeat_ms / max(ms / n, 1e-6) * 1.2)), n * 2)
                                continue
                            results.append(ms / 1e3 / n)
                    finally:
                        drv.cuEventDestroy(start)
                        drv.cuEventDestroy(end)
                    self._copy_out(call, arrays, drv)
                finally:
                    for b in bounds:
                        b.free()
                    self._free(drv, allocs)
            return BenchmarkResult(tuple(results), n)
        return evaluate

    def __repr__(self) -> str:
        return f"<tecomp.KernelSequence {self.name}: {', '.join(k.name for k, _, _ in self.steps)}>"


# launch plans -----------------------------------------------------------------------------

@dataclass(frozen=True)
class KernelLaunch:
    """One ``.entry`` of a cuda function and its launch, as plain data.

    ``spec``: the entry's own signature; ``launch``: as in `CudaModule.kernel`, over
    ``spec.dims``; ``args``: per entry parameter, its index in the function's arguments
    followed by its intermediates; ``dims``: per entry dim, its index in the function's dims;
    ``shared_mem``: dynamic shared memory bytes (``sharedMemBytes``): 0 for a kernel whose
    shared arrays are static, all its shared memory for one above the static 48 KB
    (`tecomp.codegen.gpu_shared`), opted in on the function before its first launch.
    """

    spec: KernelSpec
    launch: Mapping[str, int | str]
    args: tuple[int, ...]
    dims: tuple[int, ...]
    shared_mem: int = 0


@dataclass(frozen=True)
class LaunchPlan:
    """A cuda function as plain data: its signature (``spec``, what a caller passes), the
    kernels it launches in order, and the global tensors passed between them
    (``intermediates``, shapes over the function's dim names). A built `GpuFunction` makes
    one from its IR, a loaded library from its manifest; both launch through `launcher`, so
    a loaded function checks and launches exactly like the built one."""

    spec: KernelSpec
    kernels: tuple[KernelLaunch, ...]
    intermediates: tuple[ParamSpec, ...] = ()

    @property
    def single(self) -> bool:
        """One kernel that is the function itself (its name, the arguments in order)."""
        if len(self.kernels) != 1 or self.intermediates:
            return False
        k = self.kernels[0]
        return (k.spec.name == self.spec.name and k.args == tuple(range(len(self.spec.params)))
                and k.dims == tuple(range(len(self.spec.dims))))

    def launcher(self, mod: CudaModule) -> CudaKernel | KernelSequence:
        """The callable (`prepare`, ``__call__``, `time_evaluator`) of this function in ``mod``
        (needs no GPU until it is called)."""
        spec = self.spec
        if self.single:
            k = self.kernels[0]
            return mod.kernel(spec.name, spec.params, spec.dims, k.launch, k.shared_mem,
                              spec.check_overlap)
        # the host signature only checks arguments; each kernel is launched as itself
        host = mod.kernel(spec.name, spec.params, spec.dims, {}, check_overlap=spec.check_overlap)
        steps = [(mod.kernel_for(k.spec, k.launch, k.shared_mem), list(k.args), list(k.dims))
                 for k in self.kernels]
        return KernelSequence(host, steps, [(_numpy_dtype(p.dtype).str, _shape_fn(p, spec.dims))
                                            for p in self.intermediates])


def _numpy_dtype(dtype: str) -> np.dtype:
    from ..ir import dtype as dt

    return np.dtype(dt.to_numpy(dtype))


def _shape_fn(p: ParamSpec, dim_names: Sequence[str]) -> Callable[[Sequence[int]], tuple[int, ...]]:
    extents = [s if isinstance(s, int) else compile(s, f"<shape of {p.name}>", "eval")
               for s in p.shape]

    def shape(dims: Sequence[int]) -> tuple[int, ...]:
        env = dict(zip(dim_names, dims, strict=True))
        return tuple(e if isinstance(e, int) else int(eval(e, _SHAPE_NS, env)) for e in extents)
    return shape


def call_or_explain(kernel: CudaKernel | KernelSequence, name: str, args: Sequence[object],
                    hint: str, run: Callable[..., Any] | None = None) -> Any:
    """Run ``kernel`` (or ``run``, e.g. its timer) on ``args`` and return what it returns;
    where CUDA cannot run, check the arguments first (wrong ones are reported as such) and
    raise `CudaUnavailable` saying why, then ``hint``."""
    ok, why = cuda_available()
    if not ok:
        kernel.prepare(*args)
        kind = _state[0] if isinstance(_state, tuple) else "no-gpu"
        raise CudaUnavailable(kind, f"cannot run cuda kernel {name}: {why}. {hint}")
    return (run or kernel)(*args)


def _dim3(v: Sequence[int], what: str) -> tuple[int, int, int]:
    t = tuple(int(x) for x in v)
    if not 1 <= len(t) <= 3 or any(x < 0 for x in t):
        raise ValueError(f"{what} must be 1 to 3 non-negative extents, got {tuple(v)}")
    return (t + (1, 1))[:3]  # type: ignore[return-value]


def pack_params(params: Sequence[tuple[Any, int | float]]) -> tuple[Any, Any]:
    """``cuLaunchKernel``'s kernelParams for ``(ctypes type, value)`` pairs in the kernel's
    parameter order: each value stored as its C type at the start of its own zeroed 8-byte
    slot (the driver reads each parameter's size from the kernel's signature: 4 bytes for a
    ``.param .f32``, 8 for a pointer), and the array of the slots' addresses. Returns
    ``(slots, pointers)``; both must stay alive until the launch was issued."""
    n = len(params)
    slots = (ctypes.c_uint64 * max(n, 1))()
    base = ctypes.addressof(slots)
    for k, (ctype, value) in enumerate(params):
        if ctypes.sizeof(ctype) > 8:
            raise TypeError(f"kernel parameter {k}: {ctype.__name__} does not fit an 8-byte slot")
        ctype.from_address(base + 8 * k).value = value
    return slots, (ctypes.c_void_p * max(n, 1))(*[base + 8 * k for k in range(n)])


class _Bound:
    """Device memory and the kernelParams array of one call (inside an active context)."""

    def __init__(self, kernel: CudaKernel, dev: CudaDevice, call: PreparedCall) -> None:
        self.kernel, self.dev, self.call = kernel, dev, call
        self.buffers: list[Any] = []  # CUdeviceptr allocations to free
        self.ptrs: list[int] = [0] * len(call.host)
        drv = dev.drv
        for i, d in enumerate(call.device):
            if d is None:
                continue
            self.ptrs[i] = d.ptr
            if d.ptr and not d.any_device:
                self._check_device(i, d)
            if d.stream is not None:
                _call(drv, "cuStreamSynchronize", d.stream,
                      what=f"waiting for the producer stream of {kernel.checker._who(i)}")
        self._values: Any = None
        self._pointers: Any = None

    def _check_device(self, i: int, d: DeviceArray) -> None:
        who = self.kernel.checker._who(i)
        if d.device is not None:
            ordinal = d.device
        else:
            drv = self.dev.drv
            try:
                res = drv.cuPointerGetAttribute(
                    drv.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d.ptr)
            except Exception as e:
                raise TecompError(f"{who}: cannot query its pointer: {e}") from e
            if int(res[0]) != _SUCCESS:
                raise ValueError(f"{who}: {hex(d.ptr)} from {d.source} is not CUDA memory "
                                 f"({_describe(drv, int(res[0]))})")
            ordinal = int(res[1])
        if ordinal != self.dev.ordinal:
            raise ValueError(f"{who} is on CUDA device {ordinal}, but kernel {self.kernel.name} "
                             f"runs on device {self.dev.ordinal}")

    def copy_in(self) -> None:
        drv, what = self.dev.drv, f"copying arguments of kernel {self.kernel.name} to the device"
        for i, h in enumerate(self.call.host):
            if h is None or h.nbytes == 0:
                continue
            dptr = _call(drv, "cuMemAlloc", h.nbytes, what=f"allocating {h.nbytes} B for "
                         f"{self.kernel.checker._who(i)}")
            self.buffers.append(dptr)
            self.ptrs[i] = int(dptr)
            _call(drv, "cuMemcpyHtoD", dptr, h.ctypes.data, h.nbytes, what=what)
        k, call = self.kernel, self.call
        params = ([(ctypes.c_uint64, self.ptrs[i]) for i in k.checker._buf_pos]
                  + [(ctypes.c_int64, d) for d in call.dims]
                  + [(ct, call.scalars[i]) for i, ct in k._c_scalars])
        assert len(params) == k._n_args
        self._values, self._pointers = pack_params(params)

    @property
    def params_address(self) -> int:
        return ctypes.addressof(self._pointers) if self.kernel._n_args else 0

    def copy_out(self) -> None:
        drv = self.dev.drv
        what = f"copying outputs of kernel {self.kernel.name} back to the host"
        for i, h in enumerate(self.call.host):
            if h is not None and h.nbytes and self.kernel.params[i].output:
                _call(drv, "cuMemcpyDtoH", h.ctypes.data, self.ptrs[i], h.nbytes, what=what)

    def free(self) -> None:
        for b in self.buffers:
            try:
                self.dev.drv.cuMemFree(b)
            except Exception:
                pass
        self.buffers.clear()


__all__ = ["CudaDevice", "CudaError", "CudaKernel", "CudaModule", "CudaUnavailable",
           "DeviceArray", "KernelLaunch", "KernelSequence", "LaunchPlan", "PreparedCall",
           "as_device_array", "call_or_explain", "cuda_available", "from_cuda_array_interface",
           "from_dlpack", "from_dlpack_capsule", "get_device", "launch_spec_of", "pack_params", "pick_cubin"]

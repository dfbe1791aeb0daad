"""CUDA arrays a kernel call accepts in place: what ``__cuda_array_interface__`` (versions 0-3)
and DLPack capsules of CUDA memory describe, reduced to a `DeviceArray` (device pointer, shape,
dtype, producer stream, owner to keep alive).

Split from `tecomp.runtime.cuda` (which re-exports every name here): reading these protocols
needs no driver, only ctypes and numpy, and errors say what is wrong without naming the
argument (the caller adds that).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class DeviceArray:
    """What a CUDA array argument reduces to: a device pointer and its layout.

    ``stream``: a producer stream to synchronize before using the memory (None: none);
    ``device``: the device id when the producer says (DLPack), None to ask the driver;
    ``owner``: what keeps the memory alive during the call (the object, or a DLPack capsule);
    ``any_device``: pinned host memory, usable from every device (no device check).
    """

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    readonly: bool = False
    stream: int | None = None
    device: int | None = None
    owner: object = None
    source: str = "__cuda_array_interface__"
    any_device: bool = False

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def standin(self) -> np.ndarray:
        """A numpy array with this dtype/shape whose data pointer is the device pointer, for
        `ArgChecker` (which reads only metadata and the pointer, never the data)."""
        ptr = self.ptr
        if ptr == 0 and self.nbytes == 0:
            return np.empty(self.shape, self.dtype)
        return np.asarray(_Interface({"data": (ptr, self.readonly), "shape": self.shape,
                                      "typestr": self.dtype.str, "version": 3}))


class _Interface:
    def __init__(self, ai: dict[str, Any]) -> None:
        self.__array_interface__ = ai


_DTYPE_KINDS = "biuf"


def _parse_dtype(typestr: object) -> np.dtype:
    if not isinstance(typestr, str):
        raise TypeError(f"typestr must be a string, got {typestr!r}")
    try:
        d = np.dtype(typestr)
    except TypeError:
        raise TypeError(f"unknown typestr {typestr!r}") from None
    if d.kind not in _DTYPE_KINDS or d.fields is not None or d.subdtype is not None:
        raise TypeError(f"typestr {typestr!r} is not a bool/int/uint/float element type")
    if not d.isnative:
        raise TypeError(f"typestr {typestr!r} is byte-swapped; only native byte order is supported")
    return d


def _check_shape(shape: object) -> tuple[int, ...]:
    if not isinstance(shape, (tuple, list)) or not all(
            isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise TypeError(f"shape must be a tuple of non-negative ints, got {shape!r}")
    return tuple(int(s) for s in shape)


def _contiguous(shape: tuple[int, ...], strides: Sequence[int], itemsize: int) -> bool:
    """C-contiguous, strides in bytes; any stride on extent-1 axes; size 0 always is."""
    if 0 in shape:
        return True
    want = itemsize
    for n, s in zip(reversed(shape), reversed(strides), strict=True):
        if n != 1 and s != want:
            return False
        want *= n
    return True


_NOT_CONTIGUOUS = ("the CUDA array must be C-contiguous (strides {strides} for shape {shape}); "
                   "make a contiguous copy first (cupy.ascontiguousarray, tensor.contiguous())")


def from_cuda_array_interface(obj: object, cai: object | None = None) -> DeviceArray:
    """Read ``obj.__cuda_array_interface__`` (versions 0-3). TypeError/ValueError say what is
    wrong without naming the argument (the caller adds that)."""
    if cai is None:
        cai = obj.__cuda_array_interface__  # type: ignore[attr-defined]
    if not isinstance(cai, Mapping):
        raise TypeError(f"__cuda_array_interface__ must be a dict, got {type(cai).__name__}")
    version = cai.get("version")
    if not isinstance(version, int) or not 0 <= version <= 3:
        raise TypeError(f"__cuda_array_interface__ version {version!r} is not supported (0-3)")
    shape = _check_shape(cai.get("shape"))
    dtype = _parse_dtype(cai.get("typestr"))
    data = cai.get("data")
    if (not isinstance(data, (tuple, list)) or len(data) != 2
            or not isinstance(data[0], (int, np.integer)) or data[0] < 0):
        raise TypeError(f"__cuda_array_interface__ 'data' must be (pointer, read_only), got {data!r}")
    ptr, readonly = int(data[0]), bool(data[1])
    if cai.get("mask") is not None:
        raise TypeError("masked CUDA arrays (__cuda_array_interface__ 'mask') are not supported")
    strides = cai.get("strides")
    if strides is not None:
        if not isinstance(strides, (tuple, list)) or len(strides) != len(shape) or not all(
                isinstance(s, (int, np.integer)) and not isinstance(s, bool) for s in strides):
            raise TypeError(f"__cuda_array_interface__ 'strides' must be None or {len(shape)} "
                            f"ints, got {strides!r}")
        if not _contiguous(shape, strides, dtype.itemsize):
            raise ValueError(_NOT_CONTIGUOUS.format(strides=tuple(strides), shape=shape))
    if ptr == 0 and math.prod(shape) != 0:
        raise ValueError("__cuda_array_interface__ 'data' is a NULL pointer for a non-empty array")
    stream = cai.get("stream") if version >= 3 else None
    if stream is not None:
        if not isinstance(stream, (int, np.integer)) or isinstance(stream, bool):
            raise TypeError(f"__cuda_array_interface__ 'stream' must be None or an int, got {stream!r}")
        stream = int(stream)
        if stream in (0, 1, 2):  # legacy / per-thread default streams: ordered with ours
            stream = None
    return DeviceArray(ptr, shape, dtype, readonly, stream, None, obj)


# DLPack (https://dmlc.github.io/dlpack/latest/c_api.html) -----------------------------------

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                ("dl_tensor", _DLTensor)]


KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13
_DL_DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA host", 4: "OpenCL", 7: "Vulkan", 8: "Metal",
                    9: "VPI", 10: "ROCm", 11: "ROCm host", 12: "ext_dev", 13: "CUDA managed",
                    14: "oneAPI", 15: "WebGPU", 16: "Hexagon", 17: "MAIA"}
_DL_CODES = {0: "int", 1: "uint", 2: "float", 6: "bool"}
_DL_READ_ONLY = 1

_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype, _capsule_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
_capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_ptr.restype, _capsule_ptr.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


def dlpack_device(obj: object) -> tuple[int, int] | None:
    """``obj.__dlpack_device__()`` as ints, or None when the object has none."""
    fn = getattr(obj, "__dlpack_device__", None)
    if fn is None:
        return None
    dev = fn()
    return int(dev[0]), int(dev[1])


def from_dlpack_capsule(capsule: object, owner: object = None) -> DeviceArray:
    """Read (without consuming) a DLPack capsule of CUDA memory.

    The capsule stays "dltensor"/"dltensor_versioned", so its own destructor frees the tensor
    once the capsule is dropped; keep it (`DeviceArray.owner`) alive while the memory is used.
    """
    name = _capsule_name(capsule)
    if name == b"dltensor_versioned":
        mt = _DLManagedTensorVersioned.from_address(_capsule_ptr(capsule, name))
        if mt.version.major != 1:
            raise TypeError(f"DLPack version {mt.version.major}.{mt.version.minor} is not "
                            "supported (1.x)")
        t, readonly = mt.dl_tensor, bool(mt.flags & _DL_READ_ONLY)
    elif name == b"dltensor":
        t, readonly = _DLManagedTensor.from_address(_capsule_ptr(capsule, name)).dl_tensor, False
    else:
        raise TypeError(f"__dlpack__ returned a capsule named {name!r}, not a DLPack tensor "
                        "(was it consumed already?)")
    dt_, lanes = t.dtype, t.dtype.lanes
    kind = _DL_CODES.get(dt_.code)
    if kind is None or lanes != 1 or dt_.bits % 8 or (kind == "bool" and dt_.bits != 8):
        raise TypeError(f"DLPack dtype (code {dt_.code}, {dt_.bits} bits, {lanes} lanes) is not "
                        "a bool/int/uint/float scalar type")
    try:
        dtype = np.dtype("bool" if kind == "bool" else f"{kind}{dt_.bits}")
    except TypeError:
        raise TypeError(f"DLPack dtype {kind}{dt_.bits} is not supported") from None
    if t.ndim < 0:
        raise TypeError(f"DLPack ndim {t.ndim} is negative")
    shape = tuple(int(t.shape[k]) for k in range(t.ndim))
    if any(s < 0 for s in shape):
        raise TypeError(f"DLPack shape {shape} has a negative extent")
    if t.strides:
        strides = [int(t.strides[k]) * dtype.itemsize for k in range(t.ndim)]
        if not _contiguous(shape, strides, dtype.itemsize):
            raise ValueError(_NOT_CONTIGUOUS.format(
                strides=tuple(s // dtype.itemsize for s in strides), shape=shape)
                .replace("strides ", "element strides "))
    ptr = (t.data or 0) + int(t.byte_offset)
    if ptr == 0 and math.prod(shape) != 0:
        raise ValueError("DLPack data is a NULL pointer for a non-empty tensor")
    return DeviceArray(ptr, shape, dtype, readonly, None, int(t.device.device_id),
                       (capsule, owner), "__dlpack__")


def from_dlpack(obj: Any, device: tuple[int, int] | None = None) -> DeviceArray:
    """Ask ``obj`` for a DLPack capsule on its CUDA device (synchronized to the legacy
    default stream, on which tecomp launches) and read it."""
    dev = device if device is not None else dlpack_device(obj)
    if dev is None or dev[0] not in (KDL_CUDA, KDL_CUDA_MANAGED, KDL_CUDA_HOST):
        where = _DL_DEVICE_NAMES.get(dev[0], f"device type {dev[0]}") if dev else "unknown"
        raise TypeError(f"the DLPack tensor is on a {where} device, not a CUDA one")
    try:
        capsule = obj.__dlpack__(stream=1, max_version=(1, 0))
    except TypeError:  # a producer older than DLPack 1.0 (no max_version)
        capsule = obj.__dlpack__(stream=1)
    arr = from_dlpack_capsule(capsule, obj)
    if arr.device != dev[1]:
        raise ValueError(f"__dlpack__ says device {arr.device}, __dlpack_device__ says {dev[1]}")
    if dev[0] == KDL_CUDA_HOST:
        arr.device, arr.any_device = None, True
    return arr


def as_device_array(obj: object) -> DeviceArray | None:
    """The `DeviceArray` of a CUDA array argument, or None for host arguments (numpy arrays,
    CPU DLPack tensors) and unknown objects (the checker rejects those)."""
    if isinstance(obj, np.ndarray):
        return None
    try:
        cai = obj.__cuda_array_interface__  # type: ignore[attr-defined]
    except AttributeError:  # e.g. torch raises it for CPU tensors
        cai = None
    if cai is not None:
        return from_cuda_array_interface(obj, cai)
    if hasattr(obj, "__dlpack__"):
        dev = dlpack_device(obj)
        if dev is not None and dev[0] != KDL_CPU:
            return from_dlpack(obj, dev)
    return None


__all__ = ["KDL_CPU", "KDL_CUDA", "KDL_CUDA_HOST", "KDL_CUDA_MANAGED", "DeviceArray",
           "as_device_array", "dlpack_device", "from_cuda_array_interface", "from_dlpack",
           "from_dlpack_capsule"]

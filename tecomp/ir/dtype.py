"""Data types are plain strings ("float32", "int8", "bool"); vectors append "x<lanes>".

Strings keep IR nodes hashable and printable and are what numpy users already write.

16-bit floats (``float16``, ``bfloat16``) are stored in 16 bits and computed in float32: an
expression of a 16-bit float dtype carries a float32 value, rounded to 16 bits (to nearest,
ties to even) only where it is stored to a buffer or explicitly cast to a 16-bit dtype (see
docs/design.md, "16-bit floats"). `compute_dtype` is that register dtype; the numpy helpers
below are the exact conversions the interpreter and constant folding use, matching codegen.
"""

from __future__ import annotations

import functools
import re

import numpy as np

from ..errors import TecompError

SCALAR_DTYPES = (
    "float16", "bfloat16", "float32", "float64",
    "int8", "int16", "int32", "int64",
    "uint8", "uint16", "uint32", "uint64",
    "bool",
)
_VEC = re.compile(r"^([a-z]+[0-9]*)x([0-9]+)$")


def canonical(dtype: object) -> str:
    """Normalise a user dtype (str, numpy dtype, python type) to tecomp's string form."""
    if isinstance(dtype, str):
        m = _VEC.match(dtype)
        if m and m.group(1) in SCALAR_DTYPES:
            return dtype
        if dtype in SCALAR_DTYPES:
            return dtype
    try:
        name = np.dtype(dtype).name  # type: ignore[call-overload]
    except TypeError as e:
        if dtype is _bf16_type():  # ml_dtypes.bfloat16 the scalar type
            return "bfloat16"
        raise TecompError(f"unsupported dtype {dtype!r}") from e
    if name not in SCALAR_DTYPES:
        raise TecompError(f"unsupported dtype {dtype!r}; expected one of {', '.join(SCALAR_DTYPES)}")
    return name


# dtypes are a handful of strings asked about millions of times while lowering: parse each once
@functools.lru_cache(maxsize=256)
def lanes(dtype: str) -> int:
    m = _VEC.match(dtype)
    return int(m.group(2)) if m else 1


@functools.lru_cache(maxsize=256)
def element(dtype: str) -> str:
    """Scalar element type of a (possibly vector) dtype."""
    m = _VEC.match(dtype)
    return m.group(1) if m else dtype


def with_lanes(dtype: str, n: int) -> str:
    e = element(dtype)
    return e if n == 1 else f"{e}x{n}"


_FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})


def is_float(dtype: str) -> bool:
    return element(dtype) in _FLOATS


def is_half(dtype: str) -> bool:
    """float16 or bfloat16 (scalar or vector): stored in 16 bits, computed in float32."""
    return element(dtype) in ("float16", "bfloat16")


def compute_dtype(dtype: str) -> str:
    """The dtype a value of ``dtype`` is computed in: float32 (same lanes) for 16-bit floats."""
    return with_lanes("float32", lanes(dtype)) if is_half(dtype) else dtype


def is_int(dtype: str) -> bool:
    e = element(dtype)
    return e.startswith("int") or e.startswith("uint")


def is_uint(dtype: str) -> bool:
    return element(dtype).startswith("uint")


def is_bool(dtype: str) -> bool:
    return element(dtype) == "bool"


@functools.lru_cache(maxsize=256)
def bits(dtype: str) -> int:
    e = element(dtype)
    if e == "bool":
        return 1
    return int(re.sub(r"[a-z]", "", e))


def itemsize(dtype: str) -> int:
    """Bytes per element in memory (bool is stored as one byte, like numpy)."""
    return max(1, bits(dtype) // 8)


def to_numpy(dtype: str) -> np.dtype:
    """The numpy dtype of arrays of ``dtype`` (bfloat16: ``ml_dtypes.bfloat16``)."""
    e = element(dtype)
    if e == "bfloat16":
        t = _bf16_type()
        if t is None:
            raise TecompError("bfloat16 arrays need the ml_dtypes package (pip install "
                              "ml_dtypes); uint16 arrays of bfloat16 bit patterns also work")
        return np.dtype(t)
    return np.dtype(e)


def storage_numpy(dtype: str) -> np.dtype:
    """The numpy dtype the interpreter keeps ``dtype``'s buffers in (bfloat16: uint16 bits,
    so that it does not need ml_dtypes)."""
    e = element(dtype)
    return np.dtype(np.uint16) if e == "bfloat16" else np.dtype(e)


def value_numpy(dtype: str) -> np.dtype:
    """The numpy dtype the interpreter computes values of ``dtype`` in (`compute_dtype`)."""
    return np.dtype(element(compute_dtype(dtype)))


@functools.cache
def _bf16_type() -> type | None:
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - ml_dtypes is a dependency; uint16 bits still work
        return None
    return ml_dtypes.bfloat16  # type: ignore[no-any-return]


# exact conversions (numpy) -------------------------------------------------------------------
# Codegen emits the same bit arithmetic (tecomp/codegen/llvm_common.py); these are the
# reference the interpreter, the GPU emulator and constant folding share.


def f32_to_bf16_bits(x: object) -> np.ndarray:
    """float32 values -> bfloat16 bit patterns (uint16): round to nearest, ties to even;
    overflow gives inf; NaN keeps its sign and top payload bits and is made quiet."""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint32)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    with np.errstate(over="ignore"):
        r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    q = (u >> np.uint32(16)) | np.uint32(0x40)
    return np.where(nan, q, r).astype(np.uint16)


def bf16_bits_to_f32(bits_: object) -> np.ndarray:
    """bfloat16 bit patterns -> float32 (exact: a shift)."""
    return (np.asarray(bits_, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def f64_to_f32_odd(x: object) -> np.ndarray:
    """float64 -> float32 rounded to odd (truncate, then set the last bit if inexact).

    Rounding to odd first and to nearest-even second is one correct rounding when the
    intermediate has at least two more bits than the target (24 >= 8 + 2 and 11 + 2), so
    float64 -> float32 (odd) -> float16/bfloat16 (RNE) is exact without a float64 path.
    """
    d = np.asarray(x, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        r = d.astype(np.float32)
        back = r.astype(np.float64)
        u = r.view(np.uint32).astype(np.uint32)
        finite = np.isfinite(d)
        # round toward zero: one step back in magnitude where RNE went past |d|
        u = np.where(finite & (np.abs(back) > np.abs(d)), u - np.uint32(1), u)
        inexact = finite & (u.view(np.float32).astype(np.float64) != d)
        u = np.where(inexact, u | np.uint32(1), u)
    return u.astype(np.uint32).view(np.float32)


def round_to(x: object, dtype: str) -> np.ndarray:
    """Float values (float32 or float64 array-like) rounded to the 16-bit float ``dtype``
    (RNE, overflow to inf) and returned as float32, the way 16-bit values are computed."""
    a = np.asarray(x)
    if a.dtype == np.float64 or a.dtype.kind in "iub":
        a = f64_to_f32_odd(np.asarray(a, np.float64))
    a = np.asarray(a, np.float32)
    if element(dtype) == "float16":
        with np.errstate(over="ignore"):
            return a.astype(np.float16).astype(np.float32)
    return bf16_bits_to_f32(f32_to_bf16_bits(a))


def int_range(dtype: str) -> tuple[int, int]:
    """[min, max] of an integer dtype (bool: [0, 1])."""
    if is_bool(dtype):
        return 0, 1
    b = bits(dtype)
    return (0, (1 << b) - 1) if is_uint(dtype) else (-(1 << (b - 1)), (1 << (b - 1)) - 1)


def binary_result(a: str, b: str) -> str:
    """Result dtype of an arithmetic op; operands must already agree (checked by the caller)."""
    return a if a == b else a

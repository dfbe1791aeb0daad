"""Data types are plain strings ("float32", "int8", "bool"); vectors append "x<lanes>".

Strings keep IR nodes hashable and printable and are what numpy users already write.
"""

from __future__ import annotations

import functools
import re

import numpy as np

from ..errors import TecompError

SCALAR_DTYPES = (
    "float16", "float32", "float64",
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


def is_float(dtype: str) -> bool:
    return element(dtype).startswith("float")


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
    return np.dtype(element(dtype))


def binary_result(a: str, b: str) -> str:
    """Result dtype of an arithmetic op; operands must already agree (checked by the caller)."""
    return a if a == b else a

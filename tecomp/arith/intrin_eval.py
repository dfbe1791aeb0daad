"""Reference semantics (numpy) of the pure intrinsics added for TVM's ``tir`` spellings:
bit operations, ``reinterpret`` and the float functions numpy has under other names.

Shared by the interpreter (`tecomp.runtime.interp`, scalars: Python ints in the dtype's range
and numpy float scalars) and the GPU emulator (`tecomp.runtime.gpu_simt`, numpy arrays), so both
evaluate them identically; the code generators must match these definitions:

* shifts take the amount modulo the bit width (x86 and Java; LLVM would make an amount
  ``>= bits`` poison, C and TVM leave it undefined); ``shift_right`` is arithmetic for signed
  and logical for unsigned types;
* ``popcount`` counts the two's complement bits; ``clz(0)`` is the bit width (LLVM's ``ctlz``
  with ``is_zero_poison=false``); both read the operand's own width;
* ``reinterpret`` keeps the bits (same width);
* ``exp10`` of float32 is computed in float64 and rounded once; ``ldexp`` rounds once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..ir import dtype as dt

Fn = Callable[..., Any]

INT_NAMES = frozenset({"popcount", "clz", "bitwise_and", "bitwise_or", "bitwise_xor",
                       "bitwise_not", "shift_left", "shift_right"})


def float_fns(npd: np.dtype) -> dict[str, Fn]:
    """The float intrinsics of this module for numpy dtype ``npd`` (scalars or arrays)."""
    f64 = np.dtype("float64")

    def exp10(x: Any) -> Any:
        wide = np.power(f64.type(10.0), np.asarray(x, f64)) if npd != f64 else np.power(10.0, x)
        return np.asarray(wide).astype(npd)[()]

    return {
        "exp10": exp10, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
        "hypot": np.hypot, "nextafter": np.nextafter,
        "ldexp": lambda x, n: np.ldexp(x, np.asarray(n, np.int32)).astype(npd)[()],
    }


def _wrap(bits: int, signed: bool) -> Callable[[int], int]:
    mask = (1 << bits) - 1

    def wrap(r: int) -> int:
        r &= mask
        return r - (1 << bits) if signed and r >> (bits - 1) else r

    return wrap


def int_scalar_fn(name: str, arg_dtype: str) -> Fn | None:
    """``name`` on Python ints of ``arg_dtype`` (results in their dtype's range), or None."""
    bits = dt.bits(arg_dtype)
    mask = (1 << bits) - 1
    wrap = _wrap(bits, not dt.is_uint(arg_dtype))
    table: dict[str, Fn] = {
        "bitwise_and": lambda a, b: a & b, "bitwise_or": lambda a, b: a | b,
        "bitwise_xor": lambda a, b: a ^ b, "bitwise_not": lambda a: wrap(~a),
        "shift_left": lambda a, b: wrap(a << (b & (bits - 1))),
        # Python's >> is arithmetic; unsigned values are never negative, so it is logical
        "shift_right": lambda a, b: a >> (b & (bits - 1)),
        "popcount": lambda a: bin(a & mask).count("1"),
        "clz": lambda a: bits - (a & mask).bit_length(),
    }
    return table.get(name)


def _clz_vec(u: np.ndarray, bits: int) -> np.ndarray:
    """Leading zeros of unsigned ``u`` by binary search on the highest set bit."""
    u = u.astype(np.uint64)
    n = np.zeros(u.shape, np.int64)
    s = bits // 2
    while s:
        hi = u >> np.uint64(s)
        nz = hi != 0
        n += np.where(nz, s, 0)
        u = np.where(nz, hi, u)
        s //= 2
    return bits - (n + (u != 0))


def int_vector_fn(name: str, arg_dtype: str, ret_dtype: str) -> Fn | None:
    """``name`` on numpy arrays (or Python ints broadcast against them), or None."""
    bits = dt.bits(arg_dtype)
    npd, rd = dt.to_numpy(arg_dtype), dt.to_numpy(ret_dtype)
    udt = np.dtype(f"uint{bits}")

    def bits_of(a: Any) -> np.ndarray:
        return np.asarray(a).astype(npd).view(udt)  # wraps Python ints into the dtype first

    def amount(b: Any) -> np.ndarray:
        return np.asarray(b).astype(np.int64) & (bits - 1)

    table: dict[str, Fn] = {
        "bitwise_and": lambda a, b: np.bitwise_and(bits_of(a), bits_of(b)).view(npd),
        "bitwise_or": lambda a, b: np.bitwise_or(bits_of(a), bits_of(b)).view(npd),
        "bitwise_xor": lambda a, b: np.bitwise_xor(bits_of(a), bits_of(b)).view(npd),
        "bitwise_not": lambda a: np.invert(bits_of(a)).view(npd),
        "shift_left": lambda a, b: (bits_of(a) << amount(b).astype(udt)).view(npd),
        "shift_right": lambda a, b: np.right_shift(np.asarray(a).astype(npd),
                                                   amount(b).astype(npd)),
        "popcount": lambda a: np.bitwise_count(bits_of(a)).astype(rd),
        "clz": lambda a: _clz_vec(bits_of(a), bits).astype(rd),
    }
    return table.get(name)


def reinterpret_fn(src: str, dst: str, vector: bool) -> Fn:
    """The bits of a ``src`` value read as ``dst`` (same width)."""
    s, d = dt.to_numpy(src), dt.to_numpy(dst)
    if vector:
        return lambda v: np.asarray(v).astype(s).view(d)
    if d.kind == "f":
        return lambda v: np.asarray(v).astype(s).view(d)[()]
    return lambda v: np.asarray(v).astype(s).view(d).item()


__all__ = ["INT_NAMES", "float_fns", "int_scalar_fn", "int_vector_fn", "reinterpret_fn"]

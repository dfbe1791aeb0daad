"""Vector loads of ``Ramp(base, s, n)`` with a small constant stride: on the CPU they are ``s``
contiguous loads inside the span the ramp reads and shuffles, not gathers
(`codegen.memory.MemoryMixin._strided_load`). Checked against numpy where the buffer ends at
the last element read (a load past the span would read another allocation, or fault), in
debug builds too, and on the AVX2 and AVX-512 targets."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tecomp as tc
from tecomp import te
from tecomp.runtime.loader import host_cpu_flags

_NEEDS = {"znver3": {"avx2", "fma"}, "znver4": {"avx512f", "avx512bw", "avx512vl"}}


def _strided(n: int, stride: int, offset: int, lanes: int, dtype: str,
             tail: int = 0) -> tuple[te.Schedule, list[te.Tensor]]:
    """B[i] = A[i * stride + offset] + 1, vectorized by ``lanes``; A holds exactly up to the
    last element read, plus ``tail``."""
    A = te.placeholder(((n - 1) * stride + offset + 1 + tail,), dtype, name="A")
    one = 1.0 if dtype.startswith("float") else 1
    B = te.compute((n,), lambda i: A[i * stride + offset] + tc.tir.const(one, dtype), name="B")
    s = te.create_schedule(B.op)
    _, xi = s[B].split(B.op.axis[0], factor=lanes)
    s[B].vectorize(xi)
    return s, [A, B]


def _run(sch: te.Schedule, args: list[te.Tensor], stride: int, offset: int, n: int,
         dtype: str, **kw: object) -> tc.runtime.Module:
    m = tc.build(sch, args, **kw)  # type: ignore[arg-type]
    size = int(args[0].shape[0].value)  # type: ignore[attr-defined]
    a = (np.arange(size) * 7 % 101).astype(dtype)
    b = np.zeros(n, dtype)
    m(a, b)
    np.testing.assert_array_equal(b, a[offset::stride][:n] + 1)
    return m


@pytest.mark.parametrize("stride", [2, 3, 4])
@pytest.mark.parametrize("lanes", [4, 7, 8, 16])
def test_small_strides_are_loads_and_shuffles_not_gathers(stride: int, lanes: int) -> None:
    n = lanes * 3
    sch, args = _strided(n, stride, 1, lanes, "float32")
    m = _run(sch, args, stride, 1, n, "float32")
    ll = m.get_source("ll")
    assert "masked.gather" not in ll and "shufflevector" in ll


def test_a_larger_stride_is_still_a_gather() -> None:
    sch, args = _strided(32, 5, 0, 8, "float32")
    assert "masked.gather" in _run(sch, args, 5, 0, 32, "float32").get_source("ll")


@pytest.mark.parametrize("cpu", ["znver3", "znver4"])
def test_strided_loads_for_avx2_and_avx512_code(cpu: str) -> None:
    target = f"llvm -mcpu={cpu}"
    flags = host_cpu_flags()
    if flags is None or not _NEEDS[cpu] <= flags:
        pytest.skip(f"{cpu} code does not run on this CPU")
    for stride in (2, 3):
        sch, args = _strided(48, stride, 2, 16, "float32")
        _run(sch, args, stride, 2, 48, "float32", target=target)


@settings(max_examples=25, deadline=None)
@given(stride=st.integers(2, 4), offset=st.integers(0, 5), lanes=st.integers(2, 17),
       blocks=st.integers(1, 4), extra=st.integers(0, 5),
       dtype=st.sampled_from(["float32", "float64", "int32", "int8", "float16"]),
       debug=st.booleans())
def test_random_strided_loads_match_numpy(stride: int, offset: int, lanes: int, blocks: int,
                                          extra: int, dtype: str, debug: bool) -> None:
    """Any lane count (a tail loop when ``extra`` is not 0: its masked loads still gather)."""
    n = lanes * blocks + extra
    sch, args = _strided(n, stride, offset, lanes, dtype)
    _run(sch, args, stride, offset, n, dtype, debug=debug)

"""Runtime: argument checks, calling convention, DLPack inputs, sources, time_evaluator."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tecomp.errors import TecompError
from tecomp.ir import Buffer, BufferStore, For, ForKind, PrimFunc, Var, seq
from tecomp.ir.expr import BufferLoad, Expr, FloatImm, IntImm
from tecomp.runtime.args import ArgChecker, ParamSpec, specs_from_primfunc
from tecomp.runtime.cpu import BenchmarkResult
from tecomp.runtime.module import Function, Module, build_cpu


def _buf(name: str, shape: tuple[Expr | int, ...], dtype: str = "float32") -> Buffer:
    return Buffer(name, tuple(IntImm(s) if isinstance(s, int) else s for s in shape), dtype)


def _copy_add_kernel(name: str = "add") -> tuple[PrimFunc, Var]:
    """C[i, j] = A[i, j] + B[j] for A: (n, 4), B: (4,), C: (n, 4)."""
    n = Var("n")
    A, B, C = _buf("A", (n, 4)), _buf("B", (4,)), _buf("C", (n, 4))
    i = Var("i")
    j = Var("j")
    body = For(i, IntImm(0), n, ForKind.SERIAL, For(j, IntImm(0), IntImm(4), ForKind.SERIAL,
               BufferStore(C, BufferLoad(A, (i * 4 + j,)) + BufferLoad(B, (j,)), (i * 4 + j,))))
    return PrimFunc(name, [A, B, C], body, [n]), n


@pytest.fixture(scope="module")
def add() -> Module:
    return build_cpu([_copy_add_kernel()[0]])


def _arrays(rows: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return (rng.random((rows, 4), np.float32), rng.random(4, np.float32),
            np.zeros((rows, 4), np.float32))


def test_call_binds_dims_from_shapes(add: Module) -> None:
    for rows in (0, 1, 5):
        a, b, c = _arrays(rows)
        add(a, b, c)
        np.testing.assert_allclose(c, a + b)
    assert add.entry_name == "add"
    assert isinstance(add["add"], Function)
    assert "add" in add and add.function_names == ["add"]
    assert "A: float32" in repr(add["add"])


def test_wrong_argument_count(add: Module) -> None:
    a, b, c = _arrays()
    with pytest.raises(TypeError, match=r"add\(\) takes 3 array arguments \(A, B, C\), got 2"):
        add(a, b)


def test_wrong_dtype_names_argument(add: Module) -> None:
    a, b, c = _arrays()
    with pytest.raises(TypeError, match=r"argument 1 \('B'\) of add: expected dtype float32, got float64"):
        add(a, b.astype(np.float64), c)


def test_not_an_array(add: Module) -> None:
    a, b, c = _arrays()
    with pytest.raises(TypeError, match=r"argument 1 \('B'\).*got float"):
        add(a, 1.0, c)
    with pytest.raises(TypeError, match=r"got list"):
        add(a, [1.0, 2.0, 3.0, 4.0], c)


def test_wrong_rank_and_constant_extent(add: Module) -> None:
    a, b, c = _arrays()
    with pytest.raises(ValueError, match=r"argument 1 \('B'\) of add: expected shape \(4,\), got \(5,\)"):
        add(a, np.zeros(5, np.float32), c)
    with pytest.raises(ValueError, match=r"argument 0 \('A'\).*expected shape \(n, 4\), got \(3, 4, 1\)"):
        add(a[..., None], b, c)
    with pytest.raises(ValueError,
                       match=r"argument 0 \('A'\).*expected shape \(n, 4\) = \(3, 4\), got \(3, 5\)"):
        add(np.zeros((3, 5), np.float32), b, c)


def test_inconsistent_symbolic_dims(add: Module) -> None:
    a, b, _ = _arrays(3)
    with pytest.raises(ValueError, match=r"argument 2 \('C'\).*axis 0 has extent 4, but n = 3 "
                                         r"from the shape of argument 0 \('A'\)"):
        add(a, b, np.zeros((4, 4), np.float32))


def test_non_contiguous_and_read_only(add: Module) -> None:
    a, b, c = _arrays(6)
    with pytest.raises(ValueError, match=r"argument 0 \('A'\).*C-contiguous"):
        add(a[::2], b, c[:3])
    c.flags.writeable = False
    with pytest.raises(ValueError, match=r"argument 2 \('C'\).*read-only"):
        add(a, b, c)
    ro = a.copy()
    ro.flags.writeable = False
    c2 = np.zeros_like(a)
    add(ro, b, c2)  # read-only inputs are fine
    np.testing.assert_allclose(c2, a + b)


def test_output_overlapping_an_input_is_rejected(add: Module) -> None:
    a, b, _ = _arrays()
    with pytest.raises(ValueError, match=r"argument 2 \('C'\).*overlaps.*argument 0 \('A'\)"):
        add(a, b, a)


def test_noalias_false_allows_in_place_calls() -> None:
    f, _ = _copy_add_kernel()
    f.attrs["noalias"] = False
    mod = build_cpu([f])
    assert "noalias" not in mod.get_source("ll-unopt")
    a, b, _ = _arrays()
    want = a + b
    mod(a, b, a)  # C is A: accepted and computed in place
    np.testing.assert_allclose(a, want)


class DLPackOnly:
    """Exposes only the DLPack protocol, like a CPU torch.Tensor would."""

    def __init__(self, arr: np.ndarray) -> None:
        self._arr = arr

    def __dlpack__(self, **kwargs: Any) -> object:
        return self._arr.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._arr.__dlpack_device__()


def test_dlpack_inputs_and_outputs(add: Module) -> None:
    a, b, c = _arrays()
    add(DLPackOnly(a), DLPackOnly(b), DLPackOnly(c))
    np.testing.assert_allclose(c, a + b)  # written through the DLPack view


def test_time_evaluator(add: Module) -> None:
    a, b, c = _arrays(64)
    res = add["add"].time_evaluator(number=5, repeat=4)(a, b, c)
    assert isinstance(res, BenchmarkResult)
    assert len(res.results) == 4 and res.number == 5
    assert 0 < res.min <= res.median <= max(res.results)
    assert res.mean > 0 and res.std >= 0
    np.testing.assert_allclose(c, a + b)
    grown = add.time_evaluator(number=1, repeat=2, min_repeat_ms=5)(a, b, c)
    assert grown.number > 1
    assert all(r * grown.number >= 4e-3 for r in grown.results)
    assert "median" in str(grown)
    with pytest.raises(ValueError):
        add["add"].time_evaluator(number=0)


def test_multiple_functions_in_one_module() -> None:
    f1, _ = _copy_add_kernel("first")
    f2, _ = _copy_add_kernel("second")
    mod = build_cpu([f1, f2])
    a, b, c = _arrays()
    mod["second"](a, b, c)
    np.testing.assert_allclose(c, a + b)
    with pytest.raises(TecompError, match="several kernels"):
        mod(a, b, c)
    with pytest.raises(KeyError, match="no kernel 'third'"):
        mod["third"]


def test_get_source_formats(add: Module) -> None:
    assert "define i32 @\"add\"" in add.get_source("ll-unopt")
    assert "define" in add.get_source("ll")
    assert "add:" in add.get_source("asm")
    with pytest.raises(ValueError, match="unknown source format"):
        add.get_source("ptx")


def test_computed_extent_is_checked() -> None:
    n = Var("n")
    A, B = _buf("A", (n,)), _buf("B", (n - 2,))
    i = Var("i")
    body = For(i, IntImm(0), n - 2, ForKind.SERIAL,
               BufferStore(B, BufferLoad(A, (i,)) + BufferLoad(A, (i + 2,)), (i,)))
    mod = build_cpu([PrimFunc("diff", [A, B], body, [n])])
    a = np.arange(10, dtype=np.float32)
    b = np.zeros(8, np.float32)
    mod(a, b)
    np.testing.assert_array_equal(b, a[:-2] + a[2:])
    with pytest.raises(ValueError,
                       match=r"argument 1 \('B'\).*expected shape \(\(n - 2\),\) = \(8,\), got \(9,\)"):
        mod(a, np.zeros(9, np.float32))


def test_outputs_attr_and_inferred_outputs() -> None:
    f, _ = _copy_add_kernel()
    specs, dims = specs_from_primfunc(f)
    assert [s.output for s in specs] == [False, False, True] and dims == ["n"]
    f.attrs["outputs"] = [0, 2]
    specs, _ = specs_from_primfunc(f)
    assert [s.output for s in specs] == [True, False, True]


def test_dims_that_cannot_be_inferred() -> None:
    with pytest.raises(TecompError, match="cannot be inferred"):
        ArgChecker("k", [ParamSpec("A", "float32", ("(n + 1)",))], ["n"])


def test_scalar_results_from_argchecker_are_plain_ints() -> None:
    chk = ArgChecker("k", [ParamSpec("A", "float32", ("n", 2)), ParamSpec("B", "int8", ("n",), True)],
                     ["n"])
    arrays, cargs = chk.convert([np.zeros((3, 2), np.float32), np.zeros(3, np.int8)])
    assert len(arrays) == 2 and cargs[-1] == 3 and all(isinstance(x, int) for x in cargs)


def test_args_module_does_not_import_llvmlite() -> None:
    root = Path(__file__).resolve().parents[2]
    code = ("import sys; import tecomp.runtime.args, tecomp.runtime.cpu; "
            "assert 'llvmlite' not in sys.modules, 'llvmlite imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def test_heap_local_buffer_error_free_and_float_constants() -> None:
    # a kernel whose body is a SeqStmt of two loops over one output, with a float immediate
    n = Var("n")
    A = _buf("A", (n,))
    i = Var("i")
    body = seq(For(i, IntImm(0), n, ForKind.SERIAL, BufferStore(A, FloatImm(0.25), (i,))),
               For(i, IntImm(0), n, ForKind.SERIAL,
                   BufferStore(A, BufferLoad(A, (i,)) * FloatImm(4.0), (i,))))
    mod = build_cpu([PrimFunc("fill", [A], body, [n])])
    a = np.zeros(7, np.float32)
    mod(a)
    np.testing.assert_array_equal(a, np.ones(7, np.float32))


def test_data_pointers_are_read_fast_and_right() -> None:
    """Kernel calls read each array's data pointer from numpy's struct (``args._data_ptr``):
    ``__array_interface__`` built a dict per array, most of a small kernel's call. On CPython
    with numpy's layout the fast reader is the one in use, and it agrees with the interface on
    views, offsets, transposes, empty, read-only and subclassed arrays."""
    from tecomp.runtime import args as runtime_args

    assert runtime_args._data_ptr is not runtime_args._data_ptr_by_interface
    base = np.arange(60, dtype=np.float64).reshape(5, 12)
    ro = base.copy()
    ro.flags.writeable = False
    cases = [base, base[2:, 3:], base.T, base[::2, ::3], np.zeros(0, np.float32), ro,
             np.ma.masked_array(base).data, np.arange(7, dtype=np.int16)[1:].view(np.uint8)]
    for a in cases:
        assert runtime_args._data_ptr(a) == a.__array_interface__["data"][0]
    # and a kernel reads the element the view starts at
    import tecomp as tc
    from tecomp import te

    A = te.placeholder((4,), "float32", name="A")
    B = te.compute((4,), lambda i: A[i] * 2.0, name="B")
    f = tc.build(te.create_schedule(B.op), [A, B])
    src = np.arange(10, dtype=np.float32)
    out = np.zeros(4, np.float32)
    f(src[3:7], out)
    np.testing.assert_array_equal(out, src[3:7] * 2)

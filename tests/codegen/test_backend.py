"""The CPU backend: codegen -> artifact (data) -> compiled -> loaded or exported, one path."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

import tecomp as tc
from tecomp import te
from tecomp.codegen import llvm_jit
from tecomp.codegen.backend import Artifact, CPUBackend, backend_for
from tecomp.codegen.target import Target
from tecomp.errors import TecompError


def _funcs() -> list:
    n = te.var("n")
    A = te.placeholder((n, 8), "float32", name="A")
    B = te.compute((n, 8), lambda i, j: te.exp(A[i, j]) * 2.0, name="B")
    s = te.create_schedule(B.op)
    s[B].vectorize(s[B].op.axis[1])
    C = te.compute((n, 8), lambda i, j: A[i, j] + 1.0, name="C")
    s2 = te.create_schedule(C.op)
    s2[C].parallel(s2[C].op.axis[0])
    return [tc.lower(s, [A, B], name="expx2"), tc.lower(s2, [A, C], name="plus1")]


def _check(mod) -> None:
    a = np.linspace(-2, 2, 40, dtype=np.float32).reshape(5, 8)
    b = np.empty_like(a)
    mod["expx2"](a, b)
    np.testing.assert_allclose(b, np.exp(a) * 2, rtol=1e-6)
    mod["plus1"](a, b)
    np.testing.assert_array_equal(b, a + 1)


def test_artifact_travels_and_loads_from_its_object_code(monkeypatch: pytest.MonkeyPatch) -> None:
    be = backend_for("llvm")
    assert isinstance(be, CPUBackend)
    art = be.compile(be.codegen(_funcs(), Target.parse("llvm"), name="two"))
    assert art.binary and art.names == ["expx2", "plus1"] and art.uses_openmp and not art.debug
    again = pickle.loads(pickle.dumps(art))  # what a builder process sends the measuring one
    assert isinstance(again, Artifact) and again.binary == art.binary

    def no_optimising(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("compiled code must be linked, not compiled again")

    monkeypatch.setattr(llvm_jit, "parse_and_optimize", no_optimising)
    mod = be.load(again)
    _check(mod)
    assert mod.artifact is again and mod["plus1"].params[1].output


def test_build_and_export_share_the_artifact(tmp_path: Path) -> None:
    funcs = _funcs()
    mod = tc.build(funcs, target="llvm")
    _check(mod)
    assert "exp" in mod.get_source("ll-unopt") and mod.artifact.source == mod.get_source("ll-unopt")
    files = mod.export_library(tmp_path / "k.so")
    _check(tc.runtime.load_module(str(files.library)))


def test_debug_artifact_loaded_from_object_code_reports_out_of_bounds() -> None:
    from tecomp.lowering import lower

    A = te.placeholder((8,), "float32", name="A")
    B = te.compute((8,), lambda i: A[i + 1], name="B")  # reads one past the end
    be = backend_for("llvm")
    art = be.codegen([lower(te.create_schedule(B.op), [A, B], name="shift", debug=True)],
                     Target.parse("llvm"), debug=True)
    assert art.debug and "A" in art.debug_buffers
    mod = be.load(be.compile(art))
    with pytest.raises(IndexError, match=r"buffer 'A': flat index 8 not in \[0, 8\)"):
        mod(np.arange(8, dtype=np.float32), np.empty(8, np.float32))


def test_a_target_kind_without_backend_is_a_clear_error() -> None:
    with pytest.raises(TecompError, match="no backend for targets of kind 'vliw'"):
        backend_for(Target(kind="vliw"))

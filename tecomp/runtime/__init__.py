"""Running compiled kernels: JIT modules, libraries loaded from disk, the reference interpreter.

Attributes are imported lazily: ``tc.runtime.load_module`` must work in a process where
llvmlite (and so `module`, the JIT path) cannot be imported, e.g. a deployment that only has
an exported library.

>>> lib = tc.runtime.load_module("out/kernels.so")  # doctest: +SKIP
>>> lib["mm"](a, b, c)                                # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from typing import Any

# attribute -> submodule that defines it (only `module` and `export` need llvmlite)
_LAZY = {
    "load_module": "loader", "LoadedModule": "loader",
    "Module": "module", "build_cpu": "module",
    "Function": "cpu", "BenchmarkResult": "cpu",
    "ParamSpec": "args",
    "LibraryFiles": "export", "export_modules": "export",
    "GpuModule": "gpu_module", "GpuFunction": "gpu_module",
    "cuda_available": "cuda",
}


def convert(value: Any) -> Any:
    """TVM's ``runtime.convert``: a Python number becomes an immediate expression, a list or
    tuple a list of converted items; expressions and other objects are returned as they are."""
    from ..ir.expr import Expr, to_expr

    if isinstance(value, (list, tuple)):
        return [convert(v) for v in value]
    if isinstance(value, (bool, int, float)) and not isinstance(value, Expr):
        return to_expr(value)
    return value


def __getattr__(name: str) -> Any:
    sub = _LAZY.get(name)
    if sub is None:
        raise AttributeError(f"module 'tecomp.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{sub}", __name__), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = sorted([*_LAZY, "convert"])

"""tecomp: a tensor-expression compiler with an auto-scheduler (the classic TVM flow, in Python).

>>> import tecomp as tc
>>> from tecomp import te
>>> A = te.placeholder((4,), "float32", name="A")
>>> B = te.compute((4,), lambda i: A[i] * 2, name="B")
>>> s = te.create_schedule(B.op)
>>> print(tc.lower(s, [A, B]))  # doctest: +NORMALIZE_WHITESPACE
def main(A: float32[4], B: float32[4]):
  for i in range(4):
    B[i] = A[i] * 2.0f
"""

from __future__ import annotations

from typing import Any

from . import te
from .errors import CodegenError, LoweringError, ScheduleError, TecompError
from .ir.expr import Expr, FloorDiv, FloorMod
from .ir.expr import const as _const
from .ir.expr import to_expr as _to_expr

__version__ = "0.1.0"


def const(value: Any, dtype: str | None = None) -> Expr:
    """An immediate value (``tc.const(0, "float32")``)."""
    return _const(value, dtype)


def indexdiv(a: Any, b: Any) -> Expr:
    """Floor division of index expressions (``a // b`` with Python semantics)."""
    return _to_expr(a) // b


def indexmod(a: Any, b: Any) -> Expr:
    """Floor modulo of index expressions (``a % b`` with Python semantics)."""
    return _to_expr(a) % b


floordiv = indexdiv
floormod = indexmod


def lower(sch: Any, args: Any, name: str = "main", simple_mode: bool = False,
          target: Any = None) -> Any:
    """The loop-nest IR of ``sch`` after the pass pipeline; ``str()`` of it reads as code.

    ``target`` ("llvm" by default; "cuda -arch=sm_80" for a GPU kernel) decides what thread
    bindings and storage scopes mean and which passes run.
    """
    from .lowering import lower as _lower

    return _lower(sch, args, name=name, target=target)


def build(sch: Any, args: Any = None, target: Any = "llvm", name: str = "main",
          debug: bool = False) -> Any:
    """Compile to a callable Module (see tecomp.build_module.build)."""
    from .build_module import build as _build

    return _build(sch, args, target=target, name=name, debug=debug)


def load_extern_library(path: str) -> None:
    """Load a shared library so kernels can call its C functions (te.call_extern, intrinsics)."""
    from .codegen.llvm_jit import load_extern_library as _load

    _load(path)


def __getattr__(name: str) -> Any:
    # runtime is imported lazily so `import tecomp` stays fast
    if name in ("runtime", "tir", "target"):  # tir/target: TVM's spellings (see those modules)
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'tecomp' has no attribute {name!r}")


__all__ = [
    "CodegenError", "Expr", "FloorDiv", "FloorMod", "LoweringError", "ScheduleError",
    "TecompError", "build", "const", "load_extern_library", "floordiv", "floormod", "indexdiv", "indexmod", "lower",
    "te",
]

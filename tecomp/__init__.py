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
from .te.intrin import (  # TVM's index helpers, also at the top level (tvm.tir.* / tvm.te.*)
    ceildiv,
    div,
    floordiv,
    floormod,
    indexdiv,
    indexmod,
    truncdiv,
    truncmod,
)

__version__ = "0.1.0"


def const(value: Any, dtype: str | None = None) -> Expr:
    """An immediate value (``tc.const(0, "float32")``)."""
    return _const(value, dtype)


def lower(sch: Any, args: Any, name: str = "main", simple_mode: bool = False,
          target: Any = None, binds: Any = None) -> Any:
    """The loop-nest IR of ``sch`` after the pass pipeline; ``str()`` of it reads as code.

    ``target`` ("cuda -arch=sm_80" for a GPU kernel) decides what thread bindings and storage
    scopes mean and which passes run. Without one, a schedule that binds a loop to a GPU
    thread lowers for "cuda" and any other for "llvm": TVM's ``lower`` takes no target, and
    its GPU tutorials print ``tvm.lower(s, ...)`` of thread-bound schedules. ``simple_mode=True``
    (as in TVM 0.19) skips loop partitioning: each nest once, with its tails guarded by ``if``.
    """
    from .lowering import lower as _lower

    if target is None and _binds_threads(sch):
        target = "cuda"

    if simple_mode:  # TVM's simple_mode: every pass but loop partitioning (see simple_pipeline)
        from .build_module import simple_pipeline

        return simple_pipeline(_lower(sch, args, name=name, target=target, binds=binds, passes=False))
    return _lower(sch, args, name=name, target=target, binds=binds)


def _binds_threads(sch: Any) -> bool:
    """Whether a stage of schedule ``sch`` binds a loop to blockIdx/threadIdx/vthread."""
    return any(a.bind_thread is not None for st in getattr(sch, "stages", ())
               for a in st.iter_var_attrs.values())


def build(sch: Any, args: Any = None, target: Any = "llvm", name: str = "main",
          debug: bool = False, binds: Any = None) -> Any:
    """Compile to a callable Module (see tecomp.build_module.build)."""
    from .build_module import build as _build

    return _build(sch, args, target=target, name=name, debug=debug, binds=binds)


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
    "TecompError", "build", "ceildiv", "const", "div", "floordiv", "floormod", "indexdiv",
    "indexmod", "load_extern_library", "lower", "te", "truncdiv", "truncmod",
]

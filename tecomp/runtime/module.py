"""A compiled module: JIT-compiled kernels you can call, inspect and time.

>>> mod = build_cpu([prim_func], "llvm")          # doctest: +SKIP
>>> mod(a, b, c)                                   # single kernel: call the module
>>> mod["matmul"].time_evaluator(number=10)(a, b, c).median
>>> print(mod.get_source("asm"))
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..codegen.llvm_cpu import CodegenCPU, ErrorCode
from ..codegen.llvm_jit import JITModule
from ..codegen.target import Target
from ..errors import TecompError
from ..ir.stmt import PrimFunc
from .args import ArgChecker, specs_from_primfunc
from .cpu import BenchmarkResult, ErrorDecoder, Function, KernelSet, OOBRecord

if TYPE_CHECKING:
    from .export import LibraryFiles

# code -> name, the vocabulary ErrorDecoder (and an exported library's manifest) speaks
ERROR_CODES: dict[int, str] = {int(c): c.name for c in ErrorCode}


class Module(KernelSet):
    """Kernels compiled together into one JIT engine.

    ``mod["name"]`` is a `Function`; calling the module calls its only kernel (or the one
    named ``entry_name``). ``get_source("ll" | "asm" | "ll-unopt")`` shows the optimised IR,
    the assembly, or the IR as generated.
    """

    def __init__(self, jit: JITModule, funcs: Sequence[PrimFunc], debug_buffers: Sequence[str],
                 oob_record: str | None, uses_openmp: bool = False) -> None:
        self._jit = jit
        self.target = jit.target
        self.debug = oob_record is not None
        # what export_library needs to rebuild the same kernels as a shared object
        self.uses_openmp = uses_openmp
        self.oob_record_name = oob_record
        oob: OOBRecord | None = None
        if oob_record is not None:
            addr = jit.global_address(oob_record)
            oob = OOBRecord.from_address(addr) if addr else None
        names = list(debug_buffers)
        self.debug_buffers = names
        self._functions: dict[str, Function] = {}
        for f in funcs:
            specs, dims = specs_from_primfunc(f)
            checker = ArgChecker(f.name, specs, dims, check_overlap=f.attrs.get("noalias", True))
            self._functions[f.name] = Function(
                f.name, jit.function_address(f.name), checker, owner=jit,
                on_error=ErrorDecoder(f.name, ERROR_CODES, oob, names, owner=jit))
        self.entry_name = funcs[0].name if len(funcs) == 1 else None

    def get_source(self, fmt: str = "ll") -> str:
        """``"ll"`` optimised LLVM IR, ``"asm"`` assembly, ``"ll-unopt"`` IR as generated."""
        return self._jit.get_source(fmt)

    def export_library(self, path: str | os.PathLike[str],
                       provenance: Mapping[str, Any] | None = None,
                       kernel_provenance: Mapping[str, Mapping[str, Any]] | None = None,
                       linker: str | None = None, libs: Sequence[str] = ()) -> LibraryFiles:
        """Write ``path`` (a shared object), a C header and a JSON manifest next to it.

        `tecomp.runtime.load_module` loads the result without the compiler; C programs include
        the header. ``provenance`` (e.g. ``{"log": ..., "record_hash": ...,
        "measured_time_s": ...}``) describes the library, ``kernel_provenance`` each kernel.
        See `tecomp.runtime.export.export_module` for ``linker`` and ``libs``.
        """
        from .export import export_module

        return export_module(self, path, provenance=provenance,
                             kernel_provenance=kernel_provenance, linker=linker, libs=libs)

    def __repr__(self) -> str:
        return f"<tecomp.Module [{', '.join(self._functions)}] target='{self.target}'>"


def build_cpu(funcs: Sequence[PrimFunc], target: str | Target | None = "llvm",
              debug: bool = False, name: str | None = None) -> Module:
    """Generate, optimise and JIT-compile lowered PrimFuncs into a callable `Module`.

    ``debug=True`` bounds-checks every memory access (an out-of-bounds access raises
    IndexError naming the buffer and the flat index instead of corrupting memory).
    """
    if not funcs:
        raise TecompError("build_cpu needs at least one PrimFunc")
    tgt = Target.parse(target)
    cg = CodegenCPU(tgt, debug=debug, module_name=name or funcs[0].name)
    for f in funcs:
        cg.add_function(f)
    jit = JITModule(str(cg.module), tgt, uses_openmp=cg.uses_openmp)
    rec = cg.oob_record_name if debug and cg.oob_record_name in cg.module.globals else None
    return Module(jit, funcs, cg.debug_buffers, rec, uses_openmp=cg.uses_openmp)


__all__ = ["BenchmarkResult", "Function", "Module", "build_cpu"]

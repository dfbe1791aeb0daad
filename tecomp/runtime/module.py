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

from ..codegen.backend import Artifact, CPUBackend
from ..codegen.llvm_cpu import ErrorCode
from ..codegen.llvm_jit import JITModule
from ..codegen.target import Target
from ..errors import TecompError
from ..ir.stmt import PrimFunc
from .args import ArgChecker
from .cpu import BenchmarkResult, ErrorDecoder, Function, KernelSet, OOBRecord

if TYPE_CHECKING:
    from .export import LibraryFiles

# code -> name, the vocabulary ErrorDecoder (and an exported library's manifest) speaks
ERROR_CODES: dict[int, str] = {int(c): c.name for c in ErrorCode}


class Module(KernelSet):
    """Kernels compiled together into one JIT engine.

    ``mod["name"]`` is a `Function`; calling the module calls its only kernel (or the one
    named ``entry_name``). ``get_source("ll" | "asm" | "ll-unopt")`` shows the optimised IR,
    the assembly, or the IR as generated. ``artifact`` is the generated code as data
    (`tecomp.codegen.backend.Artifact`), what `export_library` writes.
    """

    def __init__(self, jit: JITModule, artifact: Artifact) -> None:
        self._jit = jit
        self.artifact = artifact
        self.target = jit.target
        self.debug = artifact.debug
        self.uses_openmp = artifact.uses_openmp
        self.oob_record_name = artifact.oob_record
        oob: OOBRecord | None = None
        if artifact.oob_record is not None:
            addr = jit.global_address(artifact.oob_record)
            oob = OOBRecord.from_address(addr) if addr else None
        names = list(artifact.debug_buffers)
        self.debug_buffers = names
        self._functions: dict[str, Function] = {}
        for k in artifact.kernels:
            checker = ArgChecker(k.name, k.params, k.dims, check_overlap=k.check_overlap)
            self._functions[k.name] = Function(
                k.name, jit.function_address(k.name), checker, owner=jit,
                on_error=ErrorDecoder(k.name, ERROR_CODES, oob, names, owner=jit))
        self.entry_name = artifact.kernels[0].name if len(artifact.kernels) == 1 else None

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
        See `tecomp.runtime.export.write_library` for ``linker`` and ``libs``.
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
    backend = CPUBackend()
    return backend.load(backend.codegen(funcs, Target.parse(target), debug=debug, name=name))


__all__ = ["BenchmarkResult", "Function", "Module", "build_cpu"]

"""Backends: one per target kind, the one path from lowered PrimFuncs to code that runs.

``tc.build``, ``export_library`` / ``build_library`` and the tuner's build and measure jobs all
go through a `Backend`:

* `Backend.codegen` turns PrimFuncs into an `Artifact`: plain, picklable data (the generated
  source, a description of every kernel, flags the runtime needs);
* `Backend.compile` attaches machine code for the artifact's target (done once, e.g. in a
  tuner's builder process, so a measuring process only links it);
* `Backend.load` makes an artifact a callable `tecomp.runtime.Module`;
* `Backend.export` writes it as a library (`tecomp.runtime.export`).

A new target kind is a new Backend (chosen by `backend_for`), not a branch in each of those
places.

>>> art = backend_for("llvm").codegen([prim_func], Target.parse("llvm"))   # doctest: +SKIP
>>> mod = backend_for("llvm").load(art)                                     # doctest: +SKIP
"""

from __future__ import annotations

import abc
import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import TecompError
from ..ir.stmt import PrimFunc
from .target import Target

if TYPE_CHECKING:
    from ..runtime.args import KernelSpec
    from ..runtime.export import LibraryFiles
    from ..runtime.module import Module


@dataclass(frozen=True)
class Artifact:
    """Generated code for one target, as data that can cross process boundaries.

    ``source`` is the code as generated (LLVM IR text for the CPU); ``binary`` the machine
    code for ``target`` once `Backend.compile` ran (an object file for the CPU), else None.
    ``oob_record`` names the global a debug build reports its first out-of-bounds access in
    (None: not a debug build); ``debug_buffers`` are the buffer names its reports index.
    """

    target: Target
    kernels: tuple[KernelSpec, ...]
    source: str
    binary: bytes | None = None
    uses_openmp: bool = False
    oob_record: str | None = None
    debug_buffers: tuple[str, ...] = ()
    # GPU: the final lowered kernels (what the emulator runs; their launch extents)
    funcs: tuple[PrimFunc, ...] = ()

    @property
    def debug(self) -> bool:
        return self.oob_record is not None

    @property
    def names(self) -> list[str]:
        return [k.name for k in self.kernels]


class Backend(abc.ABC):
    """Code generation, compilation, loading and export for one kind of target."""

    kind: ClassVar[str]

    @abc.abstractmethod
    def codegen(self, funcs: Sequence[PrimFunc], target: Target, debug: bool = False,
                name: str | None = None) -> Artifact:
        """Generate code for ``funcs`` (lowered for ``target``) as one module named ``name``."""

    @abc.abstractmethod
    def compile(self, art: Artifact) -> Artifact:
        """``art`` with machine code for its target attached (``binary``)."""

    @abc.abstractmethod
    def load(self, art: Artifact) -> Module:
        """A callable module of ``art``'s kernels in this process."""

    @abc.abstractmethod
    def export(self, art: Artifact, path: str | os.PathLike[str],
               provenance: Mapping[str, Any] | None = None,
               kernel_provenance: Mapping[str, Mapping[str, Any]] | None = None,
               linker: str | None = None, libs: Sequence[str] = ()) -> LibraryFiles:
        """Write ``art`` as a library at ``path`` (with whatever files the target needs);
        ``provenance`` describes the library, ``kernel_provenance`` each kernel (JSON
        objects), ``linker``/``libs`` how it is linked (`tecomp.runtime.export.write_library`)."""


class CPUBackend(Backend):
    """x86-64 (and any LLVM host triple) through llvmlite: MCJIT in process, shared objects
    on disk."""

    kind = "llvm"

    def codegen(self, funcs: Sequence[PrimFunc], target: Target, debug: bool = False,
                name: str | None = None) -> Artifact:
        from ..runtime.args import KernelSpec
        from .llvm_cpu import CodegenCPU

        if not funcs:
            raise TecompError("codegen needs at least one PrimFunc")
        cg = CodegenCPU(target, debug=debug, module_name=name or funcs[0].name)
        for f in funcs:
            cg.add_function(f)
        # a debug build without any checked access defines no record: nothing to report
        rec = cg.oob_record_name if debug and cg.oob_record_name in cg.module.globals else None
        return Artifact(target, tuple(KernelSpec.of(f) for f in funcs), str(cg.module),
                        uses_openmp=cg.uses_openmp, oob_record=rec,
                        debug_buffers=tuple(cg.debug_buffers))

    def compile(self, art: Artifact) -> Artifact:
        from .llvm_jit import emit_object

        if art.binary is not None:
            return art
        return dataclasses.replace(art, binary=emit_object(art.source, art.target))

    def load(self, art: Artifact) -> Module:
        from ..runtime.module import Module
        from .llvm_jit import JITModule

        return Module(JITModule(art.source, art.target, uses_openmp=art.uses_openmp, obj=art.binary), art)

    def export(self, art: Artifact, path: str | os.PathLike[str],
               provenance: Mapping[str, Any] | None = None,
               kernel_provenance: Mapping[str, Mapping[str, Any]] | None = None,
               linker: str | None = None, libs: Sequence[str] = ()) -> LibraryFiles:
        from ..runtime.export import write_library

        return write_library(art.source, art.target, art.kernels, path, debug=art.debug,
                             uses_openmp=art.uses_openmp, oob_record=art.oob_record,
                             debug_buffers=art.debug_buffers, provenance=provenance,
                             kernel_provenance=kernel_provenance, linker=linker, libs=libs,
                             obj=art.binary)


class CUDABackend(Backend):
    """NVIDIA GPUs: LLVM IR for nvptx64 through llvmlite, PTX that the driver loads; the
    lowered kernels travel along for `tecomp.runtime.gpu_emulator`."""

    kind = "cuda"

    def codegen(self, funcs: Sequence[PrimFunc], target: Target, debug: bool = False,
                name: str | None = None) -> Artifact:
        from ..runtime.args import KernelSpec
        from .llvm_nvptx import CodegenNVPTX

        if not funcs:
            raise TecompError("codegen needs at least one PrimFunc")
        if debug:
            raise TecompError("debug=True (bounds-checked kernels) is a CPU build option; on a cuda "
                              "target the emulator checks every access: f.emulate(*arrays)")
        cg = CodegenNVPTX(target)
        for f in funcs:
            for k in f.attrs.get("kernels") or [f]:  # a host function launches several
                _check_launch_vars(k)
                cg.add_function(k)
        return Artifact(target, tuple(KernelSpec.of(f) for f in funcs), str(cg.module),
                        funcs=tuple(funcs))

    def compile(self, art: Artifact) -> Artifact:
        from .llvm_nvptx import emit_ptx

        if art.binary is not None:
            return art
        return dataclasses.replace(art, binary=emit_ptx(art.source, art.target).encode())

    def load(self, art: Artifact) -> Module:
        from ..runtime.gpu_module import GpuModule

        return GpuModule(self.compile(art))  # type: ignore[return-value]

    def export(self, art: Artifact, path: str | os.PathLike[str],
               provenance: Mapping[str, Any] | None = None,
               kernel_provenance: Mapping[str, Mapping[str, Any]] | None = None,
               linker: str | None = None, libs: Sequence[str] = ()) -> LibraryFiles:
        from ..runtime.export import write_cuda_library

        # PTX, cubins for sm_80/sm_90 where ptxas is installed, and the manifest; nothing is
        # linked, so linker/libs do not apply
        return write_cuda_library(self.compile(art), path, provenance=provenance,
                                  kernel_provenance=kernel_provenance)


def _check_launch_vars(kernel: PrimFunc) -> None:
    """Refuse a grid sized by something other than the kernel's dims: the runtime computes
    launch extents from the argument shapes (`tecomp.runtime.cuda.CudaKernel.launch_dims`),
    and a scalar parameter (or any other variable) is not among them."""
    from ..ir import expr as E  # noqa: N812
    from ..ir.functor import free_vars

    dims = set(kernel.dim_vars)
    for tag, ext in (kernel.attrs.get("launch") or {}).items():
        if not isinstance(ext, E.Expr):
            continue
        other = sorted(v.name for v in free_vars(ext) if v not in dims)
        if other:
            raise TecompError(
                f"kernel {kernel.name}: the launch extent of {tag} is {ext}, which depends on "
                f"{', '.join(other)}, not only on dimensions of the argument buffers; a cuda "
                "grid must follow from the argument shapes (a scalar parameter cannot size it: "
                "give the tensor that axis as its shape instead)")


_CPU = CPUBackend()
_CUDA = CUDABackend()


def backend_for(target: str | Target | None) -> Backend:
    """The backend of ``target``'s kind (``"llvm ..."``: `CPUBackend`, ``"cuda ..."``:
    `CUDABackend`)."""
    t = Target.parse(target)
    for b in (_CPU, _CUDA):
        if t.kind == b.kind:
            return b
    raise TecompError(f"no backend for targets of kind {t.kind!r} ({t})")


__all__ = ["Artifact", "Backend", "CPUBackend", "CUDABackend", "backend_for"]

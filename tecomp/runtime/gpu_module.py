"""A built cuda module: its kernels run on an NVIDIA GPU, or emulated on the CPU anywhere.

``tc.build(s, args, target="cuda")`` returns a `GpuModule`. Each function (`GpuFunction`) is
one kernel, or, when several stages are computed at root, one kernel per such stage launched
in order (as TVM does), the tensors between them in global memory allocated for each call:

* ``f(*arrays)`` launches it on the GPU through the driver (`tecomp.runtime.cuda`): numpy
  arrays are copied to the device and back, device arrays (``__cuda_array_interface__`` /
  ``__dlpack__``: torch, cupy, pycuda) are used in place. Without a GPU the call raises a
  `TecompError` that says why and points at ``emulate``; with ``TECOMP_CUDA_EMULATE=1`` in the
  environment every call emulates instead.
* ``f.emulate(*numpy_arrays, seed=0)`` runs the final lowered GPU program on the CPU with
  block/thread/barrier semantics and the race detector (`tecomp.runtime.gpu_emulator`).
* ``f.get_source("ptx" | "ll")`` and ``f.resources`` (ptxas's report: registers, spills,
  shared memory; None with ``f.resources_why`` when ptxas is not installed).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import TecompError
from ..ir import dtype as dt
from ..ir.expr import IntImm
from ..ir.stmt import PrimFunc
from .args import ArgChecker, KernelSpec
from .cpu import BenchmarkResult, KernelSet

if TYPE_CHECKING:
    from ..codegen.backend import Artifact
    from .cuda import LaunchPlan


def _emulating() -> bool:
    return os.environ.get("TECOMP_CUDA_EMULATE", "") not in ("", "0")


class GpuFunction:
    """One kernel of a `GpuModule` (see the module docstring)."""

    def __init__(self, module: GpuModule, spec: KernelSpec, func: PrimFunc) -> None:
        self.module = module
        self.name = spec.name
        self.spec = spec
        self.func = func
        self.checker = ArgChecker(spec.name, spec.params, spec.dims, spec.check_overlap)
        self._kernel: Any = None
        self._plan: LaunchPlan | None = None
        self._resources: Any = None
        self.resources_why = ""

    @property
    def params(self) -> tuple[Any, ...]:
        return self.spec.params

    @property
    def launch(self) -> dict[str, Any]:
        """Grid and block extents by thread tag (expressions over the symbolic dims); for a
        function of several kernels, that dict per kernel name."""
        if "kernels" in self.func.attrs:
            return {k.name: dict(k.attrs["launch"]) for k in self.kernels}
        return dict(self.func.attrs.get("launch") or {})

    @property
    def kernels(self) -> list[PrimFunc]:
        """The GPU kernels this function launches, in order: itself, or one per stage
        computed at root (TVM's ``default_function_kernel0, 1, ...``)."""
        return list(self.func.attrs.get("kernels") or [self.func])

    def _intermediates(self, dims: list[int]) -> list[tuple[Any, tuple[int, ...]]]:
        """(buffer, shape) of the global tensors passed between kernels, for these dims."""
        return [(b, self._shape_fn(b)(dims)) for b in self.func.attrs.get("intermediates") or ()]

    def emulate(self, *arrays: Any, seed: int = 0, race_check: bool = True) -> None:
        """Run the kernel on the CPU on numpy ``arrays`` (outputs written in place; a scalar
        parameter takes a Python or numpy number at its place), with GPU semantics, bounds
        checks and the race detector; ``seed`` shuffles block and thread order (a race-free
        kernel gives the same result for every seed). A function of several kernels runs
        them in order, its intermediate tensors in fresh arrays that start as NaN (floats) or
        a fill pattern (integers), so a read before the write shows."""
        from .gpu_emulator import emulate

        bufs, cargs = self.checker.convert(arrays)  # the same checks and messages as a call
        if "kernels" not in self.func.attrs:
            emulate(self.func, *arrays, seed=seed, race_check=race_check)
            return
        scalar_at = dict(self.func.attrs.get("scalar_params", ()))  # position -> te.var
        value = {v: arrays[p] for p, v in scalar_at.items()}
        by_data = {b.data: a for b, a in zip(self.func.params, bufs, strict=True)}
        nb = len(bufs)
        for b, shape in self._intermediates(cargs[nb:nb + len(self.func.dim_vars)]):
            npd = np.dtype(dt.to_numpy(b.dtype))
            fill: Any = np.nan if npd.kind == "f" else (True if npd.kind == "b" else 0x5A)
            by_data[b.data] = np.full(shape, fill, npd)
        for k in self.kernels:
            kargs: list[Any] = [by_data[b.data] for b in k.params]
            for p, v in sorted(k.attrs.get("scalar_params", ()), key=lambda x: x[0]):
                kargs.insert(p, value[v])  # the kernel's own scalar parameters
            emulate(k, *kargs, seed=seed, race_check=race_check)

    @property
    def plan(self) -> LaunchPlan:
        """The `tecomp.runtime.cuda.LaunchPlan` of this function (`launch_plan`)."""
        if self._plan is None:
            self._plan = launch_plan(self.func, self.spec)
        return self._plan

    def _device_kernel(self) -> Any:
        if self._kernel is None:
            self._kernel = self.plan.launcher(self.module.cuda_module())
        return self._kernel

    def _shape_fn(self, buf: Any) -> Any:
        from ..arith.evaluate import evaluate

        dim_vars = self.func.dim_vars

        def shape(dims: Any) -> tuple[int, ...]:
            env = dict(zip(dim_vars, dims))
            return tuple(int(evaluate(d, env)) for d in buf.shape)  # type: ignore[arg-type]
        return shape

    def __call__(self, *arrays: Any) -> None:
        if _emulating():
            self.emulate(*arrays)
            return
        from .cuda import call_or_explain

        call_or_explain(self._device_kernel(), self.name, arrays,
                        f"Run it on the CPU with {self.name}.emulate(*numpy_arrays), or set "
                        "TECOMP_CUDA_EMULATE=1 to make every call emulate")

    def time_evaluator(self, number: int = 10, repeat: int = 3, min_repeat_ms: float = 0) -> Any:
        """Times device launches with CUDA events (`BenchmarkResult`); needs a GPU."""
        if _emulating():
            raise TecompError(f"{self.name}: TECOMP_CUDA_EMULATE is set; emulated runs are not timed "
                              "(their times say nothing about the GPU)")
        return self._device_kernel().time_evaluator(number=number, repeat=repeat,
                                                    min_repeat_ms=min_repeat_ms)

    def get_source(self, fmt: str = "ptx") -> str:
        """``"ptx"`` (what the driver loads), ``"ll"`` (LLVM IR as generated) or ``"tir"``
        (the final lowered loop nest, what ``emulate`` runs)."""
        if fmt == "ptx":
            return self.module.ptx
        if fmt in ("ll", "llvm"):
            return self.module.artifact.source
        if fmt == "tir":
            return str(self.func)
        raise ValueError(f"unknown source format {fmt!r}; expected 'ptx', 'll' or 'tir'")

    @property
    def resources(self) -> Any:
        """ptxas's report for this kernel for the module's arch (registers, spills, shared
        memory, stack); for a function of several kernels, a dict of them by kernel name;
        None when ptxas is not installed (``resources_why`` says so)."""
        if self._resources is None and not self.resources_why:
            from ..codegen.ptxas import PtxasMissing, ptxas_resources

            try:
                report = ptxas_resources(self.module.ptx, self.module.target.cpu)
            except PtxasMissing as e:
                self.resources_why = str(e)
                return None
            if "kernels" in self.func.attrs:  # several kernels: the report of each by name
                self._resources = {k.name: report[k.name] for k in self.kernels}
            else:
                self._resources = report[self.name] if isinstance(report, Mapping) else report
        return self._resources

    def __repr__(self) -> str:
        sig = ", ".join(f"{p.name}: {p.dtype}{list(p.shape)}" for p in self.params)
        return f"<tecomp.GpuFunction {self.name}({sig}) {self.module.target}>"


def launch_plan(func: PrimFunc, spec: KernelSpec | None = None) -> LaunchPlan:
    """What a call of the cuda function ``func`` (a kernel, or a host function of several,
    docs/gpu-ir.md) launches, as plain data: its kernels in order with their launch extents
    over the argument dims, their arguments and their dynamic shared memory (a kernel whose
    shared memory exceeds the static 48 KB: `tecomp.codegen.gpu_shared`), and the
    intermediates (what a built function runs and what an exported library's manifest
    records). ``spec``: ``KernelSpec.of(func)``."""
    from ..codegen.gpu_shared import dynamic_shared_bytes
    from .args import ParamSpec, _py_expr
    from .cuda import KernelLaunch, LaunchPlan, launch_spec_of

    spec = spec or KernelSpec.of(func)
    inter = list(func.attrs.get("intermediates") or ())
    # argument slots: the function's arguments (buffers and scalars, in the caller's order),
    # then its intermediates; a kernel's scalar parameter takes the slot of its scalar argument
    buf_args = [i for i, p in enumerate(spec.params) if not p.scalar]
    slot = {b.data: buf_args[j] for j, b in enumerate(func.params)}
    slot.update((b.data, len(spec.params) + j) for j, b in enumerate(inter))
    scalar_slot = {v: p for p, v in func.attrs.get("scalar_params", ())}
    launches = []
    for k in func.attrs.get("kernels") or [func]:
        kspec = spec if k is func else KernelSpec.of(k)
        launch = launch_spec_of(k.attrs.get("launch") or {}, dict(zip(k.dim_vars, kspec.dims)))
        kscalars = dict(k.attrs.get("scalar_params", ()))
        kbufs = iter(k.params)
        args = tuple(scalar_slot[kscalars[j]] if p.scalar else slot[next(kbufs).data]
                     for j, p in enumerate(kspec.params))
        launches.append(KernelLaunch(kspec, launch, args,
                                     tuple(_index_of(func.dim_vars, v) for v in k.dim_vars),
                                     dynamic_shared_bytes(k)))
    names = dict(zip(func.dim_vars, spec.dims))
    return LaunchPlan(spec, tuple(launches), tuple(
        ParamSpec(b.name, dt.element(b.dtype), tuple(
            s.value if isinstance(s, IntImm) else _py_expr(s, names) for s in b.shape))
        for b in inter))


def _index_of(dims: list[Any], v: Any) -> int:
    """Position of Var ``v`` in ``dims`` by identity (``==`` on IR builds an expression)."""
    return next(i for i, d in enumerate(dims) if d is v)


class GpuModule(KernelSet):
    """Kernels compiled together for one GPU target (one PTX module)."""

    _where = "this cuda module"

    def __init__(self, artifact: Artifact) -> None:
        if artifact.binary is None:
            raise TecompError("a cuda module is made from a compiled artifact (Backend.compile)")
        self.artifact = artifact
        self.target = artifact.target
        self.ptx = artifact.binary.decode()
        self._cuda: Any = None
        self._functions = {}  # type: ignore[assignment]
        for spec, func in zip(artifact.kernels, artifact.funcs):
            self._functions[spec.name] = GpuFunction(self, spec, func)  # type: ignore[assignment]
        self.entry_name = artifact.kernels[0].name if len(artifact.kernels) == 1 else None

    def cuda_module(self) -> Any:
        """The driver-side module (loaded on the first launch)."""
        if self._cuda is None:
            from .cuda import CudaModule

            self._cuda = CudaModule(self.ptx)
        return self._cuda

    def emulate(self, *arrays: np.ndarray, seed: int = 0, race_check: bool = True) -> None:
        """`GpuFunction.emulate` of the module's only kernel."""
        self._entry().emulate(*arrays, seed=seed, race_check=race_check)

    def _entry(self) -> GpuFunction:
        return self.entry_func  # type: ignore[return-value]

    @property
    def resources(self) -> Any:
        """`GpuFunction.resources` of the module's only kernel."""
        return self._entry().resources

    def get_source(self, fmt: str = "ptx") -> str:
        """``"ptx"`` of the whole module, ``"ll"``, or ``"tir"`` of its only kernel."""
        return self._entry().get_source(fmt) if fmt == "tir" else GpuFunction.get_source(
            self._entry(), fmt)

    def export_library(self, path: str | os.PathLike[str], **options: Any) -> Any:
        """Write the PTX, cubins (sm_80/sm_90 where ptxas is) and a manifest next to ``path``
        (`tecomp.runtime.export.write_cuda_library`); ``tc.runtime.load_module`` loads them."""
        from .export import export_modules

        return export_modules([self], path, **options)

    def __repr__(self) -> str:
        return f"<tecomp.GpuModule [{', '.join(self._functions)}] target='{self.target}'>"


__all__ = ["BenchmarkResult", "GpuFunction", "GpuModule", "launch_plan"]

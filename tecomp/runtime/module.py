"""A compiled module: JIT-compiled kernels you can call, inspect and time.

>>> mod = build_cpu([prim_func], "llvm")          # doctest: +SKIP
>>> mod(a, b, c)                                   # single kernel: call the module
>>> mod["matmul"].time_evaluator(number=10)(a, b, c).median
>>> print(mod.get_source("asm"))
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

from ..codegen.llvm_cpu import CodegenCPU, ErrorCode
from ..codegen.llvm_jit import JITModule
from ..codegen.target import Target
from ..errors import TecompError
from ..ir.stmt import PrimFunc
from .args import ArgChecker, specs_from_primfunc
from .cpu import BenchmarkResult, Function


class _OOBRecord(ctypes.Structure):
    # Mirrors memory._OOB_TYPE: {claimed, buffer id, flat index, extent}.
    _fields_ = [("claimed", ctypes.c_int32), ("buffer", ctypes.c_int32),
                ("index", ctypes.c_int64), ("extent", ctypes.c_int64)]


class _ErrorDecoder:
    """Turns a kernel's nonzero return code into the exception to raise.

    Holds the JIT module (not the Module) so that Module -> Function -> decoder has no cycle
    and the machine code is freed as soon as the last Module/Function is dropped.
    """

    def __init__(self, jit: JITModule, kernel: str, oob: _OOBRecord | None,
                 buffers: list[str]) -> None:
        self._jit, self._kernel, self._oob, self._buffers = jit, kernel, oob, buffers

    def __call__(self, rc: int) -> Exception:
        rec = self._oob
        if rc == ErrorCode.OUT_OF_BOUNDS and rec is not None and rec.claimed:
            names = self._buffers
            buf = names[rec.buffer] if 0 <= rec.buffer < len(names) else f"#{rec.buffer}"
            msg = (f"out-of-bounds access to buffer '{buf}': flat index {rec.index} "
                   f"not in [0, {rec.extent})")
            rec.claimed = 0  # first error wins per call; re-arm for the next one
            return IndexError(msg)
        if rc == ErrorCode.ALLOC_FAILED:
            return MemoryError(f"kernel {self._kernel}: could not allocate a local buffer")
        return TecompError(f"kernel {self._kernel} failed with error code {rc}")


class Module:
    """Kernels compiled together into one JIT engine.

    ``mod["name"]`` is a `Function`; calling the module calls its only kernel (or the one
    named ``entry_name``). ``get_source("ll" | "asm" | "ll-unopt")`` shows the optimised IR,
    the assembly, or the IR as generated.
    """

    def __init__(self, jit: JITModule, funcs: Sequence[PrimFunc], debug_buffers: Sequence[str],
                 oob_record: str | None) -> None:
        self._jit = jit
        self.target = jit.target
        self.debug = oob_record is not None
        oob: _OOBRecord | None = None
        if oob_record is not None:
            addr = jit.global_address(oob_record)
            oob = _OOBRecord.from_address(addr) if addr else None
        names = list(debug_buffers)
        self._functions: dict[str, Function] = {}
        for f in funcs:
            specs, dims = specs_from_primfunc(f)
            checker = ArgChecker(f.name, specs, dims, check_overlap=f.attrs.get("noalias", True))
            self._functions[f.name] = Function(
                f.name, jit.function_address(f.name), checker, owner=jit,
                on_error=_ErrorDecoder(jit, f.name, oob, names))
        self.entry_name = funcs[0].name if len(funcs) == 1 else None

    # access -----------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Function:
        try:
            return self._functions[name]
        except KeyError:
            raise KeyError(f"no kernel {name!r} in this module; it has "
                           f"{', '.join(self._functions)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._functions

    @property
    def function_names(self) -> list[str]:
        return list(self._functions)

    def get_function(self, name: str) -> Function:
        return self[name]

    @property
    def entry_func(self) -> Function:
        if self.entry_name is None:
            raise TecompError(f"module has several kernels ({', '.join(self._functions)}); "
                              "pick one with mod['name'] or set entry_name")
        return self._functions[self.entry_name]

    def __call__(self, *args: object) -> None:
        self.entry_func(*args)

    def time_evaluator(self, number: int = 10, repeat: int = 3, min_repeat_ms: float = 0,
                       name: str | None = None):  # type: ignore[no-untyped-def]
        """`Function.time_evaluator` of the kernel ``name`` (default: the entry kernel)."""
        f = self[name] if name is not None else self.entry_func
        return f.time_evaluator(number=number, repeat=repeat, min_repeat_ms=min_repeat_ms)

    def get_source(self, fmt: str = "ll") -> str:
        """``"ll"`` optimised LLVM IR, ``"asm"`` assembly, ``"ll-unopt"`` IR as generated."""
        return self._jit.get_source(fmt)

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
    return Module(jit, funcs, cg.debug_buffers, rec)


__all__ = ["BenchmarkResult", "Function", "Module", "build_cpu"]

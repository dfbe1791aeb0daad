"""From LLVM IR text to machine code: O3 with the new pass manager, MCJIT, object files.

Build time matters (the tuner compiles thousands of kernels), so TargetMachines are cached per
target, LLVM is initialised once, and the module text is printed once by the caller; the
optimised IR and assembly shown by ``Module.get_source`` are recomputed lazily from that text
only when somebody asks for them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import re
import threading

import llvmlite.binding as llvm

from ..errors import CodegenError, TecompError
from .target import Target

_init_lock = threading.Lock()
_initialized = False


def ensure_llvm_initialized() -> None:
    """Initialise the native target once (``llvm.initialize()`` raises in llvmlite 0.50)."""
    global _initialized
    if _initialized:
        return
    with _init_lock:
        if not _initialized:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            _initialized = True


@functools.cache
def load_compiler_runtime() -> None:
    """Make libgcc's soft-float helpers (``__truncdfhf2`` for double -> half...) and libm's
    functions resolvable.

    LLVM lowers some conversions to these calls; MCJIT only finds symbols that are already
    loaded into the process, and Python itself does not need libgcc_s.
    """
    name = ctypes.util.find_library("gcc_s") or "libgcc_s.so.1"
    try:
        llvm.load_library_permanently(name)
    except RuntimeError:  # pragma: no cover - then only float16 <-> float64 casts are affected
        pass
    # libm too: the symbol check before the first engine of a process finds only libraries
    # loaded permanently (MCJIT adds the process's own symbols when it is created), so a
    # process whose first kernel called fmodf/log1pf was told libm was missing
    try:
        llvm.load_library_permanently(ctypes.util.find_library("m") or "libm.so.6")
    except RuntimeError:  # pragma: no cover - a libc without a separate libm
        pass


@functools.cache
def load_openmp() -> None:
    """Make libgomp's symbols (GOMP_parallel, omp_get_*) visible to JIT-compiled code."""
    name = ctypes.util.find_library("gomp") or "libgomp.so.1"
    try:
        llvm.load_library_permanently(name)
    except RuntimeError as e:
        raise TecompError(
            f"parallel loops need the GNU OpenMP runtime, but {name} could not be loaded ({e}); "
            "install libgomp (e.g. `apt-get install libgomp1`) or remove .parallel() from "
            "the schedule"
        ) from None


def _create_tm(target: Target, jit: bool) -> llvm.TargetMachine:
    ensure_llvm_initialized()
    try:
        llvm_target = llvm.Target.from_triple(target.triple)
    except RuntimeError as e:
        raise TecompError(f"LLVM cannot generate code for triple {target.triple!r}: {e}") from None
    return llvm_target.create_target_machine(
        cpu=target.cpu, features=target.features, opt=3, reloc="pic",
        codemodel="jitdefault" if jit else "default", jit=jit,
    )


@functools.lru_cache(maxsize=16)
def target_machine(target: Target) -> llvm.TargetMachine:
    """The shared TargetMachine of ``target`` for optimisation and object/assembly emission.

    MCJIT takes ownership of the TargetMachine it is given, so engines get a fresh one
    (`_create_tm`) and this cached instance is never handed to an engine.
    """
    if target.cpu and target != Target.host():
        _check_cpu_name(target)
    return _create_tm(target, jit=False)


def _check_cpu_name(target: Target) -> None:
    # LLVM only warns on stderr about an unknown -mcpu, then aborts the whole process when it
    # generates x86-64 code for the feature-less CPU. llvmlite cannot list CPU names, so
    # create a throwaway TargetMachine with stderr captured and look for that warning.
    import os
    import tempfile

    ensure_llvm_initialized()
    try:
        llvm_target = llvm.Target.from_triple(target.triple)
    except RuntimeError:
        return  # reported with a clear message by _create_tm
    saved = os.dup(2)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 2)
        try:
            llvm_target.create_target_machine(cpu=target.cpu, features="", opt=0)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        text = log.read().decode(errors="replace")
    if "not a recognized processor" in text:
        raise TecompError(f"target '{target}': LLVM does not know the CPU {target.cpu!r} "
                          f"(-mcpu) for triple {target.triple}")


def data_layout(target: Target) -> str:
    return str(target_machine(target).target_data)


def parse_and_optimize(ir_text: str, target: Target, opt_level: int = 3) -> llvm.ModuleRef:
    """Parse LLVM IR text, verify it, and run the O``opt_level`` new-PM pipeline on it."""
    ensure_llvm_initialized()
    try:
        mod = llvm.parse_assembly(ir_text)
        mod.verify()
    except RuntimeError as e:
        # A verifier failure is a bug in the code generator, not in the user's program.
        raise CodegenError(f"internal error: generated LLVM IR is invalid: {e}") from None
    tm = target_machine(target)
    pto = llvm.create_pipeline_tuning_options(speed_level=opt_level)
    pto.loop_vectorization = opt_level >= 2
    pto.slp_vectorization = opt_level >= 2
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


class JITModule:
    """MCJIT-compiled machine code plus what is needed to show its source on demand.

    Built from the IR text (optimised here), or, when ``obj`` is given, by linking that object
    code (compiled for ``target`` elsewhere, e.g. in a tuner's builder process): the IR text
    then only serves `get_source`. Object code is used only when it can run here unchanged.
    """

    def __init__(self, ir_text: str, target: Target, uses_openmp: bool = False,
                 obj: bytes | None = None) -> None:
        if not target.is_host:
            raise TecompError(
                f"cannot run code for target '{target}' in this process (host triple is "
                f"{Target.host().triple}); use export_library to cross-compile"
            )
        load_compiler_runtime()
        lacking = target.feature_set - Target.host().feature_set
        if lacking:
            raise TecompError(
                f"cannot run code for target '{target}' here: this CPU lacks "
                f"{', '.join(sorted(lacking))}; use export_library to cross-compile"
            )
        if uses_openmp:
            load_openmp()
        self.ir_text = ir_text
        self.target = target
        self._run_target = _runnable(target)
        if obj is not None and self._run_target == target:
            _check_declared(ir_text)
            # the code is compiled: the engine only links the object and resolves symbols
            self._engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), _create_tm(target, jit=True))
            self._engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        else:
            mod = parse_and_optimize(ir_text, self._run_target)
            _check_symbols(mod)
            self._engine = llvm.create_mcjit_compiler(mod, _create_tm(self._run_target, jit=True))
        self._engine.finalize_object()

    def function_address(self, name: str) -> int:
        addr = self._engine.get_function_address(name)
        if not addr:
            raise TecompError(f"function {name!r} not found in the compiled module")
        return int(addr)

    def global_address(self, name: str) -> int:
        return int(self._engine.get_global_value_address(name))

    def get_source(self, fmt: str = "ll") -> str:
        """``"ll"``: optimised LLVM IR, ``"asm"``: assembly, ``"ll-unopt"``: IR as generated."""
        if fmt == "ll-unopt":
            return self.ir_text
        if fmt in ("ll", "llvm"):
            return str(parse_and_optimize(self.ir_text, self._run_target))
        if fmt in ("asm", "s"):
            return target_machine(self._run_target).emit_assembly(
                parse_and_optimize(self.ir_text, self._run_target)
            )
        raise ValueError(f"unknown source format {fmt!r}; expected 'll', 'asm' or 'll-unopt'")


def _runnable(target: Target) -> Target:
    """``target`` with every feature this CPU lacks switched off.

    A named -mcpu implies features llvmlite cannot list (sapphirerapids: avx512fp16); code
    using one this CPU lacks dies on SIGILL. The host's feature string names each missing
    feature as ``-feat``, so appending those keeps the CPU's tuning and stays runnable.
    """
    host = Target.host()
    if target == host:
        return target
    named = {f[1:] for f in target.features.split(",") if f}
    off = [f for f in host.features.split(",") if f.startswith("-") and f[1:] not in named]
    if not off:
        return target
    import dataclasses

    return dataclasses.replace(target, features=",".join(x for x in (target.features, *off) if x))


def _check_symbols(mod: llvm.ModuleRef) -> None:
    """Fail cleanly on extern functions the process cannot provide.

    MCJIT links unresolved symbols to address 0, so a typo in an extern call would otherwise
    crash the interpreter on the first call instead of raising here.
    """
    missing = []
    for fn in mod.functions:
        if not fn.is_declaration or fn.name.startswith("llvm."):
            continue
        if fn.name.startswith(("omp_", "GOMP_")):
            load_openmp()
        if not llvm.address_of_symbol(fn.name):
            missing.append(fn.name)
    if missing:
        raise TecompError(
            f"extern function(s) {', '.join(sorted(missing))} not found in this process; load "
            "the library that defines them first (e.g. ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL))"
        )


_DECLARE = re.compile(r"^declare [^@\n]*@\"?([-\w.$]+)\"?\(", re.M)


def _check_declared(ir_text: str) -> None:
    """`_check_symbols` for code loaded as an object: the same check, on the IR's
    ``declare`` lines (no need to parse the module again)."""
    missing = []
    for name in _DECLARE.findall(ir_text):
        if name.startswith("llvm."):
            continue
        if name.startswith(("omp_", "GOMP_")):
            load_openmp()
        if not llvm.address_of_symbol(name):
            missing.append(name)
    if missing:
        raise TecompError(
            f"extern function(s) {', '.join(sorted(missing))} not found in this process; load "
            "the library that defines them first (e.g. ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL))"
        )


def emit_object(ir_text: str, target: Target) -> bytes:
    """An ELF/COFF object file of the optimised module (for ``export_library``)."""
    return bytes(target_machine(target).emit_object(parse_and_optimize(ir_text, target)))


def emit_assembly(ir_text: str, target: Target) -> str:
    return str(target_machine(target).emit_assembly(parse_and_optimize(ir_text, target)))


__all__ = [
    "JITModule",
    "data_layout",
    "emit_assembly",
    "emit_object",
    "ensure_llvm_initialized",
    "load_openmp",
    "parse_and_optimize",
    "target_machine",
]


def load_extern_library(path: str) -> None:
    """Make the C symbols of the shared library ``path`` callable from JIT-compiled kernels.

    Needed for ``te.call_extern`` / tensor intrinsics that call C functions which are not
    already part of the process.
    """
    import os

    if not os.path.exists(path):
        raise TecompError(f"extern library {path!r} does not exist")
    ensure_llvm_initialized()
    try:
        llvm.load_library_permanently(path)
    except RuntimeError as e:
        raise TecompError(f"could not load extern library {path!r}: {e}") from e

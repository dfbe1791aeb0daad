"""GPU math: NVIDIA's libdevice (math functions as LLVM bitcode) and its use by the NVPTX codegen.

The NVPTX backend cannot lower ``llvm.exp``/``llvm.log``/``llvm.pow``... (LLVM aborts the
process: "Cannot select"), and ``llvm.exp2`` becomes the approximate ``ex2.approx``. CUDA's
own answer is libdevice, ``nvvm/libdevice/libdevice.10.bc`` in the toolkit: ``__nv_expf``,
``__nv_tanhf``, ``__nv_erff``... Kernels call those functions; `link_libdevice` links the
bitcode into the module before it is optimised, keeps only what the kernels use, and LLVM's
NVVMReflect pass resolves libdevice's ``__nvvm_reflect`` queries (no flush-to-zero).

Operations that are single PTX instructions (sqrt.rn, abs, floor/ceil/trunc/rni, fma,
copysign, min/max.NaN) stay LLVM intrinsics.
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import math
import os
import shutil

import llvmlite.binding as llvm
from llvmlite import ir

from ..errors import CodegenError, TecompError
from ..ir import dtype as dt
from .llvm_common import call_intrinsic, call_per_lane, const, declare, emit_math_call

LIBDEVICE_FILE = "libdevice.10.bc"

# tecomp math name -> LLVM intrinsic (a native PTX instruction on every supported arch)
_NATIVE = {
    "sqrt": "sqrt", "fabs": "fabs", "abs": "fabs", "floor": "floor", "ceil": "ceil",
    "trunc": "trunc", "round": "roundeven", "nearbyint": "nearbyint", "fma": "fma",
    "copysign": "copysign", "minimum": "minimum", "maximum": "maximum",
}
# tecomp math name -> libdevice function stem (``__nv_<stem>f`` for float32, ``__nv_<stem>``
# for float64)
_LIBDEVICE = {
    name: name for name in (
        "exp", "exp2", "exp10", "log", "log2", "log10", "sin", "cos", "tan", "asin", "acos",
        "atan", "sinh", "cosh", "tanh", "pow", "atan2", "erf", "log1p", "expm1", "fmod",
        "asinh", "acosh", "atanh", "cbrt", "hypot", "nextafter",
    )
}
_LIBDEVICE["power"] = "pow"

GPU_FLOAT_MATH: frozenset[str] = frozenset(
    set(_NATIVE) | set(_LIBDEVICE) | {"sigmoid", "rsqrt", "isnan", "isinf", "isfinite", "ldexp"})


# finding libdevice -------------------------------------------------------------------------
def search_locations() -> list[str]:
    """Directories that may hold libdevice, in the order they are tried.

    ``$TECOMP_LIBDEVICE`` (a file or directory), ``$CUDA_HOME`` and ``$CUDA_PATH``, the
    toolkit around ``ptxas`` on PATH, the usual install prefixes, and the pip wheels
    (``nvidia-cuda-nvcc``).
    """
    out: list[str] = []
    explicit = os.environ.get("TECOMP_LIBDEVICE")
    if explicit:
        out.append(explicit if os.path.isdir(explicit) else os.path.dirname(explicit))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root:
            out.append(os.path.join(root, "nvvm", "libdevice"))
    ptxas = shutil.which("ptxas")
    if ptxas:  # <toolkit>/bin/ptxas; realpath follows symlinks (not wrapper scripts)
        out.append(os.path.join(os.path.dirname(os.path.realpath(ptxas)), "..", "nvvm",
                                "libdevice"))
    out.append("/usr/local/cuda/nvvm/libdevice")
    out += sorted(glob.glob("/usr/local/cuda-*/nvvm/libdevice"), reverse=True)
    out.append("/opt/cuda/nvvm/libdevice")
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    for root in (spec.submodule_search_locations or []) if spec else []:
        out += sorted(glob.glob(os.path.join(root, "*", "nvvm", "libdevice")))
    return [os.path.normpath(p) for p in dict.fromkeys(out)]


def find_libdevice() -> str | None:
    """Path of ``libdevice.10.bc``, or None when no location of `search_locations` has it."""
    explicit = os.environ.get("TECOMP_LIBDEVICE")
    if explicit and os.path.isfile(explicit):
        return explicit
    for d in search_locations():
        p = os.path.join(d, LIBDEVICE_FILE)
        if os.path.isfile(p):
            return p
    return None


def require_libdevice(why: str) -> str:
    """`find_libdevice`, or a TecompError naming what needed it and every place looked at."""
    path = find_libdevice()
    if path is None:
        places = "\n  ".join(search_locations()) or "(none)"
        raise TecompError(
            f"{why} needs CUDA's libdevice ({LIBDEVICE_FILE}), which was not found. Looked in:"
            f"\n  {places}\nInstall the CUDA toolkit (or `pip install nvidia-cuda-nvcc`), or "
            "set CUDA_HOME or TECOMP_LIBDEVICE."
        )
    return path


@functools.lru_cache(maxsize=4)
def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def needs_libdevice(mod: llvm.ModuleRef) -> bool:
    return any(f.is_declaration and f.name.startswith("__nv_") for f in mod.functions)


def _global_dce(mod: llvm.ModuleRef, tm: llvm.TargetMachine) -> None:
    pm = llvm.create_new_module_pass_manager()
    pm.add_global_dead_code_eliminate_pass()
    pm.run(mod, llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=0)))


@functools.lru_cache(maxsize=64)
def _trimmed(path: str, names: frozenset[str], triple: str, layout: str,
             tm: llvm.TargetMachine) -> bytes:
    """libdevice reduced to ``names`` and what they call, as bitcode.

    Parsing all of libdevice takes ~0.1 s; kernels of one tuning task call the same few
    functions, so the reduced library is computed once per set and re-parsed in microseconds.
    """
    lib = llvm.parse_bitcode(_read(path))
    # libdevice says "nvptx64-nvidia-gpulibs"; matching triples avoids a linker warning.
    lib.triple, lib.data_layout = triple, layout
    for f in lib.functions:
        if not f.is_declaration and f.name not in names:
            f.linkage = llvm.Linkage.internal  # global DCE drops it unless a kept one calls it
    for g in lib.global_variables:
        g.linkage = llvm.Linkage.internal
    _global_dce(lib, tm)
    return bytes(lib.as_bitcode())


def link_libdevice(mod: llvm.ModuleRef, tm: llvm.TargetMachine) -> None:
    """Link the libdevice functions ``mod`` declares into it, as internal functions (they
    are inlined and never appear in the PTX on their own)."""
    names = frozenset(f.name for f in mod.functions
                      if f.is_declaration and f.name.startswith("__nv_"))
    path = require_libdevice("a kernel that calls " + ", ".join(sorted(names)))
    lib = llvm.parse_bitcode(_trimmed(path, names, mod.triple, mod.data_layout, tm))
    missing = names - {f.name for f in lib.functions if not f.is_declaration}
    if missing:
        raise TecompError(f"libdevice ({path}) does not define {', '.join(sorted(missing))}")
    defined = {f.name for f in lib.functions if not f.is_declaration}
    gvars = {g.name for g in lib.global_variables}
    mod.link_in(lib)
    for f in mod.functions:
        if f.name in defined and not f.is_declaration:
            f.linkage = llvm.Linkage.internal
    for g in mod.global_variables:
        if g.name in gvars:
            g.linkage = llvm.Linkage.internal
    _global_dce(mod, tm)


# emitting math calls -----------------------------------------------------------------------
def _libdevice_call(b: ir.IRBuilder, stem: str, args: list[ir.Value], el: str) -> ir.Value:
    """``__nv_<stem>[f]`` lane by lane (libdevice has scalar functions only)."""
    return call_per_lane(b, f"__nv_{stem}" + ("f" if el == "float32" else ""), args, el)


def _ldexp(b: ir.IRBuilder, x: ir.Value, n: ir.Value, el: str) -> ir.Value:
    sty = x.type.element if isinstance(x.type, ir.VectorType) else x.type
    sym = "__nv_ldexp" + ("f" if el == "float32" else "")
    fn = declare(b.module, sym, ir.FunctionType(sty, [sty, ir.IntType(32)]))
    if not isinstance(x.type, ir.VectorType):
        return b.call(fn, [x, n])
    out: ir.Value = ir.Constant(x.type, ir.Undefined)
    for i in range(x.type.count):
        lane = ir.Constant(ir.IntType(32), i)
        out = b.insert_element(out, b.call(fn, [b.extract_element(x, lane),
                                                 b.extract_element(n, lane)]), lane)
    return out


def _float_math(b: ir.IRBuilder, name: str, args: list[ir.Value], dtype: str) -> ir.Value:
    el = dt.element(dtype)
    if dt.is_half(el):
        # 16-bit floats are float32 values in registers (llvm_common.llvm_type): float32's
        # math, unrounded, as on the CPU and in the emulator; the value rounds when stored
        return _float_math(b, name, args, dt.compute_dtype(dtype))
    if name == "isnan":
        return b.fcmp_unordered("uno", args[0], args[0])
    if name in ("isinf", "isfinite"):
        mag = call_intrinsic(b, "fabs", [args[0]])
        inf = const(dtype, math.inf)
        return b.fcmp_ordered("==", mag, inf) if name == "isinf" else b.fcmp_ordered("<", mag, inf)
    if name in _NATIVE:
        return call_intrinsic(b, _NATIVE[name], args)
    if name == "rsqrt":  # correctly rounded like the CPU (libdevice's __nv_rsqrtf is approximate)
        return b.fdiv(const(dtype, 1.0), call_intrinsic(b, "sqrt", args))
    if name == "sigmoid":  # 1 / (1 + exp(-x))
        one = const(dtype, 1.0)
        e = _libdevice_call(b, "exp", [b.fneg(args[0])], el)
        return b.fdiv(one, b.fadd(one, e))
    if name == "ldexp":  # __nv_ldexp[f](x, int n): the only mixed signature
        require_libdevice("ldexp() on the GPU")
        return _ldexp(b, args[0], args[1], el)
    stem = _LIBDEVICE.get(name)
    if stem is None:
        raise CodegenError(f"math function {name!r} is not available on the GPU for {dtype}")
    require_libdevice(f"{name}() on the GPU")
    return _libdevice_call(b, stem, args, el)


def emit_gpu_math_call(b: ir.IRBuilder, name: str, args: list[ir.Value], arg_dtypes: list[str],
                       ret_dtype: str) -> ir.Value:
    """The GPU version of `llvm_common.emit_math_call`: integer and bit functions are the
    same LLVM intrinsics as on the CPU; float functions use native instructions or libdevice."""
    if not args or name in ("likely", "reinterpret") or not dt.is_float(arg_dtypes[0]):
        return emit_math_call(b, name, args, arg_dtypes, ret_dtype)
    return _float_math(b, name, args, arg_dtypes[0])


__all__ = ["GPU_FLOAT_MATH", "LIBDEVICE_FILE", "emit_gpu_math_call", "find_libdevice",
           "link_libdevice", "needs_libdevice", "require_libdevice", "search_locations"]

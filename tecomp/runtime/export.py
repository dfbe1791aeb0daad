"""Writing compiled kernels to disk: a shared object, a C header and a JSON manifest.

``lib.export_library("out/kernels.so")`` writes

- ``out/kernels.so``: the optimised module as object code (llvmlite) linked by the system
  linker (``gcc -shared``, or ``ld``) against libgomp when a kernel runs in parallel, and
  libm/libgcc as needed. Kernels are plain C functions ``int32_t f(T* A, ..., int64_t n)``.
- ``out/kernels.h``: one C prototype per kernel with its shapes and dtypes in a comment.
- ``out/kernels.json``: the manifest `tecomp.runtime.loader` reads (kernels, argument specs,
  target and the CPU features the code needs, the .so's sha256, tuning provenance).

The three files are written to temporary names and renamed into place, so a process that has
the old library loaded keeps running (its mapping is of the old, unlinked inode) and a reader
never sees a half-written file. Provenance (tuning log, record hash, measured time) is taken
as plain dicts, so the tuner can feed it later without this module knowing about records.

`build_library` compiles to a library without JIT-compiling first, for targets whose code this
machine cannot run (other CPU features), which `tc.build` refuses.
"""

from __future__ import annotations

import ctypes.util
import datetime
import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..codegen.target import Target
from ..errors import TecompError
from .args import KernelSpec
from .loader import CPU_FLAGS, SCHEMA, SCHEMA_VERSION, library_files, machine_arch, triple_arch

if TYPE_CHECKING:
    from .module import Module


@dataclass(frozen=True)
class LibraryFiles:
    """The files `export_library` wrote."""

    library: Path
    header: Path
    manifest: Path


def export_module(mod: Module, path: str | os.PathLike[str],
                  provenance: Mapping[str, Any] | None = None,
                  kernel_provenance: Mapping[str, Mapping[str, Any]] | None = None,
                  linker: str | None = None, libs: Sequence[str] = ()) -> LibraryFiles:
    """Export a built `Module` (see `write_library` for the arguments)."""
    from ..codegen.backend import backend_for

    return backend_for(mod.target).export(mod.artifact, path, provenance=provenance,
                                          kernel_provenance=kernel_provenance, linker=linker,
                                          libs=libs)


def build_library(sch: Any, args: Sequence[Any] | None = None, *, path: str | os.PathLike[str],
                  target: Any = "llvm", name: str = "main", debug: bool = False,
                  **export: Any) -> LibraryFiles:
    """Like ``tc.build(sch, args, target, name, debug).export_library(path)``, without the JIT.

    For targets this process cannot run (``"llvm -mcpu=sapphirerapids"`` on an AMD machine);
    ``export`` takes `write_library`'s keyword arguments.
    """
    from ..build_module import _check_name, _normalize
    from ..codegen.backend import backend_for

    funcs = _normalize(sch, args, name)
    for f in funcs:
        _check_name(f.name)
    tgt = Target.parse(target)
    backend = backend_for(tgt)
    return backend.export(backend.codegen(funcs, tgt, debug=debug, name=funcs[0].name), path, **export)


def write_library(ir_text: str, target: Target, kernels: Sequence[KernelSpec],
                  path: str | os.PathLike[str], *, debug: bool = False, uses_openmp: bool = False,
                  oob_record: str | None = None, debug_buffers: Sequence[str] = (),
                  provenance: Mapping[str, Any] | None = None,
                  kernel_provenance: Mapping[str, Mapping[str, Any]] | None = None,
                  linker: str | None = None, libs: Sequence[str] = (),
                  obj: bytes | None = None) -> LibraryFiles:
    """Compile ``ir_text`` for ``target`` to the shared object ``path``, plus header and manifest.

    ``provenance`` describes the whole library and ``kernel_provenance`` (kernel name -> dict)
    each kernel; both are free-form JSON objects, by convention with ``log`` (tuning log
    file), ``record_hash`` and ``measured_time_s``. ``linker`` is the command that links
    (default: ``$CC``, gcc, cc, then ld); ``libs`` are extra link inputs (paths or ``-l``
    flags) defining C functions that kernels call through ``te.call_extern``. ``obj``: the
    object code of ``ir_text`` for ``target`` when it was already compiled.
    """
    from ..codegen.llvm_jit import emit_object

    library, header, manifest = library_files(path)
    names = [k.name for k in kernels]
    _check_kernel_names(names)
    lib_prov = _json_object(provenance, "provenance")
    kprov = dict(kernel_provenance or {})
    unknown = sorted(set(kprov) - set(names))
    if unknown:
        raise TecompError(f"kernel_provenance names kernels this module lacks: {unknown}; "
                          f"it has {names}")
    per_kernel = {n: _merged_provenance(lib_prov, _json_object(kprov.get(n), f"provenance of {n}"))
                  for n in names}
    required = required_features(target)
    if obj is None:
        obj = emit_object(ir_text, target)
    library.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent, prefix=".tecomp-export-") as tmp:
        obj_path = Path(tmp) / "kernels.o"
        obj_path.write_bytes(obj)
        so_tmp = Path(tmp) / library.name
        link = _link(obj_path, so_tmp, library.name, target, uses_openmp, linker, libs)
        sha = hashlib.sha256(so_tmp.read_bytes()).hexdigest()
        from .. import __version__

        text = render_header(kernels, library.name, header.stem, target, debug, oob_record,
                             debug_buffers, __version__)
        data = {
            "schema": SCHEMA,
            "schema_version": SCHEMA_VERSION,
            "tecomp_version": __version__,
            "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"),
            "library": library.name,
            "header": header.name,
            "sha256": sha,
            "target": {"string": str(target), "triple": target.triple, "cpu": target.cpu,
                       "features": target.features, "required_features": required},
            "debug": debug,
            "openmp": uses_openmp,
            "link": link,
            "error_codes": _error_codes(),
            "oob_record": oob_record,
            "debug_buffers": list(debug_buffers),
            "provenance": lib_prov,
            "kernels": [{
                "name": k.name,
                "params": [p.to_json() for p in k.params],
                "dims": list(k.dims),
                "check_overlap": k.check_overlap,
                "c_prototype": c_prototype(k),
                "provenance": per_kernel[k.name],
            } for k in kernels],
        }
        (Path(tmp) / header.name).write_text(text, encoding="utf-8")
        (Path(tmp) / manifest.name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        # library first, manifest last: a reader in between sees new code with the old
        # manifest, a sha256 mismatch (a clear error), never code under the wrong description
        os.replace(so_tmp, library)
        os.replace(Path(tmp) / header.name, header)
        os.replace(Path(tmp) / manifest.name, manifest)
    return LibraryFiles(library, header, manifest)


# provenance ----------------------------------------------------------------------------------

_PROVENANCE_KEYS = ("log", "record_hash", "measured_time_s")


def _json_object(value: Mapping[str, Any] | None, what: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TecompError(f"{what} must be a dict, got {type(value).__name__}")
    out = {str(k): v for k, v in value.items()}
    try:
        json.dumps(out, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TecompError(f"{what} must hold JSON values only (str, number, bool, None, list, "
                          f"dict): {e}") from None
    return out


def _merged_provenance(lib: dict[str, Any] | None,
                       kernel: dict[str, Any] | None) -> dict[str, Any] | None:
    # each kernel entry is self-contained: the library's log plus the kernel's own record
    if lib is None and kernel is None:
        return None
    merged: dict[str, Any] = dict.fromkeys(_PROVENANCE_KEYS)
    merged.update(lib or {})
    merged.update(kernel or {})
    return merged


def _error_codes() -> dict[str, int]:
    from ..codegen.llvm_cpu import ErrorCode

    return {c.name: int(c) for c in ErrorCode}


# CPU features ---------------------------------------------------------------------------------


def required_features(target: Target) -> list[str]:
    """The checkable CPU features (LLVM names, see `loader.CPU_FLAGS`) code for ``target`` may use.

    Explicit ``+feat``s plus what ``-mcpu`` implies: the host's own list for the host CPU,
    else what gcc says ``-march=<cpu>`` enables, else a coarse table (AVX-512F / AVX2 / AVX).
    """
    feats = target.features.split(",") if target.features else []
    on = {f[1:] for f in feats if f.startswith("+")}
    off = {f[1:] for f in feats if f.startswith("-")}
    req = (_implied_features(target) | on) - off
    return sorted(f for f in req if f in CPU_FLAGS)


def _implied_features(target: Target) -> frozenset[str]:
    if triple_arch(target.triple) not in ("x86_64", "x86") or not target.cpu:
        return frozenset()
    host = Target.host()
    if target.cpu == host.cpu and target.triple == host.triple:
        return host.feature_set
    by_gcc = _gcc_march_features(target.cpu)
    if by_gcc is not None:
        return by_gcc
    from ..codegen.target import _AVX2_CPUS, _AVX512_CPUS, _AVX_CPUS

    if target.cpu in _AVX512_CPUS:
        return frozenset({"avx512f", "avx2", "fma", "avx"})
    if target.cpu in _AVX2_CPUS:
        return frozenset({"avx2", "fma", "avx"})
    return frozenset({"avx"}) if target.cpu in _AVX_CPUS else frozenset()


@functools.cache
def _gcc_march_features(cpu: str) -> frozenset[str] | None:
    # LLVM's -mcpu names match gcc's -march names for x86; llvmlite cannot list the features
    # a CPU implies, gcc can.
    gcc = shutil.which("gcc")
    if gcc is None or not re.fullmatch(r"[\w.-]+", cpu):
        return None
    try:
        out = subprocess.run([gcc, f"-march={cpu}", "-Q", "--help=target"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    found = re.findall(r"^\s+-m([\w.-]+)\s+\[enabled\]", out.stdout, re.MULTILINE)
    return frozenset(f for f in found if f in CPU_FLAGS)


# linking --------------------------------------------------------------------------------------


def _link(obj: Path, out: Path, soname: str, target: Target, uses_openmp: bool,
          linker: str | None, libs: Sequence[str]) -> dict[str, Any]:
    """Link ``obj`` into the shared object ``out``; returns what the manifest records."""
    if linker is None and triple_arch(target.triple) != machine_arch():
        raise TecompError(f"exporting for {target.triple} on a {machine_arch()} machine needs a "
                          "cross linker: pass linker='<triple>-gcc'")
    cmd = shlex.split(linker or os.environ.get("CC") or "") or [
        p for p in (shutil.which("gcc") or shutil.which("cc") or shutil.which("ld"),) if p]
    if not cmd:
        raise TecompError("export_library needs a system linker (gcc, cc or ld) on PATH; "
                          "install gcc (e.g. `apt-get install gcc`) or pass linker=")
    needed: list[str] = []
    if uses_openmp:
        gomp = ctypes.util.find_library("gomp") or "libgomp.so.1"
        needed.append(gomp)
    # -Bsymbolic-functions: calls bind to the library's own functions, never to same-named
    # ones another library made global. Not -Bsymbolic: a C program that reads the debug
    # record gets a copy relocation, and the library must then write to that copy.
    gomp_flags = [f"-l:{n}" for n in needed]
    if Path(cmd[0]).name.startswith("ld"):
        args = [*cmd, "-shared", "-o", str(out), str(obj), "-soname", soname,
                "-Bsymbolic-functions", *libs, *gomp_flags, "--as-needed", "-lm",
                "-l:libgcc_s.so.1", "-lc"]
    else:
        # --no-undefined: a symbol no library defines fails here, not at load time
        args = [*cmd, "-shared", "-o", str(out), str(obj), f"-Wl,-soname,{soname}",
                "-Wl,-Bsymbolic-functions", "-Wl,--no-undefined", *libs, *gomp_flags,
                "-Wl,--as-needed", "-lm", "-Wl,--no-as-needed"]
    try:
        res = subprocess.run(args, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as e:
        raise TecompError(f"could not run the linker {cmd[0]!r}: {e}") from None
    if res.returncode != 0:
        hint = ""
        if "undefined" in res.stderr:
            hint = ("\na kernel calls a C function that no linked library defines; pass the "
                    "library defining it in libs=[...]")
        raise TecompError(f"linking {out.name} failed ({shlex.join(args)}):\n"
                          f"{res.stderr.strip()}{hint}")
    runtime = ["libm", "libgcc_s", "libc"] if Path(cmd[0]).name.startswith("ld") else ["libm"]
    return {"linker": Path(cmd[0]).name, "libraries": [*needed, *runtime, *libs]}


# the C header -------------------------------------------------------------------------------

_C_TYPES = {
    "float32": "float", "float64": "double", "float16": "uint16_t",
    "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
    "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
    "bool": "bool",
}
# C and C++ keywords (a header should work from both) and names the header itself uses
_RESERVED = frozenset("""
    auto break case char const continue default do double else enum extern float for goto if
    inline int long register restrict return short signed sizeof static struct switch typedef
    union unsigned void volatile while bool true false alignas alignof and asm catch class
    constexpr delete explicit export friend mutable namespace new noexcept not nullptr
    operator or private protected public static_assert template this throw try typeid
    typename using virtual xor int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t
    uint64_t
""".split())


def _check_kernel_names(names: Sequence[str]) -> None:
    for n in names:
        if not n.isidentifier() or not n.isascii() or n in _RESERVED:
            raise TecompError(f"kernel name {n!r} cannot be a C function name (it must be an "
                              "ASCII identifier and not a C/C++ keyword)")
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise TecompError(f"kernel names must be unique, repeated: {sorted(dup)}")


def _c_names(k: KernelSpec) -> list[str]:
    """C parameter names: tensor names made identifiers, unique, then the dim names."""
    used: set[str] = set(k.dims)
    out = []
    for p in k.params:
        n = re.sub(r"\W", "_", p.name, flags=re.ASCII) or "arg"
        if n[0].isdigit() or n in _RESERVED:
            n = "_" + n if n[0].isdigit() else n + "_"
        base, i = n, 1
        while n in used:
            n, i = f"{base}_{i}", i + 1
        used.add(n)
        out.append(n)
    return out + [d if d not in _RESERVED else d + "_" for d in k.dims]


def c_prototype(k: KernelSpec) -> str:
    """``int32_t mm(const float* A, const float* B, float* C, int64_t n);``"""
    names = _c_names(k)
    parts = [f"{'' if p.output else 'const '}{_C_TYPES[p.dtype]}* {n}"
             for p, n in zip(k.params, names, strict=False)]
    parts += [f"int64_t {n}" for n in names[len(k.params):]]
    return f"int32_t {k.name}({', '.join(parts) or 'void'});"


def _shape_text(shape: Sequence[int | str]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _kernel_comment(k: KernelSpec) -> list[str]:
    names = _c_names(k)
    rows = []
    for p, n in zip(k.params, names, strict=False):
        label = n if n == p.name else f"{n} ('{p.name}')"
        rows.append((label, f"{p.dtype}{_shape_text(p.shape)}", "output" if p.output else "input"))
    for d, n in zip(k.dims, names[len(k.params):], strict=True):
        src = next(((p, ax) for p in k.params for ax, s in enumerate(p.shape) if s == d), None)
        why = f"extent of {src[0].name} axis {src[1]}" if src else "symbolic dim"
        rows.append((n, "int64", why))
    w0 = max(len(r[0]) for r in rows) if rows else 0
    w1 = max(len(r[1]) for r in rows) if rows else 0
    lines = [f"/* {k.name}: returns TECOMP_OK (0) or a TECOMP_ERR_* code."]
    lines += [f" *   {a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows]
    if k.check_overlap and any(p.output for p in k.params):
        lines.append(" * Outputs must not overlap any other argument.")
    return [*lines, " */"]


def render_header(kernels: Sequence[KernelSpec], library: str, stem: str, target: Target,
                  debug: bool, oob_record: str | None, debug_buffers: Sequence[str],
                  version: str) -> str:
    """The C header of a library: one prototype per kernel, shapes and dtypes in comments."""
    guard = "TECOMP_" + re.sub(r"\W", "_", stem, flags=re.ASCII).upper() + "_H"
    codes = _error_codes()
    lines = [
        f"/* {stem}.h: kernels of {library}, generated by tecomp {version}.",
        f" * Target: {target.triple}, cpu {target.cpu or 'generic'}"
        + (" (debug build: bounds-checked)" if debug else "") + ".",
        " * Arrays are dense and C-contiguous (row-major) with exactly the shapes listed; the",
        " * kernels do not check shapes or dims (the Python loader does). Link with -l:"
        + library + ". */",
        f"#ifndef {guard}",
        f"#define {guard}",
        "",
        "#include <stdbool.h>",
        "#include <stdint.h>",
        "",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
        "#ifndef TECOMP_OK",
        *(f"#define TECOMP_{'OK' if c == 'OK' else 'ERR_' + c} {v}" for c, v in codes.items()),
        "#endif",
        "",
    ]
    if oob_record is not None:
        ids = ", ".join(f"{i} {n}" for i, n in enumerate(debug_buffers))
        lines += [
            "/* Debug build: on TECOMP_ERR_OUT_OF_BOUNDS the first bad access of the call is in",
            f" * {oob_record} (buffer ids: {ids}).",
            " * Set .claimed back to 0 before the next call to record the next one. */",
            "#ifndef TECOMP_OOB_RECORD_DEFINED",
            "#define TECOMP_OOB_RECORD_DEFINED",
            "typedef struct tecomp_oob_record {",
            "  int32_t claimed;  /* 1 once an access was out of bounds */",
            "  int32_t buffer;   /* index into the buffer ids above */",
            "  int64_t index;    /* flat element index accessed */",
            "  int64_t extent;   /* number of elements of the buffer */",
            "} tecomp_oob_record;",
            "#endif",
            f"extern tecomp_oob_record {oob_record};",
            "",
        ]
    for k in kernels:
        lines += [*_kernel_comment(k), c_prototype(k), ""]
    lines += ["#ifdef __cplusplus", "}", "#endif", "", f"#endif  /* {guard} */", ""]
    return "\n".join(lines)


__all__ = ["KernelSpec", "LibraryFiles", "build_library", "c_prototype", "export_module",
           "render_header", "required_features", "write_library"]

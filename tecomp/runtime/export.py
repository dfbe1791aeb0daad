"""Writing compiled kernels to disk: a shared object, a C header and a JSON manifest.

``lib.export_library("out/kernels.so")`` writes

- ``out/kernels.so``: the optimised module as object code (llvmlite) linked by the system
  linker (``gcc -shared``, or ``ld``) against libgomp when a kernel runs in parallel, and
  libm/libgcc as needed. Kernels are plain C functions ``int32_t f(T* A, ..., int64_t n)``.
- ``out/kernels.h``: one C prototype per kernel with its shapes and dtypes in a comment.
- ``out/kernels.json``: the manifest `tecomp.runtime.loader` reads (kernels, argument specs,
  target and the CPU features the code needs, the .so's sha256, tuning provenance).

A cuda module's functions (`tecomp.runtime.gpu_module`; `export_modules` puts them beside CPU
functions in one library) add ``out/kernels.ptx`` and, where ptxas is installed,
``out/kernels.sm_80.cubin`` / ``out/kernels.sm_90.cubin``; the manifest's ``"cuda"`` section
names them (arch, sha256, PTX ISA version, ptxas's per-kernel resources) and each cuda
function's entry lists the kernels it launches in order: grid and block as expressions over
the argument dims, arguments, shared memory, and the intermediate tensors between kernels.
A library of cuda functions only has no ``.so``; the header then only describes them.

The files are written to temporary names and renamed into place, so a process that has
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..codegen.target import Target
from ..errors import TecompError
from ..ir.stmt import PrimFunc
from .args import KernelSpec, ParamSpec
from .loader import (
    CPU_FLAGS,
    CPU_SCHEMA_VERSION,
    CUDA_SCHEMA_VERSION,
    SCHEMA,
    SCHEMA_VERSION,
    library_files,
    machine_arch,
    triple_arch,
)

if TYPE_CHECKING:
    from ..codegen.backend import Artifact
    from .module import Module


@dataclass(frozen=True)
class LibraryFiles:
    """The files `export_library` wrote. ``library`` is what `load_module` takes: the shared
    object, or the PTX for a library of cuda functions only (no CPU code, no ``.so``);
    ``ptx`` and ``cubins`` (by arch) are the GPU code of a library with cuda functions."""

    library: Path
    header: Path
    manifest: Path
    ptx: Path | None = None
    cubins: Mapping[str, Path] = field(default_factory=dict)


@dataclass(frozen=True)
class _CpuPart:
    """CPU code for a library: what `write_library` takes."""

    ir_text: str
    target: Target
    kernels: Sequence[KernelSpec]
    debug: bool = False
    uses_openmp: bool = False
    oob_record: str | None = None
    debug_buffers: Sequence[str] = ()
    linker: str | None = None
    libs: Sequence[str] = ()
    obj: bytes | None = None


def export_module(mod: Module, path: str | os.PathLike[str],
                  provenance: Mapping[str, Any] | None = None,
                  kernel_provenance: Mapping[str, Mapping[str, Any]] | None = None,
                  linker: str | None = None, libs: Sequence[str] = ()) -> LibraryFiles:
    """Export a built `Module` (see `write_library` for the arguments)."""
    return export_modules([mod], path, provenance=provenance, kernel_provenance=kernel_provenance,
                          linker=linker, libs=libs)


def export_modules(modules: Sequence[Any], path: str | os.PathLike[str],
                   provenance: Mapping[str, Any] | None = None,
                   kernel_provenance: Mapping[str, Mapping[str, Any]] | None = None,
                   linker: str | None = None, libs: Sequence[str] = (),
                   cubin_archs: Sequence[str] | None = None) -> LibraryFiles:
    """Export built modules as one library: at most one CPU `Module` (``target="llvm"``) and
    one cuda `GpuModule`, whose functions share the manifest (names must not repeat).

    >>> export_modules([tc.build(s1, a1, name="pre"), tc.build(s2, a2, target="cuda", name="mm")],
    ...                "out/kernels.so")                                    # doctest: +SKIP
    >>> lib = tc.runtime.load_module("out/kernels.so"); lib["pre"], lib["mm"]  # doctest: +SKIP
    """
    from ..codegen.backend import backend_for

    cpu: _CpuPart | None = None
    gpu: Artifact | None = None
    for mod in modules:
        art = getattr(mod, "artifact", None)
        if art is None:
            raise TecompError(f"export_modules takes modules built by tc.build, got "
                              f"{type(mod).__name__}")
        kind = art.target.kind
        if (kind == "cuda" and gpu is not None) or (kind != "cuda" and cpu is not None):
            raise TecompError(f"a library holds one {kind} module; build its functions together "
                              "(tc.build([(s1, args1, 'f'), (s2, args2, 'g')], target=...))")
        art = backend_for(art.target).compile(art)  # no-op when already compiled
        if kind == "cuda":
            gpu = art
        else:
            cpu = _CpuPart(art.source, art.target, art.kernels, art.debug, art.uses_openmp,
                           art.oob_record, art.debug_buffers, linker, libs, art.binary)
    if cpu is None and gpu is None:
        raise TecompError("export_modules needs at least one module")
    return _write_bundle(path, cpu, gpu, provenance, kernel_provenance, cubin_archs)


def build_library(sch: Any, args: Sequence[Any] | None = None, *, path: str | os.PathLike[str],
                  target: Any = "llvm", name: str = "main", debug: bool = False,
                  **export: Any) -> LibraryFiles:
    """Like ``tc.build(sch, args, target, name, debug).export_library(path)``, without the JIT.

    For targets this process cannot run (``"llvm -mcpu=sapphirerapids"`` on an AMD machine,
    ``"cuda"`` anywhere); ``export`` takes `write_library`'s keyword arguments (cuda:
    `write_cuda_library`'s).
    """
    from ..build_module import _check_name, _normalize
    from ..codegen.backend import backend_for

    tgt = Target.parse(target)
    funcs = _normalize(sch, args, name, debug, tgt)  # as tc.build lowers (GPU lowering for cuda)
    for f in funcs:
        _check_name(f.name)
    backend = backend_for(tgt)
    art = backend.codegen(funcs, tgt, debug=debug, name=funcs[0].name)
    if tgt.kind == "cuda":  # CUDABackend.export does not delegate here yet
        return write_cuda_library(backend.compile(art), path, **export)
    return backend.export(art, path, **export)


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
    cpu = _CpuPart(ir_text, target, kernels, debug, uses_openmp, oob_record, debug_buffers,
                   linker, libs, obj)
    return _write_bundle(path, cpu, None, provenance, kernel_provenance, None)


def write_cuda_library(art: Artifact, path: str | os.PathLike[str],
                       provenance: Mapping[str, Any] | None = None,
                       kernel_provenance: Mapping[str, Mapping[str, Any]] | None = None,
                       cubin_archs: Sequence[str] | None = None, **_cpu_only: Any) -> LibraryFiles:
    """Write a compiled cuda artifact as a library: ``<base>.ptx``, a cubin per arch in
    ``cubin_archs`` (default: the target's arch, sm_80 and sm_90 where its PTX assembles for
    them) as ``<base>.<arch>.cubin`` when ptxas is installed, ``<base>.h`` (the kernels and
    their launches, in comments) and the manifest ``<base>.json``. ``linker``/``libs`` are
    accepted and ignored (nothing is linked)."""
    return _write_bundle(path, None, art, provenance, kernel_provenance, cubin_archs)


def _write_bundle(path: str | os.PathLike[str], cpu: _CpuPart | None, gpu: Artifact | None,
                  provenance: Mapping[str, Any] | None,
                  kernel_provenance: Mapping[str, Mapping[str, Any]] | None,
                  cubin_archs: Sequence[str] | None) -> LibraryFiles:
    from .. import __version__

    library, header, manifest = library_files(path)
    base = header.with_suffix("")
    cpu_names = [k.name for k in cpu.kernels] if cpu else []
    gpu_names = [k.name for k in gpu.kernels] if gpu else []
    names = cpu_names + gpu_names
    _check_kernel_names(names)
    lib_prov = _json_object(provenance, "provenance")
    kprov = dict(kernel_provenance or {})
    unknown = sorted(set(kprov) - set(names))
    if unknown:
        raise TecompError(f"kernel_provenance names kernels this module lacks: {unknown}; "
                          f"it has {names}")
    per_kernel = {n: _merged_provenance(lib_prov, _json_object(kprov.get(n), f"provenance of {n}"))
                  for n in names}
    cuda = _cuda_code(gpu, base.name, cubin_archs) if gpu is not None else None
    strided = any(p.strides is not None for k in (cpu.kernels if cpu else ()) for p in k.params)
    obj = None
    if cpu is not None:
        from ..codegen.llvm_jit import emit_object

        required = required_features(cpu.target)
        obj = cpu.obj if cpu.obj is not None else emit_object(cpu.ir_text, cpu.target)
    library.parent.mkdir(parents=True, exist_ok=True)
    written = {}  # final path -> temporary path, renamed in this order
    with tempfile.TemporaryDirectory(dir=library.parent, prefix=".tecomp-export-") as tmp:
        data: dict[str, Any] = {
            "schema": SCHEMA,
            # version 1 readers know CPU libraries only: one with cuda functions is version 2,
            # which they refuse with "upgrade tecomp" instead of misreading; one with strided
            # parameters is version 3 (older readers would take their arrays as compact)
            "schema_version": SCHEMA_VERSION if strided else CUDA_SCHEMA_VERSION
            if gpu is not None else CPU_SCHEMA_VERSION,
            "tecomp_version": __version__,
            "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
                timespec="seconds"),
            "library": None, "header": header.name, "sha256": None, "target": None,
            "debug": False, "openmp": False, "link": None,
            "error_codes": _error_codes(),
            "oob_record": None, "debug_buffers": [],
            "provenance": lib_prov,
        }
        entries: list[dict[str, Any]] = []
        if cpu is not None:
            assert obj is not None
            obj_path = Path(tmp) / "kernels.o"
            obj_path.write_bytes(obj)
            so_tmp = Path(tmp) / library.name
            link = _link(obj_path, so_tmp, library.name, cpu.target, cpu.uses_openmp, cpu.linker,
                         cpu.libs)
            written[library] = so_tmp
            t = cpu.target
            data.update({
                "library": library.name,
                "sha256": hashlib.sha256(so_tmp.read_bytes()).hexdigest(),
                "target": {"string": str(t), "triple": t.triple, "cpu": t.cpu,
                           "features": t.features, "required_features": required},
                "debug": cpu.debug, "openmp": cpu.uses_openmp, "link": link,
                "oob_record": cpu.oob_record, "debug_buffers": list(cpu.debug_buffers),
            })
            entries += [{
                "name": k.name,
                "kind": "llvm",
                "params": [p.to_json() for p in k.params],
                "dims": list(k.dims),
                "check_overlap": k.check_overlap,
                "c_prototype": c_prototype(k),
                "provenance": per_kernel[k.name],
            } for k in cpu.kernels]
        if cuda is not None:
            for name, blob in cuda.files.items():
                (Path(tmp) / name).write_bytes(blob)
                written[base.with_name(name)] = Path(tmp) / name
            data["cuda"] = cuda.section
            entries += [{**e, "provenance": per_kernel[e["name"]]} for e in cuda.entries]
        data["kernels"] = entries
        text = render_header(cpu.kernels if cpu else [], library.name if cpu else None,
                             header.stem, cpu.target if cpu else None,
                             cpu.debug if cpu else False, cpu.oob_record if cpu else None,
                             cpu.debug_buffers if cpu else (), __version__,
                             cuda.entries if cuda else (), cuda.section if cuda else None)
        (Path(tmp) / header.name).write_text(text, encoding="utf-8")
        (Path(tmp) / manifest.name).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        written[header] = Path(tmp) / header.name
        written[manifest] = Path(tmp) / manifest.name
        # code first, manifest last: a reader in between sees new code with the old
        # manifest, a sha256 mismatch (a clear error), never code under the wrong description
        for final, temp in written.items():
            os.replace(temp, final)
    ptx = base.with_name(cuda.section["ptx"]["file"]) if cuda else None
    cubins = {c["arch"]: base.with_name(c["file"]) for c in cuda.section["cubins"]} if cuda else {}
    return LibraryFiles(library if cpu is not None else (ptx or library), header, manifest,
                        ptx, cubins)


# cuda code -----------------------------------------------------------------------------------

DEFAULT_CUBIN_ARCHS = ("sm_80", "sm_90")


@dataclass(frozen=True)
class _CudaCode:
    """The GPU part of a library: files (name -> bytes), the manifest's ``"cuda"`` section
    and one manifest entry per cuda function (without provenance)."""

    files: dict[str, bytes]
    section: dict[str, Any]
    entries: list[dict[str, Any]]


def _arch_key(arch: str) -> tuple[int, int, bool]:
    m = re.fullmatch(r"sm_(\d+)(\d)(a?)", arch)
    if m is None:
        raise TecompError(f"{arch!r} is not a GPU arch (sm_XY)")
    return int(m.group(1)), int(m.group(2)), bool(m.group(3))


def cubin_archs_for(target_arch: str, wanted: Sequence[str] | None = None) -> list[str]:
    """The archs of the cubins to build from PTX for ``target_arch``: ``wanted`` (default:
    the target's own, sm_80 and sm_90) where that PTX can be assembled for them (not an
    older arch; an ``sm_XYa`` target only for itself)."""
    tgt = _arch_key(target_arch)
    out: list[str] = []
    for arch in [target_arch, *(DEFAULT_CUBIN_ARCHS if wanted is None else wanted)]:
        k = _arch_key(arch)
        if arch in out or (k[0], k[1]) < (tgt[0], tgt[1]):
            continue
        if (tgt[2] or k[2]) and arch != target_arch:
            continue
        out.append(arch)
    return out if wanted is None else [a for a in out if a in wanted]


def _ptx_header(ptx: str) -> dict[str, Any]:
    def field(rx: str) -> str | None:
        m = re.search(rx, ptx, re.MULTILINE)
        return m.group(1) if m else None
    size = field(r"^\s*\.address_size\s+(\d+)")
    return {"isa_version": field(r"^\s*\.version\s+(\d+\.\d+)"),
            "target": field(r"^\s*\.target\s+(\w+)"),
            "address_size": int(size) if size else None}


def _static_shared_bytes(func: PrimFunc) -> int:
    """Shared memory ``func`` declares statically, by the NVPTX codegen's rule (each array
    padded to 16 bytes; 0 when its shared memory is dynamic, `codegen.gpu_shared`): known
    without ptxas, unlike its report."""
    from ..codegen.gpu_shared import static_shared_bytes

    return static_shared_bytes(func)


def _extent_json(v: int | str) -> int | str:
    return int(v) if isinstance(v, int) else str(v)


def _cuda_code(art: Artifact, stem: str, cubin_archs: Sequence[str] | None) -> _CudaCode:
    from ..codegen import ptxas
    from .cuda import LAUNCH_TAGS

    if art.binary is None:
        raise TecompError("a cuda library is written from a compiled artifact (Backend.compile)")
    ptx = art.binary.decode()
    arch = art.target.cpu
    files = {f"{stem}.ptx": art.binary}
    cubins: list[dict[str, Any]] = []
    skipped = None
    archs = cubin_archs_for(arch, cubin_archs)
    if ptxas.find_ptxas() is None:
        skipped = "ptxas (CUDA toolkit) was not found at export: the library holds PTX only"
        archs = []
    version = ptxas.ptxas_version() if archs else None
    for a in archs:
        blob, report = ptxas.compile_cubin_report(ptx, a)
        name = f"{stem}.{a}.cubin"
        files[name] = blob
        cubins.append({
            "arch": a, "file": name, "sha256": hashlib.sha256(blob).hexdigest(),
            "ptxas_version": version,
            "resources": {k: {"registers": r.registers, "shared_bytes": r.shared_bytes,
                              "spill_stores": r.spill_stores, "spill_loads": r.spill_loads,
                              "stack_frame": r.stack_frame} for k, r in report.items()},
        })
    section = {
        "target": str(art.target), "arch": arch,
        "ptx": {"file": f"{stem}.ptx", "sha256": hashlib.sha256(art.binary).hexdigest(),
                **_ptx_header(ptx)},
        "cubins": cubins, "cubins_skipped": skipped,
    }
    entries = []
    from .gpu_module import launch_plan

    for fn_spec, func in zip(art.kernels, art.funcs, strict=True):
        plan = launch_plan(func, fn_spec)  # what a built function launches, exactly
        by_name = {k.name: k for k in (func.attrs.get("kernels") or [func])}
        launches = []
        for k in plan.kernels:
            ext = [_extent_json(k.launch.get(t, 1)) for t in LAUNCH_TAGS]
            launches.append({
                "kernel": k.spec.name,
                "params": [p.to_json() for p in k.spec.params],
                "dims": list(k.spec.dims),
                "args": list(k.args), "dim_args": list(k.dims),
                "grid": ext[:3], "block": ext[3:],
                "shared_bytes": _static_shared_bytes(by_name[k.spec.name]),
                "dynamic_shared_bytes": k.shared_mem,
            })
        entries.append({
            "name": fn_spec.name, "kind": "cuda",
            "params": [p.to_json() for p in fn_spec.params],
            "dims": list(fn_spec.dims),
            "check_overlap": fn_spec.check_overlap,
            "launches": launches,
            "intermediates": [p.to_json() for p in plan.intermediates],
        })
    return _CudaCode(files, section, entries)




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


def _c_params(k: KernelSpec) -> tuple[list[ParamSpec], list[ParamSpec]]:
    """The buffer parameters and the by-value scalar ones of ``k``'s C function (a scalar
    argument named like a dim is that int64 dim argument: not a C parameter of its own)."""
    return ([p for p in k.params if not p.scalar],
            [p for p in k.params if p.scalar and p.name not in k.dims])


def _c_names(k: KernelSpec) -> list[str]:
    """C parameter names in C order: buffers (tensor names made identifiers, unique), the
    dims, then the scalar parameters."""
    bufs, scalars = _c_params(k)
    used: set[str] = set(k.dims)
    out = []
    for p in [*bufs, *scalars]:
        n = re.sub(r"\W", "_", p.name, flags=re.ASCII) or "arg"
        if n[0].isdigit() or n in _RESERVED:
            n = "_" + n if n[0].isdigit() else n + "_"
        base, i = n, 1
        while n in used:
            n, i = f"{base}_{i}", i + 1
        used.add(n)
        out.append(n)
    dims = [d if d not in _RESERVED else d + "_" for d in k.dims]
    return out[:len(bufs)] + dims + out[len(bufs):]


def c_prototype(k: KernelSpec) -> str:
    """``int32_t mm(const float* A, const float* B, float* C, int64_t n, float alpha);``"""
    bufs, scalars = _c_params(k)
    names = _c_names(k)
    nb, nd = len(bufs), len(k.dims)
    parts = [f"{'' if p.output else 'const '}{_C_TYPES[p.dtype]}* {n}"
             for p, n in zip(bufs, names, strict=False)]
    parts += [f"int64_t {n}" for n in names[nb:nb + nd]]
    parts += [f"{_C_TYPES[p.dtype]} {n}" for p, n in zip(scalars, names[nb + nd:], strict=True)]
    return f"int32_t {k.name}({', '.join(parts) or 'void'});"


def _shape_text(shape: Sequence[int | str]) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _kernel_comment(k: KernelSpec) -> list[str]:
    bufs, scalars = _c_params(k)
    names = _c_names(k)
    nb, nd = len(bufs), len(k.dims)
    rows = []
    for p, n in zip(bufs, names, strict=False):
        label = n if n == p.name else f"{n} ('{p.name}')"
        layout = "" if p.strides is None else f" strides {_shape_text(p.strides)}"
        rows.append((label, f"{p.dtype}{_shape_text(p.shape)}{layout}",
                     "output" if p.output else "input"))
    for d, n in zip(k.dims, names[nb:nb + nd], strict=True):
        src = next(((p, ax) for p in bufs for ax, s in enumerate(p.shape) if s == d), None)
        st = next(((p, ax) for p in bufs for ax, s in enumerate(p.strides or ()) if s == d),
                  None)
        why = (f"extent of {src[0].name} axis {src[1]}" if src else
               f"stride of {st[0].name} axis {st[1]}, in elements" if st else "symbolic dim")
        if any(p.scalar and p.name == d for p in k.params):
            why += " (also a scalar argument in Python)"
        rows.append((n, "int64", why))
    for p, n in zip(scalars, names[nb + nd:], strict=True):
        label = n if n == p.name else f"{n} ('{p.name}')"
        rows.append((label, p.dtype, "scalar, by value"))
    w0 = max(len(r[0]) for r in rows) if rows else 0
    w1 = max(len(r[1]) for r in rows) if rows else 0
    lines = [f"/* {k.name}: returns TECOMP_OK (0) or a TECOMP_ERR_* code."]
    lines += [f" *   {a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows]
    if k.check_overlap and any(p.output for p in k.params):
        lines.append(" * Outputs must not overlap any other argument.")
    return [*lines, " */"]


def render_header(kernels: Sequence[KernelSpec], library: str | None, stem: str,
                  target: Target | None, debug: bool, oob_record: str | None,
                  debug_buffers: Sequence[str], version: str,
                  cuda_entries: Sequence[Mapping[str, Any]] = (),
                  cuda: Mapping[str, Any] | None = None) -> str:
    """The C header of a library: one prototype per CPU kernel, shapes and dtypes in comments;
    cuda functions (``cuda_entries``, manifest entries) are described in comments only."""
    guard = "TECOMP_" + re.sub(r"\W", "_", stem, flags=re.ASCII).upper() + "_H"
    codes = _error_codes()
    if target is not None:
        head = [f"/* {stem}.h: kernels of {library}, generated by tecomp {version}.",
                f" * Target: {target.triple}, cpu {target.cpu or 'generic'}"
                + (" (debug build: bounds-checked)" if debug else "") + ".",
                " * Arrays are dense and C-contiguous (row-major) with exactly the shapes listed; the",
                " * kernels do not check shapes or dims (the Python loader does). Link with "
                f"-l:{library}. */"]
        if any(p.strides is not None for k in kernels for p in k.params):
            # binds= to a strided decl_buffer: the one exception to dense arrays
            head[-1] = head[-1][:-3]
            head[2] = head[2].replace("Arrays are", "Arrays without strides are")
            head += [" * An array listed with strides is passed by the address of its first element,",
                     " * element (i, j, ...) at i*stride0 + j*stride1 + ... elements from it; its",
                     " * symbolic strides are int64 arguments among the dims, in elements. */"]
    else:
        head = [f"/* {stem}.h: cuda kernels of {stem}, generated by tecomp {version}. */"]
    lines = [
        *head,
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
    ]
    if target is not None:
        lines += [
            "#ifndef TECOMP_OK",
            *(f"#define TECOMP_{'OK' if c == 'OK' else 'ERR_' + c} {v}" for c, v in codes.items()),
            "#endif",
            "",
        ]
    if cuda is not None:
        lines += _cuda_comment(cuda_entries, cuda)
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


def _cuda_comment(entries: Sequence[Mapping[str, Any]], cuda: Mapping[str, Any]) -> list[str]:
    """Comments for a C host launching the cuda functions through the driver API."""
    images = [cuda["ptx"]["file"], *(c["file"] for c in cuda["cubins"])]
    lines = [f"/* cuda functions ({cuda['target']}; PTX ISA {cuda['ptx']['isa_version']}), in "
             f"{', '.join(images)}:",
             " * cuModuleLoadData the cubin of the device's arch (else the PTX), then per function",
             " * cuLaunchKernel each kernel in order with kernelParams = device pointers of the",
             " * listed buffers, then the int64 dims, then the listed scalars by value (in their",
             " * C type), and sharedMemBytes = the dynamic shared memory listed (above 48 KB,",
             " * after cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES) on the function)."]
    for e in entries:
        sig = ", ".join(f"{p['dtype']}{_shape_text(p['shape'])} {p['name']}"
                        + (" (out)" if p["output"] else "")
                        if not p.get("scalar") else f"{_C_TYPES[p['dtype']]} {p['name']} (scalar)"
                        for p in e["params"])
        lines.append(f" * {e['name']}({sig}):")
        if e["intermediates"]:
            lines.append(" *   intermediates (device memory per call): " + ", ".join(
                f"{p['dtype']}{_shape_text(p['shape'])} {p['name']}" for p in e["intermediates"]))
        slots = [p["name"] for p in e["params"]] + [p["name"] for p in e["intermediates"]]
        for k in e["launches"]:
            pairs = list(zip(k["params"], k["args"], strict=True))
            args = ([slots[i] for p, i in pairs if not p.get("scalar")]
                    + [e["dims"][i] for i in k["dim_args"]]
                    + [f"{_C_TYPES[p['dtype']]} {slots[i]}" for p, i in pairs
                       if p.get("scalar") and p["name"] not in k["dims"]])
            lines.append(f" *   {k['kernel']}({', '.join(args)}) grid {_dim3_text(k['grid'])} "
                         f"block {_dim3_text(k['block'])}, {k['shared_bytes']} B static shared"
                         + (f", {k['dynamic_shared_bytes']} B dynamic" if k["dynamic_shared_bytes"]
                            else ""))
    return [*lines, " */", ""]


def _dim3_text(v: Sequence[int | str]) -> str:
    return "(" + ", ".join(str(x) for x in v) + ")"


__all__ = ["DEFAULT_CUBIN_ARCHS", "KernelSpec", "LibraryFiles", "build_library", "c_prototype",
           "cubin_archs_for", "export_module", "export_modules", "render_header",
           "required_features", "write_cuda_library", "write_library"]

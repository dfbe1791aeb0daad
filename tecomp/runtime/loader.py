"""Loading an exported kernel library (``.so`` + JSON manifest) with ctypes only.

`load_module` is what a deployment runs: it needs numpy and this package, not llvmlite, the
compiler or the tuner (none of them is imported here). The manifest written by
`tecomp.runtime.export` says which kernels the library holds and what arguments they take, so
the loaded functions check their arguments exactly like freshly built ones (same `ArgChecker`,
same `ErrorDecoder`, same `Function.time_evaluator`).

Before any byte of the library runs, the loader checks what would otherwise crash the process
instead of raising: a manifest that is not one (corrupted, truncated, another schema), a
library that does not match its manifest (sha256), a library for another architecture or OS,
and a library compiled for CPU features this machine lacks (an illegal instruction, SIGILL,
on the first call). Each is a `TecompError` naming the file.

>>> lib = load_module("out/kernels.so")       # doctest: +SKIP
>>> lib["mm"](a, b, c)                         # same checks and errors as tc.build(...)["mm"]
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import platform
import sys
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import TecompError
from .args import ArgChecker, ParamSpec
from .cpu import ErrorDecoder, Function, KernelSet, OOBRecord

SCHEMA = "tecomp-library"
SCHEMA_VERSION = 1

# LLVM feature name -> /proc/cpuinfo flag, for the x86 extensions LLVM emits on its own when
# they are enabled (vectorisation, instruction selection). Features outside this table are not
# checked: they are baseline x86-64 (cmov, cx8, mmx, fxsr, 64bit), only reachable through
# intrinsics tecomp never emits (rdrnd, rdseed, xsave*, fsgsbase, clflushopt, clwb, shstk...),
# or too new to have a settled cpuinfo name. Some VMs hide flags that cpuid reports (RDSEED on
# Zen 5), so checking more than what code generation can use would refuse good libraries.
CPU_FLAGS: dict[str, str] = {
    "sse": "sse", "sse2": "sse2", "sse3": "pni", "ssse3": "ssse3", "sse4.1": "sse4_1",
    "sse4.2": "sse4_2", "crc32": "sse4_2", "sse4a": "sse4a", "popcnt": "popcnt", "lzcnt": "abm",
    "bmi": "bmi1", "bmi2": "bmi2", "movbe": "movbe", "cx16": "cx16", "sahf": "lahf_lm",
    "avx": "avx", "avx2": "avx2", "fma": "fma", "fma4": "fma4", "xop": "xop", "tbm": "tbm",
    "f16c": "f16c", "aes": "aes", "pclmul": "pclmulqdq", "vaes": "vaes",
    "vpclmulqdq": "vpclmulqdq", "gfni": "gfni", "sha": "sha_ni", "adx": "adx",
    "avx512f": "avx512f", "avx512cd": "avx512cd", "avx512dq": "avx512dq",
    "avx512bw": "avx512bw", "avx512vl": "avx512vl", "avx512er": "avx512er",
    "avx512pf": "avx512pf", "avx512ifma": "avx512ifma", "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512_vbmi2", "avx512vnni": "avx512_vnni",
    "avx512bitalg": "avx512_bitalg", "avx512vpopcntdq": "avx512_vpopcntdq",
    "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16",
    "avx512vp2intersect": "avx512_vp2intersect", "avxvnni": "avx_vnni",
    "amx-tile": "amx_tile", "amx-int8": "amx_int8", "amx-bf16": "amx_bf16",
}

_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "i386": "x86",
                 "i486": "x86", "i586": "x86", "i686": "x86"}


def normalize_arch(name: str) -> str:
    """``x86_64``/``aarch64``/... for a triple's first component or `platform.machine()`."""
    n = name.lower()
    return _ARCH_ALIASES.get(n, n)


def triple_arch(triple: str) -> str:
    return normalize_arch(triple.split("-", 1)[0])


def machine_arch() -> str:
    return normalize_arch(platform.machine())


@functools.cache
def host_cpu_flags() -> frozenset[str] | None:
    """The CPU flags the kernel reports for this machine, or None when it cannot tell.

    /proc/cpuinfo rather than cpuid: it needs no native code, and it reflects what the OS
    actually enabled (AVX-512 state saving, flags masked by a hypervisor).
    """
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return None


def library_files(path: str | os.PathLike[str]) -> tuple[Path, Path, Path]:
    """``(library, header, manifest)`` paths: ``out/k.so`` -> ``out/k.h``, ``out/k.json``."""
    lib = Path(path)
    base = lib.with_suffix("") if lib.suffix in (".so", ".dylib", ".dll") else lib
    return lib, base.with_name(base.name + ".h"), base.with_name(base.name + ".json")


# the manifest --------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelEntry:
    """One kernel as the manifest describes it."""

    name: str
    params: tuple[ParamSpec, ...]
    dims: tuple[str, ...]
    check_overlap: bool
    provenance: dict[str, Any] | None


@dataclass(frozen=True)
class Manifest:
    """The parts of a manifest the loader acts on (``data`` keeps everything)."""

    path: Path
    data: dict[str, Any]
    sha256: str
    triple: str
    cpu: str
    required_features: tuple[str, ...]
    error_codes: dict[int, str]
    oob_record: str | None
    debug_buffers: tuple[str, ...]
    kernels: tuple[KernelEntry, ...]


class _Fields:
    """Typed access to a JSON object whose errors name the manifest file and the field."""

    def __init__(self, file: Path) -> None:
        self.file = file

    def error(self, msg: str) -> TecompError:
        return TecompError(f"manifest {self.file}: {msg}; export the library again "
                           "(its manifest is corrupted or was not written by tecomp)")

    def get(self, obj: Any, key: str, typ: type | tuple[type, ...], where: str = "",
            optional: bool = False) -> Any:
        if not isinstance(obj, dict):
            raise self.error(f"{where or 'the top level'} must be a JSON object")
        if key not in obj or (optional and obj[key] is None):
            if optional:
                return None
            raise self.error(f"field '{where}{key}' is missing")
        v = obj[key]
        if not isinstance(v, typ) or (isinstance(v, bool) and typ is int):
            raise self.error(f"field '{where}{key}' has the wrong type ({type(v).__name__})")
        return v

    def strings(self, obj: Any, key: str, where: str = "") -> tuple[str, ...]:
        v = self.get(obj, key, list, where)
        if not all(isinstance(s, str) for s in v):
            raise self.error(f"field '{where}{key}' must be a list of strings")
        return tuple(v)


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Parse and validate a library manifest; every defect is a TecompError naming the file."""
    file = Path(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TecompError(f"manifest {file} does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TecompError(f"manifest {file} cannot be read as JSON (corrupted or truncated?): "
                          f"{e}") from None
    f = _Fields(file)
    schema = f.get(data, "schema", str)
    if schema != SCHEMA:
        raise f.error(f"schema is {schema!r}, expected {SCHEMA!r}")
    version = f.get(data, "schema_version", int)
    if version > SCHEMA_VERSION:
        raise TecompError(f"manifest {file} has schema version {version}, but this tecomp reads "
                          f"versions up to {SCHEMA_VERSION}; upgrade tecomp to load it")
    target = f.get(data, "target", dict)
    codes = f.get(data, "error_codes", dict)
    if not all(isinstance(v, int) for v in codes.values()):
        raise f.error("field 'error_codes' must map names to integers")
    kernels: list[KernelEntry] = []
    for i, k in enumerate(f.get(data, "kernels", list)):
        where = f"kernels[{i}]."
        name = f.get(k, "name", str, where)
        if not name.isidentifier():
            raise f.error(f"kernel name {name!r} is not a C identifier")
        try:
            params = tuple(ParamSpec.from_json(p) for p in f.get(k, "params", list, where))
        except ValueError as e:
            raise f.error(f"kernel {name!r}: {e}") from None
        dims = f.strings(k, "dims", where)
        if not all(d.isidentifier() for d in dims):
            raise f.error(f"kernel {name!r}: dim names must be identifiers, got {list(dims)}")
        kernels.append(KernelEntry(name, params, dims, f.get(k, "check_overlap", bool, where),
                                   f.get(k, "provenance", dict, where, optional=True)))
    if not kernels:
        raise f.error("it lists no kernels")
    names = [k.name for k in kernels]
    if len(set(names)) != len(names):
        raise f.error(f"kernel names repeat: {names}")
    return Manifest(
        path=file, data=data, sha256=f.get(data, "sha256", str),
        triple=f.get(target, "triple", str, "target."), cpu=f.get(target, "cpu", str, "target."),
        required_features=f.strings(target, "required_features", "target."),
        error_codes={v: k for k, v in codes.items()},
        oob_record=f.get(data, "oob_record", str, optional=True),
        debug_buffers=f.strings(data, "debug_buffers"), kernels=tuple(kernels),
    )


# checks before any native code runs -------------------------------------------------------


def missing_features(required: Iterable[str], flags: frozenset[str]) -> list[str]:
    """The LLVM feature names in ``required`` whose cpuinfo flag is not in ``flags``."""
    return [f for f in required if f in CPU_FLAGS and CPU_FLAGS[f] not in flags]


def check_runnable(man: Manifest, library: Path,
                   flags: frozenset[str] | None = None) -> None:
    """Raise unless code built for ``man``'s target can run here (``flags``: cpuinfo flags).

    Runs before dlopen: a library for the wrong CPU would not fail to load, it would kill the
    process with SIGILL at the first vector instruction.
    """
    arch, here = triple_arch(man.triple), machine_arch()
    if arch != here:
        raise TecompError(f"{library} was built for {man.triple} ({arch}), but this machine is "
                          f"{here}; export it again on or for this machine")
    if ("linux" in man.triple) != sys.platform.startswith("linux"):
        raise TecompError(f"{library} was built for {man.triple}, which is not this operating "
                          f"system ({sys.platform})")
    flags = host_cpu_flags() if flags is None else flags
    if flags is None or arch not in ("x86_64", "x86"):
        return  # nothing to compare with; the feature table only knows x86
    unknown = [f for f in man.required_features if f not in CPU_FLAGS]
    if unknown:
        raise TecompError(f"{library} requires CPU features this tecomp cannot check "
                          f"({', '.join(unknown)}); load it with the tecomp that exported it")
    missing = missing_features(man.required_features, flags)
    if missing:
        raise TecompError(
            f"{library} was built for CPU features this machine lacks: {', '.join(missing)} "
            f"(target cpu {man.cpu or 'generic'}); running it would crash with an illegal "
            "instruction. Export it again for this machine (target='llvm') or for a baseline "
            "every machine has (e.g. target='llvm -mcpu=x86-64-v3')"
        )


_opened: dict[str, str] = {}  # real path -> sha256 of the contents dlopen'ed under that name
_open_lock = threading.Lock()


def _dlopen(library: Path, blob: bytes, sha: str) -> ctypes.CDLL:
    real = os.path.realpath(library)
    with _open_lock:
        try:
            if _opened.get(real, sha) == sha:
                lib = ctypes.CDLL(real)
                _opened[real] = sha
                return lib
            # glibc returns the object it already mapped for a path it has seen, even when the
            # file was replaced since (re-exported in this process): load the new bytes under a
            # fresh name instead. The mapping outlives the unlinked file.
            fd, tmp = tempfile.mkstemp(suffix="-" + library.name)
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(blob)
                return ctypes.CDLL(tmp)
            finally:
                os.unlink(tmp)
        except OSError as e:
            raise TecompError(f"could not load the shared object {library}: {e}") from None


# the module ------------------------------------------------------------------------------


class LoadedModule(KernelSet):
    """Kernels of an exported library, callable like a freshly built `tecomp.Module`.

    ``lib["mm"]`` is a `Function` (argument checks, DLPack inputs, ``time_evaluator``);
    calling the module calls its only kernel. ``manifest`` is the parsed manifest (target,
    provenance, ...), ``provenance`` the library-level tuning provenance.
    """

    def __init__(self, path: Path, manifest: Manifest, handle: ctypes.CDLL,
                 header: Path | None = None) -> None:
        self.path = path
        self.header_path = header
        self.manifest = manifest.data
        target = manifest.data["target"]
        # "llvm" would read as "this machine" wherever the library is loaded: be explicit
        spelled = target.get("string")
        self.target: str = (spelled if isinstance(spelled, str) and spelled != "llvm"
                            else f"llvm -mtriple={manifest.triple} -mcpu={manifest.cpu}")
        self.debug = bool(manifest.data.get("debug", False))
        self.provenance: dict[str, Any] | None = manifest.data.get("provenance")
        self._handle = handle
        oob = None
        if manifest.oob_record is not None:
            try:
                oob = OOBRecord.in_dll(handle, manifest.oob_record)
            except ValueError:
                raise TecompError(f"{path}: the debug record {manifest.oob_record!r} named by "
                                  "its manifest is missing from the library") from None
        self._functions: dict[str, Function] = {}
        for k in manifest.kernels:
            try:
                address = ctypes.cast(getattr(handle, k.name), ctypes.c_void_p).value
            except AttributeError:
                address = None
            if not address:
                raise TecompError(f"{path}: kernel {k.name!r} listed in the manifest is not "
                                  "exported by the library")
            try:
                checker = ArgChecker(k.name, k.params, k.dims, check_overlap=k.check_overlap)
            except (TecompError, SyntaxError) as e:
                raise TecompError(f"{manifest.path}: kernel {k.name!r}: {e}") from None
            self._functions[k.name] = Function(
                k.name, address, checker, owner=handle,
                on_error=ErrorDecoder(k.name, manifest.error_codes, oob,
                                      manifest.debug_buffers, owner=handle))
        self.entry_name = manifest.kernels[0].name if len(manifest.kernels) == 1 else None
        self._kernel_provenance = {k.name: k.provenance for k in manifest.kernels}
        self._where = f"library {path}"


    def kernel_provenance(self, name: str) -> dict[str, Any] | None:
        """How kernel ``name`` was obtained (tuning log, record hash, measured time), if known."""
        self[name]  # noqa: B018 - a clear KeyError for unknown names
        return self._kernel_provenance[name]

    def get_source(self, fmt: str = "h") -> str:
        """``"h"``: the C header. A library holds machine code only; IR and assembly come from
        the `Module` that built it (or ``objdump -d`` on the file)."""
        if fmt in ("h", "c", "header") and self.header_path is not None:
            try:
                return self.header_path.read_text(encoding="utf-8")
            except OSError as e:
                raise TecompError(f"cannot read the header of {self.path}: {e}") from None
        raise TecompError(f"a loaded library has no {fmt!r} source, only machine code; "
                          "use the Module that built it, or objdump -d on the .so")

    def __repr__(self) -> str:
        return f"<tecomp.LoadedModule {self.path} [{', '.join(self._functions)}]>"


def load_module(path: str | os.PathLike[str],
                manifest: str | os.PathLike[str] | None = None) -> LoadedModule:
    """Load a library written by ``Module.export_library`` (ctypes + its JSON manifest).

    ``manifest`` defaults to the ``.json`` next to the library. Raises `TecompError` naming
    the file, before any of its code runs, when the manifest is unreadable or inconsistent,
    the library does not match it, or this machine cannot run the code (architecture, OS,
    CPU features).

    >>> lib = tc.runtime.load_module("out/kernels.so")       # doctest: +SKIP
    >>> lib["mm"](a, b, c); lib["mm"].time_evaluator()(a, b, c).median  # doctest: +SKIP
    """
    library, header, default_manifest = library_files(path)
    if not library.is_file():
        raise TecompError(f"library {library} does not exist")
    man_path = Path(manifest) if manifest is not None else default_manifest
    if not man_path.is_file():
        raise TecompError(f"library {library} has no manifest {man_path} next to it; "
                          "export_library writes one (it describes the kernels' arguments)")
    man = read_manifest(man_path)
    check_runnable(man, library)
    try:
        blob = library.read_bytes()
    except OSError as e:
        raise TecompError(f"cannot read the shared object {library}: {e}") from None
    sha = hashlib.sha256(blob).hexdigest()
    if sha != man.sha256:
        raise TecompError(f"shared object {library} does not match its manifest {man_path} "
                          "(sha256 differs): it is corrupted, truncated, or was rebuilt "
                          "without its manifest; export it again")
    handle = _dlopen(library, blob, sha)
    return LoadedModule(library, man, handle, header if header.is_file() else None)


__all__ = ["CPU_FLAGS", "KernelEntry", "LoadedModule", "Manifest", "SCHEMA", "SCHEMA_VERSION",
           "check_runnable", "host_cpu_flags", "library_files", "load_module", "missing_features",
           "read_manifest"]

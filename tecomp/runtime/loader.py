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

Cuda functions (`LoadedCudaFunction`) run through `tecomp.runtime.cuda` with the `LaunchPlan`
the manifest records (the built function's own): cuda-bindings is imported on their first
call, never to load or list them, and the driver gets the cubin of the device's arch when the
library has one, else the PTX. Their PTX and cubins are checked against the manifest's sha256
at load; where CUDA cannot run, a call raises `CudaUnavailable` after the argument checks.

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
from typing import TYPE_CHECKING, Any

from ..errors import TecompError
from .args import _SHAPE_EXPR, ArgChecker, KernelSpec, ParamSpec
from .cpu import BenchmarkResult, ErrorDecoder, Function, KernelSet, OOBRecord

if TYPE_CHECKING:
    from collections.abc import Callable

    from .cuda import CudaKernel, CudaModule, KernelSequence, LaunchPlan

SCHEMA = "tecomp-library"
SCHEMA_VERSION = 3  # the newest read here; 3: strided buffer parameters ("strides" in a param)
CUDA_SCHEMA_VERSION = 2  # 2: cuda functions ("cuda" section, entries of "kind": "cuda")
CPU_SCHEMA_VERSION = 1  # what a library of CPU functions only is written as (older readers load it)

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
    """One function as the manifest describes it; ``kind`` "llvm" (CPU code in the shared
    object) or "cuda" (``plan``: the `tecomp.runtime.cuda.LaunchPlan` of its kernels)."""

    name: str
    params: tuple[ParamSpec, ...]
    dims: tuple[str, ...]
    check_overlap: bool
    provenance: dict[str, Any] | None
    kind: str = "llvm"
    plan: LaunchPlan | None = None


@dataclass(frozen=True)
class CudaImages:
    """The manifest's ``"cuda"`` section: the GPU code's files (names next to the manifest)
    and their sha256, PTX ISA version, and the cubins by arch."""

    target: str
    arch: str
    ptx_file: str
    ptx_sha256: str
    isa_version: str | None
    cubins: tuple[tuple[str, str, str], ...]  # (arch, file, sha256)


@dataclass(frozen=True)
class Manifest:
    """The parts of a manifest the loader acts on (``data`` keeps everything). A library of
    cuda functions only has no shared object: ``library`` is None and the CPU target
    fields are empty."""

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
    library: str | None = None
    cuda: CudaImages | None = None


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
    codes = f.get(data, "error_codes", dict)
    if not all(isinstance(v, int) for v in codes.values()):
        raise f.error("field 'error_codes' must map names to integers")
    library = f.get(data, "library", str, optional=True)
    cuda = _cuda_images(f, data) if data.get("cuda") is not None else None
    kernels: list[KernelEntry] = []
    for i, k in enumerate(f.get(data, "kernels", list)):
        where = f"kernels[{i}]."
        name = f.get(k, "name", str, where)
        if not name.isidentifier():
            raise f.error(f"kernel name {name!r} is not a C identifier")
        kind = f.get(k, "kind", str, where, optional=True) or "llvm"
        if kind not in ("llvm", "cuda"):
            raise f.error(f"kernel {name!r} is of kind {kind!r}; this tecomp loads 'llvm' and "
                          "'cuda' functions")
        if kind == "llvm" and library is None:
            raise f.error(f"kernel {name!r} is CPU code, but the manifest names no library")
        if kind == "cuda" and cuda is None:
            raise f.error(f"kernel {name!r} is a cuda function, but the manifest has no 'cuda' "
                          "section")
        try:
            params = tuple(ParamSpec.from_json(p) for p in f.get(k, "params", list, where))
        except ValueError as e:
            raise f.error(f"kernel {name!r}: {e}") from None
        dims = f.strings(k, "dims", where)
        if not all(d.isidentifier() for d in dims):
            raise f.error(f"kernel {name!r}: dim names must be identifiers, got {list(dims)}")
        overlap = f.get(k, "check_overlap", bool, where)
        plan = _cuda_plan(f, k, where, KernelSpec(name, params, dims, overlap)) \
            if kind == "cuda" else None
        kernels.append(KernelEntry(name, params, dims, overlap,
                                   f.get(k, "provenance", dict, where, optional=True), kind, plan))
    if not kernels:
        raise f.error("it lists no kernels")
    names = [k.name for k in kernels]
    if len(set(names)) != len(names):
        raise f.error(f"kernel names repeat: {names}")
    if library is None:
        cpu: tuple[str, str, tuple[str, ...]] = ("", "", ())
        sha = ""
    else:
        target = f.get(data, "target", dict)
        cpu = (f.get(target, "triple", str, "target."), f.get(target, "cpu", str, "target."),
               f.strings(target, "required_features", "target."))
        sha = f.get(data, "sha256", str)
    return Manifest(
        path=file, data=data, sha256=sha, triple=cpu[0], cpu=cpu[1], required_features=cpu[2],
        error_codes={v: k for k, v in codes.items()},
        oob_record=f.get(data, "oob_record", str, optional=True),
        debug_buffers=f.strings(data, "debug_buffers"), kernels=tuple(kernels),
        library=library, cuda=cuda,
    )


def _file_name(f: _Fields, obj: Any, key: str, where: str) -> str:
    name = f.get(obj, key, str, where)
    if not name or Path(name).name != name or name in (".", ".."):
        raise f.error(f"field '{where}{key}' must name a file next to the manifest, got {name!r}")
    return name


def _cuda_images(f: _Fields, data: dict[str, Any]) -> CudaImages:
    c = f.get(data, "cuda", dict)
    ptx = f.get(c, "ptx", dict, "cuda.")
    cubins = []
    for i, cb in enumerate(f.get(c, "cubins", list, "cuda.")):
        w = f"cuda.cubins[{i}]."
        cubins.append((f.get(cb, "arch", str, w), _file_name(f, cb, "file", w),
                       f.get(cb, "sha256", str, w)))
    return CudaImages(f.get(c, "target", str, "cuda."), f.get(c, "arch", str, "cuda."),
                      _file_name(f, ptx, "file", "cuda.ptx."), f.get(ptx, "sha256", str, "cuda.ptx."),
                      f.get(ptx, "isa_version", str, "cuda.ptx.", optional=True), tuple(cubins))


_SHAPE_FUNCS = frozenset({"min", "max", "int"})


def _extent_names(f: _Fields, v: Any, what: str, allowed: Iterable[str]) -> int | str:
    """A launch extent or shape entry: a non-negative int, or an arithmetic expression over
    ``allowed`` names (it is evaluated at every call: nothing else may reach eval)."""
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v
    if isinstance(v, str) and _SHAPE_EXPR.match(v):
        try:
            names = set(compile(v, "<manifest>", "eval").co_names)
        except SyntaxError:
            names = {"<syntax error>"}
        unknown = names - _SHAPE_FUNCS - set(allowed)
        if not unknown:
            return v
        raise f.error(f"{what} {v!r} uses {sorted(unknown)}, which are not dims of the kernel")
    raise f.error(f"{what} must be a non-negative int or an expression over dim names, got {v!r}")


def _ints(f: _Fields, obj: Any, key: str, where: str, bound: int, n: int) -> tuple[int, ...]:
    v = f.get(obj, key, list, where)
    if len(v) != n or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < bound
                              for i in v):
        raise f.error(f"field '{where}{key}' must be {n} indices below {bound}, got {v!r}")
    return tuple(v)


def _cuda_plan(f: _Fields, k: Any, where: str, spec: KernelSpec) -> LaunchPlan:
    """The `LaunchPlan` of a cuda function entry, validated against itself: argument slots
    in range with matching dtypes, launch extents over the kernel's own dims."""
    from .cuda import LAUNCH_TAGS, KernelLaunch, LaunchPlan

    try:
        inter = tuple(ParamSpec.from_json(p) for p in f.get(k, "intermediates", list, where))
    except ValueError as e:
        raise f.error(f"kernel {spec.name!r}: intermediate {e}") from None
    for p in inter:
        for s in p.shape:
            _extent_names(f, s, f"{where}intermediates: shape of {p.name}", spec.dims)
    slots = list(spec.params) + list(inter)
    launches = []
    for j, lk in enumerate(f.get(k, "launches", list, where)):
        w = f"{where}launches[{j}]."
        kname = f.get(lk, "kernel", str, w)
        if not kname.isidentifier():
            raise f.error(f"kernel {kname!r} is not a PTX entry name")
        try:
            kparams = tuple(ParamSpec.from_json(p) for p in f.get(lk, "params", list, w))
        except ValueError as e:
            raise f.error(f"kernel {kname!r}: {e}") from None
        kdims = f.strings(lk, "dims", w)
        args = _ints(f, lk, "args", w, len(slots), len(kparams))
        dim_args = _ints(f, lk, "dim_args", w, len(spec.dims), len(kdims))
        for p, a in zip(kparams, args, strict=True):
            if p.dtype != slots[a].dtype:
                raise f.error(f"kernel {kname!r}: parameter {p.name} is {p.dtype}, but its "
                              f"argument {slots[a].name} is {slots[a].dtype}")
            if p.scalar != slots[a].scalar:
                # a by-value scalar must come from a scalar argument, a pointer from a buffer
                what = "a scalar" if p.scalar else "a buffer"
                raise f.error(f"kernel {kname!r}: parameter {p.name} is {what}, but its "
                              f"argument {slots[a].name} is not")
        ext = []
        for key in ("grid", "block"):
            v = f.get(lk, key, list, w)
            if len(v) != 3:
                raise f.error(f"field '{w}{key}' must have 3 extents (x, y, z), got {v!r}")
            ext += [_extent_names(f, e, f"{w}{key}", kdims) for e in v]
        smem = f.get(lk, "dynamic_shared_bytes", int, w)
        if smem < 0:
            raise f.error(f"field '{w}dynamic_shared_bytes' is negative")
        launches.append(KernelLaunch(KernelSpec(kname, kparams, kdims, spec.check_overlap),
                                     dict(zip(LAUNCH_TAGS, ext, strict=True)), args, dim_args, smem))
    if not launches:
        raise f.error(f"cuda function {spec.name!r} launches no kernel")
    return LaunchPlan(spec, tuple(launches), inter)


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


_CUDA_HINT = ("A loaded library holds compiled GPU code only, which cannot be emulated: run it "
              "where an NVIDIA GPU, its driver and cuda-bindings are (pip install 'tecomp[cuda]'), "
              "or emulate the function built from its schedule "
              "(tc.build(..., target='cuda')[name].emulate(*arrays))")


class LoadedCudaFunction:
    """A cuda function of an exported library, called like the `GpuFunction` that was
    exported (same `tecomp.runtime.cuda.LaunchPlan` launcher: argument checks and texts,
    host/device arrays, kernels in order, intermediates), ``time_evaluator`` with CUDA events.

    The driver is touched on the first call only: the module then loads the cubin of the
    device's arch when the library has one, else the PTX (``loaded_from`` says which).
    Without cuda-bindings, a driver or a device a call raises `CudaUnavailable` saying so,
    after the argument checks.
    """

    def __init__(self, library: Path, plan: LaunchPlan, module: CudaModule) -> None:
        self.library = library
        self.plan = plan
        self.name = plan.spec.name
        self.module = module
        self._launcher: CudaKernel | KernelSequence = plan.launcher(module)
        host = self._launcher.host if hasattr(self._launcher, "host") else self._launcher
        self.checker: ArgChecker = host.checker
        self._who = f"{self.name} of library {library}"
        self._hint = _CUDA_HINT.replace("[name]", f"['{self.name}']")

    @property
    def params(self) -> tuple[ParamSpec, ...]:
        return self.plan.spec.params

    @property
    def kernels(self) -> list[str]:
        """The PTX entries this function launches, in order."""
        return [k.spec.name for k in self.plan.kernels]

    @property
    def launch(self) -> dict[str, dict[str, int | str]]:
        """Launch extents by thread tag (ints or expressions over the dims), per kernel."""
        return {k.spec.name: dict(k.launch) for k in self.plan.kernels}

    @property
    def loaded_from(self) -> str | None:
        """``"cubin sm_80"`` or ``"PTX"`` once the module is loaded on a device, else None."""
        return self.module.loaded_from

    def prepare(self, *arrays: object) -> Any:
        """The argument checks of a call and its launch shape (no GPU needed)."""
        return self._launcher.prepare(*arrays)

    def _refuse_emulation(self) -> None:
        if os.environ.get("TECOMP_CUDA_EMULATE", "") not in ("", "0"):
            raise TecompError(f"cannot emulate cuda kernel {self.name} of {self.library}: "
                              f"TECOMP_CUDA_EMULATE is set, but {self._hint[0].lower()}"
                              f"{self._hint[1:]}")

    def __call__(self, *arrays: object) -> None:
        from .cuda import call_or_explain

        self._refuse_emulation()
        call_or_explain(self._launcher, self._who, arrays,
                        self._hint)

    def time_evaluator(self, number: int = 10, repeat: int = 3,
                       min_repeat_ms: float = 0) -> Callable[..., BenchmarkResult]:
        """Times device launches with CUDA events (`BenchmarkResult`); needs a GPU."""
        from .cuda import call_or_explain

        self._refuse_emulation()
        timer = self._launcher.time_evaluator(number=number, repeat=repeat,
                                              min_repeat_ms=min_repeat_ms)

        def evaluate(*arrays: object) -> BenchmarkResult:
            result: BenchmarkResult = call_or_explain(
                self._launcher, self._who, arrays,
                self._hint, run=timer)
            return result
        return evaluate

    def get_source(self, fmt: str = "ptx") -> str:
        """``"ptx"``: the library's PTX (all its cuda functions)."""
        if fmt != "ptx":
            raise TecompError(f"a loaded cuda function has no {fmt!r} source, only PTX and "
                              "cubins; use the GpuModule that built it")
        return self.module.get_source()

    def __repr__(self) -> str:
        sig = ", ".join(f"{p.name}: {p.dtype}{list(p.shape)}" for p in self.params)
        return f"<tecomp.LoadedCudaFunction {self.name}({sig}) from {self.library}>"


class LoadedModule(KernelSet):
    """Functions of an exported library, callable like a freshly built `tecomp.Module`.

    ``lib["mm"]`` is a `Function` (argument checks, DLPack inputs, ``time_evaluator``) for
    CPU code, a `LoadedCudaFunction` for a cuda function; calling the module calls its only
    function. ``manifest`` is the parsed manifest (target, provenance, ...), ``provenance`` the
    library-level tuning provenance; ``target`` the CPU target (the cuda one for a library of
    cuda functions only), ``cuda_target`` the cuda one (None without cuda functions).
    """

    def __init__(self, path: Path, manifest: Manifest, handle: ctypes.CDLL | None,
                 header: Path | None = None,
                 images: tuple[bytes, dict[str, bytes]] | None = None) -> None:
        self.path = path
        self.header_path = header
        self.manifest = manifest.data
        self.cuda_target = manifest.cuda.target if manifest.cuda is not None else None
        target = manifest.data.get("target") or {}
        # "llvm" would read as "this machine" wherever the library is loaded: be explicit
        spelled = target.get("string")
        self.target: str = (spelled if isinstance(spelled, str) and spelled != "llvm"
                            else f"llvm -mtriple={manifest.triple} -mcpu={manifest.cpu}"
                            if handle is not None else self.cuda_target or "")
        self.debug = bool(manifest.data.get("debug", False))
        self.provenance: dict[str, Any] | None = manifest.data.get("provenance")
        self._handle = handle
        oob = None
        if manifest.oob_record is not None and handle is not None:
            try:
                oob = OOBRecord.in_dll(handle, manifest.oob_record)
            except ValueError:
                raise TecompError(f"{path}: the debug record {manifest.oob_record!r} named by "
                                  "its manifest is missing from the library") from None
        self._cuda: CudaModule | None = None
        if images is not None:
            from .cuda import CudaModule

            # one driver module for all the library's cuda functions, loaded on first use
            self._cuda = CudaModule(images[0], cubins=images[1])
        self._functions: dict[str, Function] = {}
        for k in manifest.kernels:
            if k.kind == "cuda":
                assert k.plan is not None and self._cuda is not None
                try:
                    fn: Any = LoadedCudaFunction(path, k.plan, self._cuda)
                except (TecompError, ValueError, SyntaxError) as e:
                    raise TecompError(f"{manifest.path}: cuda function {k.name!r}: {e}") from None
                self._functions[k.name] = fn
                continue
            assert handle is not None
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
        """``"h"``: the C header; ``"ptx"``: the PTX of the cuda functions. A library holds
        machine code only; IR and assembly come from the `Module` that built it (or
        ``objdump -d`` on the file)."""
        if fmt == "ptx" and self._cuda is not None:
            return self._cuda.get_source()
        if fmt in ("h", "c", "header") and self.header_path is not None:
            try:
                return self.header_path.read_text(encoding="utf-8")
            except OSError as e:
                raise TecompError(f"cannot read the header of {self.path}: {e}") from None
        raise TecompError(f"a loaded library has no {fmt!r} source, only machine code; "
                          "use the Module that built it, or objdump -d on the .so")

    def __repr__(self) -> str:
        return f"<tecomp.LoadedModule {self.path} [{', '.join(self._functions)}]>"


def _read_checked(file: Path, sha: str, what: str, man_path: Path) -> bytes:
    try:
        blob = file.read_bytes()
    except FileNotFoundError:
        raise TecompError(f"the {what} {file} named by the manifest {man_path} is missing; "
                          "copy it along with the library, or export it again") from None
    except OSError as e:
        raise TecompError(f"cannot read the {what} {file}: {e}") from None
    if hashlib.sha256(blob).hexdigest() != sha:
        raise TecompError(f"the {what} {file} does not match its manifest {man_path} (sha256 "
                          "differs): it is corrupted, truncated, or was rebuilt without its "
                          "manifest; export it again")
    return blob


def load_module(path: str | os.PathLike[str],
                manifest: str | os.PathLike[str] | None = None) -> LoadedModule:
    """Load a library written by ``export_library`` (ctypes + its JSON manifest; cuda
    functions through cuda-bindings, imported on their first call).

    ``path``: the ``.so`` (or, for a library of cuda functions only, which has none, the
    ``.ptx`` or the ``.json``); ``manifest`` defaults to the ``.json`` next to it. Raises
    `TecompError` naming the file, before any of its code runs, when the manifest is
    unreadable or inconsistent, a file does not match it (sha256), or this machine cannot
    run the CPU code (architecture, OS, CPU features).

    >>> lib = tc.runtime.load_module("out/kernels.so")       # doctest: +SKIP
    >>> lib["mm"](a, b, c); lib["mm"].time_evaluator()(a, b, c).median  # doctest: +SKIP
    """
    given = Path(path)
    base = given.with_suffix("") if given.suffix in (".json", ".ptx") else None
    library, header, default_manifest = library_files(base.with_name(base.name + ".so")
                                                      if base is not None else given)
    man_path = Path(manifest) if manifest is not None else default_manifest
    if not man_path.is_file():
        if not library.is_file() and base is None:
            raise TecompError(f"library {library} does not exist")
        raise TecompError(f"library {given} has no manifest {man_path} next to it; "
                          "export_library writes one (it describes the kernels' arguments)")
    man = read_manifest(man_path)
    handle = None
    if man.library is not None:
        if base is not None:  # named through its .json/.ptx: the manifest names the .so
            library = man_path.parent / man.library
        if not library.is_file():
            raise TecompError(f"library {library} does not exist")
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
    images = None
    where = library if man.library is not None else man_path.parent / man.cuda.ptx_file \
        if man.cuda is not None else given
    if man.cuda is not None:
        c = man.cuda
        ptx = _read_checked(man_path.parent / c.ptx_file, c.ptx_sha256, "PTX", man_path)
        cubins = {arch: _read_checked(man_path.parent / file, sha, f"{arch} cubin", man_path)
                  for arch, file, sha in c.cubins}
        images = (ptx, cubins)
    return LoadedModule(where, man, handle, header if header.is_file() else None, images)


__all__ = ["CPU_FLAGS", "CPU_SCHEMA_VERSION", "CUDA_SCHEMA_VERSION", "CudaImages", "KernelEntry", "LoadedCudaFunction",
           "LoadedModule", "Manifest", "SCHEMA", "SCHEMA_VERSION",
           "check_runnable", "host_cpu_flags", "library_files", "load_module", "missing_features",
           "read_manifest"]

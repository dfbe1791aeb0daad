"""ptxas, NVIDIA's PTX assembler: checks generated PTX without a GPU and reports what each
kernel uses (registers, spills, stack, shared and constant memory).

``ptxas -arch=sm_80 -v`` prints, per kernel::

    ptxas info    : Compiling entry function 'k' for 'sm_80'
    ptxas info    : Function properties for k
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 14 registers, used 1 barriers, 512 bytes smem, 376 bytes cmem[0]

`ptxas_resources` parses that into `Resources`; `compile_cubin` assembles a cubin
(`compile_cubin_report`: both from one run).

When ptxas is absent, `find_ptxas` returns None and the other functions raise
`PtxasMissing` (a `TecompError`; catch it to skip the check). PTX that ptxas rejects
raises `PtxasError` (also a `TecompError`) with ptxas's own messages.

>>> res = ptxas_resources(ptx, "sm_80")                          # doctest: +SKIP
>>> res["k"].registers, res["k"].spill_stores, res["k"].shared_bytes   # doctest: +SKIP
(14, 0, 512)
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from ..errors import TecompError

TIMEOUT_S = 120.0  # ptxas takes milliseconds on small kernels; a hang must not hang a tuner


class PtxasMissing(TecompError):
    """ptxas is not installed where tecomp looks (see `search_locations`)."""


class PtxasError(TecompError):
    """ptxas rejected the PTX (or did not finish); the message holds its output."""


def search_locations() -> list[str]:
    """Candidate ptxas executables, in the order they are tried."""
    out: list[str] = []
    explicit = os.environ.get("TECOMP_PTXAS")
    if explicit:
        out.append(explicit)
    which = shutil.which("ptxas")
    if which:
        out.append(which)
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root:
            out.append(os.path.join(root, "bin", "ptxas"))
    out.append("/usr/local/cuda/bin/ptxas")
    out += sorted(glob.glob("/usr/local/cuda-*/bin/ptxas"), reverse=True)
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    for root in (spec.submodule_search_locations or []) if spec else []:
        out += sorted(glob.glob(os.path.join(root, "*", "bin", "ptxas")))
    return list(dict.fromkeys(out))


def find_ptxas() -> str | None:
    """The ptxas to run (``$TECOMP_PTXAS``, PATH, ``$CUDA_HOME/bin``...), or None."""
    for p in search_locations():
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def _require() -> str:
    exe = find_ptxas()
    if exe is None:
        raise PtxasMissing(
            "ptxas (from the CUDA toolkit) was not found; looked at: "
            + ", ".join(search_locations())
            + ". Install the toolkit or `pip install nvidia-cuda-nvcc`, or set TECOMP_PTXAS."
        )
    return exe


@dataclass(frozen=True)
class KernelResources:
    """What ptxas allotted one kernel (an ``.entry``). Sizes are in bytes."""

    name: str
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack_frame: int = 0
    shared_bytes: int = 0  # static shared memory ("smem")
    constant_bytes: int = 0  # all constant banks ("cmem[n]"), parameters included
    local_bytes: int = 0  # "lmem", when ptxas reports it
    barriers: int = 0

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


@dataclass(frozen=True)
class Resources(Mapping[str, KernelResources]):
    """`KernelResources` per kernel name, from one ``ptxas -v`` run (``log``: its output)."""

    arch: str
    kernels: dict[str, KernelResources] = field(default_factory=dict)
    global_bytes: int = 0
    log: str = ""

    def __getitem__(self, name: str) -> KernelResources:
        try:
            return self.kernels[name]
        except KeyError:
            raise KeyError(f"ptxas reported no kernel {name!r}; it has {sorted(self.kernels)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.kernels)

    def __len__(self) -> int:
        return len(self.kernels)


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_GMEM = re.compile(r"(\d+) bytes gmem")
_NUM = {
    "barriers": re.compile(r"used (\d+) barriers"),
    "shared_bytes": re.compile(r"(\d+) bytes smem"),
    "local_bytes": re.compile(r"(\d+) bytes lmem"),
}
_CMEM = re.compile(r"(\d+) bytes cmem\[\d+\]")


def parse_resources(log: str, arch: str) -> Resources:
    """Parse ``ptxas -v`` output (see the module docstring) into `Resources`."""
    found: dict[str, dict[str, int]] = {}
    frames: dict[str, tuple[int, int, int]] = {}
    current: str | None = None  # the entry whose "Used ..." line comes next
    props: str | None = None  # the function whose stack-frame line comes next
    gmem = 0
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = m.group(1)
            found.setdefault(current, {})
        elif m := _PROPS.search(line):
            props = m.group(1)
        elif (m := _FRAME.search(line)) and props is not None:
            frames[props] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            props = None
        elif (m := _USED.search(line)) and current is not None:
            info = found[current]
            info["registers"] = int(m.group(1))
            for key, rx in _NUM.items():
                if n := rx.search(line):
                    info[key] = int(n.group(1))
            info["constant_bytes"] = sum(int(x) for x in _CMEM.findall(line))
            current = None
        elif m := _GMEM.search(line):
            gmem += int(m.group(1))
    kernels = {}
    for name, info in found.items():
        stack, st, ld = frames.get(name, (0, 0, 0))
        kernels[name] = KernelResources(name, stack_frame=stack, spill_stores=st,
                                        spill_loads=ld, **info)
    return Resources(arch, kernels, gmem, log)


def _run(ptx: str, arch: str, extra: list[str]) -> tuple[str, bytes]:
    exe = _require()
    with tempfile.TemporaryDirectory(prefix="tecomp-ptxas-") as d:
        src = os.path.join(d, "kernel.ptx")
        out = os.path.join(d, "kernel.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [exe, f"-arch={arch}", *extra, "-o", out, src]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise PtxasError(f"ptxas did not finish within {TIMEOUT_S:.0f} s ({arch})") from None
        log = (p.stdout + p.stderr).replace(src, "<ptx>")
        if p.returncode != 0:
            raise PtxasError(f"ptxas rejected the PTX for {arch} (exit {p.returncode}):\n"
                             f"{log.strip()}")
        with open(out, "rb") as f:
            return log, f.read()


def ptxas_resources(ptx: str, arch: str) -> Resources:
    """Assemble ``ptx`` for ``arch`` ("sm_80") with ``ptxas -v`` and return what each kernel
    uses. Raises `PtxasError` when ptxas rejects it, `PtxasMissing` without ptxas."""
    log, _ = _run(ptx, arch, ["-v"])
    return parse_resources(log, arch)


def compile_cubin(ptx: str, arch: str) -> bytes:
    """Assemble ``ptx`` into a cubin for ``arch`` (the toolkit's ptxas: a driver at least
    as new as it loads the result). Raises like `ptxas_resources`."""
    _, cubin = _run(ptx, arch, [])
    return cubin


def compile_cubin_report(ptx: str, arch: str) -> tuple[bytes, Resources]:
    """`compile_cubin` and `ptxas_resources` from one ptxas run: the cubin for ``arch`` and
    what each kernel in it uses (what an exported library records beside its cubins)."""
    log, cubin = _run(ptx, arch, ["-v"])
    return cubin, parse_resources(log, arch)


def ptxas_version() -> str | None:
    """The release of the ptxas `find_ptxas` picks ("13.0.88"), None without one; a cubin
    loads on drivers at least as new as the ptxas that made it."""
    exe = find_ptxas()
    if exe is None:
        return None
    try:
        p = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"\bV(\d+(?:\.\d+)+)", p.stdout)
    return m.group(1) if m else None


__all__ = ["KernelResources", "PtxasError", "PtxasMissing", "Resources", "compile_cubin",
           "compile_cubin_report", "find_ptxas", "parse_resources", "ptxas_resources",
           "ptxas_version", "search_locations"]

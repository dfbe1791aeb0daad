"""Compilation targets: which CPU (triple, cpu name, feature flags) code is generated for.

A target is written the way TVM users know it: ``"llvm"`` (the host CPU, all its features),
``"llvm -mcpu=skylake-avx512 -mattr=+avx2,+fma"`` or ``"llvm -mtriple=x86_64-linux-gnu"``.
Lowering reads `Target.vector_bits` to pick vector widths; the LLVM backend turns the target
into a TargetMachine (cached per target in `tecomp.codegen.llvm_jit`).

This module deliberately does not import llvmlite at module level, so that parsing targets
and reading ``vector_bits`` stays cheap for code that never compiles (e.g. loading records).
"""

from __future__ import annotations

import functools
import shlex
from dataclasses import dataclass

from ..errors import TecompError

# CPUs whose LLVM definition enables AVX-512F / AVX2 without an explicit -mattr. Used only to
# answer `vector_bits` for a named CPU; LLVM itself knows the real feature sets.
_AVX512_CPUS = frozenset({
    "skylake-avx512", "cascadelake", "cooperlake", "cannonlake", "icelake-client",
    "icelake-server", "tigerlake", "sapphirerapids", "emeraldrapids", "graniterapids",
    "graniterapids-d", "diamondrapids", "rocketlake", "knl", "knm", "znver4", "znver5",
    "x86-64-v4",
})
_AVX2_CPUS = frozenset({
    "haswell", "broadwell", "skylake", "kabylake", "coffeelake", "cometlake", "alderlake",
    "raptorlake", "meteorlake", "arrowlake", "arrowlake-s", "lunarlake", "pantherlake",
    "gracemont", "sierraforest", "grandridge", "clearwaterforest", "znver1", "znver2",
    "znver3", "bdver4", "x86-64-v3",
})
_AVX_CPUS = frozenset({"sandybridge", "ivybridge", "btver2", "bdver1", "bdver2", "bdver3"})


@dataclass(frozen=True)
class Target:
    """A CPU code generation target (hashable, so TargetMachines can be cached on it).

    ``features`` is LLVM's comma-separated ``+feat,-feat`` string ("" lets the CPU decide).

    >>> Target.parse("llvm -mcpu=skylake-avx512").vector_bits
    512
    """

    kind: str = "llvm"
    triple: str = ""
    cpu: str = ""
    features: str = ""

    @staticmethod
    def host() -> Target:
        """The machine we are running on, with every feature it has."""
        return _host()

    @staticmethod
    def parse(target: str | Target | None) -> Target:
        """Parse ``"llvm [-mtriple=T] [-mcpu=C] [-mattr=+a,-b]"`` (a Target passes through)."""
        if isinstance(target, Target):
            return target
        if target is None:
            return _host()
        if not isinstance(target, str):
            raise TecompError(f"expected a target string such as 'llvm', got {target!r}")
        return _parse(target.strip())

    @property
    def is_host(self) -> bool:
        """True when code for this target can run in this process (same triple)."""
        return self.triple == _host().triple

    @property
    def feature_set(self) -> frozenset[str]:
        """The features explicitly enabled (``+x``) in ``features``, without the plus."""
        return frozenset(f[1:] for f in self.features.split(",") if f.startswith("+"))

    @property
    def vector_bits(self) -> int:
        """Width of the widest SIMD register lowering should target (512, 256 or 128)."""
        feats = self.features.split(",") if self.features else []
        enabled = {f[1:] for f in feats if f.startswith("+")}
        disabled = {f[1:] for f in feats if f.startswith("-")}
        if "avx512f" in enabled or (self.cpu in _AVX512_CPUS and "avx512f" not in disabled):
            return 512
        if enabled & {"avx2", "avx"} or (
            self.cpu in _AVX2_CPUS | _AVX512_CPUS | _AVX_CPUS and "avx" not in disabled
        ):
            return 256
        return 128

    def __str__(self) -> str:
        if self == _host():
            return "llvm"  # parses back to the host target; the feature list is very long
        parts = [self.kind]
        if self.triple:
            parts.append(f"-mtriple={self.triple}")
        if self.cpu:
            parts.append(f"-mcpu={self.cpu}")
        if self.features:
            parts.append(f"-mattr={self.features}")
        return " ".join(parts)


@functools.cache
def _host() -> Target:
    import llvmlite.binding as llvm

    from .llvm_jit import ensure_llvm_initialized

    ensure_llvm_initialized()
    return Target("llvm", llvm.get_process_triple(), llvm.get_host_cpu_name(),
                  llvm.get_host_cpu_features().flatten())


@functools.lru_cache(maxsize=64)
def _parse(text: str) -> Target:
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise TecompError(f"cannot parse target {text!r}: {e}") from None
    if not words or words[0] != "llvm":
        raise TecompError(f"unsupported target {text!r}; CPU targets start with 'llvm'")
    opts: dict[str, str] = {}
    for w in words[1:]:
        key, eq, value = w.partition("=")
        if not eq or key not in ("-mtriple", "-mcpu", "-mattr") or not value:
            raise TecompError(
                f"unknown target option {w!r} in {text!r}; expected -mtriple=, -mcpu= or -mattr="
            )
        opts[key] = value
    host = _host()
    triple = opts.get("-mtriple", host.triple)
    cpu = opts.get("-mcpu", "")
    if cpu == "native":
        cpu = host.cpu
    features = opts.get("-mattr", "")
    if not cpu and not features and triple == host.triple:
        return host  # plain "llvm": all host features
    if not cpu:
        cpu = host.cpu if triple == host.triple else "generic"
    # A host cpu without -mattr still gets its full feature list: LLVM's definition of e.g.
    # znver5 can lag the real chip, and the host query is authoritative.
    if cpu == host.cpu and triple == host.triple and "-mattr" not in opts:
        features = host.features
    return Target("llvm", triple, cpu, features)


__all__ = ["Target"]

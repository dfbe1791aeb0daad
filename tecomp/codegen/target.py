"""Compilation targets: which CPU or GPU (triple, cpu name, feature flags) code is made for.

A target is written the way TVM users know it: ``"llvm"`` (the host CPU, all its features),
``"llvm -mcpu=skylake-avx512 -mattr=+avx2,+fma"``, ``"llvm -mtriple=x86_64-linux-gnu"``, or
``"cuda"`` / ``"cuda -arch=sm_90"`` for an NVIDIA GPU (`GPULimits` carries its hardware limits).
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
# Dot-product extensions of named CPUs (for `Target.has_feature` when only -mcpu is given):
# which int8/bf16 instruction an intrinsic may use must be known before LLVM sees it, since
# LLVM aborts the process on an intrinsic the target lacks.
_VNNI512_CPUS = frozenset({
    "cascadelake", "cooperlake", "icelake-client", "icelake-server", "tigerlake",
    "sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d", "diamondrapids",
    "rocketlake", "znver4", "znver5",
})
_AVXVNNI_CPUS = frozenset({
    "alderlake", "raptorlake", "meteorlake", "arrowlake", "arrowlake-s", "lunarlake",
    "pantherlake", "gracemont", "sierraforest", "grandridge", "clearwaterforest",
    "sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d", "diamondrapids",
    "znver5",
})
_BF16_CPUS = frozenset({
    "cooperlake", "sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d",
    "diamondrapids", "znver4", "znver5",
})
_CPU_FEATURES: dict[str, frozenset[str]] = {
    "avx512f": _AVX512_CPUS,
    "avx512bw": _AVX512_CPUS - {"knl", "knm"},
    "avx512vl": _AVX512_CPUS - {"knl", "knm"},
    "avx512vnni": _VNNI512_CPUS,
    "avxvnni": _AVXVNNI_CPUS,
    "avx512bf16": _BF16_CPUS,
    "avx2": _AVX2_CPUS | _AVX512_CPUS,
    "fma": _AVX2_CPUS | _AVX512_CPUS,
}
# features whose absence implies the absence of these (-avx512f also turns off avx512vnni)
_IMPLIED_BY = {"avx512bw": "avx512f", "avx512vl": "avx512f", "avx512vnni": "avx512f",
               "avx512bf16": "avx512f", "avxvnni": "avx2", "avx512f": "avx2", "fma": "avx"}


@dataclass(frozen=True)
class GPULimits:
    """What an NVIDIA architecture allows one kernel launch (per block unless noted).

    Shared memory: ``static_smem`` is what a kernel may declare statically; up to
    ``max_dynamic_smem`` (the per-block opt-in maximum, CUDA's
    ``MAX_SHARED_MEMORY_PER_BLOCK_OPTIN``) needs dynamic shared memory and the opt-in, which
    codegen and the runtime do for a kernel above ``static_smem`` (`gpu_shared`). ptxas
    does not check either.
    """

    arch: str
    compute_capability: tuple[int, int]
    max_threads_per_block: int = 1024
    max_block_dims: tuple[int, int, int] = (1024, 1024, 64)
    max_grid_dims: tuple[int, int, int] = (2**31 - 1, 65535, 65535)
    warp_size: int = 32
    static_smem: int = 48 * 1024
    max_dynamic_smem: int = 163 * 1024
    registers_per_sm: int = 64 * 1024
    max_registers_per_thread: int = 255
    sm_count: int = 108  # of the arch's flagship part (A100, H100 SXM): a tuning hint only


# The architectures ptxas 13 accepts that tecomp targets (sm_70 is gone from CUDA 13).
_GPU_ARCHS: dict[str, GPULimits] = {
    "sm_75": GPULimits("sm_75", (7, 5), max_dynamic_smem=64 * 1024, sm_count=72),
    "sm_80": GPULimits("sm_80", (8, 0), max_dynamic_smem=163 * 1024, sm_count=108),
    "sm_86": GPULimits("sm_86", (8, 6), max_dynamic_smem=99 * 1024, sm_count=84),
    "sm_89": GPULimits("sm_89", (8, 9), max_dynamic_smem=99 * 1024, sm_count=128),
    "sm_90": GPULimits("sm_90", (9, 0), max_dynamic_smem=227 * 1024, sm_count=132),
    "sm_90a": GPULimits("sm_90a", (9, 0), max_dynamic_smem=227 * 1024, sm_count=132),
}
# PTX ISA version to emit per arch: the lowest that has every instruction tecomp uses there
_PTX_VERSION = {"sm_75": "+ptx63", "sm_80": "+ptx70", "sm_86": "+ptx71", "sm_89": "+ptx78",
                "sm_90": "+ptx78", "sm_90a": "+ptx80"}
CUDA_TRIPLE = "nvptx64-nvidia-cuda"


@dataclass(frozen=True)
class Target:
    """A code generation target (hashable, so TargetMachines can be cached on it).

    ``kind`` is "llvm" (a CPU) or "cuda" (an NVIDIA GPU: ``cpu`` is the arch, "sm_80").
    ``features`` is LLVM's comma-separated ``+feat,-feat`` string ("" lets the CPU decide).

    >>> Target.parse("llvm -mcpu=skylake-avx512").vector_bits
    512
    >>> Target.parse("cuda -arch=sm_90").gpu.static_smem
    49152
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
        return self.kind == "llvm" and self.triple == _host().triple

    @property
    def is_gpu(self) -> bool:
        return self.kind == "cuda"

    @property
    def gpu(self) -> GPULimits:
        """The hardware limits of a cuda target (TecompError for a CPU target)."""
        if self.kind != "cuda":
            raise TecompError(f"target '{self}' is not a GPU target")
        return _GPU_ARCHS[self.cpu]

    @property
    def feature_set(self) -> frozenset[str]:
        """The features explicitly enabled (``+x``) in ``features``, without the plus."""
        return frozenset(f[1:] for f in self.features.split(",") if f.startswith("+"))

    def has_feature(self, feature: str) -> bool:
        """Whether code for this target may use the x86 feature ``feature`` (LLVM's name:
        "avx2", "avx512bw", "avx512vnni", "avxvnni", "avx512bf16"...): enabled explicitly
        with ``+feature`` (the host lists all of its own), or part of the named ``-mcpu`` and
        not disabled (``-feature``, or ``-avx512f`` for any AVX-512 extension)."""
        if self.kind != "llvm":
            return False
        feats = self.features.split(",") if self.features else []
        if "+" + feature in feats:
            return True
        f: str | None = feature
        while f is not None:
            if "-" + f in feats:
                return False
            f = _IMPLIED_BY.get(f)
        return self.cpu in _CPU_FEATURES.get(feature, frozenset())

    @property
    def vector_bits(self) -> int:
        """Width of the widest SIMD register lowering should target (512, 256 or 128; on a GPU
        128: a thread's widest load is 16 bytes)."""
        if self.kind == "cuda":
            return 128
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

    @property
    def half_conversions(self) -> tuple[str, str]:
        """How float32 <-> (float16, bfloat16) conversions are emitted: "hw" (LLVM's
        fptrunc/fpext, which the backend selects to instructions) or "soft" (exact integer
        bit arithmetic in IR, vectorised like any other code).

        x86 converts float16 with F16C (vcvtph2ps/vcvtps2ph; AVX-512 FP16 has them too).
        bfloat16 stays soft on x86: AVX512-BF16's vcvtneps2bf16 treats denormal inputs as zero,
        so it would disagree with the exact conversion (and numpy/ml_dtypes) on them; the soft
        conversion is a handful of integer vector ops. NVIDIA GPUs convert float16 in hardware
        (cvt.rn.f16.f32), and bfloat16 from sm_80 (cvt.rn.bf16.f32).
        """
        if self.kind == "cuda":
            return "hw", ("hw" if self.gpu.compute_capability >= (8, 0) else "soft")
        return ("hw" if self.has_f16c else "soft"), "soft"

    @property
    def has_f16c(self) -> bool:
        """Whether the CPU converts float16 <-> float32 in hardware (F16C or AVX512-FP16)."""
        feats = self.features.split(",") if self.features else []
        enabled = {f[1:] for f in feats if f.startswith("+")}
        disabled = {f[1:] for f in feats if f.startswith("-")}
        if enabled & {"f16c", "avx512fp16"}:
            return True
        named = self.cpu in _AVX2_CPUS | _AVX512_CPUS | {"ivybridge", "bdver1", "bdver2",
                                                          "bdver3", "btver2"}
        return named and "f16c" not in disabled and "avx" not in disabled

    def __str__(self) -> str:
        if self.kind == "cuda":
            return f"cuda -arch={self.cpu}"
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
    if words and words[0] == "cuda":
        return _parse_cuda(text, words[1:])
    if not words or words[0] != "llvm":
        raise TecompError(f"unsupported target {text!r}; CPU targets start with 'llvm', NVIDIA "
                          "GPU targets with 'cuda'")
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


def _parse_cuda(text: str, words: list[str]) -> Target:
    arch = "sm_80"
    for w in words:
        key, eq, value = w.partition("=")
        if key in ("-arch", "-mcpu") and eq and value:
            arch = value
        elif key == "-model" or key == "-libs" or w.startswith("-max_"):
            continue  # TVM's informational options: accepted, no effect here
        else:
            raise TecompError(f"unknown target option {w!r} in {text!r}; cuda targets take -arch=sm_XX")
    if arch not in _GPU_ARCHS:
        raise TecompError(f"target {text!r}: unsupported arch {arch!r}; use one of "
                          f"{', '.join(_GPU_ARCHS)}")
    return Target("cuda", CUDA_TRIPLE, arch, _PTX_VERSION[arch])


__all__ = ["CUDA_TRIPLE", "GPULimits", "Target"]

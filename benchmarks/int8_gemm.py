"""int8 GEMM (uint8 x int8 -> int32) 1024^3 in GOP/s vs our fp32 GEMM and PyTorch's int8, same run.

tecomp's int8 GEMM is `tecomp.te.intrin_x86.dense_u8s8s32`: B packed to the dot-product
intrinsic's ``[n/L, k/G, L, G]`` tiles, an ``mr x nr`` int32 register tile, B walked in
L2-sized column blocks, row blocks in parallel, the inner step tensorized onto the best
instruction the CPU has (`dot_u8s8s32`: vpdpbusd with AVX512-VNNI / AVX-VNNI, else
vpmaddubsw + vpmaddwd + vpaddd). It is timed twice: B packed inside the kernel (from a plain
``(n, k)`` int8 array) and B prepacked once (weights, as PyTorch's prepacked linear does).
The fp32 baseline is benchmarks/gemm.py's hand schedule; PyTorch's column is its quantized
linear (fbgemm/oneDNN, uint8 activations x int8 weights, requantized output), skipped when
torch (or a quantized engine) is absent.

Rounds are interleaved (every contender once per round) and medians reported, because shared
machines are noisy. The aim (issue 15): int8 >= 2.5x our fp32 with VNNI, >= 1.5x on AVX2.
On AVX2/AVX-512BW the vpmaddubsw path is exact only while each int16 pair sum does not
saturate: the data here is uint8 in [0, 127] (PyTorch's ``reduce_range``), which is exact.

Usage: python benchmarks/int8_gemm.py [--n 1024] [--rounds 7] [--exact]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gemm import gemm_schedule  # noqa: E402

import tecomp as tc  # noqa: E402
from tecomp.codegen.target import Target  # noqa: E402
from tecomp.te import intrin_x86  # noqa: E402


def cpu_description() -> str:
    """lscpu's model name and the int8/bf16-relevant flags of this CPU."""
    name = "unknown CPU"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        m = re.search(r"Model name:\s*(.+)", out)
        if m:
            name = m.group(1).strip()
    except OSError:
        pass
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    wanted = ["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16"]
    have = [f for f in wanted if f in flags] or ["(flags unknown)"]
    return f"{name}, {os.cpu_count()} CPUs; flags: {' '.join(have)}"


def torch_int8(n: int, a: np.ndarray, b: np.ndarray) -> tuple[Callable[[], object], str] | None:
    """PyTorch's quantized linear on (a, b), or None when torch or an int8 engine is missing."""
    try:
        import torch
    except ImportError:
        return None
    engines = torch.backends.quantized.supported_engines
    engine = next((e for e in ("x86", "fbgemm", "onednn") if e in engines), None)
    if engine is None:
        return None
    torch.backends.quantized.engine = engine
    torch.set_num_threads(os.cpu_count() or 1)
    warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*deprecated")
    xq = torch.quantize_per_tensor(torch.from_numpy(a.astype(np.float32)), 1.0, 0, torch.quint8)
    wq = torch.quantize_per_tensor(torch.from_numpy(b.astype(np.float32)), 1.0, 0, torch.qint8)
    packed = torch.ops.quantized.linear_prepack(wq, None)
    # output scale large enough that the int32 sums fit quint8 after requantization
    out_scale = float(a.shape[1] * 127 * 127 / 255)

    def run() -> object:
        return torch.ops.quantized.linear(xq, packed, out_scale, 0)

    run()
    return run, f"torch {torch.__version__} quantized.linear ({engine})"


def median_time(fn: Callable[[], object], number: int = 3) -> float:
    """Mean seconds per call over ``number`` calls (one sample of a round)."""
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--exact", action="store_true",
                    help="without VNNI, use the exact (widened, vpmaddwd-only) dot product")
    args = ap.parse_args()
    n = args.n
    host = Target.host()
    rng = np.random.default_rng(0)

    # fp32 baseline: benchmarks/gemm.py's schedule
    s32, p32 = gemm_schedule(n, n, n)
    f32 = tc.build(s32, p32, target="llvm", name="gemm_f32")
    af = rng.random((n, n), dtype=np.float32)
    bf = rng.random((n, n), dtype=np.float32)
    cf = np.zeros((n, n), np.float32)
    f32(af, bf, cf)
    np.testing.assert_allclose(cf, af @ bf, rtol=1e-3)

    # int8: B (n, k) packed in the kernel, and B prepacked
    t0 = time.perf_counter()
    s8, p8, kind = intrin_x86.dense_u8s8s32(n, n, n, target=host, exact=args.exact)
    f8 = tc.build(s8, p8, target="llvm", name="gemm_u8s8s32")
    build_s = time.perf_counter() - t0
    s8p, p8p, _ = intrin_x86.dense_u8s8s32(n, n, n, target=host, exact=args.exact, prepacked=True)
    f8p = tc.build(s8p, p8p, target="llvm", name="gemm_u8s8s32_prepacked")
    hi = 256 if kind.exact else 128  # vpmaddubsw: data <= 127 keeps every int16 pair sum exact
    a = rng.integers(0, hi, (n, n)).astype(np.uint8)
    b = rng.integers(-128, 128, (n, n)).astype(np.int8)
    bp = intrin_x86.pack_u8s8_kernel(b, kind)
    c8 = np.zeros((n, n), np.int32)
    c8p = np.zeros((n, n), np.int32)
    f8(a, b, c8)
    f8p(a, bp, c8p)
    ref = a.astype(np.int32) @ b.astype(np.int32).T
    np.testing.assert_array_equal(c8, ref)
    np.testing.assert_array_equal(c8p, ref)
    asm = f8.get_source("asm")
    used = [ins for ins in ("vpdpbusd", "vpmaddubsw", "vpmaddwd", "vpmovsxbw") if ins in asm]
    reg = next((r for r in ("zmm", "ymm") if re.search(rf"%{r}\d", asm)), "xmm")

    contenders: dict[str, Callable[[], object]] = {
        "tecomp fp32": lambda: f32(af, bf, cf),
        "tecomp int8": lambda: f8(a, b, c8),
        "tecomp int8 prepacked": lambda: f8p(a, bp, c8p),
    }
    th = torch_int8(n, a, b)
    torch_label = "PyTorch int8: skipped (torch or a quantized engine not installed)"
    if th is not None:
        contenders["torch int8"] = th[0]
        torch_label = th[1]
    for fn in contenders.values():
        fn()  # warm-up (threads, caches)
    samples: dict[str, list[float]] = {k: [] for k in contenders}
    for _ in range(args.rounds):
        for name, fn in contenders.items():
            samples[name].append(median_time(fn))
            time.sleep(0.05)  # let the other runtime's worker threads go idle
    ops = 2.0 * n**3
    med = {k: statistics.median(v) for k, v in samples.items()}

    print(f"int8 GEMM {n}x{n}x{n}, uint8 x int8 -> int32 on {cpu_description()}")
    print(f"  dot product: {kind.isa} ({' + '.join(kind.instructions)}, {kind.lanes} int32 lanes x "
          f"{kind.group} products; {'exact' if kind.exact else 'int16-saturating, data in [0, 127]'}); "
          f"in the assembly: {', '.join(used)} on {reg}; build {build_s:.2f} s")
    print(f"  medians of {args.rounds} interleaved rounds:")
    for k in contenders:
        unit = "GFLOP/s" if "fp32" in k else "GOP/s  "
        print(f"  {k + ':':24s}{ops / med[k] / 1e9:8.1f} {unit} ({med[k] * 1e3:.2f} ms)")
    if th is None:
        print(f"  {torch_label}")
    else:
        print(f"  ({torch_label}; its time includes requantizing the output to uint8)")
    r = med["tecomp fp32"] / med["tecomp int8"]
    rp = med["tecomp fp32"] / med["tecomp int8 prepacked"]
    aim = 2.5 if kind.isa in ("avx512vnni", "avxvnni") else 1.5
    line = f"  int8 / fp32: {r:.2f}x (prepacked {rp:.2f}x); aim >= {aim}x on {kind.isa}"
    if "torch int8" in med:
        line += f"; tecomp int8 / torch int8: {med['torch int8'] / med['tecomp int8']:.2f}x"
    print(line)


if __name__ == "__main__":
    main()

"""This machine's fp32 FMA peak and memory bandwidth, measured, so benchmark figures compare across machines.

Project machines differ (AVX-512 Zen 5 at ~444 GFLOP/s on 2 cores, AVX2-only ones at a
fraction of that), so every benchmark prints its result as a fraction of the peak measured
here beside its same-run ratio to numpy/PyTorch:

* **FMA peak**: a kernel built with tecomp itself, a GEMM register tile over data that stays
  in L1: ``mr x nv`` vector accumulators (6 x 2 on 256-bit vectors: 12 independent chains,
  6 x 4 = 24 on AVX-512) fed by ``nv`` vector loads and ``mr`` broadcasts per step, for
  ``64 x RO`` steps. Vectors are the host's widest (`Target.host().vector_bits`: 512 with
  AVX-512F, 256 with AVX/AVX2). It runs on all cores (a parallel outer loop, one chunk per
  core) and on one core; the assembly is checked for packed ``vfmadd`` on zmm/ymm. Best of
  many short repeats (the machine is shared: the best repeat is the least disturbed one).
* **Bandwidth**: a parallel, vectorized tecomp copy ``y = x`` and triad ``a = b + 3 c`` over
  arrays far larger than the last-level cache, counted STREAM-style (bytes read + bytes
  written, no write-allocate traffic), and numpy's single-threaded copy (glibc's memcpy, whose
  non-temporal stores skip the write-allocate reads); the bandwidth is the best of the three.

The measurement runs in a fresh interpreter with ``OMP_NUM_THREADS`` = all cores (whatever the
caller's environment says) and is cached as JSON in ``$TMPDIR/tecomp-peak/``, keyed by the CPU
model, LLVM CPU name, core count and vector width; `measure` returns the cached figures when
present. Benchmarks call ``measure(quick=True)``: any cached measurement, else a quick one
(a few seconds).

    python benchmarks/peak.py [--quick] [--fresh] [--json] [--target "llvm -mcpu=znver3"]

    >>> import peak
    >>> p = peak.measure(quick=True)
    >>> p.compute_fraction(25.0)        # 25 GFLOP/s as a fraction of the all-core FMA peak
    >>> p.memory_fraction(10.0)         # 10 GB/s as a fraction of the measured bandwidth
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.join(HERE, "..") not in sys.path:
    sys.path.insert(0, os.path.join(HERE, ".."))
CACHE_DIR = os.path.join(tempfile.gettempdir(), "tecomp-peak")


@dataclass(frozen=True)
class Peak:
    """Measured peaks of one machine (fp32 GFLOP/s with FMAs, GB/s streaming)."""

    fma_gflops: float  # all cores
    bandwidth_gbs: float  # best of the parallel copy and triad and numpy's copy, STREAM counting
    vector_bits: int
    cores: int
    cpu_name: str
    fma_gflops_1core: float = 0.0
    llvm_cpu: str = ""
    isa: str = ""  # "AVX-512", "AVX2+FMA", ...
    fma_asm: str = ""  # what the FMA kernel's hot loop was checked to contain
    copy_gbs: float = 0.0
    triad_gbs: float = 0.0
    numpy_copy_gbs: float = 0.0  # one thread
    quick: bool = False
    measured_at: str = ""
    load_before: float = 0.0  # 1-minute load average when the measurement started
    seconds: float = 0.0  # how long it took

    def fma_for(self, threads: int | None = None) -> float:
        """The FMA peak for ``threads`` threads (default: as many as tecomp will use here)."""
        threads = threads_used() if threads is None else threads
        if threads >= self.cores or not self.fma_gflops_1core:
            return self.fma_gflops
        return min(threads * self.fma_gflops_1core, self.fma_gflops)

    def compute_fraction(self, gflops: float, threads: int | None = None) -> float:
        """``gflops`` as a fraction of the FMA peak of ``threads`` threads (compute-bound kernels)."""
        return gflops / self.fma_for(threads)

    def memory_fraction(self, gbs: float) -> float:
        """``gbs`` as a fraction of the measured streaming bandwidth (memory-bound kernels)."""
        return gbs / self.bandwidth_gbs

    def compute_note(self, gflops: float, threads: int | None = None) -> str:
        """``'37.2% of FMA peak'``: the column the benchmarks print."""
        return f"{self.compute_fraction(gflops, threads):.1%} of FMA peak"

    def memory_note(self, gbs: float) -> str:
        """``'61.0% of bandwidth'``: the column the benchmarks print."""
        return f"{self.memory_fraction(gbs):.1%} of bandwidth"

    def fractions(self, kind: str, values: dict[str, float], threads: int | None = None) -> str:
        """The column beside a benchmark's ratio: ``kind`` "compute" (``values`` in GFLOP/s, of
        the FMA peak of ``threads`` threads) or "memory" (GB/s, of the bandwidth), e.g.
        ``'fraction of peak: tecomp 48.2%, numpy 88.0% (of 62.6 GFLOP/s FMA)'``."""
        if kind == "compute":
            ref, what = self.fma_for(threads), "GFLOP/s FMA"
        elif kind == "memory":
            ref, what = self.bandwidth_gbs, "GB/s bandwidth"
        else:
            raise ValueError(f"kind must be 'compute' or 'memory', not {kind!r}")
        cells = ", ".join(f"{name} {v / ref:.1%}" for name, v in values.items())
        return f"fraction of peak: {cells} (of {ref:.1f} {what})"

    def summary(self) -> str:
        """One line: the machine and its peaks."""
        return (f"{self.cpu_name} ({self.llvm_cpu}, {self.isa} {self.vector_bits}-bit, {self.cores} cores): "
                f"fp32 FMA peak {self.fma_gflops:.1f} GFLOP/s ({self.fma_gflops_1core:.1f} on 1 core), "
                f"memory bandwidth {self.bandwidth_gbs:.1f} GB/s")

    def line(self, threads: int | None = None) -> str:
        """The line benchmarks print under their results: which peak the fractions are of."""
        threads = threads_used() if threads is None else threads
        per = "" if threads >= self.cores else f"; {threads} thread(s): {self.fma_for(threads):.1f} GFLOP/s"
        return (f"  peak: {self.summary()}{per}  [benchmarks/peak.py, {'quick, ' if self.quick else ''}"
                f"measured {self.measured_at}]")

    @property
    def key(self) -> str:
        return cache_key(self.cpu_name, self.llvm_cpu, self.cores, self.vector_bits)


class PeakBeside:
    """The all-core FMA peak timed *beside* a benchmark, in each of its rounds, so that the
    fraction of the peak a kernel reaches is of the machine's speed in the same minutes.

    Why. The cached peak (`measure`) is of another moment, and on the shared 2-core VMs the
    peak itself moves: one Zen 3 VM measured 157.3 GFLOP/s at 05:56 and 197.3 at 07:58, and a
    benchmark there printed a dense layer at "115% of the FMA peak" against a cache taken in a
    slow hour. A ratio to numpy is immune to that because both are timed in the same rounds;
    this makes the fraction of the peak so too. Each `sample` is the best of ``repeat`` calls
    of the same kernel as `measure` (about 0.5 ms each on 2 cores), with ``threads`` chunks in
    a parallel loop; `gflops` is the best sample, as a benchmark's own time is its best round.

        >>> beside = PeakBeside()
        >>> for _ in range(rounds):
        ...     beside.sample(); t = min(t, time_the_kernel())
        >>> fraction = flops / t / 1e9 / beside.gflops
    """

    def __init__(self, target: str = "llvm", threads: int | None = None, repeat: int = 10) -> None:
        from tecomp.codegen.target import Target

        if Target.parse(target).kind != "llvm":
            raise ValueError(f"PeakBeside: the FMA peak is of this CPU; target {target!r} is not a CPU target")
        _, _, ncores, bits, _ = _host_key(target)
        self.threads = threads_used() if threads is None else threads
        self.f, self.args, self.flops = fma_kernel(bits, max(1, min(self.threads, ncores)),
                                                   parallel=True, ro=2048, target=target)
        self.f(*self.args)
        self.repeat = repeat
        self.samples: list[float] = []  # GFLOP/s of each sample, in order

    def sample(self) -> float:
        """The peak now (GFLOP/s, best of ``repeat`` calls); kept in ``samples``."""
        t = self.f.time_evaluator(number=1, repeat=self.repeat)(*self.args).min
        self.samples.append(self.flops / t / 1e9)
        return self.samples[-1]

    @property
    def gflops(self) -> float:
        """The best sample so far (a first one is taken when there is none)."""
        return max(self.samples) if self.samples else self.sample()

    def restart(self) -> None:
        """Forget the samples: another benchmark's rounds begin."""
        self.samples = []

    def note(self, gflops: float) -> str:
        """``'91.2% of FMA peak (160.3 GFLOP/s beside)'``: the column the benchmarks print."""
        return f"{gflops / self.gflops:.1%} of FMA peak ({self.gflops:.1f} GFLOP/s beside)"


# ---------------------------------------------------------------------------------------------
# what the benchmarks need besides the peak


def cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_used() -> int:
    """Threads tecomp's OpenMP loops (and the BLAS) use here: ``OMP_NUM_THREADS``, else every core."""
    try:
        n = int(os.environ.get("OMP_NUM_THREADS", "0").split(",")[0] or 0)
    except ValueError:
        n = 0
    return min(n, cores()) if n > 0 else cores()


_FMA_RE = re.compile(r"\bv(?:fmadd|fnmadd|fmsub|fnmsub)\d+p[sd]\b.*?\b(zmm|ymm|xmm)\d", re.IGNORECASE)


def fma_counts(asm: str) -> dict[str, int]:
    """Packed FMA instructions in an assembly listing, by register width: ``{'zmm': 24, 'ymm': 0, 'xmm': 0}``."""
    out = {"zmm": 0, "ymm": 0, "xmm": 0}
    for line in asm.splitlines():
        m = _FMA_RE.search(line)
        if m:
            out[m.group(1).lower()] += 1
    return out


def cpu_model_name() -> str:
    """The CPU's marketing name (``/proc/cpuinfo``), else what the platform says."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"


def cache_key(cpu_name: str, llvm_cpu: str, ncores: int, vector_bits: int) -> str:
    raw = f"{cpu_name}-{llvm_cpu}-{ncores}c-{vector_bits}b"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", raw).strip("_")


def _host_key(target: str = "llvm") -> tuple[str, str, int, int, str]:
    """The machine and the code it runs: ``target`` names the code (``"llvm -mcpu=znver3"``
    on an AVX-512 machine measures the peak of AVX2 code there)."""
    from tecomp.codegen.target import Target

    t = Target.parse(target)
    bits = t.vector_bits
    if bits >= 512:
        isa = "AVX-512"
    elif t.has_feature("avx2") and t.has_feature("fma"):  # the host's +features or its -mcpu's
        isa = "AVX2+FMA"
    elif bits >= 256:
        isa = "AVX+FMA" if t.has_feature("fma") else "AVX"
    else:
        isa = "SSE/NEON"
    return cpu_model_name(), t.cpu, cores(), bits, isa


def cache_path(key: str) -> str:
    return os.path.join(CACHE_DIR, f"{key}.json")


# ---------------------------------------------------------------------------------------------
# the kernels


def fma_schedule(vector_bits: int, chunks: int, parallel: bool, ro: int = 4096):
    """The FMA-peak kernel: ``C[t, i, j] = sum_{ro, ri} A[ri, i] * B[ri, j]`` with a register tile.

    Returns ``(schedule, [A, B, C], flops_per_call)``. ``A`` (64 x mr) and ``B`` (64 x nr) stay
    in L1; the ``ro`` loop does not index them, it only repeats the 64 steps. ``C_local`` holds
    the ``mr x nv`` accumulator vectors (independent FMA chains) for the whole reduction.
    """
    from tecomp import te

    lanes = max(vector_bits // 32, 4)
    nv = 4 if vector_bits >= 512 else 2  # 24 zmm or 12 ymm accumulators (of 32 or 16 registers)
    mr, nr, ri_n = 6, nv * lanes, 64
    A = te.placeholder((ri_n, mr), "float32", name="A")
    B = te.placeholder((ri_n, nr), "float32", name="B")
    ro_ax = te.reduce_axis((0, ro), name="ro")
    ri_ax = te.reduce_axis((0, ri_n), name="ri")
    C = te.compute((chunks, mr, nr), lambda t, i, j: te.sum(A[ri_ax, i] * B[ri_ax, j], axis=[ro_ax, ri_ax]),
                   name="C")
    s = te.create_schedule(C.op)
    CC = s.cache_write(C, "local")
    t, _, j = s[C].op.axis
    if parallel:
        s[C].parallel(t)  # one chunk per thread
    s[C].vectorize(j)
    s[CC].compute_at(s[C], t)
    ct, ci, cj = s[CC].op.axis
    rro, rri = s[CC].op.reduce_axis
    s[CC].reorder(ct, rro, rri, ci, cj)
    s[CC].unroll(ci)
    s[CC].vectorize(cj)
    return s, [A, B, C], 2.0 * chunks * mr * nr * ri_n * ro


def fma_kernel(vector_bits: int, chunks: int, parallel: bool, ro: int = 4096, target: str = "llvm"):
    """`fma_schedule` built for ``target`` (this CPU), with inputs: ``(f, (a, b, c), flops_per_call)``."""
    import numpy as np

    import tecomp as tc

    s, params, flops = fma_schedule(vector_bits, chunks, parallel, ro)
    f = tc.build(s, params, target=target, name="fma_peak")
    rng = np.random.default_rng(0)
    # small values: ro * 64 accumulations stay finite and normal (no denormal slow paths)
    a, b, c = (np.zeros(tuple(int(d.value) for d in t.shape), np.float32) for t in params)
    a[...] = rng.random(a.shape) * 1e-3
    b[...] = rng.random(b.shape) * 1e-3
    return f, (a, b, c), flops


def cross_asm(target: str) -> str:
    """Assembly of the all-core FMA kernel for another CPU (compiled, not run): checks that an
    AVX-512 machine would get zmm FMAs, from any machine."""
    from tecomp.codegen.llvm_cpu import CodegenCPU
    from tecomp.codegen.llvm_jit import parse_and_optimize, target_machine
    from tecomp.codegen.target import Target
    from tecomp.lowering import lower

    tgt = Target.parse(target)
    s, params, _ = fma_schedule(tgt.vector_bits, 2, parallel=True)
    cg = CodegenCPU(tgt)
    cg.add_function(lower(s, params, name="fma_peak"))
    return target_machine(tgt).emit_assembly(parse_and_optimize(str(cg.module), tgt))


def stream_kernels(n: int, vector_bits: int, target: str = "llvm"):
    """Parallel vectorized copy ``y = x`` and triad ``a = b + 3 c`` over ``n`` floats (tecomp)."""
    import tecomp as tc
    from tecomp import te

    block = max(vector_bits // 32, 4) * 8
    X = te.placeholder((n,), "float32", name="X")
    Y = te.compute((n,), lambda i: X[i], name="Y")
    Bt = te.placeholder((n,), "float32", name="B")
    Ct = te.placeholder((n,), "float32", name="C")
    At = te.compute((n,), lambda i: Bt[i] + Ct[i] * 3.0, name="A")
    out = []
    for res, params, name in ((Y, [X, Y], "copy"), (At, [Bt, Ct, At], "triad")):
        s = te.create_schedule(res.op)
        o, i = s[res].split(s[res].op.axis[0], factor=block)
        s[res].parallel(o)
        s[res].vectorize(i)
        out.append(tc.build(s, params, target=target, name=name))
    return out[0], out[1]


def _best_time(ev, args, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        best = min(best, ev(*args).min)
        time.sleep(0.05)  # let the OpenMP workers go idle, and a neighbour's burst pass
    return best


def _measure_here(quick: bool, target: str = "llvm") -> Peak:
    """Measure in this process (`measure` runs this in a fresh one with OMP_NUM_THREADS set)."""
    import numpy as np

    from tecomp.codegen.target import Target

    t_start = time.perf_counter()
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    cpu_name, llvm_cpu, ncores, bits, isa = _host_key(target)
    # many short repeats: a 2-20 ms call fits between a neighbour's time slices now and then
    rounds, repeat = (3, 10) if quick else (8, 25)

    f_all, a_all, fl_all = fma_kernel(bits, ncores, parallel=True, target=target)
    f_one, a_one, fl_one = fma_kernel(bits, 1, parallel=False, target=target)
    f_all(*a_all)
    a, b, c = a_all
    ref = (a.T.astype(np.float64) @ b.astype(np.float64)) * 4096
    np.testing.assert_allclose(c[0], ref, rtol=1e-2)  # the kernel computes what it claims
    counts = fma_counts(f_all.get_source("asm"))
    widest = next((r for r in ("zmm", "ymm", "xmm") if counts[r]), None)
    want = {512: "zmm", 256: "ymm"}.get(bits, "xmm")
    if widest is None:
        fma_asm = "no packed vfmadd in the assembly (the peak is of separate multiplies and adds)"
        print(f"peak.py: warning: {fma_asm}; target features {Target.parse(target).features[:80]}...",
              file=sys.stderr)
    else:
        fma_asm = f"{counts[widest]} vfmadd*ps on {widest} in the kernel"
        if widest != want:
            print(f"peak.py: warning: FMAs on {widest}, expected {want} for {bits}-bit vectors", file=sys.stderr)
    ev_all = f_all.time_evaluator(number=1, repeat=repeat)
    ev_one = f_one.time_evaluator(number=1, repeat=repeat)
    t_all, t_one = float("inf"), float("inf")
    # Interleaved, so a burst of load hits both alike. All cores at once are what a neighbour
    # disturbs most: while they give less than 80% of cores x one core, keep trying (up to a
    # time budget) for a quiet moment.
    budget = time.perf_counter() + (5.0 if quick else 40.0)
    done = 0
    while True:
        t_all = min(t_all, _best_time(ev_all, a_all, 1))
        t_one = min(t_one, _best_time(ev_one, a_one, 1))
        done += 1
        consistent = fl_all / t_all >= 0.8 * ncores * fl_one / t_one
        if done >= rounds and (consistent or time.perf_counter() > budget):
            break
    fma_all, fma_one = fl_all / t_all / 1e9, fl_one / t_one / 1e9

    n = (1 << 24) if quick else (1 << 25)  # 64 or 128 MiB per array: far beyond any L3 here
    copy, triad = stream_kernels(n, bits, target)
    x = np.ones(n, np.float32)
    y = np.zeros(n, np.float32)
    z = np.full(n, 2.0, np.float32)
    copy(x, y)  # first touch of every page outside the timings
    triad(x, z, y)
    if not np.allclose(y[:: 1 << 16], 7.0):
        raise RuntimeError("triad kernel computed the wrong values")
    ev_copy = copy.time_evaluator(number=1, repeat=max(repeat // 2, 3))
    ev_triad = triad.time_evaluator(number=1, repeat=max(repeat // 2, 3))
    t_copy, t_triad, t_np = float("inf"), float("inf"), float("inf")
    for _ in range(rounds):
        t_copy = min(t_copy, _best_time(ev_copy, (x, y), 1))
        t_triad = min(t_triad, _best_time(ev_triad, (x, z, y), 1))
        for _ in range(max(repeat // 2, 3)):
            t0 = time.perf_counter()
            np.copyto(y, x)
            t_np = min(t_np, time.perf_counter() - t0)
    copy_gbs, triad_gbs, np_gbs = 8 * n / t_copy / 1e9, 12 * n / t_triad / 1e9, 8 * n / t_np / 1e9
    return Peak(fma_gflops=round(fma_all, 2), bandwidth_gbs=round(max(copy_gbs, triad_gbs, np_gbs), 2),
                vector_bits=bits, cores=ncores, cpu_name=cpu_name, fma_gflops_1core=round(fma_one, 2),
                llvm_cpu=llvm_cpu, isa=isa, fma_asm=fma_asm, copy_gbs=round(copy_gbs, 2),
                triad_gbs=round(triad_gbs, 2), numpy_copy_gbs=round(np_gbs, 2), quick=quick,
                measured_at=time.strftime("%Y-%m-%d %H:%M"), load_before=round(load_before, 2),
                seconds=round(time.perf_counter() - t_start, 1))


# ---------------------------------------------------------------------------------------------
# the cache and the entry points


def _host_key_cheap(target: str = "llvm") -> str:
    """The cache key without compiling anything (imports llvmlite for the host CPU name only)."""
    cpu_name, llvm_cpu, ncores, bits, _ = _host_key(target)
    return cache_key(cpu_name, llvm_cpu, ncores, bits)


def cached(quick: bool = True, target: str = "llvm") -> Peak | None:
    """The cached measurement of this machine, if any (a quick one only when ``quick``)."""
    try:
        with open(cache_path(_host_key_cheap(target))) as fh:
            d = json.load(fh)
        names = {f.name for f in dataclasses.fields(Peak)}
        p = Peak(**{k: v for k, v in d.items() if k in names})
    except (OSError, ValueError, TypeError):
        return None
    if p.quick and not quick:
        return None
    return p


def measure(quick: bool = False, fresh: bool = False, verbose: bool = True, target: str = "llvm") -> Peak:
    """This machine's peaks: cached when measured before (a full measurement also serves
    ``quick``), else measured in a fresh interpreter on all cores and cached. ``target`` is
    the code whose peak is wanted: the host's widest vectors by default; on an AVX-512
    machine, ``"llvm -mcpu=znver3"`` gives the peak of 256-bit FMAs there (the same as
    512-bit ones on Zen 4, half on Zen 5), which is what AVX2 code tuned there is a fraction of."""
    if not fresh:
        p = cached(quick, target)
        if p is not None:
            return p
    if verbose:
        print(f"[peak.py: measuring this machine's FMA peak and bandwidth{' (quick)' if quick else ''}, "
              f"cached in {CACHE_DIR} for later runs]", file=sys.stderr, flush=True)
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(cores())  # the machine's peak, whatever the caller restricts itself to
    cmd = ([sys.executable, os.path.abspath(__file__), "--_measure", "--target", target]
           + (["--quick"] if quick else []))
    out = subprocess.run(cmd, env=env, check=True, stdout=subprocess.PIPE, text=True)
    d = json.loads(out.stdout.strip().splitlines()[-1])
    p = Peak(**d)
    os.makedirs(CACHE_DIR, exist_ok=True)
    tmp = cache_path(p.key) + f".{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(dataclasses.asdict(p), fh, indent=1)
    os.replace(tmp, cache_path(p.key))  # atomic: a concurrent reader sees the old or the new file
    return p


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats, smaller arrays (a few seconds)")
    ap.add_argument("--fresh", action="store_true", help="measure again even if a measurement is cached")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    ap.add_argument("--cross", metavar="TARGET", action="append", default=[],
                    help="also compile (not run) the FMA kernel for TARGET, e.g. 'llvm -mcpu=znver5', and "
                         "count its FMAs by register width")
    ap.add_argument("--target", default="llvm",
                    help="the code to measure the peak of (default: this CPU's widest vectors), e.g. "
                         "'llvm -mcpu=znver3' for 256-bit AVX2 code on an AVX-512 machine")
    ap.add_argument("--_measure", action="store_true", help=argparse.SUPPRESS)  # the worker process
    args = ap.parse_args()
    if args._measure:
        print(json.dumps(dataclasses.asdict(_measure_here(args.quick, args.target))))
        return
    was_cached = not args.fresh and cached(args.quick, args.target) is not None
    p = measure(quick=args.quick, fresh=args.fresh, target=args.target)
    if args.json:
        print(json.dumps(dataclasses.asdict(p)))
        return
    how = (f"cached, measured {p.measured_at} (--fresh to measure again)" if was_cached
           else f"measured now in {p.seconds:.0f} s")
    print(f"CPU: {p.cpu_name}  (LLVM cpu {p.llvm_cpu}, {p.cores} cores, {p.isa}, {p.vector_bits}-bit vectors)")
    print(f"fp32 FMA peak:    {p.fma_gflops:8.1f} GFLOP/s on {p.cores} cores, {p.fma_gflops_1core:.1f} on 1 core "
          f"({p.fma_asm})")
    print(f"memory bandwidth: {p.bandwidth_gbs:8.1f} GB/s  (parallel copy {p.copy_gbs:.1f}, triad {p.triad_gbs:.1f}; "
          f"numpy copy, 1 thread, {p.numpy_copy_gbs:.1f}; bytes read + written)")
    print(f"{'quick' if p.quick else 'full'} measurement, {how}; load average before: {p.load_before:.2f}; "
          f"cache {cache_path(p.key)}")
    if p.fma_gflops_1core and p.fma_gflops < 0.8 * p.cores * p.fma_gflops_1core:
        print(f"note: {p.cores} cores gave {p.fma_gflops / p.fma_gflops_1core:.2f}x one core: the machine was "
              "busy; run again with --fresh when it is idle")
    for tgt in args.cross:
        counts = fma_counts(cross_asm(tgt))
        print(f"FMA kernel for '{tgt}' (compiled only): " + ", ".join(f"{v} on {k}" for k, v in counts.items()))


if __name__ == "__main__":
    main()

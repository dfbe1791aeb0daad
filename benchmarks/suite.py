"""The operator suite: the unique conv layers of ResNet-50, MobileNet-V2's depthwise and
pointwise layers, ResNeXt-50 32x4d's grouped 3x3 layers, and BERT-base's dense / batch-matmul
/ softmax / layer-norm operators at sequence 128 (batch 1, fp32), tuned together under one
budget by the gradient task scheduler, then each best kernel checked against PyTorch and timed
interleaved with it.

    python benchmarks/suite.py --trials 3000 --log suite.jsonl      # the real run (hours)
    python benchmarks/suite.py --ops bert --trials 64               # a quick look at one net
    python benchmarks/suite.py --ops mobilenet_v2 --only "pw 1x1 96->576" --trials 200  # one operator
    python benchmarks/suite.py --log suite.jsonl --trials 0         # re-time an existing log
    python benchmarks/suite.py --ops resnet50 --prepack              # constant weights packed once
    python benchmarks/suite.py --target "llvm -mcpu=znver3"          # AVX2 code, e.g. on an AVX-512 machine

Prints one row per operator: tecomp and PyTorch ms per call (best of interleaved rounds on
the same arrays, both called from Python), the ratio (PyTorch time / tecomp time: above 1 is
faster than PyTorch; the median of the rounds' ratios), and
``log/now`` (the log's best cost over the time now, both normalised by the machine-speed
index: 1.00x when the log's claim holds; run with --trials 0 for a fresh process), and the
kernel alone, timed in a C loop as the tuner times it (what log/now compares): its ms and
speed as a fraction of this machine's peak (benchmarks/peak.py: GFLOP/s of the fp32 FMA
peak, its kernel timed beside the operator in the same rounds, for compute-bound operators;
GB/s of the cached streaming bandwidth for memory-bound ones);
then the geometric mean of the ratios and the end-to-end latency of each network weighted by
how often each operator occurs in it. The log resumes: run the same command again to go on.
``--prepack`` tunes the convolutions and dense layers as prepack tasks (their constant weight
packed once, outside the timed kernel, as a deployed network does) and times them so, printing
the pack's own time beside; ``--time-prepacked`` times any log's kernels that way.
Needs PyTorch (the CPU build) for the comparison; without it only tecomp's times print.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from peak import Peak, PeakBeside  # noqa: E402
from peak import measure as measure_peak  # noqa: E402
from timing import best_of  # noqa: E402

import tecomp as tc  # noqa: E402
import tuning  # noqa: E402
from tuning import workloads as wl  # noqa: E402
from tuning.machine import local_machine  # noqa: E402
from tuning.measure import RunOptions, measure_empty  # noqa: E402
from tuning.prepack import prepacked_steps  # noqa: E402
from tuning.records import iter_records  # noqa: E402
from tuning.speed import SettledReference, SpeedIndex, drift_factor, kind_of, reference_job  # noqa: E402


@dataclass(frozen=True)
class Op:
    net: str
    name: str
    workload: Callable[..., Any]
    args: tuple[Any, ...]
    weight: int  # occurrences in the network's forward pass
    bound: str = "compute"  # or "memory": which peak its speed is a fraction of


def _conv(net: str, name: str, ci: int, hw: int, co: int, k: int, stride: int, weight: int) -> Op:
    return Op(net, name, wl.conv2d, (1, ci, hw, hw, co, k, k, stride, k // 2), weight)


# ResNet-50 v1.5 at 224x224 (the stride on the 3x3 of each first bottleneck); weights count
# the layers of each shape in the network
RESNET = [
    _conv("resnet50", "stem 7x7 s2", 3, 224, 64, 7, 2, 1),
    _conv("resnet50", "l1 1x1 64->64", 64, 56, 64, 1, 1, 1),
    _conv("resnet50", "l1 3x3 64", 64, 56, 64, 3, 1, 3),
    _conv("resnet50", "l1 1x1 64->256", 64, 56, 256, 1, 1, 4),
    _conv("resnet50", "l1 1x1 256->64", 256, 56, 64, 1, 1, 2),
    _conv("resnet50", "l2 1x1 256->128", 256, 56, 128, 1, 1, 1),
    _conv("resnet50", "l2 3x3 128 s2", 128, 56, 128, 3, 2, 1),
    _conv("resnet50", "l2 1x1 128->512", 128, 28, 512, 1, 1, 4),
    _conv("resnet50", "l2 down 1x1 256->512 s2", 256, 56, 512, 1, 2, 1),
    _conv("resnet50", "l2 1x1 512->128", 512, 28, 128, 1, 1, 3),
    _conv("resnet50", "l2 3x3 128", 128, 28, 128, 3, 1, 3),
    _conv("resnet50", "l3 1x1 512->256", 512, 28, 256, 1, 1, 1),
    _conv("resnet50", "l3 3x3 256 s2", 256, 28, 256, 3, 2, 1),
    _conv("resnet50", "l3 1x1 256->1024", 256, 14, 1024, 1, 1, 6),
    _conv("resnet50", "l3 down 1x1 512->1024 s2", 512, 28, 1024, 1, 2, 1),
    _conv("resnet50", "l3 1x1 1024->256", 1024, 14, 256, 1, 1, 5),
    _conv("resnet50", "l3 3x3 256", 256, 14, 256, 3, 1, 5),
    _conv("resnet50", "l4 1x1 1024->512", 1024, 14, 512, 1, 1, 1),
    _conv("resnet50", "l4 3x3 512 s2", 512, 14, 512, 3, 2, 1),
    _conv("resnet50", "l4 1x1 512->2048", 512, 7, 2048, 1, 1, 3),
    _conv("resnet50", "l4 down 1x1 1024->2048 s2", 1024, 14, 2048, 1, 2, 1),
    _conv("resnet50", "l4 1x1 2048->512", 2048, 7, 512, 1, 1, 2),
    _conv("resnet50", "l4 3x3 512", 512, 7, 512, 3, 1, 2),
]


def _dw(c: int, hw: int, stride: int, weight: int) -> Op:
    return Op("mobilenet_v2", f"dw 3x3 {c}@{hw} s{stride}", wl.depthwise_conv2d,
              (1, c, hw, hw, 3, 3, stride, 1), weight, "memory")


def _pw(ci: int, hw: int, co: int, weight: int) -> Op:
    return Op("mobilenet_v2", f"pw 1x1 {ci}->{co}@{hw}", wl.conv2d, (1, ci, hw, hw, co, 1, 1, 1, 0), weight)


# MobileNet-V2's depthwise layers and a representative set of its pointwise ones
MOBILENET = [
    _dw(32, 112, 1, 1), _dw(96, 112, 2, 1), _dw(144, 56, 1, 1), _dw(144, 56, 2, 1),
    _dw(192, 28, 1, 2), _dw(192, 28, 2, 1), _dw(384, 14, 1, 4), _dw(576, 14, 1, 2),
    _dw(576, 14, 2, 1), _dw(960, 7, 1, 3),
    _pw(32, 112, 16, 1), _pw(16, 112, 96, 1), _pw(96, 56, 24, 1), _pw(24, 56, 144, 2),
    _pw(144, 28, 32, 1), _pw(32, 28, 192, 3), _pw(192, 14, 64, 1), _pw(64, 14, 384, 4),
    _pw(384, 14, 96, 1), _pw(96, 14, 576, 3), _pw(576, 7, 160, 1), _pw(160, 7, 960, 3),
    _pw(960, 7, 320, 1), _pw(320, 7, 1280, 1),
]

# BERT-base at sequence 128, batch 1: 12 layers of QKV projections, the attention output
# projection and FFN2 (each + bias + the residual, before the layer norm), FFN1 (+ bias + GELU,
# tanh approximation), the attention's two batch matmuls over 12 heads, its softmax and two
# layer norms
BERT = [
    Op("bert_base", "dense 768->768 (q, k, v)", wl.dense, (128, 768, 768), 36),
    Op("bert_base", "dense+res 768->768 (attn out)", wl.dense_bias_residual, (128, 768, 768), 12),
    Op("bert_base", "dense+gelu 768->3072 (ffn1)", wl.dense_gelu, (128, 768, 3072), 12),
    Op("bert_base", "dense+res 3072->768 (ffn2)", wl.dense_bias_residual, (128, 3072, 768), 12),
    Op("bert_base", "bmm q.kT 12x128x64x128", wl.batch_matmul, (12, 128, 64, 128), 12),
    Op("bert_base", "bmm attn.v 12x128x128x64", wl.batch_matmul, (12, 128, 128, 64), 12),
    Op("bert_base", "softmax 1536x128", wl.softmax, (12 * 128, 128), 12, "memory"),
    Op("bert_base", "layernorm 128x768", wl.layer_norm, (128, 768), 24, "memory"),
]

# normalisations beyond BERT's layer norm (issue 18): an RMSNorm row at BERT-base's width, and
# group / inference batch norm on a ResNet-50 layer-1 activation; `--ops norms`
NORMS = [
    Op("norms", "rmsnorm 128x768", wl.rms_norm, (128, 768), 1, "memory"),
    Op("norms", "groupnorm 256@56 G=32", wl.group_norm, (1, 256, 56, 56, 32), 1, "memory"),
    Op("norms", "batchnorm infer 256@56", wl.batch_norm_infer, (1, 256, 56, 56), 1, "memory"),
]



def _gconv(c: int, hw: int, stride: int, weight: int) -> Op:
    return Op("resnext50_32x4d", f"3x3 {c} G32@{hw} s{stride}", wl.conv2d_grouped,
              (1, c, hw, hw, c, 3, 3, stride, 1, 1, 32), weight)


# ResNeXt-50 (32x4d) at 224x224: the grouped 3x3 conv of each bottleneck (width 128, 256, 512,
# 1024 in stages 1-4, 32 groups: 4, 8, 16, 32 channels per group), stride 2 on the first block
# of stages 2-4 (torchvision's resnext50_32x4d; blocks 3, 4, 6, 3); `--ops resnext`. Its 1x1
# layers are ResNet-50's shapes at twice the width (not repeated here)
RESNEXT = [
    _gconv(128, 56, 1, 3),
    _gconv(256, 56, 2, 1), _gconv(256, 28, 1, 3),
    _gconv(512, 28, 2, 1), _gconv(512, 14, 1, 5),
    _gconv(1024, 14, 2, 1), _gconv(1024, 7, 1, 2),
]

NETS = {"resnet50": RESNET, "mobilenet_v2": MOBILENET, "bert": BERT, "norms": NORMS, "resnext": RESNEXT}


# workloads whose weight the layout sketches copy into a packed layout (`--prepack`)
# and the dense layers: a network's weights are constants, as a convolution's are
PREPACK_WORKLOADS = (wl.conv2d, wl.conv2d_grouped, wl.dense, wl.dense_relu, wl.dense_gelu,
                     wl.dense_bias_residual)


def torch_fn(op: Op, ins: list[np.ndarray]) -> Callable[[], Any]:
    """PyTorch's kernel for ``op`` on the same numpy arrays."""
    import torch
    import torch.nn.functional as F  # noqa: N812

    t = [torch.from_numpy(a) for a in ins]
    w = op.workload
    if w is wl.conv2d:
        stride, pad = op.args[7], op.args[8]
        return lambda: F.conv2d(t[0], t[1], stride=stride, padding=pad)
    if w is wl.conv2d_grouped:
        stride, pad, dilation, groups = op.args[7:]
        return lambda: F.conv2d(t[0], t[1], stride=stride, padding=pad, dilation=dilation, groups=groups)
    if w is wl.depthwise_conv2d:
        c, stride, pad = op.args[1], op.args[6], op.args[7]
        w4 = t[1].reshape(c, 1, op.args[4], op.args[5])
        return lambda: F.conv2d(t[0], w4, stride=stride, padding=pad, groups=c)
    if w is wl.dense:
        return lambda: F.linear(t[0], t[1], t[2])
    if w is wl.dense_relu:
        return lambda: torch.relu(F.linear(t[0], t[1], t[2]))
    if w is wl.dense_gelu:
        return lambda: F.gelu(F.linear(t[0], t[1], t[2]), approximate="tanh")
    if w is wl.dense_bias_residual:
        # addmm's beta path would fuse the residual; BERT's modules add it after the linear
        return lambda: F.linear(t[0], t[1], t[2]) + t[3]
    if w is wl.batch_matmul:
        return lambda: torch.bmm(t[0], t[1])
    if w is wl.softmax:
        return lambda: torch.softmax(t[0], dim=1)
    if w is wl.layer_norm:
        return lambda: F.layer_norm(t[0], (op.args[1],), t[1], t[2], eps=1e-5)
    if w is wl.rms_norm:
        return lambda: F.rms_norm(t[0], (op.args[1],), t[1], eps=1e-6)
    if w is wl.group_norm:
        return lambda: F.group_norm(t[0], op.args[4], t[1], t[2], eps=1e-5)
    if w is wl.batch_norm_infer:
        return lambda: F.batch_norm(t[0], t[1], t[2], t[3], t[4], training=False, eps=1e-5)
    raise ValueError(f"no PyTorch reference for {op.name}")


def _placed(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` where the tuner measures (`tuning.measure.measure_empty`)."""
    out = measure_empty(a.shape, a.dtype.name)
    out[...] = a
    return out


def _traffic(task: tuning.SearchTask) -> int:
    return sum(math.prod(int(d.value) for d in t.shape) * np.dtype(t.dtype).itemsize  # type: ignore[attr-defined]
               for t in task.tensors)


def _kernel(task: tuning.SearchTask, rec: Any, ins: list[np.ndarray], prepacked: bool,
            row: dict[str, Any]) -> tuple[Any, list[np.ndarray]]:
    """The kernel to time and its inputs: the best record's schedule on the plain arrays; or,
    with ``prepacked`` (or for a prepack task), its weight copies hoisted out
    (`tuning.prepacked_best` of the record ``rec``): the kernel on weights packed here, once,
    beforehand, as a user packs a constant weight -- the pack's time goes in
    ``row["pack_ms"]``."""
    if not (prepacked or task.prepack):
        s, args = task.apply_steps(rec.steps)
        return tc.build(s, args, target=task.target), ins
    pp = prepacked_steps(task, rec.steps)
    if not pp.packs:  # the best packs nothing: the kernel is the schedule as it is
        return tc.build(*pp.kernel, target=task.target), ins
    mod = pp.build("kernel", target=task.target)
    plain = {id(t.op): a for t, a in zip(task.tensors, ins)}
    packed: dict[int, np.ndarray] = {}
    pack_s = 0.0
    for h in pp.packs:
        fpack = mod[pp.pack_name("kernel", h)]
        wp = measure_empty(tuple(h.shape), h.packed.dtype)
        src = plain[id(h.source.op)]
        pack_s += best_of(functools.partial(fpack, src, wp), repeat=3, number=1)
        packed[id(h.packed.op)] = wp
    row["pack_ms"] = pack_s * 1e3
    return mod["kernel"], [packed[id(a.op)] if id(a.op) in packed else plain[id(a.op)] for a in pp.args[:-1]]


# the machine's speed now, as the tuner's runner takes it (`tuning.speed.SettledReference`): a
# round that meets a short slow spell of the machine waits it out, so the fresh time and its
# index come from the machine's usual state, as the log's claims now do. One per process: its
# recent typical index spans the operators
_NOW = SettledReference(lambda: reference_job(RunOptions()))


def evaluate(op: Op, task: tuning.SearchTask, log: str, index: SpeedIndex, rounds: int, pk: Peak,
             have_torch: bool, prepacked: bool = False, beside: PeakBeside | None = None) -> dict[str, Any]:
    """Build the log's best schedule of ``task``, check it against PyTorch and time both,
    interleaved, on the same numpy arrays (placed as the tuner places its own); and compare
    the log's claim with the time now, both normalised by the machine-speed index
    (``log/now``). ``prepacked`` (always for a prepack task): the kernel on its weights packed
    once beforehand (`_kernel`). ``beside``: the FMA peak timed in the same rounds, which a
    compute-bound operator's fraction of the peak is then of (else of the cached ``pk``)."""
    row: dict[str, Any] = {"op": op, "task": task}
    try:
        rec = tuning.best_record(log, task)
    except tuning.NoValidRecordError:
        row["error"] = "no valid record"
        return row
    rng = np.random.default_rng(0)
    # numpy arrays placed as a user's large ones are (16 bytes past a 64-byte boundary, where
    # malloc's mmap puts them), which is where the tuner measured (tuning.measure.MEASURE_OFFSET):
    # a claim must hold on what users pass, and a vectorized kernel is up to ~1.7x faster on
    # aligned data, so letting the allocator place them would make log/now a lottery. PyTorch
    # reads the very same arrays.
    ins = [_placed(rng.uniform(-1, 1, tuple(int(d.value) for d in t.shape)).astype(t.dtype))  # type: ignore[attr-defined]
           for t in task.tensors[:-1]]
    if op.workload is wl.batch_norm_infer:
        ins[2][...] = np.abs(ins[2]) + 0.1  # a variance: negative ones give NaNs, which compare as no error
    out = measure_empty(tuple(int(d.value) for d in task.tensors[-1].shape), "float32")  # type: ignore[attr-defined]
    out[...] = 0.0
    f, kins = _kernel(task, rec, ins, prepacked, row)
    f(*kins, out)
    ev = f.time_evaluator(number=1, repeat=1, min_repeat_ms=50)
    ours: list[float] = []  # the kernel alone (its time evaluator: a C loop)
    ours_py: list[float] = []  # called from Python
    theirs: list[float] = []
    ref_fn = torch_fn(op, ins) if have_torch else None
    if ref_fn is not None:
        ref = ref_fn().numpy()
        scale = float(np.sqrt(np.mean(np.square(ref, dtype=np.float64)))) or 1.0
        err = float(np.max(np.abs(out - ref))) / scale
        if err > 1e-3:
            row["error"] = f"differs from PyTorch: max error {err:.2g} of the output's RMS"
            return row
    # the machine's speed now, by the reference kernel of the record's kind, timed beside the
    # kernel in every round: the fresh time normalised by it is comparable with the log's claim
    kind = kind_of(rec.steps)
    refs: list[float] = []
    beside = beside if op.bound != "memory" else None
    if beside is not None:
        beside.restart()
    for _ in range(rounds):
        refs.append(_NOW.take([kind])[kind][0])
        if beside is not None:
            beside.sample()
        ours.append(ev(*kins, out).mean)
        if ref_fn is not None:
            # like for like: the kernel called from Python on the same arrays, as PyTorch is
            # (a call's argument checks cost ~4-6 us here, PyTorch's dispatch ~7: a tenth or
            # more of the smallest operators)
            n = max(1, int(0.02 / max(ours[-1], 1e-7)))
            ours_py.append(best_of(functools.partial(f, *kins, out), repeat=3, number=n))
            theirs.append(best_of(ref_fn, repeat=3, number=n))
    row["kernel_ms"] = min(ours) * 1e3
    row["ms"] = min(ours_py or ours) * 1e3
    if theirs:
        row["torch_ms"] = min(theirs) * 1e3
        row["ratio"] = statistics.median(t / o for t, o in zip(theirs, ours_py))
    secs = min(ours)
    # the log's claim (its best record's cost normalised by the speed index) against the time
    # now normalised alike: within a few percent when the claim holds
    base = index.baselines.get(f"{local_machine().id}/{kind}")
    scale = drift_factor(base, statistics.median(refs)) if base else 1.0
    if task.prepack or "pack_ms" not in row:  # the log timed what was timed now
        row["logged_ms"] = index.cost(rec) * 1e3
        row["now_norm_ms"] = statistics.median(ours) * scale * 1e3
    if op.bound == "memory":
        gbs = _traffic(task) / secs / 1e9
        row["peak"] = f"{gbs:.1f} GB/s, {pk.memory_note(gbs)}"
    else:
        gflops = task.flop_ct / secs / 1e9
        row["peak"] = f"{gflops:.1f} GFLOP/s, {beside.note(gflops) if beside else pk.compute_note(gflops)}"
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", nargs="*", default=list(NETS), choices=list(NETS),
                    help="which networks' operators (default: all)")
    ap.add_argument("--only", nargs="*", default=None, metavar="NAME",
                    help="only the operators whose name contains one of these, e.g. 'pw 1x1 96->576'")
    ap.add_argument("--trials", type=int, default=None,
                    help="tuning budget shared by every operator (default: 64 per operator); 0 only re-times the log")
    ap.add_argument("--log", default="suite.jsonl")
    # 10: on a noisy 2-core Zen 3, medians of 5 rounds of one kernel a minute apart agreed within
    # 5% in 55% of pairs, of 10 in 65%, of 20 in 71% (docs/benchmark-notes.md, seventeenth)
    ap.add_argument("--rounds", type=int, default=10, help="interleaved timing rounds per operator")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", default="llvm",
                    help="CPU target to tune for, e.g. 'llvm -mcpu=znver3' (AVX2 code) on an AVX-512 machine")
    ap.add_argument("--prepack", action="store_true",
                    help="tune the convolutions and dense layers as prepack tasks (ranked with their weights packed "
                         "outside the kernel, SearchTask(prepack=True)) and time them on packed weights")
    ap.add_argument("--time-prepacked", action="store_true",
                    help="time every kernel that copies a weight into another layout on its weight "
                         "packed once beforehand (tuning.prepacked_best), whichever task tuned it")
    a = ap.parse_args()
    ops = [op for net in a.ops for op in NETS[net] if a.only is None or any(n in op.name for n in a.only)]
    if not ops:
        ap.error(f"no operator of {' '.join(a.ops)} has a name containing any of {a.only}")
    tasks = [tuning.SearchTask(op.workload, op.args, target=a.target,
                               prepack=a.prepack and op.workload in PREPACK_WORKLOADS) for op in ops]
    budget = 64 * len(tasks) if a.trials is None else a.trials
    try:
        import torch  # noqa: F401

        have_torch = True
    except ImportError:
        have_torch = False
        print("PyTorch is not installed: tecomp's times only (pip install torch, the CPU build)")
    if budget:
        # one budget, spent where the weighted end-to-end latency gains most
        # tune's budget for several tasks is trials x len(tasks)
        tuning.tune(tasks, trials=max(1, budget // len(tasks)), log=a.log, seed=a.seed,
                    weights=[op.weight for op in ops])
    pk = measure_peak(quick=True, verbose=False, target=a.target)
    print(f"\nmachine: {pk.cpu_name} ({pk.llvm_cpu}, {pk.isa}, {pk.cores} cores): FMA peak "
          f"{pk.fma_gflops:.1f} GFLOP/s, bandwidth {pk.bandwidth_gbs:.1f} GB/s; log {a.log}\n")
    index = SpeedIndex.from_records(iter_records(a.log)) if os.path.exists(a.log) else SpeedIndex()
    # a compute-bound operator's fraction is of the FMA peak timed beside it in its own rounds:
    # the cached one above is of another moment, and a shared VM's peak moves by a quarter
    beside = PeakBeside(a.target)
    rows = [evaluate(op, t, a.log, index, a.rounds, pk, have_torch, a.time_prepacked, beside)
            for op, t in zip(ops, tasks)]
    print(f"{'net':15s} {'operator':28s} {'x':>3s} {'tecomp ms':>10s} {'torch ms':>9s} {'ratio':>6s} "
          f"{'log/now':>8s}  the kernel alone (a C loop): ms, speed, fraction of the peak")
    for r in rows:
        op = r["op"]
        if "error" in r:
            print(f"{op.net:15s} {op.name:28s} {op.weight:3d}  {r['error']}")
            continue
        tm = f"{r['torch_ms']:9.3f}" if "torch_ms" in r else f"{'-':>9s}"
        ratio = f"{r['ratio']:5.2f}x" if "ratio" in r else f"{'-':>6s}"
        claim = f"{r['logged_ms'] / r['now_norm_ms']:7.2f}x" if "logged_ms" in r else f"{'-':>8s}"
        pack = f"; prepacked, pack once {r['pack_ms']:.2f} ms" if "pack_ms" in r else ""
        print(f"{op.net:15s} {op.name:28s} {op.weight:3d} {r['ms']:10.3f} {tm} {ratio} {claim}  "
              f"{r['kernel_ms']:.3f} ms: {r['peak']}{pack}")
    ratios = [r["ratio"] for r in rows if "ratio" in r]
    if ratios:
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        print(f"\ngeometric mean of the ratios: {geo:.2f}x over {len(ratios)} operators; lowest "
              f"{min(ratios):.2f}x ({min((r for r in rows if 'ratio' in r), key=lambda r: r['ratio'])['op'].name})")
    claims = [(r["logged_ms"] / r["now_norm_ms"], r["op"].name) for r in rows if "logged_ms" in r]
    if claims:
        off = [c for c in claims if abs(c[0] - 1) > 0.05]
        print(f"log/now: the log's best (normalised by the speed index) over the time now on "
              f"numpy arrays placed as the tuner's (normalised alike); {len(claims) - len(off)} of {len(claims)} "
              f"within 5%" + (f"; off: {', '.join(f'{n} {c:.2f}x' for c, n in off)}" if off else ""))
    for net in a.ops:
        mine = [r for r in rows if r["op"].net == NETS[net][0].net and "ms" in r]
        if not mine:
            continue
        ours = sum(r["op"].weight * r["ms"] for r in mine)
        line = f"{NETS[net][0].net}: weighted latency of these operators {ours:.2f} ms"
        if all("torch_ms" in r for r in mine):
            theirs = sum(r["op"].weight * r["torch_ms"] for r in mine)
            line += f", PyTorch {theirs:.2f} ms ({theirs / ours:.2f}x)"
        print(line)


if __name__ == "__main__":
    main()

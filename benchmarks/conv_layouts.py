"""Convolutions with the vector over output channels: the tuner with and without the relayout sketch.

For each ResNet-50 layer below the same trial budget is spent twice: once on the plain space
(``plain``: the sketches of the space without its `Relayout` ones -- what the tuner searched
before that rule existed) and once on the default space (``default``: the relayout sketches
included, found by the search itself). The best kernel of each log is built here, checked
against the reference, and timed interleaved with PyTorch (or, without PyTorch, with a numpy
im2col + matmul convolution), best of several rounds: the machine is shared.
The repacking of the weight is a stage of the tuned kernel (the user passes the plain OIHW
array). The same kernel with its weight packed once, outside (`tuning.prepacked_best`: the
kernel takes the packed array, a pre-transform makes it) is timed too, interleaved with the
others, and the pre-transform on its own: the layout-transform cost a user pays once per weight
instead of on every call.

    python benchmarks/conv_layouts.py [--trials 100] [--layers s2a,s2b,s1,p1,l4,l4s2] [--log-dir DIR]
                                      [--spaces plain,default]

``--spaces default`` tunes the default space alone: half the time, for comparing two versions
of the sketch (run each version's copy of the repository with its own ``--log-dir``).
``--spaces default,prepack`` adds the default space tuned as a prepack task
(`SearchTask(..., prepack=True)`: each candidate timed with its weight packed outside the
kernel), whose ``prepack_prepacked`` row is the kernel such a tune picks.

Prints tecomp/reference ratios (> 1: tecomp faster) and fractions of the fp32 FMA peak
(benchmarks/peak.py, measured once at the start of the run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from peak import measure as measure_peak  # noqa: E402
from timing import best_of  # noqa: E402

import tecomp as tc  # noqa: E402
import tuning  # noqa: E402
from tuning import prepack, workloads  # noqa: E402
from tuning.measure import measure_empty  # noqa: E402
from tuning.space import SearchSpace, Sketch  # noqa: E402

# (N, CI, H, W, CO, KH, KW, stride, pad): ResNet-50's stride-2 3x3 layers, a stride-1 3x3 and a 1x1
LAYERS: dict[str, tuple[int, ...]] = {
    "s2a": (1, 128, 56, 56, 128, 3, 3, 2, 1),
    "s2b": (1, 256, 28, 28, 256, 3, 3, 2, 1),
    "s1": (1, 128, 28, 28, 128, 3, 3, 1, 1),
    "p1": (1, 512, 28, 28, 128, 1, 1, 1, 0),
    # late layers: 512x512x3x3 weights (9.4 MB), the copy is a large share of the kernel
    "l4": (1, 512, 7, 7, 512, 3, 3, 1, 1),
    "l4s2": (1, 512, 14, 14, 512, 3, 3, 2, 1),
    # grouped (`workloads.conv2d_grouped`: + dilation, groups): ResNeXt-style 128->128 3x3 at
    # 28x28 with 32 groups of 4 channels (ResNeXt-50 32x4d's widths) and with 4 groups of 32
    "gx32": (1, 128, 28, 28, 128, 3, 3, 1, 1, 1, 32),
    "gx4": (1, 128, 28, 28, 128, 3, 3, 1, 1, 1, 4),
}


def workload(args: tuple[int, ...]) -> Callable[..., Any]:
    """`workloads.conv2d` for 9 arguments, `workloads.conv2d_grouped` for 11."""
    return workloads.conv2d if len(args) == 9 else workloads.conv2d_grouped


def numpy_conv(x: np.ndarray, w: np.ndarray, stride: int, pad: int, dilation: int = 1, groups: int = 1) -> np.ndarray:
    """The reference without PyTorch: im2col by a strided view, then one matmul (BLAS) per group."""
    n, ci, _, _ = x.shape
    co, cig, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ext = (dilation * (kh - 1) + 1, dilation * (kw - 1) + 1)
    win = np.lib.stride_tricks.sliding_window_view(xp, ext, axis=(2, 3))[:, :, ::stride, ::stride, ::dilation, ::dilation]
    oh, ow = win.shape[2], win.shape[3]
    cog = co // groups
    outs = []
    for g in range(groups):
        cols = win[:, g * cig:(g + 1) * cig].transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, cig * kh * kw)
        outs.append(cols @ w[g * cog:(g + 1) * cog].reshape(cog, -1).T)
    out = np.concatenate(outs, axis=1)
    return np.ascontiguousarray(out.reshape(n, oh, ow, co).transpose(0, 3, 1, 2))


def reference(ins: Sequence[np.ndarray], args: Sequence[int]) -> tuple[str, Callable[[], Any]]:
    """PyTorch's conv2d when it is installed, else the numpy im2col convolution."""
    stride, pad = args[7], args[8]
    dilation, groups = (args[9], args[10]) if len(args) == 11 else (1, 1)
    try:
        import torch
    except ImportError:
        x, w = ins
        return "numpy", lambda: numpy_conv(x, w, stride, pad, dilation, groups)
    tx, tw = (torch.from_numpy(np.ascontiguousarray(v)) for v in ins)
    return "PyTorch", lambda: torch.nn.functional.conv2d(tx, tw, stride=stride, padding=pad, dilation=dilation,
                                                         groups=groups)


def _plain_sketches(self: SearchSpace, task: tuning.SearchTask) -> list[Sketch]:
    return [s for s in tuning.space.generate_sketches(task)
            if not any(p.relayout is not None for p in s.plans)]


def tune_layer(args: tuple[int, ...], space: str, trials: int, log: str, seed: int) -> tuple[float, str]:
    """Tune the layer on ``space`` ("plain", "default", or "prepack": the default space as a
    prepack task); (wall seconds, best sketch)."""
    task = tuning.SearchTask(workload(args), args, target="llvm", prepack=space == "prepack")
    orig = SearchSpace.make_sketches
    if space == "plain":
        SearchSpace.make_sketches = _plain_sketches  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        tuning.tune([task], trials=trials, log=log, seed=seed, progress=False)
        wall = time.perf_counter() - t0
    finally:
        SearchSpace.make_sketches = orig  # type: ignore[method-assign]
    s, _ = task.apply_best(log)
    # a prepack task's apply_best packs at root into "kernel_pack"
    uses = any(st.op.name in ("kernel.pack", "kernel_pack") for st in s.stages)
    return wall, "relayout" if uses else "plain layout"


def prepacked(task: tuning.SearchTask, log: str) -> tuple[tuning.Prepacked | None, str]:
    """The log's best kernel with its weight packed outside (`tuning.prepacked_best`), or,
    when the best packs no weight (a plain-layout sketch won), the best relayout candidate's
    (timed with its copy inside, as the tuner times them all); None if the log has none."""
    pp = tuning.prepacked_best(task, log)
    if pp.packs:
        return pp, "best"
    mine = [r for r in tuning.load_records(log, task) if r.valid and prepack.layout_copies(r.steps)]
    if not mine:
        return None, ""
    return prepack.prepacked_steps(task, min(mine, key=lambda r: r.mean).steps), "best relayout"


def run_layer(name: str, args: tuple[int, ...], opts: argparse.Namespace, peak_gflops: float) -> dict[str, Any]:
    line: dict[str, Any] = {"layer": name, "args": list(args), "trials": opts.trials}
    fns = {}
    pre: dict[str, tuple[Any, Any, Any]] = {}  # space -> (kernel, pre-transform, HoistedLayout)
    for space in opts.spaces:
        log = os.path.join(opts.log_dir, f"{name}-{space}.jsonl")
        wall, best = tune_layer(args, space, opts.trials, log, opts.seed)
        line[f"{space}_tune_s"], line[f"{space}_best_sketch"] = wall, best
        task = tuning.SearchTask(workload(args), args, target="llvm", prepack=space == "prepack")
        s, params = task.apply_best(log)
        fns[space] = tc.build(s, params, name=f"conv_{space}")
        pp, which = prepacked(task, log)
        if pp is not None:
            mod = pp.build(name=f"conv_{space}_prepacked")
            h = pp.packs[0]
            pre[space] = (mod[f"conv_{space}_prepacked"], mod[pp.pack_name(f"conv_{space}_prepacked", h)], h)
            line[f"{space}_prepacked_from"] = which
    rng = np.random.default_rng(0)
    arrs: list[np.ndarray] = []
    for tt in task.tensors:
        a = measure_empty(tuple(int(d.value) for d in tt.shape), tt.dtype)  # type: ignore[attr-defined]
        a[...] = rng.random(a.shape) if len(arrs) < 2 else 0
        arrs.append(a)
    ref_name, run_ref = reference(arrs[:2], args)
    want = np.asarray(run_ref())
    evs = {}
    for space, f in fns.items():
        arrs[2][...] = np.nan
        f(*arrs)
        np.testing.assert_allclose(arrs[2], want, rtol=1e-3, atol=1e-3, err_msg=f"{name} {space}")
        evs[space] = f.time_evaluator(number=opts.number, repeat=opts.repeat)
    packed = {}
    for space, (kf, pf, h) in pre.items():
        wp = measure_empty(tuple(int(d.value) for d in h.packed.shape), "float32")  # type: ignore[attr-defined]
        pf(arrs[1], wp)
        np.testing.assert_array_equal(wp, h.numpy(arrs[1]))
        arrs[2][...] = np.nan
        kf(arrs[0], wp, arrs[2])
        np.testing.assert_allclose(arrs[2], want, rtol=1e-3, atol=1e-3, err_msg=f"{name} {space} prepacked")
        packed[space] = wp
        evs[f"{space}_prepacked"] = kf.time_evaluator(number=opts.number, repeat=opts.repeat)
    t_ref = float("inf")
    t = {space: float("inf") for space in evs}
    for _ in range(opts.rounds):  # interleaved: a burst of load hits every side alike
        t_ref = min(t_ref, best_of(run_ref, opts.repeat, opts.number))
        time.sleep(0.05)
        for space, ev in evs.items():
            run_args = arrs
            if space.endswith("_prepacked"):  # the packed weight in place of the plain one
                run_args = [arrs[0], packed[space.removesuffix("_prepacked")], arrs[2]]
            t[space] = min(t[space], ev(*run_args).min)
            time.sleep(0.05)
    flop = task.flop_ct
    line["reference"], line["ref_ms"] = ref_name, t_ref * 1e3
    line["ref_frac_peak"] = flop / t_ref / 1e9 / peak_gflops
    for space, sec in t.items():
        line[f"{space}_ms"] = sec * 1e3
        line[f"{space}_ratio"] = t_ref / sec
        line[f"{space}_frac_peak"] = flop / sec / 1e9 / peak_gflops
    for space, (_, pf, _h) in pre.items():
        # the pre-transform alone, on the same arrays: what packing the weight costs, once
        ev = pf.time_evaluator(number=opts.number, repeat=opts.repeat)
        line[f"{space}_pack_ms"] = min(ev(arrs[1], packed[space]).min for _ in range(opts.rounds)) * 1e3
        line[f"{space}_pack_share"] = line[f"{space}_pack_ms"] / line[f"{space}_ms"]
    return line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--layers", default=",".join(LAYERS), help=f"comma-separated, of {sorted(LAYERS)}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-dir", default="conv_layout_logs", help="<layer>-<space>.jsonl; re-runs resume")
    ap.add_argument("--number", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds (best of each side)")
    ap.add_argument("--spaces", default="plain,default",
                    help="comma-separated, of plain,default,prepack (default alone: a shorter before/after run)")
    opts = ap.parse_args()
    opts.spaces = [x for x in opts.spaces.split(",") if x]
    if not opts.spaces or set(opts.spaces) - {"plain", "default", "prepack"}:
        ap.error("--spaces takes plain, default and/or prepack")
    layers = [x for x in opts.layers.split(",") if x]
    unknown = [x for x in layers if x not in LAYERS]
    if unknown:
        ap.error(f"unknown layers {unknown}; known: {sorted(LAYERS)}")
    os.makedirs(opts.log_dir, exist_ok=True)
    pk = measure_peak(quick=True, fresh=True)  # in this run: the shared VM's speed drifts
    print(pk.line())
    peak = pk.fma_for()
    for name in layers:
        r = run_layer(name, LAYERS[name], opts, peak)
        ref = r["reference"]
        print(f"\n{name} {workload(LAYERS[name]).__name__}{LAYERS[name]}: {opts.trials} trials per space  "
              f"({ref} {r['ref_ms']:.3f} ms, "
              f"{100 * r['ref_frac_peak']:.0f}% of FMA peak)")
        for space in opts.spaces:
            print(f"  {space:8s} {r[f'{space}_ms']:.3f} ms  {r[f'{space}_ratio']:.2f}x {ref}  "
                  f"{100 * r[f'{space}_frac_peak']:.0f}% of peak  best: {r[f'{space}_best_sketch']}  "
                  f"(tuned in {r[f'{space}_tune_s']:.0f} s)")
            if f"{space}_pack_ms" not in r:
                print("           prepacked: the log has no relayout candidate")
                continue
            print(f"           prepacked kernel ({r[f'{space}_prepacked_from']}) "
                  f"{r[f'{space}_prepacked_ms']:.3f} ms  {r[f'{space}_prepacked_ratio']:.2f}x {ref}  "
                  f"{100 * r[f'{space}_prepacked_frac_peak']:.0f}% of peak; its weight pack, run once: "
                  f"{r[f'{space}_pack_ms']:.3f} ms (= {100 * r[f'{space}_pack_share']:.1f}% of the "
                  f"{space} kernel)")
        print("JSON " + json.dumps(r))


if __name__ == "__main__":
    main()

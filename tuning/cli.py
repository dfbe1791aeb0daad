"""The ``tecomp`` command: tune a workload, inspect a log, export the best kernels.

    tecomp tune matmul --args 512 512 512 --trials 64 --log mm.jsonl
    tecomp tune my_ops.py:gelu --args 4096 --log gelu.jsonl
    tecomp show-log mm.jsonl
    tecomp show-log mm.jsonl --retime 3           # do the log's best 3 still run that fast?
    tecomp export --log mm.jsonl -o out/          # out/kernels.so + kernels.h + kernels.json

A workload is the name of a standard one (``tuning.workloads``: matmul, batch_matmul, conv2d,
depthwise_conv2d, softmax) or ``path/to/file.py:function`` for a function decorated with
``@tuning.register_workload`` (or ``@tuning.template``: its knobs are tuned) there.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .task import SearchTask, TuningError


def resolve_workload(spec: str) -> Callable[..., Any]:
    """A registered workload function from a standard name or ``file.py:function``."""
    from . import workloads

    if spec in workloads.STANDARD:
        return workloads.STANDARD[spec]
    if ":" not in spec:
        raise TuningError(f"unknown workload {spec!r}: use one of {', '.join(workloads.STANDARD)} "
                          "or path/to/file.py:function")
    path_s, func_name = spec.rsplit(":", 1)
    path = Path(path_s).resolve()
    if not path.is_file() or path.suffix != ".py":
        raise TuningError(f"workload file {path_s!r} is not a Python file")
    # Measurement workers import the workload by module name: make the file's folder importable
    # here and in every process spawned from here.
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (folder, os.environ.get("PYTHONPATH", "")) if p)
    module = importlib.import_module(path.stem)
    func = getattr(module, func_name, None)
    if func is None:
        raise TuningError(f"{path} defines no function {func_name!r}")
    return func  # type: ignore[no-any-return]


def _parse_args(values: Sequence[str]) -> tuple[Any, ...]:
    out: list[Any] = []
    for v in values:
        try:
            out.append(int(v))
        except ValueError:
            try:
                out.append(float(v))
            except ValueError:
                out.append(v)
    return tuple(out)


def cmd_tune(ns: argparse.Namespace) -> int:
    from .tune import tune

    func = resolve_workload(ns.workload)
    args = _parse_args(ns.args)
    task = SearchTask(func, args, target=ns.target, prepack=ns.prepack)
    # options not given on the command line keep tune()'s defaults (one place to change them)
    opts: dict[str, Any] = {k: v for k, v in (("batch_size", ns.batch_size), ("remeasure", ns.remeasure))
                            if v is not None}
    if ns.ray_build and ns.ray in (None, "local"):
        # --ray local is one node, and its measuring process holds every CPU of it
        raise TuningError("--ray-build builds on the nodes of a Ray cluster that do not measure: "
                          "give it with --ray ADDRESS of such a cluster (not local)")
    runner: Any = None
    builder: Any = None
    try:
        if ns.ray is not None:
            # the runner first: it connects to Ray, and the builder joins that connection
            runner = opts["runner"] = _ray_runner(ns, task)
            if ns.ray_build:
                from .ray_builder import RayBuilder

                builder = opts["builder"] = RayBuilder(ns.ray)
        (res,) = tune([task], trials=ns.trials, log=ns.log, seed=ns.seed, cost_model=ns.cost_model,
                      warm_start=ns.warm_start or None, **opts)
    finally:
        # the builder first: the runner may own the Ray connection both use
        if builder is not None:
            builder.close()
        if runner is not None:
            runner.close()
    if res.interrupted:
        print(f"{task.name}: interrupted after {res.trials} trials; re-run the same command to "
              f"go on (log: {ns.log})")
        return 130
    # the raw figure (the final re-timing's, when there was one): no speed index applied, so
    # it is what the kernel ran at, and show-log's normalised "best ms" may differ from it
    print(f"{task.name}: best {res.best_cost * 1e3:.4g} ms, {res.best_gflops:.1f} GFLOP/s (measured, "
          f"raw) after {res.trials} trials; log: {ns.log}")
    return 0


def _ray_runner(ns: argparse.Namespace, task: SearchTask) -> Any:
    """The `RayRunner` of ``--ray ADDRESS`` ("local": a Ray instance on this machine)."""
    from tecomp.codegen.target import Target

    from .distributed import RayRunner
    from .measure import LocalRunner

    jobs_from: type[LocalRunner] = LocalRunner
    if Target.parse(task.target).kind == "cuda":
        from .gpu_measure import GpuRunner

        jobs_from = GpuRunner
    address = None if ns.ray == "local" else ns.ray
    return RayRunner(address, node_resource=ns.ray_resource, jobs_from=jobs_from)


def _group(path: str) -> dict[str, list[Any]]:
    from .records import iter_records

    if not os.path.exists(path):
        raise TuningError(f"tuning log {path!r} does not exist")
    groups: dict[str, list[Any]] = {}
    for r in iter_records(path):
        groups.setdefault(r.task_key, []).append(r)
    return groups


def cmd_show_log(ns: argparse.Namespace) -> int:
    for w in ns.workload or []:
        resolve_workload(w)
    groups = _group(ns.log)
    if not groups:
        print(f"{ns.log}: no records")
        return 0
    from .records import aggregate, load_model_quality, ranked, side_by_side
    from .speed import SpeedIndex

    # candidates measured at different times are compared by their normalised cost
    # (tuning.speed); the raw mean of the best is shown beside it
    index = SpeedIndex.from_records(r for recs in groups.values() for r in recs)
    # the cost model's ranking quality on held-out batches, averaged per task
    quality: dict[str, list[tuple[float, float]]] = {}
    for q in load_model_quality(ns.log):
        quality.setdefault(q.task_key, []).append((q.pairwise_acc, q.topk_recall))
    labels = _machine_labels(groups)
    retimed_side_by_side = 0  # tasks whose best won a final side-by-side re-timing
    confirmed = 0  # ... and was then confirmed (`tuning.remeasure`)
    rows = [("task", "target", "records", "valid", "errors", "best ms", "raw ms", "GFLOP/s", "rank acc",
             "top-k", "measured on")]
    for recs in groups.values():
        r0 = recs[0]
        # one row per candidate, judged as best_record and apply_best judge it (its re-timings
        # without the one that selected it, if it was re-timed; its confirmations, if any)
        valid = aggregate(recs, index)
        errs: dict[str, int] = {}
        for r in recs:
            if not r.valid:
                errs[r.error.name] = errs.get(r.error.name, 0) + 1
        top = ranked(recs, index)[0] if valid else None
        if top is not None and (sbs := side_by_side(recs)) and top.key in sbs[0]:
            retimed_side_by_side += 1
            confirmed += any(r.confirm and r.valid for r in recs if r.key == top.key)
        best = index.cost(top) if top is not None else float("nan")
        task, _ = r0.task_or_why()
        gf = f"{task.flop_ct / best / 1e9:.1f}" if task is not None and valid else "-"
        name = f"{r0.workload.split(':')[-1]}{tuple(r0.args)}"
        acc, topk = (_mean([q[c] for q in quality.get(r0.task_key, [])]) for c in (0, 1))
        rows.append((name, r0.target, str(len(recs)), str(len(valid)),
                     ", ".join(f"{k}={v}" for k, v in sorted(errs.items())) or "-",
                     f"{best * 1e3:.3f}" if top is not None else "-",
                     f"{top.mean * 1e3:.3f}" if top is not None else "-", gf, acc, topk,
                     ",".join(sorted({labels[r.machine.id] for r in recs if r.machine is not None})) or "-"))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    for k, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        if k == 0:
            print("  ".join("-" * w for w in widths))
    if index.baselines:
        print("\nbest ms: normalised by the machine-speed index (raw mean x the log's median reference "
              "time / the one timed with it); raw ms: the same candidate's measured mean; GFLOP/s: "
              "from best ms")
    if retimed_side_by_side:
        print("best: the winner of the final re-timing, where the best few were timed side by side "
              "and ranked by raw ms (no index between them)"
              + ("; its ms: the median of the confirmation timings taken after it won (the rounds "
                 "that chose it were its luckiest)" if confirmed else ""))
    _print_machines(groups, labels, index)
    _print_errors(groups)
    if ns.retime:
        _print_retimed(ns.log, ns.retime, ns.rounds)
    return 0


def _print_retimed(log: str, n: int, rounds: int) -> None:
    """``--retime``: the best ``n`` records of each task timed again now, side by side."""
    from .speed import retime

    print(f"\nre-timed now (best {n} per task, {rounds} interleaved rounds in one fresh process on "
          "the same arrays, each after the reference kernel of its kind):")
    for task, rows in retime(log, n, rounds):
        print(f"  {task.name}:")
        table = [("rank", "logged ms", "normalised ms", "fresh ms", "fresh normalised ms", "fresh / normalised",
                  "reference now ms")]
        for k, r in enumerate(rows, 1):
            ok = not r.error and r.fresh_s < float("inf")
            table.append((str(k), _ms(r.logged_s), _ms(r.normalised_s),
                          _ms(r.fresh_s) if ok else f"failed: {r.error.splitlines()[-1][:80]}",
                          _ms(r.fresh_normalised_s) if ok else "-",
                          f"{r.fresh_normalised_s / r.normalised_s:.2f}x" if ok else "-",
                          f"{_ms(r.ref_now_s)} ({r.kind})"))
        widths = [max(len(row[c]) for row in table) for c in range(len(table[0]))]
        for row in table:
            print("    " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())


def _machine_labels(groups: dict[str, list[Any]]) -> dict[str, str]:
    """A short label (m1, m2, ...) per measuring machine, in order of first appearance."""
    labels: dict[str, str] = {}
    for recs in groups.values():
        for r in recs:
            if r.machine is not None and r.machine.id not in labels:
                labels[r.machine.id] = f"m{len(labels) + 1}"
    return labels


def _ms(seconds: float) -> str:
    """Milliseconds to 4 significant digits (kernels here take from microseconds to seconds)."""
    return f"{seconds * 1e3:.4g}"


def _print_machines(groups: dict[str, list[Any]], labels: dict[str, str], index: Any = None) -> None:
    """Which machines measured the records (costs compare only within one machine), with
    each one's median reference time (the baseline of its normalised costs)."""
    if not labels:
        return
    machines: dict[str, tuple[Any, int]] = {}
    for recs in groups.values():
        for r in recs:
            if r.machine is not None:
                m, n = machines.get(r.machine.id, (r.machine, 0))
                machines[r.machine.id] = (m, n + 1)
    print("\nmeasured on:")
    for mid, label in labels.items():
        m, n = machines[mid]
        line = f"  {label}: {m.describe()}; {n} record(s)"
        if index is not None:
            from .speed import RECORD_KINDS

            bases = [(k, index.baselines[f"{mid}/{k}"]) for k in RECORD_KINDS
                     if f"{mid}/{k}" in index.baselines]
            if bases:
                line += "; median reference " + ", ".join(f"{k} {_ms(v)} ms" for k, v in bases)
        if not m.host_id and not m.gpu_name:
            line += " (a schema-1 record: the CPU of the host that tuned, which may not be the one that measured)"
        print(line)
        if m.features:
            print(f"      features: {m.features}")


def _print_errors(groups: dict[str, list[Any]]) -> None:
    """Failed measurements by kind, each with how many there were and one example message."""
    examples: dict[str, tuple[int, str, str]] = {}
    for recs in groups.values():
        for r in recs:
            if r.valid:
                continue
            n, task, msg = examples.get(r.error.name, (0, "", ""))
            if not msg:
                task = f"{r.workload.split(':')[-1]}{tuple(r.args)}"
                msg = r.error_msg.strip() or "(no message)"
            examples[r.error.name] = (n + 1, task, msg)
    if not examples:
        return
    print("\nerrors by kind (one example each):")
    for kind, (n, task, msg) in sorted(examples.items(), key=lambda kv: -kv[1][0]):
        lines = msg.splitlines()
        body = "\n".join("      " + ln for ln in lines[-8:])
        print(f"  {kind}: {n} record(s); e.g. {task}:\n{body}")


def _mean(xs: Sequence[float]) -> str:
    vals = [x for x in xs if x == x]  # NaN: a batch without two costs to order
    return f"{sum(vals) / len(vals):.2f}" if vals else "-"


def _kernel_name(task: SearchTask) -> str:
    base = task.workload.split(":")[-1].split(".")[-1]
    args = "_".join(str(a).replace(".", "p").replace("-", "m") for a in task.args)
    name = f"{base}_{args}" if args else base
    return f"{name}_prepacked" if task.prepack else name


def cmd_export(ns: argparse.Namespace) -> int:
    import tecomp as tc

    from .prepack import prepacked_steps
    from .records import best_record

    for w in ns.workload or []:
        resolve_workload(w)
    groups = _group(ns.log)
    items: list[tuple[Any, Any, str]] = []
    prov: dict[str, Any] = {}
    targets = set()  # of every task rebuilt here, exported or not
    for recs in groups.values():
        task, why = recs[0].task_or_why()
        if task is None:
            print(f"skipping {recs[0].workload}{tuple(recs[0].args)}: cannot rebuild its task ({why}; "
                  "pass --workload file.py:function if it is not importable)", file=sys.stderr)
            continue
        targets.add(task.target)
        if not any(r.valid for r in recs):
            print(f"skipping {task.name}: no valid record", file=sys.stderr)
            continue
        rec = best_record(ns.log, task)
        name = _kernel_name(task)
        if task.prepack:
            # the kernel takes the packed weights; each pre-transform makes one, once per weight
            pp = prepacked_steps(task, rec.steps)
            items += pp.functions(name)
            prov.update(pp.provenance(name))
        else:
            s, args = task.apply_steps(rec.steps)
            items.append((s, args, name))
        blob = json.dumps({"task": task.workload_key, "steps": [repr(x) for x in rec.steps]},
                          sort_keys=True)
        prov[name] = {"log": os.path.abspath(ns.log), "record_hash": hashlib.sha256(blob.encode()).hexdigest(),
                      "measured_time_s": rec.mean, "workload": task.workload, "args": list(task.args),
                      **({"prepacked": True} if task.prepack else {})}
    if not items:
        raise TuningError(f"{ns.log}: no task with a valid record to export")
    if len(targets) > 1:
        raise TuningError(f"{ns.log} mixes targets {sorted(targets)}; export them separately")
    lib = tc.build(items, target=targets.pop())
    out = Path(ns.output)
    out.mkdir(parents=True, exist_ok=True)
    files = lib.export_library(str(out / f"{ns.name}.so"), provenance={"log": os.path.abspath(ns.log)},
                               kernel_provenance=prov)
    names = ", ".join(i[2] for i in items)
    print(f"exported {len(items)} kernel(s) ({names}) to {files.library} "
          f"(+ {files.header.name}, {files.manifest.name})")
    return 0


def _positive(v: str) -> int:
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{v!r} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def build_parser() -> argparse.ArgumentParser:
    import tecomp

    p = argparse.ArgumentParser(prog="tecomp", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"tecomp {tecomp.__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tune", help="tune a workload on this machine")
    t.add_argument("workload", help="standard workload name or path/to/file.py:function")
    t.add_argument("--args", nargs="*", default=[], help="workload arguments (shapes)")
    t.add_argument("--target", default="llvm")
    t.add_argument("--trials", type=int, default=200)
    t.add_argument("--log", default="tecomp_tune.jsonl")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--batch-size", type=int, help="candidates measured per round (default: tune's, 8)")
    t.add_argument("--cost-model", default="xgb", choices=["xgb", "random"],
                   help="'random': random search, the baseline the learned model must beat")
    t.add_argument("--warm-start", action="append", metavar="LOG",
                   help="earlier log that pre-trains the cost model (repeatable)")
    t.add_argument("--ray", metavar="ADDRESS",
                   help="measure on a Ray cluster: ray://HEAD:10001, auto (the cluster this machine "
                        "is in) or local (a Ray instance on this machine); needs tecomp[distributed]")
    t.add_argument("--ray-resource", metavar="NAME",
                   help="with --ray: only nodes started with this custom resource measure")
    t.add_argument("--ray-build", action="store_true",
                   help="with --ray: compile candidates as Ray tasks on the cluster too, for this "
                        "machine's CPU (default: on this machine). A measuring node's CPUs are all "
                        "held by its measurement, so this needs nodes that do not measure: start "
                        "the measuring ones with --ray-resource's resource and the others without; "
                        "tuning stops with an error when no CPU is free for a build")
    t.add_argument("--remeasure", type=int,
                   help="best candidates timed again at the end (0: none; default: tune's, 4)")
    t.add_argument("--prepack", action="store_true",
                   help="the weights a candidate copies into another layout are packed once, outside "
                        "the timed kernel (tuning.SearchTask's prepack); export then writes the "
                        "kernel and its pre-transform")
    t.set_defaults(fn=cmd_tune)
    s = sub.add_parser("show-log", help="best record per task of a tuning log, as a table")
    s.add_argument("log")
    s.add_argument("--workload", action="append", help="file.py:function to import (repeatable)")
    s.add_argument("--retime", type=_positive, metavar="N",
                   help="time the best N records of each task again now, side by side, and show the "
                        "fresh times beside the logged ones")
    s.add_argument("--rounds", type=_positive, default=7,
                   help="with --retime: interleaved timing rounds (default 7; the median is shown)")
    s.set_defaults(fn=cmd_show_log)
    e = sub.add_parser("export", help="build the best schedule of every task in a log into one library")
    e.add_argument("--log", required=True)
    e.add_argument("--workload", action="append", help="file.py:function to import (repeatable)")
    e.add_argument("-o", "--output", required=True, help="output folder")
    e.add_argument("--name", default="kernels", help="library base name (default: kernels)")
    e.set_defaults(fn=cmd_export)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        return int(ns.fn(ns))
    except TuningError as e:
        print(f"tecomp: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

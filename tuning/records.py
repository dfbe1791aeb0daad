"""Tuning logs: JSON lines, one measurement per line, appended and flushed as it happens.

A line holds the schema version, the tecomp version, the task (workload name, args, target,
key), the candidate's steps (what replays), its sketch and knob values (what the search
resumes from), and the costs or the error. Logs are never pickled: they outlive the code that
wrote them and are read by people. A process killed mid-write leaves at most a torn last line,
which `load_records` skips with a warning; the next writer starts on a fresh line.

A log may also hold lines of other kinds, marked by a ``"kind"`` field (measurements have
none): ``"model_quality"`` lines grade the cost model on each batch before it learnt from it
(`load_model_quality`), and one ``"task"`` line per task, written before its first record,
carries the task's computation as data (`tecomp.te.serialize`): with it a log is
self-sufficient, and `Record.task` rebuilds the task in a process that cannot import the
function that declared it (a notebook cell, a script, another machine). Logs written before
task lines existed still load; their tasks are rebuilt by importing the workload by name.
Readers of measurements skip the other kinds silently. One ``"machine"`` line per measuring
machine (`tuning.machine.Machine`: CPU model and LLVM features, or GPU name and compute
capability, and a host id), written before the first record it measured, is what records
name in their ``"machine"`` field; `Record.machine` is it.

Schema versions: 2 (this one) adds the machine lines and drops version 1's ``"host_cpu"``
(the LLVM CPU name of the *tuner's* host, stamped even where another machine measured).
Version-1 logs still load, resume and warm-start; their records' machine is
`Machine.legacy` of that CPU name. A record may carry ``"ref_s"``, the machine-speed index
timed with it (`tuning.speed`), ``"ref_kind"``, which reference kernel that was, and
``"ref_spread"``, how far its repeats were apart (an unsteady index is kept, not used), and
``"round"``, the side-by-side round of the final re-timing it was taken in, and ``"confirm"``,
true on a confirmation timing of that re-timing's winner (`aggregate`): optional fields
within schema 2 (readers ignore fields they do not know), absent from older records, whose
index is then unknown.

Which cost is used where: a record's ``costs`` are always the raw seconds measured.
The candidates of a run's final re-timing (`tuning.remeasure`) were timed side by side in the
same rounds and are ranked by those raw costs (`side_by_side`); every other comparison of
candidates measured at different times uses their *normalised* cost
(`tuning.speed.SpeedIndex`: mean x the log's median reference time of that machine and kind /
the record's ``ref_s``; the raw mean for a record without an index). `ranked` combines the
two; `best_record`, `apply_best`, ``tecomp show-log``'s best and ``export`` choose by it. A
candidate timed more than once is judged on its re-timings, without the earliest timing that
selected it (`aggregate`).

>>> rec = best_record("matmul.jsonl", task)       # doctest: +SKIP
>>> s, args = task.apply_steps(rec.steps)          # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

from .machine import Machine
from .measure import MeasureErrorNo, MeasureInput, MeasureResult, Timed
from .speed import LEGACY_PARALLEL, PARALLEL, RECORD_KINDS, SpeedIndex, combined_ref
from .steps import Step, steps_from_json, steps_key, steps_to_json
from .task import SearchTask, TuningError

_T = TypeVar("_T")

SCHEMA_VERSION = 2
# the versions this tecomp reads (see the module docstring for what changed)
READ_VERSIONS = (1, 2)
# a side-by-side round id (`side_by_side`): the re-timing session, "/", the round number
_ROUND = re.compile(r"[0-9A-Za-z._-]+/[0-9]+")
MODEL_QUALITY = "model_quality"
TASK = "task"
MACHINE = "machine"


def _check_version(d: dict[str, Any]) -> None:
    if d.get("v") not in READ_VERSIONS:
        raise ValueError(f"schema version {d.get('v')!r}, this tecomp reads {', '.join(map(str, READ_VERSIONS))}")


class NoValidRecordError(TuningError, LookupError):
    """The log holds no successful measurement of the requested task."""


@dataclass(frozen=True)
class Record(Timed):
    """One measurement as stored in a log."""

    task_key: str
    workload: str
    args: tuple[Any, ...]
    target: str
    steps: tuple[Step, ...]
    costs: tuple[float, ...]
    error: MeasureErrorNo
    error_msg: str = ""
    sketch: int | None = None
    params: tuple[tuple[str, Any], ...] = ()
    build_s: float = 0.0
    run_s: float = 0.0
    timestamp: float = 0.0
    tecomp_version: str = ""
    timing: str = ""  # "" for a real measurement; else a label (the CI stand-in's)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    # the log's "task" line for this record's task (its computation as data), if it has one
    task_line: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    # the machine that measured it (None: the log does not say, e.g. a build error)
    machine: Machine | None = field(default=None, compare=False)
    # the machine-speed index measured with it (`tuning.speed`; None: unknown, e.g. an old
    # record); for an `aggregate`d candidate, the index of the timings it is judged on together
    ref_s: float | None = None
    ref_kind: str = ""  # which reference kernel (`tuning.speed.RECORD_KINDS`; "" without ref_s)
    ref_spread: float | None = None  # max / min of its repeats (`tuning.speed.UNSTEADY`)
    round: str = ""  # the side-by-side re-timing round it was timed in (`side_by_side`), if any
    confirm: bool = False  # a confirmation timing of a re-timing's winner (`aggregate`)

    @property
    def key(self) -> str:
        return steps_key(self.steps)

    def task(self) -> SearchTask:
        """The task this record measured: rebuilt from the computation its log carries, or
        for older logs and templates by importing its workload by name (raises as
        `SearchTask.from_json` does when that cannot be found here)."""
        d = {"workload": self.workload, "args": list(self.args), "target": self.target,
             "name": self.extra.get("name") or None, "prepack": self.extra.get("prepack", False)}
        line = self.task_line
        if line is not None and not line.get("template") and line.get("dag") is not None:
            try:
                task = SearchTask.from_json(d, dag=line["dag"])
            except TuningError:
                task = None  # a DAG this version cannot read: the function may still be here
            if task is not None and task.workload_key == self.task_key:
                return task
        return SearchTask.from_json(d)

    def task_or_why(self) -> tuple[SearchTask | None, str]:
        """`task`, or None and why it cannot be rebuilt here. A workload from another
        project may fail in any way (not importable, different signature, its own errors);
        readers of a log that only use it as a hint (warm start, ``show-log``, ``export``)
        skip it with that reason instead of stopping."""
        try:
            return self.task(), ""
        except Exception as e:  # noqa: BLE001 - see above
            return None, f"{type(e).__name__}: {e}"

    def result(self) -> MeasureResult:
        return MeasureResult(self.costs, self.error, self.error_msg, self.build_s, self.run_s,
                             self.timestamp, timing=self.timing, machine=self.machine, ref_s=self.ref_s,
                             ref_kind=self.ref_kind, ref_spread=self.ref_spread, round=self.round,
                             confirm=self.confirm)


def _tuplify(v: Any) -> Any:
    return tuple(_tuplify(x) for x in v) if isinstance(v, list) else v


def record_to_json(inp: MeasureInput, res: MeasureResult) -> dict[str, Any]:
    """A measurement line; its machine (if any) is named by `Machine.id`, whose ``"machine"``
    line `RecordWriter.write` puts in the log first."""
    import tecomp

    return {
        "v": SCHEMA_VERSION,
        "tecomp": tecomp.__version__,
        "task": inp.task.to_json(),
        "name": inp.task.name,
        **({"machine": res.machine.id} if res.machine is not None else {}),
        "sketch": inp.sketch,
        "params": {k: list(v) if isinstance(v, tuple) else v for k, v in inp.params},
        "steps": steps_to_json(inp.steps),
        "costs": list(res.costs),
        "error": res.error.name,
        "error_msg": res.error_msg,
        "build_s": round(res.build_s, 4),
        "run_s": round(res.run_s, 4),
        "time": round(res.timestamp, 3),
        # the machine-speed index (`tuning.speed`), when the runner timed one
        **({"ref_s": res.ref_s, "ref_kind": res.ref_kind or PARALLEL} if res.ref_s is not None else {}),
        **({"ref_spread": round(res.ref_spread, 4)} if res.ref_s is not None and res.ref_spread is not None else {}),
        # a final re-timing's side-by-side round (`side_by_side`)
        **({"round": res.round} if res.round else {}),
        # a confirmation timing of the re-timing's winner (`aggregate`)
        **({"confirm": True} if res.confirm else {}),
        # only where the costs are not a real measurement: a reader must not take them for one
        **({"timing": res.timing} if res.timing else {}),
    }


def task_to_json(task: SearchTask) -> dict[str, Any]:
    """The ``"task"`` line of ``task``: what rebuilds it without its function."""
    import tecomp

    out: dict[str, Any] = {"v": SCHEMA_VERSION, "kind": TASK, "tecomp": tecomp.__version__,
                           "task": task.to_json(), "name": task.name}
    if task.is_template:
        out["template"] = True  # knob values replay only through the template's own code
    else:
        out["dag"] = task.dag_json()
    return out


def machine_to_json(machine: Machine) -> dict[str, Any]:
    """The ``"machine"`` line of ``machine``: what records measured there refer to."""
    return {"v": SCHEMA_VERSION, "kind": MACHINE, "id": machine.id, "machine": machine.to_json()}


def record_from_json(d: dict[str, Any], task_line: dict[str, Any] | None = None,
                     machines: dict[str, Machine] | None = None) -> Record:
    """Parse one log line (``task_line``: the log's task line for its task, if any;
    ``machines``: the log's machines by id); raises ValueError/KeyError on a line this
    version cannot read."""
    _check_version(d)
    t = d["task"]
    machine: Machine | None = None
    if d["v"] == 1:
        # version 1 only knew the tuner's LLVM CPU name
        machine = Machine.legacy(d["host_cpu"]) if d.get("host_cpu") else None
    elif d.get("machine") is not None:
        mid = d["machine"]
        if not isinstance(mid, str):
            raise ValueError(f"the machine of a record is a machine line's id, got {mid!r}")
        machine = (machines or {}).get(mid)
        if machine is None:
            raise ValueError(f"the record names machine {mid!r}, and the log has no machine line with that id")
    params = tuple(sorted((k, _tuplify(v)) for k, v in (d.get("params") or {}).items()))
    return Record(
        task_key=t["key"], workload=t["workload"], args=_tuplify(t["args"]), target=t["target"],
        steps=steps_from_json(d["steps"]), costs=tuple(float(c) for c in d["costs"]),
        error=MeasureErrorNo[d["error"]], error_msg=d.get("error_msg", ""),
        sketch=d.get("sketch"), params=params, build_s=d.get("build_s", 0.0),
        run_s=d.get("run_s", 0.0), timestamp=d.get("time", 0.0),
        tecomp_version=d.get("tecomp", ""), timing=d.get("timing", ""),
        extra={"name": d.get("name", ""), "prepack": t.get("prepack", False) is True},
        task_line=task_line, machine=machine, round=_round(d), confirm=d.get("confirm") is True,
        **(_speed_index(d) if d["v"] >= 2 else {}),
    )


def _round(d: dict[str, Any]) -> str:
    """A record line's side-by-side round ("SESSION/N"; "" for none)."""
    v = d.get("round", "")
    if not isinstance(v, str) or (v and not _ROUND.fullmatch(v)):
        raise ValueError(f"a record's round is 'SESSION/N', got {v!r}")
    return v


def _speed_index(d: dict[str, Any]) -> dict[str, Any]:
    """A record line's ``ref_s``/``ref_kind`` (none in records from before the index)."""
    v = d.get("ref_s")
    if v is None:
        return {}
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise ValueError(f"a record's ref_s is a positive number of seconds, got {v!r}")
    # a record with a time and no kind is from before the kinds: the first parallel reference
    kind = d.get("ref_kind", LEGACY_PARALLEL)
    if kind not in RECORD_KINDS:
        raise ValueError(f"a record's ref_kind is one of {', '.join(RECORD_KINDS)}, got {kind!r}")
    spread = d.get("ref_spread")
    if spread is not None and (isinstance(spread, bool) or not isinstance(spread, (int, float))
                               or not math.isfinite(spread) or spread < 1.0):
        raise ValueError(f"a record's ref_spread is a ratio >= 1, got {spread!r}")
    return {"ref_s": float(v), "ref_kind": kind, "ref_spread": None if spread is None else float(spread)}


class RecordWriter:
    """Appends records to a log, one flushed line each (a kill loses nothing written)."""

    def __init__(self, path: str) -> None:
        self.path = path
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        # the tasks and machines whose lines the log already holds (written once each)
        self._tasks = set(_task_lines(path)) if os.path.exists(path) else set()
        self._machines = set(_machine_lines(path)) if os.path.exists(path) else set()
        self._f: IO[str] = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - closed in close()
        # a torn last line (killed writer) must not swallow the first new record
        self._f.seek(0, os.SEEK_END)
        if self._f.tell() > 0:
            self._f.seek(self._f.tell() - 1)
            last = self._f.read(1)
            self._f.seek(0, os.SEEK_END)
            if last != "\n":
                self._f.write("\n")
                self._f.flush()

    def write(self, inp: MeasureInput, res: MeasureResult) -> None:
        if res.timing:
            from .gpu_measure import check_standin_allowed

            check_standin_allowed(f"writing a record timed by {res.timing!r} to {self.path}")
        self.write_task(inp.task)
        if res.machine is not None and res.machine.id not in self._machines:
            self._line(machine_to_json(res.machine))
            self._machines.add(res.machine.id)
        self._line(record_to_json(inp, res))

    def write_task(self, task: SearchTask) -> None:
        """The task's ``"task"`` line, unless the log already has it."""
        if task.workload_key not in self._tasks:
            self._line(task_to_json(task))
            self._tasks.add(task.workload_key)

    def write_model_quality(self, task: SearchTask, trials: int, pairwise_acc: float,
                            topk_recall: float, k: int, n: int) -> None:
        """How the cost model ranked a batch of ``task`` before learning from it (``trials``:
        the task's measured candidates, that batch included)."""
        self._line({"v": SCHEMA_VERSION, "kind": MODEL_QUALITY, "task": task.workload_key,
                    "name": task.name, "trials": trials, "pairwise_acc": _num(pairwise_acc),
                    "topk_recall": _num(topk_recall), "k": k, "n": n,
                    "time": round(time.time(), 3)})

    def _line(self, d: dict[str, Any]) -> None:
        self._f.write(json.dumps(d, separators=(",", ":")) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _num(x: float) -> float | None:
    # JSON has no NaN: an undefined metric is written as null
    return round(float(x), 6) if math.isfinite(x) else None


def _lines(path: str, kind: str | None) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` of the lines of one kind (None: measurements); torn or
    invalid JSON lines are skipped with a warning."""
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    yield from _parse(path, lines, kind)


def _parse(path: str, lines: Sequence[str], kind: str | None) -> Iterator[tuple[int, dict[str, Any]]]:
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        torn = n == len(lines) and not line.endswith("\n")
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            what = "torn last line (a writer was interrupted)" if torn else f"invalid JSON ({e})"
            warnings.warn(f"{path}:{n}: skipping {what}", RuntimeWarning, stacklevel=3)
            continue
        # a line that is no object is a broken measurement: its reader says so
        if (d.get("kind") if isinstance(d, dict) else None) != kind:
            continue  # another kind of line (a later tecomp may add kinds): not for this reader
        yield n, d


def _task_lines(path: str, lines: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """The ``"task"`` lines of a log by task key (the first of each key)."""
    if lines is None:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    out: dict[str, dict[str, Any]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torn lines are reported once, by the record reader
        for _, d in _parse(path, lines, TASK):
            key = (d.get("task") or {}).get("key") if isinstance(d.get("task"), dict) else None
            if isinstance(key, str) and d.get("v") in READ_VERSIONS:
                out.setdefault(key, d)
    return out


def _machine_lines(path: str, lines: Sequence[str] | None = None) -> dict[str, Machine]:
    """The machines of a log's ``"machine"`` lines by id; an unreadable one is skipped with
    a warning (the records naming it are then reported unreadable too)."""
    if lines is None:
        with open(path, encoding="utf-8") as f:
            lines = f.readlines()
    out: dict[str, Machine] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torn lines are reported once, by the record reader
        found = list(_parse(path, lines, MACHINE))
    for n, d in found:
        try:
            _check_version(d)
            m = Machine.from_json(d["machine"])
            if m.id != d["id"]:
                raise ValueError(f"its id {d['id']!r} is not the hash of its fields ({m.id!r})")
        except (ValueError, KeyError, TypeError) as e:
            warnings.warn(f"{path}:{n}: skipping unreadable machine line ({type(e).__name__}: {e})",
                          RuntimeWarning, stacklevel=3)
            continue
        out.setdefault(m.id, m)
    return out


def iter_records(path: str) -> Iterator[Record]:
    """The readable measurement records of ``path``; unreadable lines are skipped with a
    warning, lines of other kinds (``"kind"`` set) silently."""
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    tasks = _task_lines(path, lines)
    machines = _machine_lines(path, lines)
    for n, d in _parse(path, lines, None):
        try:
            key = d["task"]["key"] if isinstance(d, dict) and isinstance(d.get("task"), dict) else None
            yield record_from_json(d, tasks.get(key) if isinstance(key, str) else None, machines)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            warnings.warn(f"{path}:{n}: skipping unreadable record ({type(e).__name__}: {e})",
                          RuntimeWarning, stacklevel=2)


@dataclass(frozen=True)
class ModelQuality:
    """One ``"model_quality"`` line: the cost model graded on a batch it had not seen."""

    task_key: str
    trials: int  # the task's measured candidates, that batch included
    pairwise_acc: float  # nan when the batch had no pair to order
    topk_recall: float
    k: int
    n: int  # valid candidates graded
    timestamp: float = 0.0
    name: str = ""


def load_model_quality(path: str, task: SearchTask | None = None) -> list[ModelQuality]:
    """The model-quality lines of ``path`` (only ``task``'s when given), in log order;
    ``[]`` when the file is absent."""
    if not os.path.exists(path):
        return []
    out = []
    for n, d in _lines(path, MODEL_QUALITY):
        try:
            _check_version(d)
            q = ModelQuality(
                str(d["task"]), int(d["trials"]),
                math.nan if d["pairwise_acc"] is None else float(d["pairwise_acc"]),
                math.nan if d["topk_recall"] is None else float(d["topk_recall"]),
                int(d["k"]), int(d["n"]), float(d.get("time", 0.0)), str(d.get("name", "")))
        except (ValueError, KeyError, TypeError) as e:
            warnings.warn(f"{path}:{n}: skipping unreadable model-quality line ({type(e).__name__}: {e})",
                          RuntimeWarning, stacklevel=2)
            continue
        if task is None or q.task_key == task.workload_key:
            out.append(q)
    return out


def load_records(path: str, task: SearchTask | None = None) -> list[Record]:
    """All records of ``path`` (only ``task``'s when given); ``[]`` when the file is absent."""
    if not os.path.exists(path):
        return []
    return [r for r in iter_records(path) if task is None or r.task_key == task.workload_key]


def best_record(path: str, task: SearchTask) -> Record:
    """The best valid candidate of ``task`` in ``path`` (`ranked`): the winner of the latest
    side-by-side re-timing, else the lowest normalised cost (`tuning.speed.SpeedIndex` of the
    whole log: raw costs for records without an index), each candidate judged on its timings
    but the one that selected it (`aggregate`)."""
    if not os.path.exists(path):
        raise NoValidRecordError(f"tuning log {path!r} does not exist; run tuning.tune([task], "
                                 f"log={path!r}) first")
    every = list(iter_records(path))
    mine = [r for r in every if r.task_key == task.workload_key]
    valid = [r for r in mine if r.valid]
    if not valid:
        errors = sorted({r.error.name for r in mine})
        detail = (f"{len(mine)} record(s) for it, all failed ({', '.join(errors)})" if mine
                  else f"none of its {len(every)} record(s) are for this task")
        raise NoValidRecordError(
            f"no valid record for {task.name} (key {task.workload_key}, target {task.target}) "
            f"in {path!r}: {detail}")
    return ranked(valid, SpeedIndex.from_records(every))[0]


def rank_rounds(rounds: Sequence[Mapping[str, float]]) -> list[str]:
    """The candidates of the last round of a side-by-side re-timing, fastest first.

    ``rounds``: per round, in the order taken, each valid candidate's raw mean (steps key ->
    seconds per call). The candidates are those of the last round with a valid timing, ranked
    by the geometric mean of their raw costs over the rounds in which every one of them was
    timed validly -- the same moments of the machine for all, so no speed index comes between
    them (an index of a 0.1 ms reference does not follow the drift of a 5 ms kernel: one
    credited with its batch's slow reference once won the export by 1.3x over a kernel it
    ran slower than)."""
    last = next((r for r in reversed(rounds) if r), None)
    if last is None:
        return []
    final = set(last)
    shared = [r for r in rounds if final <= r.keys()]  # holds ``last`` at least
    return sorted(final, key=lambda k: (sum(math.log(r[k]) for r in shared) / len(shared), k))


def side_by_side(records: Sequence[Record]) -> tuple[list[str], float] | None:
    """The ranking (`rank_rounds`) of the latest side-by-side re-timing among one task's
    ``records`` -- `tuning.remeasure` tags its rounds ``"SESSION/N"`` -- and the time its
    last timing was taken; None when the records hold none."""
    sessions: dict[str, dict[int, list[Record]]] = {}
    for r in records:
        if r.round:
            sess, n = r.round.rsplit("/", 1)
            sessions.setdefault(sess, {}).setdefault(int(n), []).append(r)
    if not sessions:
        return None
    last = max(sessions.values(), key=lambda s: max(r.timestamp for rs in s.values() for r in rs))
    rounds = [{r.key: r.mean for r in last[n] if r.valid} for n in sorted(last)]
    return rank_rounds(rounds), max(r.timestamp for rs in last.values() for r in rs)


def ranked(records: Sequence[Record], index: SpeedIndex | None = None) -> list[Record]:
    """One task's candidates (`aggregate`d), best first: how `best_record`, ``show-log`` and
    ``--retime`` order them.

    The candidates of the latest side-by-side re-timing come in its order (`side_by_side`:
    raw costs taken in the same rounds); every other candidate is placed by its normalised
    cost (`tuning.speed.SpeedIndex`), after them -- that re-timing chose them from the rest --
    except one first measured after it (a run that stopped before its own re-timing), which
    goes first if its normalised cost beats the re-timing's winner's. Without a re-timing,
    all are ranked by normalised cost."""
    index = index or SpeedIndex.from_records(records)
    agg = sorted(aggregate(records, index), key=lambda r: (index.cost(r), r.timestamp))
    sbs = side_by_side(records)
    by_key = {a.key: a for a in agg}
    final = [by_key[k] for k in (sbs[0] if sbs else []) if k in by_key]
    if not final or sbs is None:
        return agg
    first: dict[str, float] = {}
    for r in records:
        if r.valid:
            first[r.key] = min(first.get(r.key, math.inf), r.timestamp)
    keys = {a.key for a in final}
    head = [a for a in agg if a.key not in keys and first[a.key] > sbs[1]
            and index.cost(a) < index.cost(final[0])]
    done = keys | {a.key for a in head}
    return head + final + [a for a in agg if a.key not in done]


def aggregate(records: Sequence[Record], index: SpeedIndex | None = None) -> list[Record]:
    """One record per candidate (steps key): the latest, holding the raw costs its estimate
    rests on. A candidate timed once is judged on that timing. A candidate timed more than
    once (`tune`'s ``remeasure`` re-times the best) is judged on its re-timings only: its
    earliest valid timing is the one that made it a best -- the fastest of hundreds of noisy
    timings is the luckiest, and keeping it in the mean kept about half that luck in the
    estimate (docs/design.md, "Honest numbers"). That *selection timing* stays in the log,
    unused (`selection_split`); the rule needs no marker, so logs of every version read alike.
    The winner of a final re-timing was chosen by its rounds as well -- the fastest of the few
    timed side by side is again the luckiest (the suite's claims ran 2.8% optimistic, the
    geometric mean over 55 operators on an Intel Xeon) -- so a candidate with *confirmation
    timings* (``confirm``, taken after those rounds: `tuning.remeasure`) is judged on them
    alone. Of the timings used, the estimate is
    their median by normalised cost (`middle_timings`: the middle one, or the two middle ones,
    whose costs the record then holds), as `tuning.search.estimate` judges them while tuning:
    on a shared VM one re-timing in a neighbour's burst ran 4-7x slow and made a mean of four
    a 1.8x claim. Its ``ref_s`` is then the index of the timings used
    (`tuning.speed.combined_ref` under ``index``, by default the index of ``records``), so
    ``index.cost`` of it is the mean of those timings each
    normalised by its own measurement's index."""
    index = index or SpeedIndex.from_records(records)
    by_key: dict[str, list[Record]] = {}
    for r in records:
        if r.valid:
            by_key.setdefault(r.key, []).append(r)
    out = []
    for recs in by_key.values():
        _, used = selection_split(recs)
        last = max(recs, key=lambda r: r.timestamp)
        mid = middle_timings(used, index)
        out.append(used[0] if len(used) == 1 else
                   dataclasses.replace(last, costs=tuple(c for r in mid for c in r.costs),
                                       ref_s=combined_ref(mid, index), ref_spread=None))
    return out


def middle_timings(used: Sequence[Record], index: SpeedIndex) -> list[Record]:
    """The timings a candidate's estimate rests on, of those ``used`` (`selection_split`): all
    of one or two, else the middle one (an odd count) or two (even) by normalised cost, in
    time order -- the median, which a timing taken in a burst of the machine does not move."""
    if len(used) <= 2:
        return list(used)
    mid = middle(used, key=lambda r: (index.cost(r), r.timestamp))
    return sorted(mid, key=lambda r: r.timestamp)


def middle(items: Sequence[_T], key: Callable[[_T], Any]) -> list[_T]:
    """The middle one (an odd count) or two (even) of ``items`` ordered by ``key``: the median
    `middle_timings` and `tune` without a log judge a candidate on."""
    order = sorted(items, key=key)
    n = len(order)
    return order[(n - 1) // 2: n // 2 + 1]


def selection_split(records: Sequence[Record]) -> tuple[Record | None, list[Record]]:
    """The valid timings of one candidate split into its selection timing (the earliest, by
    timestamp and then log order; None when it was timed once) and those, in time order,
    whose median its estimate is (`aggregate`, `middle_timings`): its confirmation timings
    when it has any (`tuning.remeasure`), else all the others."""
    valid = sorted((r for r in records if r.valid), key=lambda r: r.timestamp)  # stable: log order
    if len(valid) < 2:
        return None, valid
    confirmed = [r for r in valid[1:] if r.confirm]
    return valid[0], confirmed or valid[1:]


def summarize(records: Sequence[Record]) -> dict[str, int]:
    """Count of records per error kind (for reports)."""
    out: dict[str, int] = {}
    for r in records:
        out[r.error.name] = out.get(r.error.name, 0) + 1
    return out


def load_tasks(path: str, strict: bool = True) -> list[SearchTask]:
    """The tasks of a log, in the order they first appear, rebuilt from the computation the
    log carries (or, for older logs and templates, by importing their workloads by name).

    How a later process -- one that cannot import the notebook or script that declared the
    workloads -- gets tasks to apply: ``for t in load_tasks(log): t.apply_best(log)``.
    Raises `TuningError` naming the tasks that cannot be rebuilt here (``strict=False``:
    skips them with a warning).
    """
    if not os.path.exists(path):
        raise TuningError(f"tuning log {path!r} does not exist")
    first: dict[str, Record] = {}
    for r in iter_records(path):
        first.setdefault(r.task_key, r)
    out, why = [], []
    for r in first.values():
        task, reason = r.task_or_why()
        if task is None:
            why.append(f"{r.extra.get('name') or r.workload}{'' if r.extra.get('name') else tuple(r.args)}: {reason}")
        else:
            out.append(task)
    if why:
        msg = f"{path}: cannot rebuild {len(why)} task(s) here: " + "; ".join(why)
        if strict:
            raise TuningError(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
    return out


def apply_best(log: str, task: SearchTask | str | None = None) -> tuple[Any, list[Any]]:
    """``(schedule, args)`` of the fastest valid record in ``log``, ready for ``tc.build``.

    ``task`` is a `SearchTask`, a task's name as `tecomp show-log` prints it (e.g.
    ``"matmul(512, 512, 512)"``), or None when the log holds one task. Works in a process that
    cannot import the workload: the task is rebuilt from the log (`load_tasks`).

    >>> s, args = tuning.apply_best("matmul.jsonl")              # doctest: +SKIP
    >>> lib = tc.build(s, args, target="llvm", name="matmul")    # doctest: +SKIP
    """
    if isinstance(task, SearchTask):
        return task.apply_best(log)
    tasks = load_tasks(log, strict=task is None)
    if task is not None:
        named = [t for t in tasks if t.name == task]
        if not named:
            raise TuningError(f"{log} has no task named {task!r}; it has: "
                              + ", ".join(repr(t.name) for t in tasks))
        tasks = named
    if len(tasks) != 1:
        raise TuningError(f"{log} holds {len(tasks)} tasks; name one: "
                          + ", ".join(repr(t.name) for t in tasks))
    return tasks[0].apply_best(log)


__all__ = ["MACHINE", "MODEL_QUALITY", "READ_VERSIONS", "TASK", "ModelQuality", "NoValidRecordError", "Record",
           "RecordWriter",
           "SCHEMA_VERSION", "aggregate", "apply_best", "best_record", "iter_records", "load_model_quality",
           "load_records", "load_tasks", "machine_to_json", "middle", "middle_timings", "rank_rounds", "ranked",
           "record_from_json",
           "record_to_json",
           "selection_split", "side_by_side",
           "summarize",
           "task_to_json"]

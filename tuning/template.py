"""User-written templates: a schedule with knobs, whose values the tuner searches.

A template is the second way to give the tuner a space (the first being the sketches it derives
from a plain workload): the user writes the schedule and leaves some decisions open as knobs on
``cfg``. The same loop -- evolutionary search, cost model, measurement, records -- tunes it.

>>> @tuning.template
... def matmul(cfg, n, m, k):
...     A = te.placeholder((n, k), "float32", name="A")
...     B = te.placeholder((k, m), "float32", name="B")
...     r = te.reduce_axis((0, k), name="r")
...     C = te.compute((n, m), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
...     s = te.create_schedule(C.op)
...     i, j = s[C].op.axis
...     cfg.define_split("tile_i", i, num_outputs=2)
...     cfg.define_knob("vec", [0, 1])
...     io, ii = cfg["tile_i"].apply(s, C, i)
...     if cfg["vec"].val:
...         s[C].vectorize(j)
...     return s, [A, B, C]
>>> task = tuning.SearchTask(matmul, args=(64, 64, 64))          # doctest: +SKIP
>>> tuning.tune([task], trials=16, log="t.jsonl")                # doctest: +SKIP
>>> s, args = task.apply_best("t.jsonl")                        # doctest: +SKIP

The space is discovered by calling the template once with a recording `ConfigSpace`, which
answers every ``cfg[name]`` with the knob's first choice (splits: ``(extent, 1, ...)``); that
call's tensors are the task's DAG and its reference. A candidate is one `TemplateConfigStep`
holding every knob's value, so it replays in a worker process and is logged like any steps.
Knobs must be defined unconditionally, with choices that do not depend on other knobs.
"""

from __future__ import annotations

import abc
import itertools
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from tecomp.errors import TecompError
from tecomp.ir.expr import IntImm
from tecomp.te.schedule import Schedule, Stage
from tecomp.te.tensor import IterVar, Operation, Tensor

from .space import Candidate, SearchSpace, Sketch, factorizations
from .steps import Step, TemplateConfigStep, steps_key
from .task import TEMPLATE_MARK, SearchTask, TuningError, register_workload, require_callable

POLICIES = ("factors", "power2")
MAX_CHOICES = 1_000_000  # per knob: the choices are enumerated, and kept, in memory
_MEMO_LIMIT = 100_000

F = TypeVar("F", bound=Callable[..., Any])


def template(func: F) -> F:
    """Declare ``func(cfg, *args) -> (schedule, [tensors])`` as a tunable template.

    ``cfg`` offers ``define_split``, ``define_knob`` and ``cfg[name]``. It is returned
    unchanged, and `SearchTask(func, args)` builds its task. Measurement workers run the
    template (its schedule is code): it travels to them by value, so it may be defined in a
    script, a notebook cell or a REPL. Its logs hold knob values, not the schedule, so
    applying or exporting them later needs the template itself (`SearchTask(func, args)`,
    or ``tecomp export --workload file.py:function``).
    """
    require_callable(func, "tuning.template")
    setattr(func, TEMPLATE_MARK, True)  # noqa: B010 - the mark's name is a shared constant
    register_workload(func)
    return func


# knobs ------------------------------------------------------------------------------------------


def _key(v: Any) -> str:
    """A lookup key that tells 1, 1.0 and True apart (they are equal, and hash alike, in Python)."""
    return json.dumps(v, sort_keys=True)


def _plain(v: Any, where: str) -> Any:
    """``v`` as a JSON-serialisable, hashable value (lists become tuples), or TuningError."""
    if isinstance(v, np.generic):
        v = v.item()
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return tuple(_plain(x, where) for x in v)
    raise TuningError(f"{where}: choice {v!r} is not a JSON value (None, bool, int, float, str or "
                      "a list of those); records store knob values as JSON")


@dataclass(frozen=True)
class SplitEntity:
    """The value of a split knob: loop extents, outermost first (the outermost rounded up)."""

    size: tuple[int, ...]

    def apply(self, s: Schedule, op: Tensor | Operation | Stage, axis: IterVar) -> list[IterVar]:
        """Split ``axis`` of ``op``'s stage into ``len(size)`` loops; returns them, outermost
        first."""
        stage = op if isinstance(op, Stage) else s[op]
        out: list[IterVar] = []
        iv = axis
        for k in range(1, len(self.size)):
            # split by the product of the remaining inner extents, as SplitStep does: inner
            # splits then divide exactly and only the outermost loop may need a tail guard
            outer, iv = stage.split(iv, factor=math.prod(self.size[k:]))
            out.append(outer)
        out.append(iv)
        return out


@dataclass(frozen=True)
class KnobEntity:
    """The value of a `define_knob` knob."""

    val: Any


@dataclass(frozen=True)
class _Knob(abc.ABC):
    name: str
    choices: tuple[Any, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_index", {_key(c): k for k, c in enumerate(self.choices)})

    def index(self, value: Any) -> int | None:
        """The position of ``value`` among the choices (None: not one of them)."""
        try:
            return self._index.get(_key(value))  # type: ignore[attr-defined,no-any-return]
        except TypeError:  # not even JSON: certainly not a choice
            return None

    @abc.abstractmethod
    def entity(self, value: Any) -> Any:
        """What ``cfg[name]`` returns for ``value``."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line that identifies the knob's definition (part of a template's task key)."""

    def neighbour(self, value: Any, rng: np.random.Generator) -> Any:
        """Another choice near ``value`` (any other choice for unordered knobs)."""
        k = self.index(value)
        others = [c for i, c in enumerate(self.choices) if i != k]
        return others[int(rng.integers(len(others)))] if others else self.choices[0]


@dataclass(frozen=True)
class OptionKnob(_Knob):
    """``cfg.define_knob(name, choices)``: one of a list of JSON values."""

    def entity(self, value: Any) -> KnobEntity:
        return KnobEntity(value)

    def describe(self) -> str:
        return f"knob {self.name} {_key(self.choices)}"


@dataclass(frozen=True)
class SplitKnob(_Knob):
    """``cfg.define_split(...)``: the extents of the loops one axis is split into."""

    extent: int = 1
    num_outputs: int = 2
    policy: str = "factors"
    max_factor: int | None = None

    def entity(self, value: Any) -> SplitEntity:
        return SplitEntity(tuple(value))

    def describe(self) -> str:
        return (f"split {self.name} extent={self.extent} outputs={self.num_outputs} "
                f"policy={self.policy} max_factor={self.max_factor}")

    def neighbour(self, value: Any, rng: np.random.Generator) -> Any:
        """The nearest other split: a factor moved between two levels (policy "factors"), or
        one inner extent doubled or halved (policy "power2")."""
        k = self.index(value)
        if k is None or len(self.choices) < 2:
            return super().neighbour(value, rng)
        old = self.choices[k]
        dist = [sum(a != b for a, b in zip(old, c)) for c in self.choices]
        near = min(d for d in dist if d > 0)
        pick = [c for c, d in zip(self.choices, dist) if d == near]
        return pick[int(rng.integers(len(pick)))]


def _prime_exponents(n: int) -> list[int]:
    out, p = [], 2
    while p * p <= n:
        e = 0
        while n % p == 0:
            n //= p
            e += 1
        if e:
            out.append(e)
        p += 1
    if n > 1:
        out.append(1)
    return out


def _split_choices(where: str, extent: int, num_outputs: int, policy: str,
                   max_factor: int | None) -> tuple[tuple[int, ...], ...]:
    levels = num_outputs - 1
    cap = min(extent, max_factor) if max_factor is not None else extent
    if policy == "factors":
        # ordered factorizations into num_outputs parts: each prime's exponent is spread over
        # the parts independently (an upper bound when max_factor filters some out)
        count = math.prod(math.comb(e + levels, levels) for e in _prime_exponents(extent))
        if count > MAX_CHOICES:
            raise TuningError(f"{where}: {count} ways to split {extent} into {num_outputs} "
                              f"factors (at most {MAX_CHOICES}); use fewer outputs or max_factor")
        inner = [f for f in factorizations(extent, levels, extent) if max(f) <= cap]
        return tuple((extent // math.prod(f), *f) for f in inner)
    pow2 = [2**e for e in range(cap.bit_length()) if 2**e <= cap]
    if len(pow2) ** levels > MAX_CHOICES:
        raise TuningError(f"{where}: about {len(pow2) ** levels} power-of-two splits of {extent} "
                          f"into {num_outputs} (at most {MAX_CHOICES}); use fewer outputs or max_factor")
    out = []
    for f in itertools.product(pow2, repeat=levels):
        p = math.prod(f)
        if p <= extent:
            out.append((-(-extent // p), *f))  # the outermost loop covers the rest, rounded up
    return tuple(out)


Knob = OptionKnob | SplitKnob


# the cfg a template receives ----------------------------------------------------------------------


class _Config(abc.ABC):
    """What a template gets as ``cfg``: knob definitions and their values."""

    def __init__(self, where: str) -> None:
        self.where = where  # the template, for messages
        self._defined: dict[str, Knob] = {}

    def define_split(self, name: str, axis: IterVar | int, num_outputs: int = 2,
                     policy: str = "factors", max_factor: int | None = None) -> None:
        """A knob splitting ``axis`` (an IterVar or an extent) into ``num_outputs`` loops.

        ``policy="factors"``: every exact factorization (no tail); ``"power2"``: inner extents
        are powers of two and the outermost loop is rounded up (a tail is allowed). No inner
        extent exceeds ``max_factor``. ``cfg[name].size`` holds the extents, outermost first;
        ``cfg[name].apply(s, op, axis)`` performs the split.
        """
        where = f"template {self.where}: define_split({name!r})"
        if isinstance(axis, IterVar):
            ext = axis.dom.extent if axis.dom is not None else None
            if not isinstance(ext, IntImm):
                raise TuningError(f"{where}: axis {axis.name} has no constant extent ({ext})")
            extent = ext.value
        elif isinstance(axis, (int, np.integer)) and not isinstance(axis, bool):
            extent = int(axis)
        else:
            raise TuningError(f"{where}: axis must be an IterVar or an int extent, got {axis!r}")
        if extent < 1:
            raise TuningError(f"{where}: extent {extent} < 1")
        if not isinstance(num_outputs, int) or num_outputs < 2:
            raise TuningError(f"{where}: num_outputs must be an int >= 2, got {num_outputs!r}")
        if policy not in POLICIES:
            raise TuningError(f"{where}: unknown policy {policy!r} (use one of {', '.join(POLICIES)})")
        if max_factor is not None and (not isinstance(max_factor, int) or max_factor < 1):
            raise TuningError(f"{where}: max_factor must be a positive int, got {max_factor!r}")
        choices = _split_choices(where, extent, num_outputs, policy, max_factor)
        self._define(SplitKnob(name, choices, extent, num_outputs, policy, max_factor))

    def define_knob(self, name: str, candidates: Iterable[Any]) -> None:
        """A knob taking one of ``candidates`` (JSON values; lists come back as tuples).
        ``cfg[name].val`` is the value."""
        where = f"template {self.where}: define_knob({name!r})"
        if isinstance(candidates, (str, bytes, Mapping)) or not isinstance(candidates, Iterable):
            raise TuningError(f"{where}: candidates must be a list, got {candidates!r}")
        choices: dict[str, Any] = {}
        for c in candidates:
            v = _plain(c, where)
            choices.setdefault(_key(v), v)  # repeats add nothing to the space
        if not choices:
            raise TuningError(f"{where}: no candidates")
        self._define(OptionKnob(name, tuple(choices.values())))

    def _define(self, knob: Knob) -> None:
        if not isinstance(knob.name, str) or not knob.name:
            raise TuningError(f"template {self.where}: knob names are non-empty strings, got {knob.name!r}")
        old = self._defined.get(knob.name)
        if old is not None and old != knob:
            raise TuningError(f"template {self.where}: knob {knob.name!r} defined twice with different "
                              f"choices ({old.describe()}; then {knob.describe()})")
        self._defined[knob.name] = knob

    @abc.abstractmethod
    def _value(self, knob: Knob) -> Any:
        """The value ``knob`` has in this cfg."""

    def __getitem__(self, name: str) -> Any:
        # SplitEntity or KnobEntity, by how the knob was defined (Any keeps templates readable)
        knob = self._lookup(name)
        return knob.entity(self._value(knob))

    def _lookup(self, name: str) -> Knob:
        knob = self._defined.get(name)
        if knob is None:
            known = ", ".join(repr(k) for k in self._defined) or "none"
            raise TuningError(f"template {self.where}: cfg[{name!r}] reads a knob that is not defined "
                              f"(defined: {known}); call cfg.define_split/define_knob({name!r}, ...) first")
        return knob

    def __contains__(self, name: object) -> bool:
        return name in self._defined


class ConfigSpace(_Config):
    """The knobs of a template, recorded by calling it once; answers every ``cfg[name]`` with
    the knob's first choice. ``len(space)`` is the number of configs."""

    def __init__(self, where: str) -> None:
        super().__init__(where)
        self._frozen = False

    def _define(self, knob: Knob) -> None:
        if self._frozen:
            raise TuningError(f"template {self.where}: the config space is complete; knob "
                              f"{knob.name!r} cannot be added to it")
        super()._define(knob)

    def _value(self, knob: Knob) -> Any:
        return knob.choices[0]

    @property
    def knobs(self) -> dict[str, Knob]:
        """The knobs by name, in the order the template defined them."""
        return dict(self._defined)

    def __len__(self) -> int:
        return math.prod(len(k.choices) for k in self._defined.values())

    def __iter__(self) -> Iterator[str]:
        return iter(self._defined)

    def default(self) -> dict[str, Any]:
        """The config of the discovery call: every knob's first choice."""
        return {k.name: k.choices[0] for k in self._defined.values()}

    def configs(self) -> Iterator[dict[str, Any]]:
        """Every config (grid order, the last knob fastest)."""
        names = list(self._defined)
        for combo in itertools.product(*(k.choices for k in self._defined.values())):
            yield dict(zip(names, combo))

    def describe(self) -> str:
        return "\n".join(k.describe() for k in self._defined.values())

    def __repr__(self) -> str:
        parts = ", ".join(f"{k.name}[{len(k.choices)}]" for k in self._defined.values())
        return f"ConfigSpace({self.where}: {len(self)} configs; {parts})"

    def validate(self, config: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
        """``config`` as sorted ``(knob, value)`` pairs of canonical values, or TuningError when
        it does not fit this space (a record written for another version of the template)."""
        missing = [k for k in self._defined if k not in config]
        extra = [k for k in config if k not in self._defined]
        if missing or extra:
            raise TuningError(f"template {self.where}: config does not fit its knobs (missing "
                              f"{missing}, unknown {extra}); was it written for another version?")
        out = []
        for name, knob in self._defined.items():
            k = knob.index(config[name])
            if k is None:
                raise TuningError(f"template {self.where}: {config[name]!r} is not a choice of knob "
                                  f"{name!r} ({knob.describe()})")
            out.append((name, knob.choices[k]))
        return tuple(sorted(out, key=lambda kv: kv[0]))


class ConfigEntity(_Config):
    """One point of a `ConfigSpace`, as a template receives it when a candidate is built.

    Definitions are checked against the space: a knob the discovery call did not define, or
    defined with other choices, is an error (the config could not say what it should be).
    """

    def __init__(self, space: ConfigSpace, config: Mapping[str, Any]) -> None:
        super().__init__(space.where)
        self.space = space
        self.config = space.validate(config)
        self._values = dict(self.config)

    def _define(self, knob: Knob) -> None:
        known = self.space.knobs.get(knob.name)
        if known is None:
            raise TuningError(f"template {self.where}: knob {knob.name!r} was not defined when the "
                              "config space was discovered (with every knob at its first choice); "
                              "define every knob unconditionally")
        if known != knob:
            raise TuningError(f"template {self.where}: knob {knob.name!r} defined with other choices "
                              f"than at discovery ({known.describe()}; now {knob.describe()}); "
                              "choices must not depend on other knobs")
        super()._define(knob)

    def _lookup(self, name: str) -> Knob:
        # a knob of the space may be read before this call defines it: its value is known
        knob = self._defined.get(name) or self.space._defined.get(name)
        return knob if knob is not None else super()._lookup(name)

    def _value(self, knob: Knob) -> Any:
        return self._values[knob.name]

    def __repr__(self) -> str:
        return f"ConfigEntity({self.where}: {dict(self.config)})"


# calling templates ----------------------------------------------------------------------------


def _call(func: Callable[..., Any], cfg: _Config, args: Sequence[Any]) -> tuple[Schedule, list[Tensor]]:
    out = func(cfg, *args)
    if not (isinstance(out, (tuple, list)) and len(out) == 2 and isinstance(out[0], Schedule)
            and isinstance(out[1], (tuple, list)) and out[1]
            and all(isinstance(t, Tensor) for t in out[1])):
        raise TuningError(f"template {cfg.where} must return (schedule, [tensors]) (the tensors are "
                          f"the kernel's arguments, inputs and outputs), got {type(out).__name__}")
    return out[0], list(out[1])


def discover(func: Callable[..., Any], args: Sequence[Any], where: str) -> tuple[ConfigSpace, list[Tensor]]:
    """Call the template with a recording cfg: its knobs and its tensors (the task's DAG)."""
    space = ConfigSpace(where)
    try:
        _, tensors = _call(func, space, args)
    except TecompError as e:
        raise TuningError(f"template {where}{tuple(args)!r} fails with every knob at its first choice "
                          f"({type(e).__name__}: {e}); that config must give a valid schedule, as it "
                          "is how the tuner discovers the knobs") from e
    space._frozen = True
    return space, tensors


def apply_config(task: SearchTask, config: Mapping[str, Any]) -> tuple[Schedule, list[Tensor]]:
    """The template of ``task`` called with ``config``: ``(schedule, args)``.

    A tecomp error (the schedule rejects this config) propagates: the caller decides whether
    it is an invalid candidate or a failure.
    """
    space = task.config_space
    if space is None or task.func is None:
        raise TuningError(f"task {task.name} is not a template; it has no knobs to configure")
    s, tensors = _call(task.func, ConfigEntity(space, config), task.args)
    ref = [(str(t.dtype), [str(d) for d in t.shape]) for t in task.tensors]
    got = [(str(t.dtype), [str(d) for d in t.shape]) for t in tensors]
    if got != ref:
        # measurements compare against the default config's outputs, argument by argument
        raise TuningError(f"template {task.workload} returns other arguments for config "
                          f"{dict(config)} ({got}) than for its default ({ref}); the knobs may "
                          "change the schedule, not the computation")
    return s, tensors


def apply_template_steps(task: SearchTask, steps: Sequence[Step]) -> tuple[Schedule, list[Tensor]]:
    """`SearchTask.apply_steps` of a template task: one TemplateConfigStep, or none (default)."""
    if not steps:
        assert task.config_space is not None
        return apply_config(task, task.config_space.default())
    if len(steps) == 1 and isinstance(steps[0], TemplateConfigStep):
        return apply_config(task, dict(steps[0].config))
    kinds = ", ".join(type(s).__name__ for s in steps)
    raise TuningError(f"task {task.name} is a template: its candidates are one TemplateConfigStep "
                      f"(the knob values), got [{kinds}]; schedule steps apply to plain workloads only")


# the search space -----------------------------------------------------------------------------


class TemplateSpace(SearchSpace):
    """The configs of a template, with `SearchSpace`'s interface so the same search tunes it.

    There is one pseudo-sketch (index 0); a candidate's ``params`` are the config as sorted
    ``(knob, value)`` pairs and its steps the one `TemplateConfigStep` that holds them.
    """

    def __init__(self, task: SearchTask) -> None:
        # SearchSpace.__init__ is not called: it derives sketches from the DAG by rules, and
        # a template is its own (single) sketch
        if task.config_space is None:
            raise TuningError(f"task {task.name} is not a template (use SearchSpace)")
        self.task = task
        self.config_space = task.config_space
        self.sketches = [Sketch(())]
        self._knobs = list(self.config_space.knobs.values())
        # the search proposes the same configs over and over, and each build calls the template
        self._memo: dict[tuple[tuple[str, Any], ...], Candidate | None] = {}

    def __len__(self) -> int:
        return len(self.config_space)

    def instantiate(self, sketch: int, params: Mapping[str, Any],
                    rng: np.random.Generator | None = None) -> Candidate | None:
        """The candidate for this config (knobs missing from ``params``, or holding no valid
        choice, drawn from ``rng``), or None when the template's schedule rejects it."""
        if sketch != 0:
            return None
        pairs = []
        for knob in self._knobs:
            k = knob.index(params[knob.name]) if knob.name in params else None
            if k is None:
                if rng is None:
                    return None
                k = int(rng.integers(len(knob.choices)))
            pairs.append((knob.name, knob.choices[k]))
        config = tuple(sorted(pairs, key=lambda kv: kv[0]))
        if config in self._memo:
            return self._memo[config]
        try:
            apply_config(self.task, dict(config))
        except TecompError:
            cand = None
        else:
            steps: tuple[Step, ...] = (TemplateConfigStep(config),)
            cand = Candidate(0, config, steps, steps_key(steps))
        if len(self._memo) >= _MEMO_LIMIT:
            self._memo.clear()
        self._memo[config] = cand
        return cand

    def sample(self, rng: np.random.Generator) -> Candidate | None:
        return self.instantiate(0, {}, rng)

    def mutate(self, cand: Candidate, rng: np.random.Generator, knob: str | None = None) -> Candidate | None:
        """Change one knob: another choice, or for a split a factor moved between levels.
        ``knob``: that knob (None when the template has no such knob or it cannot move)."""
        movable = [k for k in self._knobs if len(k.choices) > 1 and knob in (None, k.name)]
        if not movable:
            return None  # a space of one config has no neighbour
        params = dict(cand.params)
        for _ in range(4):  # an invalid neighbour is likely to have a valid sibling
            kb = movable[int(rng.integers(len(movable)))]
            child = self.instantiate(0, {**params, kb.name: kb.neighbour(params.get(kb.name), rng)}, rng)
            if child is not None:
                return child
        return None

    def crossover(self, a: Candidate, b: Candidate, rng: np.random.Generator) -> Candidate | None:
        """Each knob's value from one parent or the other."""
        pa, pb = dict(a.params), dict(b.params)
        params = {}
        for k in self._knobs:
            parent = pa if rng.integers(2) else pb
            if k.name in parent:
                params[k.name] = parent[k.name]
        return self.instantiate(0, params, rng)


__all__ = ["ConfigEntity", "ConfigSpace", "KnobEntity", "OptionKnob", "SplitEntity", "SplitKnob",
           "TemplateSpace", "apply_config", "discover", "template"]

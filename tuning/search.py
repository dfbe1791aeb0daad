"""Evolutionary search over annotated sketches, guided by the cost model.

Each batch starts from a population of fresh random candidates plus the best candidates
measured so far, then evolves it for a few generations: parents are drawn in proportion to
their rank under the cost model, children come from mutation (one knob moved: a tile factor
shifted between levels, another unroll budget, parallel depth, vector width or compute
location) or crossover (per stage, all knobs from one parent). Every unmeasured candidate seen
on the way competes for the batch; the model's best fill it, except three reserved shares:
the model's best among the fresh random samples (exploration the model still steers), the
best of every sketch never timed yet (up to half a batch) and of every sketch the model ranked
out, and an epsilon-greedy share of random candidates that keeps the model honest about
regions it has never seen. All randomness comes from one ``numpy.random.Generator``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .cost_model import CostModel
from .measure import MeasureInput, MeasureResult
from .space import Candidate, SearchSpace
from .task import SearchTask


def estimate(timings: Sequence[float]) -> float:
    """A candidate's cost from its timings in the order taken: the one timing it has, else
    the median of all but the first -- the timing that made it a best is the luckiest of many,
    and one timing of the rest taken in a neighbour's burst (4-7x slow on a shared VM) must not
    move the estimate; inf when one of them failed (`tuning.records.aggregate` reads a log by
    the same rule)."""
    if len(timings) == 1:
        return float(timings[0])
    rest = timings[1:]
    return float(np.median(rest)) if all(np.isfinite(rest)) else float("inf")


SKETCH_TRIES = 2  # failed first timings after which a sketch no longer claims a slot as unseen


@dataclass(frozen=True)
class SearchOptions:
    """Knobs of the evolutionary search (defaults sized for a 2-core machine)."""

    population: int = 64
    generations: int = 3
    mutation_prob: float = 0.85
    eps_greedy: float = 0.1
    local_prob: float = 0.5  # an eps-greedy pick is a random one-knob mutant of the best instead
    elites: int = 8  # best measured candidates seeded into each population
    sketch_share: float = 0.25  # of a batch, reserved for sketches the model ranked out
    fresh_share: float = 0.375  # of a batch, reserved for the model's best fresh samples
    fresh_pool: int = 192  # fresh random samples the model screens per batch (min. first population)


class EvolutionarySearch:
    """Proposes batches of unmeasured candidates for one task."""

    def __init__(self, task: SearchTask, model: CostModel, rng: np.random.Generator,
                 options: SearchOptions | None = None, space: SearchSpace | None = None) -> None:
        self.task = task
        self.model = model
        self.rng = rng
        self.options = options or SearchOptions()
        self.space = space or task.make_space()
        self.measured: dict[str, float] = {}  # steps key -> mean cost (inf: failed)
        # proposed and in flight (a runner measuring several batches at once): not proposed
        # again; the tuner adds a batch's keys when it submits it, `update` removes them
        self.pending: set[str] = set()
        self._elite_pool: dict[str, tuple[float, Candidate]] = {}
        # steps key -> every mean measured here, the first the one that selected it
        self._timings: dict[str, list[float]] = {}
        # steps key of a best -> knob -> its one-knob mutants proposed (`_local`)
        self._moved: dict[str, dict[str, int]] = {}
        # sketch -> (measurements, valid ones): which sketches still await a first timing
        self._sketch_runs: dict[int, tuple[int, int]] = {}

    def update(self, candidates: Sequence[Candidate], results: Sequence[MeasureResult]) -> None:
        """Remember measurements (never propose them again; the fastest seed populations)."""
        for c, r in zip(candidates, results):
            self.pending.discard(c.key)
            cost = r.mean if r.valid else float("inf")
            self._count_sketch(c.sketch, r.valid)
            self.measured[c.key] = cost
            self._timings[c.key] = [cost]
            if r.valid:
                self._elite_pool[c.key] = (cost, c)
            else:  # a warm-start elite that fails here is no elite
                self._elite_pool.pop(c.key, None)

    def mark_measured(self, key: str, cost: float, candidate: Candidate | None = None) -> None:
        """A measurement from a log (resume); ``candidate`` when it could be re-created."""
        self.measured[key] = cost
        self._timings[key] = [cost]
        if candidate is not None:
            self._count_sketch(candidate.sketch, bool(np.isfinite(cost)))
        if candidate is not None and np.isfinite(cost):
            self._elite_pool[key] = (cost, candidate)

    def add_timing(self, key: str, cost: float, candidate: Candidate | None = None) -> None:
        """Another timing of a measured candidate (a re-measurement): from now on it is judged
        on its re-timings (`estimate`: the first timing, which selected it, left out); a failed
        one (inf) makes it no elite."""
        t = self._timings.setdefault(key, [])
        t.append(cost)
        mean = estimate(t)
        self.measured[key] = mean
        old = self._elite_pool.pop(key, None)
        cand = candidate or (old[1] if old else None)
        if cand is not None and np.isfinite(mean):
            self._elite_pool[key] = (mean, cand)

    def best(self, k: int) -> list[Candidate]:
        """The ``k`` fastest candidates measured by this search (or resumed from its log)."""
        mine = [(cost, c) for key, (cost, c) in self._elite_pool.items() if key in self._timings]
        return [c for _, c in sorted(mine, key=lambda t: t[0])[:k]]

    def best_cost(self) -> float:
        """The lowest cost of a measured candidate (each judged by `estimate`)."""
        return min((estimate(t) for t in self._timings.values() if t), default=float("inf"))

    def timings(self, key: str) -> int:
        """How many times the candidate was timed here (0: never)."""
        return len(self._timings.get(key, ()))

    def add_elite(self, candidate: Candidate, cost: float) -> None:
        """A good candidate known from an earlier run (``tune(warm_start=...)``).

        It seeds populations but is not marked measured: its cost comes from another run, so
        the search may measure it again, which puts it into this run's log with this run's
        timing (and replaces the old cost here).
        """
        if candidate.key not in self._elite_pool and np.isfinite(cost):
            self._elite_pool[candidate.key] = (cost, candidate)

    def _count_sketch(self, sketch: int, valid: bool) -> None:
        runs, ok = self._sketch_runs.get(sketch, (0, 0))
        self._sketch_runs[sketch] = (runs + 1, ok + int(valid))

    def unseen_sketches(self) -> list[int]:
        """Sketches without a valid timing yet, each given up after ``SKETCH_TRIES`` failed
        ones (a sketch whose every candidate fails must not hold slots for ever)."""
        runs = [self._sketch_runs.get(k, (0, 0)) for k in range(len(self.space.sketches))]
        return [k for k, (tried, ok) in enumerate(runs) if ok == 0 and tried < SKETCH_TRIES]

    def _of_sketch(self, sketch: int, tries: int = 16) -> Candidate | None:
        """The model's pick of a few fresh samples of ``sketch`` (for a sketch that has none
        in the pool)."""
        cands = [c for c in (self.space.instantiate(sketch, {}, self.rng) for _ in range(tries))
                 if c is not None and self._new(c.key)]
        if not cands:
            return None
        scores = self._score(cands)
        k = int(np.argmax(scores))
        return cands[k] if np.isfinite(scores[k]) else None

    def _new(self, key: str) -> bool:
        """Neither measured nor in flight: a candidate worth proposing."""
        return key not in self.measured and key not in self.pending

    def _elites(self) -> list[Candidate]:
        best = sorted(self._elite_pool.values(), key=lambda t: t[0])
        return [c for _, c in best[: self.options.elites]]

    def _random(self, n: int, tries: int | None = None) -> list[Candidate]:
        out: list[Candidate] = []
        for _ in range(tries or n * 4):
            if len(out) >= n:
                break
            c = self.space.sample(self.rng)
            if c is not None:
                out.append(c)
        return out

    def _score(self, cands: Sequence[Candidate]) -> np.ndarray:
        """The model's scores of ``cands`` (-inf for those whose steps do not lower)."""
        return self.model.predict([MeasureInput.of(self.task, c) for c in cands])

    def _local(self, best: Candidate, n: int, taken: Mapping[str, Candidate]) -> list[Candidate]:
        """Up to ``n`` new one-knob mutants of ``best`` that lower, each of another knob, the
        knobs least moved from this ``best`` first (random order among equals).

        Covering the knobs in turn, rather than drawing a knob each time, is what finds the one
        move out of a basin: GEMM 1024^3's seed 4 settled on a candidate whose one untried
        neighbour (the accumulator's compute_at, a choice of two) ran 10% faster, while its
        random local picks kept moving tiles (docs/benchmark-notes.md)."""
        moved = self._moved.setdefault(best.key, {})
        knobs = sorted((k for k, _ in best.params), key=lambda k: (moved.get(k, 0), self.rng.random()))
        found: list[tuple[str, Candidate]] = []
        for knob in knobs:
            if len(found) >= 2 * n:  # spares for those that do not lower
                break
            for _ in range(4):  # a knob of few values may need some tries for a new one
                m = self.space.mutate(best, self.rng, knob=knob)
                if m is not None and self._new(m.key) and m.key not in taken \
                        and all(m.key != c.key for _, c in found):
                    found.append((knob, m))
                    break
            else:  # no new neighbour along this knob (all measured, or none lowers)
                moved[knob] = moved.get(knob, 0) + 1
        if not found:
            return []
        scores = self._score([c for _, c in found])
        out = [(k, c) for (k, c), sc in zip(found, scores) if np.isfinite(sc)][:n]
        for knob, _ in out:
            moved[knob] = moved.get(knob, 0) + 1
        return [c for _, c in out]

    def _pick(self, ranked: Sequence[Candidate], weights: np.ndarray) -> Candidate:
        return ranked[int(self.rng.choice(len(ranked), p=weights))]

    def next_batch(self, n: int) -> list[Candidate]:
        """Up to ``n`` distinct candidates never measured before."""
        opt = self.options
        elites = self._elites()
        pop = elites + self._random(max(opt.population - opt.elites, opt.fresh_pool, 1))
        pool: dict[str, tuple[float, Candidate]] = {}
        fresh_scored: list[tuple[float, Candidate]] = []  # the first population's fresh samples
        for gen in range(opt.generations + 1):
            scores = self._score(pop)
            for k, (c, s) in enumerate(zip(pop, scores)):
                if self._new(c.key) and np.isfinite(s):
                    pool[c.key] = (float(s), c)
                    if gen == 0 and k >= len(elites):
                        fresh_scored.append((float(s), c))
            if gen == opt.generations:
                break
            alive = [(s, c) for s, c in zip(scores, pop) if np.isfinite(s)]
            if not alive:
                pop = self._random(opt.population)
                continue
            alive.sort(key=lambda t: -t[0])
            ranked = [c for _, c in alive]
            # rank-based selection: robust to the arbitrary scale of ranking scores
            w = 1.0 / (np.arange(len(ranked)) + 4.0)
            w /= w.sum()
            children: list[Candidate] = []
            for _ in range(opt.population * 3):
                if len(children) >= opt.population:
                    break
                a = self._pick(ranked, w)
                if self.rng.random() < opt.mutation_prob:
                    child = self.space.mutate(a, self.rng)
                else:
                    child = self.space.crossover(a, self._pick(ranked, w), self.rng)
                if child is not None:
                    children.append(child)
            pop = children
        ranked_pool = sorted(pool.values(), key=lambda t: -t[0])
        n_rand = int(round(n * opt.eps_greedy))
        unseen = self.unseen_sketches()
        n_cover = min(len(unseen), max(n // 2, 1))
        n_div = min(len(self.space.sketches) - 1, max(int(n * opt.sketch_share), n_cover))
        n_fresh = int(round(n * opt.fresh_share)) if self.model.trained else 0
        batch: dict[str, Candidate] = {}
        # the model's best fresh samples: exploration the model still guides. The evolved
        # candidates are mostly mutants of the elites, and a model trained on them knows that
        # basin best, so without this share a search can stay in the first basin it found
        # while better ones exist elsewhere. The pool is large (``fresh_pool``) because
        # screening is where a model beats chance: its top few of many unseen random samples
        # usually hold one close to the best of them (benchmarks/cost_model_eval.py), and a
        # smaller pool with fewer picks let searches spend most of their budget in one basin.
        # Figures: docs/benchmark-notes.md. The samples are also the evolution's first
        # population, so its parents are the model's picks of a wider draw.
        for _, c in sorted(fresh_scored, key=lambda t: -t[0]):
            if len(batch) >= n_fresh:
                break
            batch[c.key] = c
        for _, c in ranked_pool:
            if len(batch) >= n - n_rand - n_div:
                break
            batch.setdefault(c.key, c)
        # every sketch keeps a voice: the best-scored candidate of each sketch the model left
        # out. A model trained on a few early batches ranks whole structures low after a few
        # bad annotations of them, and would never measure the good ones (softmax's fused
        # sketch held schedules the model never tried; docs/benchmark-notes.md).
        present = {c.sketch for c in batch.values()}
        # first every sketch never timed (up to half a batch): the model's best candidate of
        # each, whatever it thinks of the sketch. With 8 sketches and 2 voices per batch, a
        # model that liked other sketches better left softmax's fused one untimed through all
        # 16 trials the task scheduler gave it in a BERT run, which ended at 0.60x PyTorch;
        # timed early, it reached 1.27-1.31x in three seeds (docs/benchmark-notes.md)
        best_of: dict[int, Candidate] = {}
        for _, c in ranked_pool:
            best_of.setdefault(c.sketch, c)
        covered = 0
        for k in (unseen[int(i)] for i in self.rng.permutation(len(unseen))):
            if covered >= n_cover or len(batch) >= n - n_rand:
                break
            if k in present:
                continue
            pick = best_of.get(k) or self._of_sketch(k)
            if pick is not None and pick.key not in batch:
                batch[pick.key] = pick
                present.add(k)
                covered += 1
        for _, c in ranked_pool:
            if len(batch) >= n - n_rand:
                break
            if c.sketch not in present and c.key not in batch:
                batch[c.key] = c
                present.add(c.sketch)
        for _, c in ranked_pool:  # sketches all present: the model's next best
            if len(batch) >= n - n_rand:
                break
            batch.setdefault(c.key, c)
        # the eps-greedy share, model-free: global random samples, or one-knob mutants of
        # the best measured candidate, its knobs in turn (`_local`). The model ranks a
        # basin's neighbours by what it learnt there and can stay blind to the one move out
        # (e.g. one tile factor moved to double the vector width; docs/benchmark-notes.md)
        best = self.best(1)
        n_local = sum(self.rng.random() < opt.local_prob for _ in range(n - len(batch))) if best else 0
        for c in self._local(best[0], n_local, batch) if n_local else ():
            batch[c.key] = c  # n_local <= n - len(batch): they all fit
        for c in self._random(n * 2, tries=n * 8):
            if len(batch) >= n:
                break
            if self._new(c.key) and c.key not in batch:
                batch[c.key] = c
        return list(batch.values())


class RandomSearch(EvolutionarySearch):
    """Random search: every batch is fresh samples of the space, nothing else.

    No evolution, no elites mutated, no model ranking -- the baseline a learned cost model
    must beat (``tune(cost_model="random")``). Candidates that do not lower are dropped
    before measuring (the model's ``predict`` gives them -inf), as the guided search drops
    them, so both spend their trials on candidates that compile. (An evolutionary search
    driven by random scores is `EvolutionarySearch` with a `RandomModel`: it still mutates the
    best measured candidates, which is local search, not random search.)
    """

    def next_batch(self, n: int) -> list[Candidate]:
        batch: dict[str, Candidate] = {}
        for _ in range(8):  # a space nearly exhausted gives few new samples per try
            fresh = [c for c in self._random(2 * n, tries=8 * n)
                     if self._new(c.key) and c.key not in batch]
            if fresh:
                for c, s in zip(fresh, self._score(fresh)):
                    if len(batch) < n and np.isfinite(s):
                        batch.setdefault(c.key, c)
            if len(batch) >= n:
                break
        return list(batch.values())


__all__ = ["EvolutionarySearch", "RandomSearch", "SearchOptions", "estimate"]

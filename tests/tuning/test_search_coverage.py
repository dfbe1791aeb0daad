"""Every sketch gets a timing early, whatever the cost model thinks of it."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import tuning_workloads as wl

from tuning import SearchTask
from tuning.cost_model import CostModel
from tuning.measure import MeasureErrorNo, MeasureInput, MeasureResult
from tuning.search import SKETCH_TRIES, EvolutionarySearch, SearchOptions
from tuning.space import Candidate


class _Prejudiced(CostModel):
    """Ranks every candidate of a higher sketch number below every one of a lower: the model
    of a search that learnt to like one structure early."""

    def update(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        pass

    def predict(self, candidates: Sequence[MeasureInput]) -> np.ndarray:
        return np.array([-float(c.sketch or 0) for c in candidates])


def _search(seed: int = 0) -> EvolutionarySearch:
    task = SearchTask(wl.softmax, (16, 64))
    return EvolutionarySearch(task, _Prejudiced(), np.random.default_rng(seed),
                              SearchOptions(population=16, generations=1, fresh_pool=64))


def _ok(cands: Sequence[Candidate], failing: int = -1) -> list[MeasureResult]:
    return [MeasureResult((), MeasureErrorNo.RUN_ERROR) if c.sketch == failing
            else MeasureResult((1e-3,), MeasureErrorNo.NO_ERROR) for c in cands]


def test_every_sketch_is_timed_within_the_first_batches() -> None:
    for seed in range(3):
        search = _search(seed)
        k = len(search.space.sketches)
        assert k >= 6  # softmax: enough sketches that two voices per batch would not reach all
        timed: set[int] = set()
        for _ in range(math.ceil(k / 4)):  # half of each batch of 8 goes to unseen sketches
            batch = search.next_batch(8)
            assert len(batch) == 8
            search.update(batch, _ok(batch))
            timed |= {c.sketch for c in batch}
        assert timed == set(range(k)), seed
        assert search.unseen_sketches() == []
        # all timed: the batch is the model's again (its best sketch), bar the reserved shares
        batch = search.next_batch(8)
        assert sum(c.sketch == 0 for c in batch) >= 8 - 1 - 2


def test_a_sketch_that_always_fails_stops_claiming_slots() -> None:
    search = _search()
    k = len(search.space.sketches)
    bad = k - 1  # the model's least liked: only the coverage rule proposes it
    tries = 0
    for _ in range(8):
        batch = search.next_batch(8)
        tries += sum(c.sketch == bad for c in batch)
        search.update(batch, _ok(batch, failing=bad))
    assert bad not in search.unseen_sketches()
    # given up after SKETCH_TRIES failures; later it comes back only through the other shares
    # (two voices for sketches absent from a batch, the random share), not every batch
    assert SKETCH_TRIES <= tries < 8 * 2


def test_resumed_records_count_as_timed() -> None:
    search = _search()
    rng = np.random.default_rng(1)
    for sketch in range(len(search.space.sketches)):
        c = search.space.instantiate(sketch, {}, rng)
        assert c is not None
        search.mark_measured(c.key, 1e-3, c)
    assert search.unseen_sketches() == []

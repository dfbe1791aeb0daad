"""A short cuda tuning run with the emulating test stand-in, shared by the GPU tuning tests:
tune, check every record is valid and stand-in timed, and that a record of the sketch under
test replays from its knobs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import tuning
from tuning.gpu_measure import STANDIN_TIMING, EmulatingRunner, GpuBuilder
from tuning.measure import MeasureErrorNo
from tuning.records import Record, load_records
from tuning.task import SearchTask


def tune_with_standin(task: SearchTask, log: Path, trials: int, batch_size: int, seed: int,
                      population: int, step_type: type[Any]) -> list[Record]:
    """Tune ``task`` for ``trials`` (the stand-in must be enabled: the ``standin`` fixture)
    and return the records that used ``step_type``, after the checks every such run shares."""
    builder, runner = GpuBuilder(n_workers=2), EmulatingRunner(timeout=60)
    try:
        (res,) = tuning.tune([task], trials=trials, batch_size=batch_size, log=str(log), seed=seed,
                             builder=builder, runner=runner, progress=False, remeasure=0,
                             search=tuning.SearchOptions(population=population, generations=1,
                                                         fresh_pool=population))
    finally:
        builder.close()
        runner.close()
    assert res.trials == trials and math.isfinite(res.best_cost)
    recs = load_records(str(log))
    assert len(recs) == trials and all(r.error == MeasureErrorNo.NO_ERROR for r in recs), \
        [r.error_msg for r in recs]
    mine = [r for r in recs if any(isinstance(s, step_type) for s in r.steps)]
    assert mine and all(r.timing == STANDIN_TIMING for r in mine)
    rec = mine[0]  # replays from its knobs
    c = task.make_space().instantiate(rec.sketch, dict(rec.params))  # type: ignore[arg-type]
    assert c is not None and c.key == rec.key
    return mine

"""tuning: the auto-scheduler of tecomp.

Give it a compute declaration and a target; it derives sketches from the DAG, fills them with
tile sizes and annotations by an evolutionary search guided by a learned cost model, measures
candidates through a `Builder` and a `Runner` (by default in isolated processes on this
machine, checking each against the default schedule), and logs every measurement with the
machine that made it, so a run can be resumed and its best schedule applied later.

>>> @tuning.register_workload
... def matmul(n, k, m):
...     A = te.placeholder((n, k), "float32", name="A")
...     B = te.placeholder((k, m), "float32", name="B")
...     r = te.reduce_axis((0, k), name="r")
...     return [A, B, te.compute((n, m), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")]
>>> task = tuning.SearchTask(matmul, args=(256, 1024, 512), target="llvm")   # doctest: +SKIP
>>> tuning.tune([task], trials=200, log="matmul.jsonl", seed=0)              # doctest: +SKIP
>>> s, args = task.apply_best("matmul.jsonl")                                # doctest: +SKIP

`tuning` imports tecomp; tecomp never imports tuning.
"""

from .cost_model import CostModel, RandomModel, XGBModel
from .distributed import RayRunner
from .machine import Machine
from .measure import BuildResult, LocalBuilder, LocalRunner, MeasureErrorNo, MeasureInput, MeasureResult
from .prepack import Prepacked, prepacked_best
from .protocols import Builder, Runner
from .ray_builder import RayBuilder
from .records import NoValidRecordError, apply_best, best_record, load_model_quality, load_records, load_tasks
from .scheduler import GradientTaskScheduler
from .search import SearchOptions
from .task import SearchTask, TuningError, register_workload
from .template import ConfigEntity, ConfigSpace, template
from .tune import AllCandidatesFailedError, TuneResult, tune, tune_report

__all__ = [
    "AllCandidatesFailedError", "BuildResult", "Builder", "ConfigEntity", "ConfigSpace", "CostModel",
    "GradientTaskScheduler", "LocalBuilder", "LocalRunner", "Machine", "MeasureErrorNo", "MeasureInput",
    "MeasureResult", "NoValidRecordError", "Prepacked", "RandomModel", "RayBuilder", "RayRunner", "Runner", "SearchOptions",
    "SearchTask", "TuneResult", "TuningError", "XGBModel", "apply_best", "best_record", "load_model_quality",
    "load_records", "load_tasks", "prepacked_best", "register_workload", "template", "tune", "tune_report",
]

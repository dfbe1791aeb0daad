"""Schedule -> loop nest -> pass pipeline."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..ir.stmt import PrimFunc
from ..te.schedule import Schedule
from .schedule_ops import lower_schedule


def lower(sch: Schedule, args: Sequence[Any], name: str = "main", passes: bool = True,
          debug: bool = False, target: Any = None, binds: Any = None) -> PrimFunc:
    """Lower ``sch`` with parameters ``args``; ``passes=False`` returns the raw loop nest.

    ``debug=True`` adds a bounds check per axis of every multi-dimensional access.
    ``target`` ("llvm" by default, or "cuda -arch=sm_80") decides what thread bindings and
    storage scopes mean and which pass pipeline runs. ``binds`` maps argument tensors to the
    buffers (``tc.tir.decl_buffer``) they are passed as (TVM's ``binds``).
    """
    from ..errors import TecompError

    if not isinstance(sch, Schedule):
        raise TecompError(f"lower: expected a te.Schedule, got {type(sch).__name__}")
    if not isinstance(args, (list, tuple)):
        raise TecompError("lower: args must be a list of tensors")
    from ..codegen.target import Target

    func = lower_schedule(sch, args, name, Target.parse(target) if target is not None else None,
                          binds)
    if passes:
        from ..passes.pipeline import run_pipeline

        func = run_pipeline(func, debug=debug)
    return func


__all__ = ["lower", "lower_schedule"]

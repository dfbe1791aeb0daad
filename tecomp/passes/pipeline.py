"""The ordered pass list that turns a freshly lowered loop nest into codegen-ready IR."""

from __future__ import annotations

from collections.abc import Callable

from ..ir.stmt import PrimFunc
from .flatten import flatten
from .inject_double_buffer import inject_double_buffer
from .inject_software_pipeline import inject_software_pipeline
from .inject_virtual_thread import inject_virtual_thread
from .loop_partition import loop_partition
from .simplify import simplify_func
from .storage_rewrite import storage_rewrite
from .thread_sync import thread_sync
from .transpose_copy import transpose_copy
from .unroll import unroll
from .vectorize import vectorize

Pass = Callable[[PrimFunc], PrimFunc]

# Order matters: partition needs the multi-dimensional guards before flattening mixes the
# indices; unroll before vectorize so unrolled copies of a vector body are each widened;
# flatten before vectorize so every index is one affine expression that becomes one Ramp;
# storage rewrite on flat 1-D local buffers; transposed copies after it, on flat indices and
# final loops, and the last simplification then tidies the block indices they build.
PIPELINE: list[tuple[str, Pass]] = [
    ("simplify", simplify_func),
    ("loop_partition", loop_partition),
    ("simplify", simplify_func),
    ("unroll", unroll),
    ("flatten", flatten),
    ("vectorize", vectorize),
    ("storage_rewrite", storage_rewrite),
    ("transpose_copy", transpose_copy),
    ("simplify", simplify_func),
]


# GPU kernels: no storage rewrite (its CPU stack-buffer reuse does not know shared memory),
# and barriers last, on the final statement structure. Double buffering right after the virtual
# threads (their copies then share one load of each tile, which is what gets pipelined) and
# before loop partition, which then cuts the pipelined loop at a ragged last tile (the doubled
# allocation sits outside the loop, so the cut copies share it).
# Software pipelining (cp.async rings, `pipeline(depth)`) at the same place, for the same reasons.
GPU_PIPELINE: list[tuple[str, Pass]] = [
    ("inject_virtual_thread", inject_virtual_thread),
    ("inject_double_buffer", inject_double_buffer),
    ("inject_software_pipeline", inject_software_pipeline),
    ("simplify", simplify_func),
    ("loop_partition", loop_partition),
    ("simplify", simplify_func),
    ("unroll", unroll),
    ("flatten", flatten),
    ("vectorize", vectorize),
    ("simplify", simplify_func),
    ("thread_sync", thread_sync),
]


def debug_pipeline() -> list[tuple[str, Pass]]:
    """PIPELINE with per-axis bounds checks inserted while indices are still N-dimensional."""
    from .bounds_check import insert_axis_checks

    at = [name for name, _ in PIPELINE].index("flatten")
    return [*PIPELINE[:at], ("axis_checks", insert_axis_checks), *PIPELINE[at:]]


def run_pipeline(func: PrimFunc, passes: list[tuple[str, Pass]] | None = None,
                 debug: bool = False) -> PrimFunc:
    kernels = func.attrs.get("kernels")
    if kernels is not None:  # a host function launching several GPU kernels: each is lowered
        attrs = dict(func.attrs)
        attrs["kernels"] = [run_pipeline(k, passes, debug) for k in kernels]
        return PrimFunc(func.name, func.params, func.body, func.dim_vars, attrs)
    if passes is None:
        gpu = func.attrs.get("target") is not None and func.attrs["target"].is_gpu
        passes = GPU_PIPELINE if gpu else debug_pipeline() if debug else PIPELINE
    for _name, p in passes:
        func = p(func)
    return func

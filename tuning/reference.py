"""The reference schedule that every candidate's outputs are checked against.

A task's default schedule (every stage at root, loops in declaration order) defines the
right answer, but it is slow where a tuning task is big: a GEMM's reduction innermost reads
B down a column, so 1024^3 took 10 s on a 2-core VM and 4096^3 would take ~11 minutes --
before the first candidate of a GPU tuning run is checked (an H100 run of
``tecomp tune matmul --args 4096 4096 4096 --target cuda`` logged nothing in 150 s).

`reference_schedule` computes the same values faster without changing any output element's
arithmetic: per root compute stage, its outermost spatial loop runs in parallel (spatial
iterations are independent), and when it has a reduction, its innermost spatial loop moves
inside the reduction loops, split by `VECTOR` and vectorized. Every output element still
accumulates its terms one at a time in the declared order; only *which* elements are in
flight together changes. A tuple reduction or a reduction with one spatial axis keeps its
loop order (it is only parallelised).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tecomp import te
from tecomp.te.tensor import ComputeOp

if TYPE_CHECKING:
    from .task import SearchTask

VECTOR = 8  # lanes of the moved spatial loop (an AVX2 vector of float32)


def reference_schedule(task: SearchTask) -> te.Schedule:
    """`SearchTask.create_schedule` with each root compute stage parallel over its outer
    spatial loop and, for reductions, vectorized over its inner spatial loop (module
    docstring). Its outputs are the default schedule's."""
    s = task.create_schedule()
    for st in list(s.stages):
        op = st.op
        if not isinstance(op, ComputeOp) or st.attach_type != "root" or not op.axis:
            continue
        spatial = list(op.axis)
        if op.reduce_axis and len(spatial) >= 2 and op.num_outputs == 1:
            inner = spatial[-1]
            jo, ji = st.split(inner, factor=VECTOR)
            st.reorder(*spatial[:-1], jo, *op.reduce_axis, ji)
            st.vectorize(ji)
        st.parallel(spatial[0])
    return s


__all__ = ["VECTOR", "reference_schedule"]

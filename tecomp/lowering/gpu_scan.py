"""te.scan on a cuda target: which threads each time step of a scan depends on.

A scan's kernel runs its serial time loop in every thread, around the thread-bound loops of
its update stages (as TVM's tutorial schedule does: the spatial axis split and bound to
blockIdx/threadIdx). Step ``t`` reads rows the threads wrote at earlier steps, so the loop is
correct without any synchronisation only when every thread reads back what it wrote itself:

* every read of a state (or of another stage of the scan body) in the body is at the reader's
  own spatial index (``s_state[t - 1, i]``, not ``s_state[t - 1, (i + 1) % n]``), and
* every stage of the body maps a spatial index to the same thread (identical splits and
  bindings), computing its values itself rather than through thread loops of its own.

Otherwise threads exchange values through global memory between steps. Within one block a
barrier after each stage of every step makes that correct (``__syncthreads`` orders global
memory for the block as it does shared memory); across blocks only a grid-wide sync could,
so a body bound to blockIdx is refused with a `LoweringError` naming the scan and the read.
"""

from __future__ import annotations

from ..arith.simplify import simplify
from ..errors import LoweringError
from ..ir.expr import Expr, IntImm, ProducerLoad, Var
from ..ir.functor import ExprVisitor, substitute
from ..te.scan import ScanOp
from ..te.schedule import Stage
from ..te.tensor import ComputeOp
from .bound import StageBounds


class _Reads(ExprVisitor):
    """Reads of the tensors of ``ops`` (by op identity)."""

    def __init__(self, ops: set[int]) -> None:
        self.ops = ops
        self.found: list[ProducerLoad] = []

    def visit_ProducerLoad(self, e: ProducerLoad) -> None:
        if id(e.producer.op) in self.ops:
            self.found.append(e)
        super().visit_ProducerLoad(e)


def _thread_tag(st: Stage, iv: object) -> str | None:
    a = st.iter_var_attrs.get(iv)  # type: ignore[call-overload]
    if a is None or a.bind_thread is None:
        return None
    return str(a.bind_thread.thread_tag)


def _cross_column_read(st: Stage, bodies: list[Expr], inner: set[int]) -> str | None:
    """A read in ``st``'s body of a scan-internal tensor at a spatial index other than the
    reader's own, as text; None when every such read stays in the reader's column."""
    op = st.op
    if not isinstance(op, ComputeOp):
        return f"stage {st.name}"
    v = _Reads(inner)
    for e in bodies:
        v.visit(e)
    own = [iv.var for iv in op.axis]
    for ld in v.found:
        if ld.producer.op is op or ld.producer.op is st.origin_op:
            continue  # a stage reading its own value (a reduction's accumulator)
        idx = [simplify(i) for i in ld.indices]
        if len(idx) != len(own) or any(not (isinstance(i, Var) and i is o)
                                      for i, o in zip(idx[1:], own[1:])):
            return f"{st.name} reads {ld.producer.name}[{', '.join(map(str, idx))}]"
    return None


def _thread_map(st: Stage, b: StageBounds) -> str:
    """Which thread computes which spatial index of ``st``: its spatial root values with each
    thread-bound leaf named by its tag and every other leaf by its position."""
    op = st.op
    assert isinstance(op, ComputeOp)
    names: dict[Var, Expr] = {}
    for k, iv in enumerate(st.leaf_iter_vars):
        tag = _thread_tag(st, iv)
        names[iv.var] = Var(tag if tag is not None else f"loop{k}", iv.var.dtype)
    return "; ".join(str(simplify(substitute(b.root_value(iv), names))) for iv in op.axis[1:])


def _own_threads(st: Stage) -> bool:
    return any(_thread_tag(st, iv) is not None for iv in st.leaf_iter_vars)


def _block_bound(st: Stage, b: StageBounds) -> str | None:
    """The first leaf of ``st`` bound to a blockIdx with an extent that may exceed 1."""
    for iv in st.leaf_iter_vars:
        tag = _thread_tag(st, iv)
        if tag is not None and tag.startswith("blockIdx"):
            ext = b.ext.get(iv)
            ext = simplify(ext) if ext is not None else None
            if not (isinstance(ext, IntImm) and ext.value == 1):
                return f"{iv.var.name} ({tag})"
    return None


def scan_step_needs_barrier(scan: Stage, roots: list[Stage], body: list[Stage],
                            bodies: dict[Stage, list[Expr]],
                            bounds: dict[Stage, StageBounds]) -> bool:
    """Whether the time steps of ``scan`` (root body stages ``roots``, all body stages
    ``body``) need a barrier after each stage; raises when they would need a grid sync."""
    op = scan.op
    assert isinstance(op, ScanOp)
    inner = {id(s.op) for s in op.state_placeholder}
    for st in body:
        inner |= {id(st.op), id(st.origin_op)}
    why: str | None = None
    for st in body:
        why = _cross_column_read(st, bodies.get(st, []), inner)
        if why is not None:
            why = f"{why}, a value of another column that another thread computes"
            break
    if why is None and len({_thread_map(st, bounds[st]) for st in roots}) > 1:
        why = ("its update stages " + ", ".join(st.name for st in roots) + " map columns to "
               "threads differently (split and bind their spatial axes alike)")
    if why is None:
        why = next((f"{st.name} binds its own threads inside the update" for st in body
                    if st not in roots and _own_threads(st)), None)
    if why is None:
        return False
    grid = next(((st, ax) for st in roots if (ax := _block_bound(st, bounds[st])) is not None),
                None)
    if grid is not None:
        raise LoweringError(
            f"scan {op.name}: on cuda each time step must see the previous step's values of "
            f"other threads, but {why}; with the spatial axis bound to blockIdx "
            f"({grid[0].name}: {grid[1]}) that needs a grid-wide sync between steps, which a "
            "kernel does not have. Bind the spatial axis to threadIdx only (one block; a barrier "
            "then separates the steps), or make each column depend on itself only")
    return True


__all__ = ["scan_step_needs_barrier"]

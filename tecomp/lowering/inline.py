"""Compute-inline at the declaration level: substitute inlined stages into their readers."""

from __future__ import annotations

from ..ir.expr import Expr, ProducerLoad, Var
from ..ir.functor import ExprMutator, substitute
from ..te.schedule import Schedule, Stage
from ..te.tensor import ComputeOp


class _Inliner(ExprMutator):
    def __init__(self, sch: Schedule, bodies: dict[Stage, list[Expr]]) -> None:
        self.sch = sch
        self.bodies = bodies

    def visit_ProducerLoad(self, e: ProducerLoad) -> Expr:
        idx = tuple(self.visit(i) for i in e.indices)
        st = self.sch._by_op.get(e.producer.op)
        if st is not None and st.attach_type == "inline":
            op = st.op
            assert isinstance(op, ComputeOp)
            body = self.bodies[st][e.producer.value_index]
            vmap: dict[Var, Expr] = {iv.var: i for iv, i in zip(op.axis, idx)}
            return substitute(body, vmap)  # type: ignore[no-any-return]
        if all(x is y for x, y in zip(idx, e.indices)):
            return e
        return ProducerLoad(e.producer, idx)


def effective_bodies(sch: Schedule) -> dict[Stage, list[Expr]]:
    """Each compute stage's body with every inlined producer substituted (topological order)."""
    bodies: dict[Stage, list[Expr]] = {}
    inl = _Inliner(sch, bodies)
    for st in sch.stages:
        if isinstance(st.op, ComputeOp):
            bodies[st] = [inl.visit(b) for b in st.op.body]
    return bodies

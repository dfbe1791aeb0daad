"""Recurrences over a time axis (TVM's ``te.scan`` / ScanOp).

``scan(init, update, state_placeholder)``: output ``k`` has the shape of
``state_placeholder[k]``; its first ``init[k].shape[0]`` rows are ``init[k]``, and row ``t`` after
them is ``update[k]`` at ``t``, which may read earlier rows of the states through
``state_placeholder[k][t - 1, ...]``. As in TVM, init, update and the states all write and read
one buffer (the scan's output); lowering runs the stages between the states and the updates (the
scan body) inside one serial loop over ``t``, each computing its row ``t``. The update stages
are scheduled like any compute stage (split/parallel of their other axes, compute_at of body
stages into them); the scan stage itself has no loops to schedule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..arith.simplify import simplify
from ..errors import TecompError
from ..ir.expr import IntImm
from .tensor import AxisVar, IterVar, IterVarKind, Operation, PlaceholderOp, Range, Tensor


class ScanOp(Operation):
    """``scan_axis`` runs over ``[init length, time extent)``; see the module docstring."""

    def __init__(self, name: str, tag: str, attrs: dict[str, Any] | None, scan_axis: IterVar,
                 init: list[Tensor], update: list[Tensor], state_placeholder: list[Tensor],
                 inputs: list[Tensor]) -> None:
        self.name = name
        self.tag = tag
        self.attrs = dict(attrs or {})
        self.scan_axis = scan_axis
        self.init = init
        self.update = update
        self.state_placeholder = state_placeholder
        self.inputs = inputs
        self.outputs = [Tensor(tuple(s.shape), s.dtype, self, k)
                        for k, s in enumerate(state_placeholder)]

    @property
    def num_outputs(self) -> int:
        return len(self.outputs)

    @property
    def input_tensors(self) -> list[Tensor]:
        # TVM: the init and update tensors (the inputs reach the schedule through them)
        return [*self.init, *self.update]


def _as_list(x: Any, what: str) -> list[Tensor]:
    items = list(x) if isinstance(x, (list, tuple)) else [x]
    for k, t in enumerate(items):
        if not isinstance(t, Tensor):
            raise TecompError(f"scan: {what}[{k}] must be a te.Tensor, got {type(t).__name__}")
    return items


def _same(a: Any, b: Any) -> bool | None:
    """Are two extents equal (None: cannot tell, e.g. different symbolic expressions)?"""
    d = simplify(a - b)
    if isinstance(d, IntImm):
        return d.value == 0
    return None


def scan(init: Tensor | Sequence[Tensor], update: Tensor | Sequence[Tensor],
         state_placeholder: Tensor | Sequence[Tensor], inputs: Sequence[Tensor] | None = None,
         name: str = "scan", tag: str = "", attrs: dict[str, Any] | None = None) -> Any:
    """A recurrence over the first axis (TVM's ``te.scan``); one Tensor per state, a list of
    them for several states."""
    inits = _as_list(init, "init")
    updates = _as_list(update, "update")
    states = _as_list(state_placeholder, "state_placeholder")
    ins = _as_list(inputs, "inputs") if inputs is not None else []
    if not (len(inits) == len(updates) == len(states)) or not states:
        raise TecompError(f"scan {name}: init, update and state_placeholder must have the same "
                          f"number of tensors, got {len(inits)}, {len(updates)}, {len(states)}")
    for k, (i, u, s) in enumerate(zip(inits, updates, states)):
        if not isinstance(s.op, PlaceholderOp):
            raise TecompError(f"scan {name}: state_placeholder[{k}] ({s.name}) must be a "
                              "te.placeholder")
        if not s.shape:
            raise TecompError(f"scan {name}: state {s.name} needs a time axis (rank >= 1)")
        for t, what in ((i, "init"), (u, "update")):
            if len(t.shape) != len(s.shape):
                raise TecompError(
                    f"scan {name}: {what}[{k}] ({t.name}) has {len(t.shape)} dimensions, state "
                    f"{s.name} has {len(s.shape)}")
            if t.dtype != s.dtype:
                raise TecompError(f"scan {name}: {what}[{k}] ({t.name}) is {t.dtype}, state "
                                  f"{s.name} is {s.dtype}")
            for d in range(1, len(s.shape)):
                if _same(t.shape[d], s.shape[d]) is False:
                    raise TecompError(
                        f"scan {name}: dimension {d} of {what}[{k}] ({t.name}) is {t.shape[d]}, "
                        f"state {s.name} has {s.shape[d]}")
        if _same(u.shape[0], s.shape[0]) is False:
            raise TecompError(f"scan {name}: the time extent of update[{k}] ({u.name}) is "
                              f"{u.shape[0]}, state {s.name} has {s.shape[0]}")
        if _same(i.shape[0], inits[0].shape[0]) is False:
            raise TecompError(f"scan {name}: every init must have the same time extent")
    t0 = inits[0].shape[0]
    ext = simplify(updates[0].shape[0] - t0)
    axis = IterVar(Range(t0, ext), AxisVar(f"{name}.idx", "int32"), IterVarKind.OPAQUE)
    op = ScanOp(name, tag, attrs, axis, inits, updates, states, ins)
    return op.outputs[0] if len(op.outputs) == 1 else op.outputs


def scan_body(op: ScanOp, by_op: dict[Operation, Any]) -> list[Any]:
    """The stages (values of ``by_op``) of the operations between ``op``'s states and its
    updates, updates included (TVM's ScanGetBody): what runs once per time step."""
    states = {id(s.op) for s in op.state_placeholder}
    memo: dict[int, bool] = {}

    def reaches(o: Operation) -> bool:
        key = id(o)
        if key in states:
            return True
        if key not in memo:
            memo[key] = False  # cycles cannot happen in a DAG; this just stops recursion
            memo[key] = any(reaches(t.op) for t in o.input_tensors)
        return memo[key]

    out: list[Any] = []
    for u in op.update:
        todo = [u.op]
        while todo:
            o = todo.pop()
            st = by_op.get(o)
            if id(o) in states or st is None or st in out or (o is not u.op and not reaches(o)):
                continue
            out.append(st)
            todo.extend(t.op for t in o.input_tensors)
    return out


__all__ = ["ScanOp", "scan", "scan_body"]

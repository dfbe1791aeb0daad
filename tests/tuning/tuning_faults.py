"""Test-only steps that make a candidate misbehave when run (crash, hang, wrong answer).

They rewrite the body of an elementwise stage; the tuner treats them like any other step,
which is the point: the measurement pipeline must survive whatever a schedule does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import tecomp as tc
from tecomp import te
from tecomp.ir.expr import Expr
from tecomp.te.tensor import ComputeOp
from tuning.steps import State, Step


def _rewrite(state: State, stage: str, extra: Expr) -> None:
    st = state.stage(stage)
    op = st.op
    assert isinstance(op, ComputeOp) and not op.reduce_axis
    new = ComputeOp(op.name, op.axis, [op.body[0] + extra], op.tag, op.attrs)
    state.sch._replace_op(st, new, keep_axes=True)


@dataclass(frozen=True)
class CrashStep(Step):
    """Raises SIGSEGV inside the kernel (as an out-of-bounds write would)."""

    KIND: ClassVar[str] = "test_crash"

    def apply(self, state: State) -> None:
        _rewrite(state, self.stage, te.call_extern("int32", "raise", 11).astype("float32"))


@dataclass(frozen=True)
class HangStep(Step):
    """Never returns in useful time: the kernel sleeps for an hour."""

    KIND: ClassVar[str] = "test_hang"

    def apply(self, state: State) -> None:
        _rewrite(state, self.stage, te.call_extern("int32", "sleep", 3600).astype("float32"))


@dataclass(frozen=True)
class WrongStep(Step):
    """Computes a different function (adds 0.5 more than the declaration says)."""

    KIND: ClassVar[str] = "test_wrong"

    def apply(self, state: State) -> None:
        _rewrite(state, self.stage, tc.const(0.5, "float32"))


@dataclass(frozen=True)
class ExitStep(Step):
    """Kills the process replaying it (the builder), after saying why on stderr."""

    KIND: ClassVar[str] = "test_exit"

    def apply(self, state: State) -> None:
        import os
        import sys

        sys.stderr.write("ExitStep: the builder gives up here\n")
        sys.stderr.flush()
        os._exit(3)

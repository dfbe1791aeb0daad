"""Templates shared by the template tests (module level: measurement workers import them)."""

from __future__ import annotations

from typing import Any

import tuning
from tecomp import te
from tecomp.errors import ScheduleError


def _matmul(n: int, m: int, k: int) -> tuple[te.Tensor, te.Tensor, te.Tensor]:
    A = te.placeholder((n, k), "float32", name="A")
    B = te.placeholder((k, m), "float32", name="B")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    return A, B, C


@tuning.template
def matmul_tmpl(cfg: Any, n: int, m: int, k: int) -> tuple[te.Schedule, list[te.Tensor]]:
    A, B, C = _matmul(n, m, k)
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    (r,) = s[C].op.reduce_axis
    cfg.define_split("tile_i", i, num_outputs=3)
    cfg.define_split("tile_j", j, num_outputs=2, policy="power2")
    cfg.define_knob("unroll", [0, 1])
    io, im, ii = cfg["tile_i"].apply(s, C, i)
    jo, ji = cfg["tile_j"].apply(s, C, j)
    s[C].reorder(io, jo, im, r, ii, ji)
    if cfg["unroll"].val:
        s[C].unroll(ii)
    return s, [A, B, C]


@tuning.template
def split_only(cfg: Any, n: int) -> tuple[te.Schedule, list[te.Tensor]]:
    """One knob: a split of ``n`` into two (``n = 64``: 7 configs)."""
    A = te.placeholder((n,), "float32", name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0, name="B")
    s = te.create_schedule(B.op)
    cfg.define_split("t", s[B].op.axis[0], num_outputs=2)
    cfg["t"].apply(s, B, s[B].op.axis[0])
    return s, [A, B]


@tuning.template
def vector_knob(cfg: Any, n: int) -> tuple[te.Schedule, list[te.Tensor]]:
    """A knob whose value 3 makes the schedule invalid (a tecomp error, so no candidate)."""
    A = te.placeholder((n,), "float32", name="A")
    B = te.compute((n,), lambda i: A[i] + 1.0, name="B")
    s = te.create_schedule(B.op)
    cfg.define_knob("v", [1, 2, 3, 4])
    cfg.define_knob("mode", ["a", "b"])
    if cfg["v"].val == 3:
        raise ScheduleError("v=3 is rejected on purpose")
    if cfg["v"].val > 1:
        _, inner = s[B].split(s[B].op.axis[0], factor=cfg["v"].val)
        s[B].vectorize(inner)
    return s, [A, B]


@tuning.template
def reads_undefined(cfg: Any, n: int) -> tuple[te.Schedule, list[te.Tensor]]:
    A = te.placeholder((n,), "float32", name="A")
    B = te.compute((n,), lambda i: A[i] + 1.0, name="B")
    cfg.define_knob("x", [0, 1])
    if cfg["nope"].val:
        pass
    return te.create_schedule(B.op), [A, B]


@tuning.template
def defines_twice(cfg: Any, n: int) -> tuple[te.Schedule, list[te.Tensor]]:
    A = te.placeholder((n,), "float32", name="A")
    B = te.compute((n,), lambda i: A[i] + 1.0, name="B")
    cfg.define_knob("x", [0, 1])
    cfg.define_knob("x", [0, 1])  # the same definition again is harmless
    cfg.define_knob("x", [0, 2])
    return te.create_schedule(B.op), [A, B]


@tuning.template
def bad_default(cfg: Any, n: int) -> tuple[te.Schedule, list[te.Tensor]]:
    te.placeholder((n,), "float32", name="A")
    cfg.define_knob("x", [0, 1])
    raise ScheduleError("never valid")

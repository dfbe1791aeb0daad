"""Features of a lowered loop nest: the traffic estimates by cache tier, checked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tecomp import te
from tecomp.lowering import lower
from tuning import workloads
from tuning.features import CAPACITIES, N_FEATURES, PROGRAM_FEATURES, TRAFFIC, program_features


def _features(s: te.Schedule, args: list[te.Tensor]) -> dict[str, float]:
    f = program_features(lower(s, args, name="f", passes=False).body)
    assert f.shape == (N_FEATURES,) and np.isfinite(f).all()
    return dict(zip(PROGRAM_FEATURES, f.tolist()))


def _l(x: float) -> float:
    return math.log2(1.0 + x)


def test_traffic_of_an_elementwise_nest_by_hand() -> None:
    A = te.placeholder((64, 64), name="A")
    B = te.placeholder((64, 64), name="B")
    C = te.compute((64, 64), lambda i, j: A[i, j] + B[i, j], name="C")
    f = _features(te.create_schedule(C.op), [A, B, C])
    # inside j: one row of each buffer (3 x 256 B); inside i: the whole arrays (3 x 16 KiB)
    assert CAPACITIES[0] < 3 * 16384 <= CAPACITIES[1]
    # registers (2 KiB): the rows fit, reloaded for each of 64 rows
    assert f["s0.c0.working_set"] == pytest.approx(_l(768))
    assert f["s0.c0.fit_depth"] == 1
    assert f["s0.c0.traffic"] == pytest.approx(_l(64 * 768))
    # L1 (48 KiB): the whole 48 KiB nest fits, loaded once
    assert f["s0.c1.working_set"] == pytest.approx(_l(3 * 16384))
    assert f["s0.c1.fit_depth"] == 2
    assert f["s0.c1.traffic"] == pytest.approx(_l(3 * 16384))
    # one add per element over the bytes moved
    assert f["s0.c1.intensity"] == pytest.approx(_l(4096 / (3 * 16384)))


def _matmul_blocked(kb: int) -> dict[str, float]:
    """256^3 matmul with a 4x16 register tile; only the reduction's split differs."""
    A, B, C = workloads.matmul(256, 256, 256)
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    io, jo, ii, ji = s[C].tile(i, j, 4, 16)
    ro, ri = s[C].split(s[C].op.reduce_axis[0], factor=kb)
    s[C].reorder(ro, io, jo, ri, ii, ji)
    return _features(s, [A, B, C])


def test_traffic_sees_a_reduction_split_above_the_innermost_loop() -> None:
    # The innermost loops are the same, so the per-access features (innermost stride,
    # whole-nest footprint) are the same; of the loop and access features only the outermost
    # extent and C's reuse count (the extent of ri) move. What also changes is how much of A
    # and B one iteration of the loops above touches, so how often data comes back.
    small, big = _matmul_blocked(8), _matmul_blocked(256)
    tiers = {f"s0.{t}" for t in TRAFFIC}
    differ = {k for k in PROGRAM_FEATURES if small[k] != big[k]}
    assert differ - tiers == {"s0.outer_extent", "s0.b0.reuse_ct"}
    assert len(differ & tiers) == 8  # registers and L1: traffic, working set, depth, intensity
    # kb=8, loops ro(32) io(64) jo(16) ri(8) ii(4) ji(16). Inside ri: A 4x8, B 8x16, C 4x16
    # floats = 896 B, the outermost that fits 2 KiB, entered 32*64*16 times. Inside jo:
    # A 4x8 + B 8x256 + C 4x256 = 12416 B fits 48 KiB, entered 32*64 times.
    assert small["s0.c0.working_set"] == pytest.approx(_l(896))
    assert small["s0.c0.traffic"] == pytest.approx(_l(32 * 64 * 16 * 896))
    assert small["s0.c1.working_set"] == pytest.approx(_l(12416))
    assert small["s0.c1.traffic"] == pytest.approx(_l(32 * 64 * 12416))
    # kb=256, loops ro(1) io(64) jo(16) ri(256) ii(4) ji(16): inside ri the A and B panels are
    # 20 KiB, so only the 336 B inside ii fits 2 KiB (entered 64*16*256 times); 20736 B
    # inside ri fits 48 KiB, entered 64*16 times
    assert big["s0.c0.working_set"] == pytest.approx(_l(336))
    assert big["s0.c0.traffic"] == pytest.approx(_l(64 * 16 * 256 * 336))
    assert big["s0.c1.traffic"] == pytest.approx(_l(64 * 16 * 20736))
    # 768 KiB in all: both fit L2 and L3 whole and load everything once
    for tier in (2, 3):
        assert small[f"s0.c{tier}.traffic"] == big[f"s0.c{tier}.traffic"] == pytest.approx(_l(3 * 256 * 256 * 4))

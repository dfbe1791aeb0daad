"""`benchmarks/peak.py`'s `PeakBeside`: the FMA peak kernel timed beside a benchmark's rounds
computes what it claims and reports the best of its samples."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))

import peak  # noqa: E402


def test_the_peak_beside_a_benchmark_is_its_best_sample_of_a_kernel_that_computes() -> None:
    beside = peak.PeakBeside(threads=2)
    a, b, c = beside.args
    ref = (a.T.astype(np.float64) @ b.astype(np.float64)) * 2048  # its reduction repeats 2048 times
    for t in range(c.shape[0]):
        np.testing.assert_allclose(c[t], ref, rtol=1e-2)
    assert beside.flops == 2.0 * c.size * a.shape[0] * 2048
    first = beside.gflops  # a first sample when there is none
    assert first > 0 and len(beside.samples) == 1
    beside.sample()
    beside.sample()
    assert len(beside.samples) == 3 and beside.gflops == max(beside.samples)
    assert beside.note(beside.gflops / 2) == f"50.0% of FMA peak ({beside.gflops:.1f} GFLOP/s beside)"
    beside.restart()
    assert beside.samples == []


def test_the_peak_beside_is_of_a_cpu_and_of_the_threads_asked_for() -> None:
    with pytest.raises(ValueError, match="not a CPU target"):
        peak.PeakBeside(target="cuda")
    one = peak.PeakBeside(threads=1)
    assert one.args[2].shape[0] == 1 and one.sample() > 0  # one chunk: one thread's peak

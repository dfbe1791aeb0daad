"""Timing helper shared by the benchmark scripts (numpy/PyTorch side of each comparison)."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_of(fn: Callable[[], object], repeat: int = 5, number: int = 3) -> float:
    """Best mean seconds per call of ``fn`` over ``repeat`` rounds of ``number`` calls (after a warm-up)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best

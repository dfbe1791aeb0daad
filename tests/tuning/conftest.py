"""Shared fixtures of the tuning tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tuning import LocalBuilder, LocalRunner


@pytest.fixture(scope="module")
def pools() -> Iterator[tuple[LocalBuilder, LocalRunner]]:
    """Build/measure worker pools for end-to-end tuning, started once per test module."""
    builder, runner = LocalBuilder(n_workers=2), LocalRunner(timeout=10.0, min_repeat_ms=5.0)
    yield builder, runner
    builder.close()
    runner.close()

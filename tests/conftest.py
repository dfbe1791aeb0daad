"""Make the repository root importable so the tests run from a plain checkout."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu`` tests, with the reason, where no CUDA device can run them."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    from tecomp.runtime.cuda import cuda_available

    ok, reason = cuda_available()
    if not ok:
        for item in gpu:
            item.add_marker(pytest.mark.skip(reason=f"no usable CUDA GPU: {reason}"))

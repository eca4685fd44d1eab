"""GPU tier: runs where torch is built with CUDA and the driver shows a GPU; skips elsewhere
(CI has none). The controller never starts CUDA itself: workers own the GPUs."""

from __future__ import annotations

import pytest
from support import gpus_here

GPUS = gpus_here()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if GPUS:
        return
    reason = "needs an NVIDIA GPU and a CUDA build of torch (this machine has none)"
    for item in items:
        if "tests/gpu/" in str(item.path):
            item.add_marker(pytest.mark.skip(reason=reason))

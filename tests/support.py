"""Helpers for tests: waiting on conditions with deadlines (never sleeping as synchronisation),
and which GPUs this machine gives the ranks."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` until it is true; raise with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def gpus_here() -> list[str]:
    """The GPUs ranks can use here (``CUDA_VISIBLE_DEVICES`` names); none without a CUDA build
    of torch. Read without starting CUDA in the test process."""
    import torch

    from actormesh.runtime.procs.osutil import visible_gpus

    return visible_gpus() if torch.backends.cuda.is_built() else []

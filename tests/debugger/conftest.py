"""Debugger tier: real kernels (jupyter_client) with real ranks, driven through ``%mesh dbg``.

Reuses the kernel tier's fixtures: the kernelspec installed once per session and the ``Kernel``
wrapper whose teardown checks that every process of the kernel is gone.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("debugpy")

from kernel.conftest import kernelspec
from kernel_support import Kernel, spawn_code, start_kernel

assert kernelspec  # the session fixture, registered for this directory by importing it


@pytest.fixture(scope="module")
def dbg4() -> Iterator[Kernel]:
    """A kernel with a 4-rank mesh ``procs`` whose executors are up."""
    k = start_kernel()
    try:
        k.ok(spawn_code(4))
        k.ok("%%mesh procs\nimport torch")
        yield k
    finally:
        k.shutdown()

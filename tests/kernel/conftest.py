"""Kernel tier: real kernels driven through jupyter_client, notebooks through nbclient.

The "actormesh" kernelspec is installed once per session by the CLI
(``python -m actormesh install-kernel --prefix TMP``) and found through ``JUPYTER_PATH``, so the
tests do not depend on what pip installed where. Every kernel a test starts is shut down by its
fixture, which then waits (with a deadline) until the kernel's whole process tree is gone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

pytest.importorskip("ipykernel")
pytest.importorskip("jupyter_client")

from kernel_support import Kernel, spawn_code, start_kernel
from panel_support import Panel
from support import wait_until


@pytest.fixture(scope="session", autouse=True)
def kernelspec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    prefix = tmp_path_factory.mktemp("jupyter-prefix")
    subprocess.run(
        [sys.executable, "-m", "actormesh", "install-kernel", "--prefix", str(prefix)],
        check=True,
        timeout=60,
        capture_output=True,
    )
    path = str(prefix / "share" / "jupyter")
    mp = pytest.MonkeyPatch()
    mp.setenv("JUPYTER_PATH", os.pathsep.join([path, os.environ.get("JUPYTER_PATH", "")]))
    mp.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # quiets the kernel's debugpy warning
    yield path
    mp.undo()


@pytest.fixture
def kernel() -> Iterator[Kernel]:
    """A fresh actormesh kernel for this test, shut down (and checked gone) afterwards."""
    k = start_kernel()
    try:
        yield k
    finally:
        k.shutdown()


@pytest.fixture
def panel_kernel() -> Iterator[tuple[Kernel, Panel]]:
    """A fresh kernel and a sidebar client subscribed to nothing yet, both closed afterwards."""
    k = start_kernel()
    p = Panel(k)
    try:
        yield k, p
    finally:
        p.close()
        k.shutdown()


@pytest.fixture(scope="module")
def kernel4() -> Iterator[Kernel]:
    """One kernel per module with a 4-rank mesh ``procs`` (made before any test looks for
    leaked processes, so the mesh counts as already there)."""
    k = start_kernel()
    try:
        k.ok(spawn_code(4))
        wait_until(lambda: len(k.tree()) >= 7, 30, "the kernel's agent, fork server and workers")
        # Executors up and IPython.display imported on every rank: the first cell of a test
        # then does not pay for them, so ranks print their lines close together.
        k.ok("%%mesh procs\nimport IPython.display")
        yield k
    finally:
        k.shutdown()

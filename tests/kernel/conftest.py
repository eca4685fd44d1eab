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
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil
import pytest

pytest.importorskip("ipykernel")
pytest.importorskip("jupyter_client")

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager, start_new_kernel
from support import wait_until

STARTUP_TIMEOUT = 60
CELL_TIMEOUT = 60


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


@dataclass
class Result:
    """What one execute request produced."""

    reply: dict[str, Any]
    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> str:
        return str(self.reply["content"]["status"])

    @property
    def ename(self) -> str:
        return str(self.reply["content"].get("ename", ""))

    def stream(self, name: str = "stdout") -> str:
        return "".join(
            m["content"]["text"]
            for m in self.messages
            if m["msg_type"] == "stream" and m["content"]["name"] == name
        )

    @property
    def error(self) -> dict[str, Any] | None:
        for m in self.messages:
            if m["msg_type"] == "error":
                return dict(m["content"])
        return None

    @property
    def traceback(self) -> str:
        err = self.error
        return "" if err is None else "\n".join(err["traceback"])

    @property
    def value(self) -> str | None:
        for m in self.messages:
            if m["msg_type"] == "execute_result":
                return str(m["content"]["data"]["text/plain"])
        return None

    def displays(self) -> list[dict[str, Any]]:
        return [
            dict(m["content"]["data"]) for m in self.messages if m["msg_type"] == "display_data"
        ]


class Kernel:
    """A started kernel and its blocking client."""

    def __init__(self, km: KernelManager, kc: BlockingKernelClient) -> None:
        self.km = km
        self.kc = kc

    @property
    def pid(self) -> int:
        provisioner = self.km.provisioner
        assert provisioner is not None
        pid = getattr(provisioner, "pid", None) or provisioner.process.pid  # type: ignore[attr-defined]
        return int(pid)

    def tree(self) -> list[int]:
        """The kernel and every process below it (host agent, fork server, workers)."""
        try:
            kernel = psutil.Process(self.pid)
            return [self.pid, *(p.pid for p in kernel.children(recursive=True))]
        except psutil.Error:
            return []

    def execute(
        self,
        code: str,
        timeout: float = CELL_TIMEOUT,
        on_message: Callable[[dict[str, Any]], None] | None = None,
    ) -> Result:
        messages: list[dict[str, Any]] = []

        def hook(msg: dict[str, Any]) -> None:
            messages.append(msg)
            if on_message is not None:
                on_message(msg)

        reply = self.kc.execute_interactive(code, timeout=timeout, output_hook=hook)
        return Result(reply, messages)

    def ok(self, code: str, timeout: float = CELL_TIMEOUT) -> Result:
        result = self.execute(code, timeout)
        assert result.status == "ok", (
            f"{code!r} failed:\n{result.traceback}{result.stream('stderr')}"
        )
        return result

    def shutdown(self) -> None:
        tree = self.tree()
        try:
            self.kc.stop_channels()
            if self.km.has_kernel:
                self.km.shutdown_kernel(now=False)
        finally:
            wait_gone(tree, 30, "the kernel's processes to exit after shutdown")


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            continue
    return out


def wait_gone(pids: list[int], timeout: float, what: str) -> None:
    wait_until(lambda: not alive(pids), timeout, f"{what} (left: {alive(pids)})")


def start_kernel(name: str = "actormesh") -> Kernel:
    km, kc = start_new_kernel(kernel_name=name, startup_timeout=STARTUP_TIMEOUT)
    return Kernel(km, kc)


def spawn_code(n: int = 4, name: str = "procs") -> str:
    return f"import actormesh as am\n{name} = am.this_host().spawn_procs(per_host={{'gpus': {n}}})"


@pytest.fixture
def kernel() -> Iterator[Kernel]:
    """A fresh actormesh kernel for this test, shut down (and checked gone) afterwards."""
    k = start_kernel()
    try:
        yield k
    finally:
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


def wait_for_output(result_messages: list[dict[str, Any]], text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(m["msg_type"] == "stream" and text in m["content"]["text"] for m in result_messages):
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for output {text!r}")

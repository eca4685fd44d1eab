"""Helpers for tests that drive real kernels through jupyter_client (kernel, debugger tiers).

A module of its own, not a conftest: pytest names every directory's conftest "conftest", so
tests could not import helpers from two of them in one run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager, start_new_kernel
from support import wait_until

STARTUP_TIMEOUT = 60
CELL_TIMEOUT = 60


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

"""Fake hosts for multi-host tests: network namespaces on a bridge (scripts/fakehosts/*.sh).

Each host has its own network stack and IP address but shares the file system and the host
name, like containers do; processes run "on" host i through ``ip netns exec``. Faults: kill
every process of a host (``kill_host``), unplug it from the switch (``cut_link``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parents[2] / "scripts" / "fakehosts"


def skip_reason() -> str | None:
    if sys.platform != "linux":
        return "fake hosts are Linux network namespaces"
    if os.geteuid() != 0:
        return "fake hosts need root (ip netns add); CI runs as root"
    if shutil.which("ip") is None:
        return "fake hosts need iproute2's `ip`"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {probe.stderr.strip()}"
    return None


class FakeNet:
    """``n`` fake hosts ``prefix-h0..`` at ``subnet.10+i``; this namespace is ``subnet.1``."""

    def __init__(self, n: int) -> None:
        tag = os.getpid() % 10000
        self.prefix = f"am{tag}"
        self.subnet = f"10.{201 + tag % 50}.{tag % 250}"
        self.n = n
        self.controller_ip = f"{self.subnet}.1"
        subprocess.run(
            ["bash", str(SCRIPTS / "down.sh"), self.prefix], check=False, capture_output=True
        )
        subprocess.run(
            ["bash", str(SCRIPTS / "up.sh"), self.prefix, self.subnet, str(n)],
            check=True,
            capture_output=True,
        )

    def ns(self, i: int) -> str:
        return f"{self.prefix}-h{i}"

    def ip(self, i: int) -> str:
        return f"{self.subnet}.{10 + i}"

    def popen(self, i: int, cmd: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        """Start ``cmd`` on host ``i`` (the process is our child: ``ip netns exec`` execs)."""
        return subprocess.Popen(["ip", "netns", "exec", self.ns(i), *cmd], **kwargs)  # type: ignore[call-overload]

    def pids(self, i: int) -> list[int]:
        out = subprocess.run(
            ["ip", "netns", "pids", self.ns(i)], capture_output=True, text=True, check=False
        ).stdout
        return [int(p) for p in out.split()]

    def kill_host(self, i: int) -> None:
        for pid in self.pids(i):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass

    def cut_link(self, i: int) -> None:
        subprocess.run(
            ["ip", "-n", f"{self.prefix}-sw", "link", "set", f"p{i}", "down"], check=True
        )

    def restore_link(self, i: int) -> None:
        subprocess.run(["ip", "-n", f"{self.prefix}-sw", "link", "set", f"p{i}", "up"], check=True)

    def down(self) -> None:
        subprocess.run(["bash", str(SCRIPTS / "down.sh"), self.prefix], check=False)


def require_fake_hosts() -> None:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)

"""The controller's handle on one host agent (``AgentHandle``): its process (when the controller
started it), its address once it is up, whether it died."""

from __future__ import annotations

import os
import subprocess

from ..actors import Future
from ..messaging import Address
from .osutil import GOODBYE


class AgentHandle:
    """The controller's view of one host agent."""

    def __init__(self, host_rank: int, proc: subprocess.Popen[bytes] | None, lifeline: int | None):
        self.host_rank = host_rank
        self.proc = proc
        self.lifeline = lifeline
        self.address: Address | None = None
        self.hostname = ""
        self.dead = False
        self.ready: Future[AgentHandle] = Future(lambda: "the host agent to start")
        # Hosts other than the controller's (see actormesh.hosts): their workers' ipc:// inboxes
        # live under the agent's own run directory, and errors name the host.
        self.run_dir: str | None = None
        self.name = "this host"

    def close(self, timeout: float = 3.0) -> None:
        if self.lifeline is not None:
            # Closing the lifeline tells the agent to kill its workers and exit; the goodbye
            # tells it that we clean up ourselves (it does when we die without one).
            try:
                os.write(self.lifeline, GOODBYE)
            except OSError:
                pass  # the agent is gone already
            os.close(self.lifeline)
            self.lifeline = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

"""The controller's handle on one host agent (``AgentHandle``): its process (when the controller
started it), its address once it is up, whether it died; and starting this machine's agent
(``start_local_agent``), with the start-up line it reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from ... import config
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


def start_local_agent(host_rank: int) -> tuple[AgentHandle, int]:
    """Start this machine's host agent as a child process (``python -m
    actormesh.runtime.procs.host_agent``): its handle, and the read end of the pipe whose
    end-of-file says the agent is gone. It waits for its start-up line (``send_start_up``)."""
    r, w = os.pipe()
    # The agent holds the write end of `watch` and never writes: end-of-file on our side
    # means the agent is gone (killed), and so are its workers.
    watch_r, watch_w = os.pipe()
    env = dict(os.environ)
    env.pop("ACTORMESH_KEY", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "actormesh.runtime.procs.host_agent", "--lifeline-fd", str(r)],
        pass_fds=(r, watch_w),
        env=env,
        stdin=subprocess.DEVNULL,
    )
    os.close(r)
    os.close(watch_w)
    return AgentHandle(host_rank, proc, w), watch_r


def send_start_up(
    agent: AgentHandle, key: bytes, controller: Address, run_dir: str, owns_run_dir: bool
) -> None:
    """The line a local agent starts from, on its lifeline. ``owns_run_dir``: it removes the
    run directory if the controller is killed (not when the controller only borrows a
    worker's)."""
    assert agent.lifeline is not None
    init = {
        "key": key.hex(),
        "controller": address_to_json(controller),
        "run_dir": run_dir,
        "host_rank": agent.host_rank,
        "preload": config.PRELOAD,
        "start_method": config.START_METHOD,
        "worker_sched": config.WORKER_SCHED,
        "controller_pid": os.getpid(),
        "owns_run_dir": owns_run_dir,
    }
    os.write(agent.lifeline, (json.dumps(init) + "\n").encode())


def address_to_json(a: Address) -> list[Any]:
    """An address as the agent's start-up line carries it (``address_from_json`` reads it)."""
    return [a.host, a.ipc, a.tcp, a.mailbox.hex()]


def address_from_json(v: list[Any]) -> Address:
    return Address(v[0], v[1], v[2], bytes.fromhex(v[3]))

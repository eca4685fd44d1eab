"""Fixtures for multi-host tests: one fake network of namespaces, the controller listening on
it, and factories that start host agents "on" fake hosts and stop them afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator

import pytest
from fakehosts import FakeNet, require_fake_hosts
from support import wait_until

import actormesh as am
from actormesh.runtime.messaging.run_dir import sweep_run_dirs

N_HOSTS = 4  # h0 runs Slurm's controller in the Slurm test; agents use h1..h3


@pytest.fixture(scope="session")
def fake_net() -> Iterator[FakeNet]:
    """The namespaces (created once: the controller's tcp inbox is bound to this network for the
    rest of the session) and, at the end, their removal with every process in them."""
    require_fake_hosts()
    net = FakeNet(N_HOSTS)
    try:
        yield net
    finally:
        net.down()


@pytest.fixture(scope="session")
def listener(fake_net: FakeNet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    listener = am.listen_for_hosts(f"{fake_net.controller_ip}:0")
    listener.key_path = listener.write_key_file(  # type: ignore[attr-defined]
        str(tmp_path_factory.mktemp("key") / "job.key")
    )
    yield listener
    listener.close()


class Agents:
    """Host agents started on fake hosts by a test or fixture; ``stop_all`` leaves none."""

    def __init__(self, net: FakeNet, listener: object) -> None:
        self.net = net
        self.listener = listener
        self.procs: list[tuple[int, subprocess.Popen[bytes]]] = []  # (host, agent)

    def start(self, host: int, *extra: str) -> subprocess.Popen[bytes]:
        env = dict(os.environ, ACTORMESH_KEY_FILE=self.listener.key_path)  # type: ignore[attr-defined]
        cmd = [*self.listener.agent_command(), *extra]  # type: ignore[attr-defined]
        proc = self.net.popen(host, cmd, env=env)
        self.procs.append((host, proc))
        return proc

    def stop_all(self) -> None:
        mine = {p.pid for _, p in self.procs}
        run_dirs = {}  # agent pid -> its socket directory, which must not outlive it
        for agent in self.listener.agents:  # type: ignore[attr-defined]
            if agent.info["pid"] in mine:
                run_dirs[agent.info["pid"]] = agent.info["run_dir"]
            if agent.info["pid"] in mine and not agent.dead:
                agent.close()
        for _, proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for host in {h for h, _ in self.procs}:
            wait_until(lambda h=host: not self.net.pids(h), 10, f"no process left on host {host}")
        # An agent that exited removed its directory; one killed outright (its host "died")
        # could not: the next actormesh process on the host removes it (make_run_dir sweeps).
        killed = {p.pid for _, p in self.procs if p.returncode == -signal.SIGKILL}
        left = [d for pid, d in run_dirs.items() if pid not in killed and os.path.exists(d)]
        sweep_run_dirs()
        left += [d for pid, d in run_dirs.items() if pid in killed and os.path.exists(d)]
        assert not left, f"host agents left their socket directories behind: {left}"


@pytest.fixture
def agents(fake_net: FakeNet, listener: object) -> Iterator[Agents]:
    """Factory: ``agents.start(host)``; every agent (and so every worker) is gone afterwards."""
    made = Agents(fake_net, listener)
    yield made
    made.stop_all()


@pytest.fixture(scope="module")
def three_hosts(fake_net: FakeNet, listener: object) -> Iterator[am.HostMesh]:
    """Agents on h1..h3 for a whole module, as a host mesh of extent {hosts: 3}."""
    made = Agents(fake_net, listener)
    for host in (1, 2, 3):
        made.start(host)
    try:
        yield listener.wait_for_hosts(3, timeout=60)  # type: ignore[attr-defined]
    finally:
        made.stop_all()


HostFactory = Callable[..., object]

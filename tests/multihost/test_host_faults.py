"""Faults across hosts: a host killed outright, a host unplugged from the switch. Each test has
its own two agents (h1, h2); the deadline is the default heartbeat deadline."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest
from fakehosts import FakeNet
from support import wait_until

import actormesh as am
from actormesh import config

WAIT = 60


class Sleeper(am.Actor):
    @am.endpoint
    def nap(self, seconds: float) -> int:
        time.sleep(seconds)
        return os.getpid()

    @am.endpoint
    def ping(self) -> str:
        return os.environ["ACTORMESH_HOST_ADDR"]


@pytest.fixture
def two_hosts(agents: Any, listener: Any) -> Any:
    agents.start(1)
    agents.start(2)
    hosts = listener.wait_for_hosts(2, timeout=WAIT)
    procs = hosts.spawn_procs(per_host={"gpus": 2})
    yield procs
    procs.stop().get(timeout=30)


def _lost_host(unhandled: list[object], fake_net: FakeNet, host: int) -> None:
    """The failure report of the event, if nobody waited: one SupervisionError naming the host."""
    for failure in unhandled:
        assert isinstance(failure, am.SupervisionError)
        assert fake_net.ip(host) in str(failure)
    unhandled.clear()


def test_killed_host_fails_its_ranks_naming_the_host(
    two_hosts: Any, fake_net: FakeNet, unhandled_failures: list[object]
) -> None:
    sleepers = two_hosts.spawn("sleepers", Sleeper)
    sleepers.ping.call().get(timeout=WAIT)
    pending = sleepers.slice(hosts=1).nap.call(60.0)
    started = time.monotonic()
    fake_net.kill_host(2)  # agent, fork server and workers of h2, all at once (SIGKILL)
    with pytest.raises(am.SupervisionError) as info:
        pending.get(timeout=WAIT)
    took = time.monotonic() - started
    assert fake_net.ip(2) in str(info.value), str(info.value)
    assert took < config.HOST_DEADLINE + 5, f"detected after {took:.1f} s"
    # The other host keeps working.
    alive = sleepers.slice(hosts=0).ping.call().get(timeout=WAIT)
    assert alive.values() == [fake_net.ip(1)] * 2
    # Later calls to the lost ranks fail at once, naming the host too.
    with pytest.raises(am.SupervisionError, match=fake_net.ip(2).replace(".", r"\.")):
        sleepers.slice(hosts=1).ping.call().get(timeout=WAIT)
    assert not fake_net.pids(2)
    _lost_host(unhandled_failures, fake_net, 2)


def test_cut_link_is_detected_by_heartbeats_and_the_host_cleans_up(
    two_hosts: Any, fake_net: FakeNet, unhandled_failures: list[object]
) -> None:
    sleepers = two_hosts.spawn("sleepers", Sleeper)
    sleepers.ping.call().get(timeout=WAIT)
    pending = sleepers.slice(hosts=1).nap.call(60.0)
    started = time.monotonic()
    fake_net.cut_link(2)
    try:
        with pytest.raises(am.SupervisionError) as info:
            pending.get(timeout=WAIT)
        took = time.monotonic() - started
        assert fake_net.ip(2) in str(info.value)
        assert "heartbeat" in str(info.value)
        assert took < config.HOST_DEADLINE + 5, f"detected after {took:.1f} s"
        # The unplugged host's agent stops hearing the controller too: it kills its workers
        # and exits, so nothing is left running there.
        wait_until(lambda: not fake_net.pids(2), config.HOST_DEADLINE + 10, "h2 to clean up")
        assert (
            sleepers.slice(hosts=0).ping.call().get(timeout=WAIT).values() == [fake_net.ip(1)] * 2
        )
    finally:
        fake_net.restore_link(2)
    _lost_host(unhandled_failures, fake_net, 2)


def test_a_host_silent_for_seconds_is_not_lost(
    two_hosts: Any, fake_net: FakeNet, unhandled_failures: list[object]
) -> None:
    """A loaded machine can keep a live agent from sending heartbeats for seconds (3.3 s once,
    at load ~20 on 2 cores): stopped for 4 s, every process of a host is still its host."""
    sleepers = two_hosts.spawn("sleepers", Sleeper)
    sleepers.ping.call().get(timeout=WAIT)
    assert config.HOST_DEADLINE > 4 + 2  # the pause, and margin for this machine's own load
    pids = fake_net.pids(2)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(4.0)  # the scenario: four seconds in which host 2 sends nothing
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert (
        sleepers.ping.call().get(timeout=WAIT).values()
        == [fake_net.ip(1)] * 2 + [fake_net.ip(2)] * 2
    )
    assert unhandled_failures == []


class Keeper(am.Actor):
    """Remembers its constructor argument: a healed rank gets the same one."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    @am.endpoint
    def where(self) -> tuple[str, str]:
        return self.tag, os.environ["ACTORMESH_HOST_ADDR"]

    @am.endpoint
    def ask(self, others: am.ActorMesh[Any]) -> list[str]:
        return [addr for _, addr in others.where.call().get(timeout=WAIT).values()]


def _spare_registered(listener: Any, proc: Any) -> bool:
    return any(
        a.info["pid"] == proc.pid and a.ready.done() and not a.taken for a in listener.agents
    )


def test_heal_moves_a_lost_hosts_ranks_to_a_spare_host(
    agents: Any, listener: Any, fake_net: FakeNet, unhandled_failures: list[object]
) -> None:
    agents.start(1)
    agents.start(2)
    procs = listener.wait_for_hosts(2, timeout=WAIT).spawn_procs(per_host={"gpus": 2})
    try:
        keepers = procs.spawn("keepers", Keeper, "kept")
        watcher = procs.slice(hosts=0, gpus=0).spawn("watcher", Keeper, "watcher")
        ip = [fake_net.ip(i) for i in range(4)]
        assert [a for _, a in keepers.where.call().get(WAIT).values()] == [ip[1]] * 2 + [ip[2]] * 2
        # A host lost with no spare: calls fail naming it, and heal() says what is missing.
        fake_net.kill_host(2)
        with pytest.raises(am.SupervisionError, match=ip[2].replace(".", r"\.")):
            keepers.where.call().get(timeout=WAIT)
        with pytest.raises(am.SupervisionError, match="no spare host"):
            procs.heal().get(timeout=WAIT)
        # A spare dials in: heal() takes it, the actors are re-created there with their
        # arguments, and calls from the controller and from actors on other hosts reach them.
        spare = agents.start(3)
        wait_until(lambda: _spare_registered(listener, spare), WAIT, "the spare host h3")
        procs.heal().get(timeout=WAIT)
        moved = keepers.where.call().get(timeout=WAIT).values()
        assert moved == [("kept", ip[1])] * 2 + [("kept", ip[3])] * 2
        assert watcher.ask.call_one(keepers).get(timeout=WAIT) == [ip[1]] * 2 + [ip[3]] * 2
        assert procs.health().values() == ["alive"] * 4
        # heal(hosts=...): lose the new host too, and heal onto one given explicitly.
        fake_net.kill_host(3)
        with pytest.raises(am.SupervisionError, match=ip[3].replace(".", r"\.")):
            keepers.where.call().get(timeout=WAIT)
        agents.start(2)
        procs.heal(hosts=listener.wait_for_hosts(1, timeout=WAIT)).get(timeout=WAIT)
        assert [a for _, a in keepers.where.call().get(WAIT).values()] == [ip[1]] * 2 + [ip[2]] * 2
        assert watcher.ask.call_one(keepers).get(timeout=WAIT) == [ip[1]] * 2 + [ip[2]] * 2
    finally:
        procs.stop().get(timeout=30)
    for failure in unhandled_failures:
        assert isinstance(failure, am.SupervisionError)
    unhandled_failures.clear()


def test_a_heal_interrupted_by_a_death_on_another_host_leaves_no_rank_without_its_actors(
    agents: Any, listener: Any, unhandled_failures: list[object]
) -> None:
    agents.start(1)
    second = agents.start(2)
    procs = listener.wait_for_hosts(2, timeout=WAIT).spawn_procs(per_host={"gpus": 1})
    try:
        sleepers = procs.spawn("sleepers", Sleeper)
        pids = sleepers.nap.call(0).get(timeout=WAIT).values()
        os.kill(pids[1], signal.SIGKILL)
        wait_until(lambda: procs.health().values()[1] != "alive", WAIT, "the death on h2")
        # h2's agent is paused (well within the heartbeat deadline) while the heal asks it for
        # rank 1's new process and h1's rank dies: the controller learns of that death while
        # the heal waits for rank 1 to start.
        assert config.HOST_DEADLINE > 4
        os.kill(second.pid, signal.SIGSTOP)
        try:
            first = procs.heal()
            os.kill(pids[0], signal.SIGKILL)
            wait_until(lambda: procs.health().values()[0] != "alive", 3, "the death on h1")
        finally:
            os.kill(second.pid, signal.SIGCONT)
        failure = None
        try:
            first.get(timeout=WAIT)
        except am.SupervisionError as exc:
            failure = exc
        procs.heal().get(timeout=WAIT)
        unhandled_failures.clear()  # the kills, which no call observed
        # Both ranks answer, with their actors re-created: rank 1's new process did not stay
        # without them because the heal that started it was interrupted.
        new_pids = sleepers.nap.call(0).get(timeout=30).values()
        assert not set(new_pids) & set(pids)
        # Rank 0 was not a rank that the first heal restarted: its death did not fail that heal.
        assert failure is None, failure
    finally:
        procs.stop().get(timeout=30)

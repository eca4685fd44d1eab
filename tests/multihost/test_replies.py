"""Replies of a call() across hosts come back gathered by each host's agent (relay.py): one
message per host, without holding a fast rank's reply behind a slow one, with deaths and output
order as when every rank answered directly."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

import actormesh as am
from actormesh import config
from actormesh.runtime.messaging.codec import Message
from actormesh.runtime.messaging.node import current_node

WAIT = 60
LINES = 300


def _wait_for(path: str) -> None:
    deadline = time.monotonic() + WAIT
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} was not created")
        time.sleep(0.01)


class Replier(am.Actor):
    @am.endpoint
    def where(self) -> str:
        return str(am.current_rank())

    @am.endpoint
    def gate(self, slow: dict[str, int], path: str, victim: dict[str, int] | None = None) -> str:
        """Answer at once, except the rank ``slow``, which answers once ``path`` exists, and the
        rank ``victim``, which exits instead."""
        me = dict(am.current_rank())
        if me == victim:
            os._exit(7)
        if me == slow:
            _wait_for(path)
        return str(am.current_rank())

    @am.endpoint
    def talk(self, lines: int) -> str:
        for i in range(lines):
            print(f"line {i} of {am.current_rank()}")
        return "said"


@pytest.fixture(scope="module")
def procs(three_hosts: am.HostMesh) -> Any:
    mesh = three_hosts.spawn_procs(per_host={"gpus": 2})
    yield mesh
    mesh.stop().get(timeout=30)


@pytest.fixture
def replies_seen(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many reply messages the controller handled: gathered ones (``replies``, and the
    replies they carried) and direct ones (``reply``)."""
    seen: Counter[str] = Counter()
    handlers = current_node().handlers

    def counting(kind: str, handle: Callable[[Message], None]) -> Callable[[Message], None]:
        def count(msg: Message) -> None:
            seen[kind] += 1
            if kind == "replies":
                seen["gathered"] += len(msg.envelope[1])
            handle(msg)

        return count

    for kind in ("reply", "replies"):
        monkeypatch.setitem(handlers, kind, counting(kind, handlers[kind]))
    return seen


def test_replies_of_a_call_come_one_message_per_host(
    procs: Any, replies_seen: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    repliers = procs.spawn("per-host", Replier)
    repliers.initialized.get(timeout=WAIT)
    replies_seen.clear()  # the spawn's replies come straight from each worker
    # A window longer than the test: an agent sends only once all its ranks answered.
    monkeypatch.setattr(config, "REPLY_WINDOW", 600.0)
    for _ in range(3):
        got = repliers.where.call().get(timeout=WAIT)
        assert got.values() == [str(p) for p, _ in got.items()]
    assert replies_seen == {"replies": 9, "gathered": 18}  # 3 calls x 3 hosts, 6 ranks each
    # One reply only: nothing to gather, it comes straight from the worker.
    replies_seen.clear()
    one = repliers.slice(hosts=2, gpus=1).where.call_one().get(timeout=WAIT)
    assert one == "{'hosts': 2/3, 'gpus': 1/2}"  # a rank prints as Monarch's
    assert replies_seen == {"reply": 1}
    # A window of 0 turns gathering off: every rank answers the controller directly.
    replies_seen.clear()
    monkeypatch.setattr(config, "REPLY_WINDOW", 0.0)
    assert len(repliers.where.call().get(timeout=WAIT)) == 6
    assert replies_seen == {"reply": 6}


def test_a_slow_rank_does_not_hold_back_the_replies_of_the_others(
    procs: Any, tmp_path: Path, replies_seen: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    repliers = procs.spawn("slow", Replier)
    repliers.initialized.get(timeout=WAIT)
    replies_seen.clear()
    monkeypatch.setattr(config, "REPLY_WINDOW", 0.005)
    gate = tmp_path / "open"
    slow = {"hosts": 1, "gpus": 0}
    pending = repliers.gate.call(slow, str(gate))
    mesh_id = procs._procs.mesh_id
    # Its sibling on host 1 answered at once; the agent sends that reply after the window
    # without waiting for the slow rank.
    wait_until(
        lambda: pending.pending_ranks() == [(mesh_id, 2)],
        WAIT,
        "every rank but the slow one to be recorded",
    )
    with pytest.raises(am.MeshTimeoutError) as info:
        pending.get(timeout=0.2)
    assert "from rank {hosts=1, gpus=0}" in str(info.value)
    assert str(info.value).count("{hosts=") == 1, str(info.value)
    # The timeout asked the slow rank what it waits on (WAITS, answered by a plain reply);
    # what is counted from here is how the call's own replies travel.
    replies_seen.clear()
    gate.touch()
    got = pending.get(timeout=WAIT)
    assert got.values() == [str(p) for p, _ in got.items()]
    assert replies_seen["reply"] == 0  # all gathered, the slow rank's too


def test_a_rank_dying_mid_call_fails_the_call_naming_it(
    three_hosts: am.HostMesh, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A proc mesh of its own (this test leaves a rank dead): three ranks on one remote host.
    procs = three_hosts.slice(hosts=1).spawn_procs(per_host={"gpus": 3})
    try:
        repliers = procs.spawn("dying", Replier)
        repliers.initialized.get(timeout=WAIT)
        # No window to fall back on: when the victim exits, its agent sends the reply it holds
        # (the fast rank's) at once, without waiting for the slow rank.
        monkeypatch.setattr(config, "REPLY_WINDOW", 600.0)
        gate = tmp_path / "open"
        pending = repliers.gate.call({"gpus": 2}, str(gate), victim={"gpus": 0})
        with pytest.raises(am.SupervisionError) as info:
            pending.get(timeout=WAIT)
        assert "rank gpus=0 " in str(info.value), str(info.value)
        assert "exited with code 7" in str(info.value)
        mesh_id = procs._procs.mesh_id
        wait_until(lambda: pending.pending_ranks() == [(mesh_id, 2)], WAIT, "the fast rank's reply")
        gate.touch()
        wait_until(lambda: pending.pending_ranks() == [], WAIT, "the slow rank's reply")
    finally:
        procs.stop().get(timeout=30)


def test_output_printed_before_the_reply_arrives_before_the_result(
    procs: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    repliers = procs.spawn("talk", Replier)
    # Each print is a message of its own straight to the controller; the reply goes through
    # the agent, and may get there first: the controller holds it until the lines are in.
    for _ in range(3):
        assert repliers.talk.call(LINES).get(timeout=WAIT).values() == ["said"] * 6
        out = capsys.readouterr().out
        for point, _ in repliers.where.call().get(timeout=WAIT).items():
            label = ",".join(f"{k}={v}" for k, v in point.items())
            assert f"[{label}] line {LINES - 1} of {point}" in out

"""How a Gather takes the replies of a call (collect.py): a rank that answered is recorded where
its reply is read, and what the general path decides (failures, deaths, the last reply) holds."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pytest

from actormesh import config
from actormesh.errors import ActorError, ProcDeath, RemoteFailure, SupervisionError
from actormesh.runtime.meshes.collect import Gather
from actormesh.runtime.meshes.proc_table import ProcTable
from actormesh.runtime.messaging.address import Address
from actormesh.runtime.messaging.codec import Message
from actormesh.runtime.messaging.node import Node, set_node
from actormesh.runtime.messaging.protocol import FAILED, OK, REPLY
from actormesh.runtime.shape import Shape

TIMEOUT = 5.0


@pytest.fixture
def current(node: Node) -> Iterator[Node]:
    set_node(node)
    try:
        yield node
    finally:
        set_node(None)


def _gather(node: Node, ranks: int) -> Gather[list[Any]]:
    addresses = [Address("h", f"ipc://w{r}", None, bytes([16 + r]) * 8) for r in range(ranks)]
    table = ProcTable("gather-test", addresses, [str(r) for r in range(ranks)], None)
    gather: Gather[list[Any]] = Gather("T.ep", table, Shape.from_extent({"gpus": ranks}), list)
    gather.port = node.open_port(gather)
    return gather


def _reply(gather: Gather[Any], index: int, value: Any, status: int = OK) -> Message:
    assert gather.port is not None
    envelope = (REPLY, gather.port.port_id, index, status)
    return Message(bytes([16 + index]) * 8, envelope, pickle.dumps(value, protocol=5), [])


def _failure(rank: int) -> RemoteFailure:
    return RemoteFailure(str(rank), "T.ep", "ep", "ValueError", "bad", "ValueError: bad\n")


def test_replies_in_any_order_complete_the_call_with_the_last_and_close_its_port(
    current: Node,
) -> None:
    gather = _gather(current, 3)
    assert gather.port is not None
    for index in (2, 0):
        current.to_port(_reply(gather, index, f"v{index}"))
        assert not gather.future.done()
    current.to_port(_reply(gather, 1, "v1"))
    assert gather.future.get(timeout=TIMEOUT) == ["v0", "v1", "v2"]
    assert current.handlers_since(gather.port.port_id - 1) == []


def test_a_rank_that_answers_twice_is_taken_once(current: Node) -> None:
    gather = _gather(current, 2)
    gather.on_message(_reply(gather, 0, "first"))
    gather.on_message(_reply(gather, 0, "again"))
    assert not gather.future.done()
    gather.on_message(_reply(gather, 1, "other"))
    assert gather.future.get(timeout=TIMEOUT) == ["first", "other"]


def test_a_failed_rank_fails_the_call_once_every_rank_answered(current: Node) -> None:
    gather = _gather(current, 3)
    gather.on_message(_reply(gather, 1, _failure(1), FAILED))
    gather.on_message(_reply(gather, 0, "ok"))
    assert not gather.future.done()
    gather.on_message(_reply(gather, 2, "ok"))
    with pytest.raises(ActorError, match="bad"):
        gather.future.get(timeout=TIMEOUT)


def test_a_reply_after_its_rank_died_is_dropped(current: Node) -> None:
    gather = _gather(current, 1)
    death = ProcDeath("0", "h", 1234, None, "SIGKILL")
    assert gather.on_death(bytes([16]) * 8, death)
    gather.on_message(_reply(gather, 0, "late"))
    with pytest.raises(SupervisionError):
        gather.future.get(timeout=TIMEOUT)


def test_a_reply_that_cannot_be_unpickled_fails_its_rank(current: Node) -> None:
    gather = _gather(current, 1)
    assert gather.port is not None
    envelope = (REPLY, gather.port.port_id, 0, OK)
    gather.on_message(Message(bytes([16]) * 8, envelope, b"not a pickle", []))
    with pytest.raises(ActorError, match="could not be unpickled"):
        gather.future.get(timeout=TIMEOUT)


@pytest.mark.parametrize(
    ("ranks", "spin_ranks", "spins"), [(1, 1, True), (2, 1, False), (8, 8, True), (1, 0, False)]
)
def test_a_call_to_few_enough_ranks_is_waited_for_spinning(
    current: Node, monkeypatch: pytest.MonkeyPatch, ranks: int, spin_ranks: int, spins: bool
) -> None:
    """A thread waiting for a call's replies spins first (config.WAIT_SPIN_US) only when the
    call's ranks leave it a core: at most SPIN_RANKS of them."""
    monkeypatch.setattr(config, "SPIN_RANKS", spin_ranks)
    gather = _gather(current, ranks)
    assert gather.future._spin is spins
    gather.close()

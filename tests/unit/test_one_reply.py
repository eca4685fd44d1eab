"""The gather of a call to one actor (``One``): a successful reply completes the future where it
is read; failures, unreadable replies and deaths end it as any gather does, and whatever comes
first wins. Over a node that is never started: the handlers are called directly."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pytest

from actormesh.errors import ActorError, ProcDeath, RemoteFailure, SupervisionError
from actormesh.runtime.meshes.collect import One
from actormesh.runtime.meshes.proc_table import ProcTable
from actormesh.runtime.messaging import node as nodemod
from actormesh.runtime.messaging.codec import Message, new_id
from actormesh.runtime.messaging.node import Node
from actormesh.runtime.messaging.protocol import FAILED, OK, REPLY
from actormesh.runtime.shape import Shape

WORKER = new_id()


@pytest.fixture
def one(node: Node) -> Iterator[One[Any]]:
    previous = nodemod._node
    nodemod.set_node(node)
    try:
        procs = ProcTable(new_id().hex(), [node.address._replace(mailbox=WORKER)], ["gpus=0"])
        gather: One[Any] = One("A.ping", procs, Shape.from_extent({"gpus": 1}))
        gather.port = node.open_port(gather)
        yield gather
    finally:
        nodemod.set_node(previous)


def _reply(one: One[Any], status: int, payload: bytes) -> Message:
    assert one.port is not None
    return Message(WORKER, (REPLY, one.port.port_id, 0, status), payload, [])


def _death() -> ProcDeath:
    return ProcDeath("{gpus=0}", "h", 1234, None, "SIGKILL")


def test_a_reply_is_the_result_and_closes_the_port(one: One[Any], node: Node) -> None:
    one.on_message(_reply(one, OK, pickle.dumps({"x": 1})))
    assert one.future.get(timeout=0) == {"x": 1}
    assert one.port is not None and one.port.port_id not in node._ports
    one.on_death(WORKER, _death())  # after the answer: nothing changes
    assert one.future.get(timeout=0) == {"x": 1}


def test_a_failure_is_an_actor_error(one: One[Any]) -> None:
    failure = RemoteFailure("{gpus=0}", "A", "ping", "ValueError", "no", "ValueError: no\n")
    one.on_message(_reply(one, FAILED, pickle.dumps(failure)))
    with pytest.raises(ActorError, match="no"):
        one.future.get(timeout=0)


def test_an_unreadable_reply_fails_the_call_and_says_so(one: One[Any]) -> None:
    one.on_message(_reply(one, OK, b"not a pickle"))
    with pytest.raises(ActorError, match="could not be unpickled in the caller"):
        one.future.get(timeout=0)


def test_a_death_first_wins_over_a_late_reply(one: One[Any]) -> None:
    assert one.on_death(WORKER, _death())
    one.on_message(_reply(one, OK, pickle.dumps(5)))
    with pytest.raises(SupervisionError):
        one.future.get(timeout=0)

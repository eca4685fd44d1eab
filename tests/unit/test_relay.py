"""Cast plans across hosts (relay.py): which ranks a sender reaches directly, which agents relay;
and how a caller takes the replies an agent gathered."""

from __future__ import annotations

from typing import Any

from actormesh.runtime.meshes.proc_table import ProcTable
from actormesh.runtime.meshes.relay import plan
from actormesh.runtime.messaging.address import Address
from actormesh.runtime.messaging.codec import Message
from actormesh.runtime.messaging.node import Node
from actormesh.runtime.messaging.protocol import shape_state
from actormesh.runtime.shape import Shape


def _table() -> tuple[ProcTable, list[Address | None]]:
    # {hosts: 3, gpus: 2}: host 0 is the controller's own (no relay), hosts 1 and 2 remote.
    agents: list[Address | None] = [None]
    agents += [Address(f"h{i}", None, f"tcp://10.0.0.{i}:1", bytes([i]) * 8) for i in (1, 2)]
    addresses = [Address(f"h{r // 2}", f"ipc://w{r}", None, bytes([16 + r]) * 8) for r in range(6)]
    relays = [agents[r // 2] for r in range(6)]
    return ProcTable("plan-test", addresses, [str(r) for r in range(6)], relays), agents


def test_the_controller_reaches_remote_hosts_through_their_agents_only() -> None:
    table, agents = _table()
    shape = Shape.from_extent({"hosts": 3, "gpus": 2})
    direct, relayed = plan(table, shape, shape_state(shape), "controller-host")
    assert direct == (0, 1)
    assert relayed == (agents[1], agents[2])


def test_a_sender_on_a_remote_host_reaches_its_siblings_directly() -> None:
    table, agents = _table()
    shape = Shape.from_extent({"hosts": 3, "gpus": 2})
    direct, relayed = plan(table, shape, shape_state(shape), "h1")
    assert direct == (0, 1, 2, 3)
    assert relayed == (agents[2],)


def test_a_slice_touches_only_its_hosts_and_the_plan_is_cached() -> None:
    table, agents = _table()
    shape = Shape.from_extent({"hosts": 3, "gpus": 2}).slice(hosts=2, gpus=1)
    first = plan(table, shape, shape_state(shape), "controller-host")
    assert first == ((), (agents[2],))
    assert plan(table, shape, shape_state(shape), "controller-host") is first


class _Recorder:
    def __init__(self) -> None:
        self.got: list[tuple[int, int, Any]] = []

    def on_message(self, msg: Message) -> None:
        self.got.append((msg.envelope[2], msg.envelope[3], msg.value()))

    def on_death(self, mailbox: bytes, death: Any) -> None:
        return None


def test_gathered_replies_are_split_and_wait_for_what_their_worker_sent_before(node: Node) -> None:
    """A host agent's ``replies`` message: each reply reaches its port with its own payload and
    buffers, and one that names an earlier message of its worker waits until that is handled."""
    import pickle

    recorder = _Recorder()
    port = node.open_port(recorder)
    early, late = b"W" * 8, b"V" * 8  # two workers' sender ids
    big = pickle.PickleBuffer(bytearray(b"x" * 100))
    p0, b0 = pickle.dumps("first", protocol=5), []
    p1_buffers: list[Any] = []
    p1 = pickle.dumps(big, protocol=5, buffer_callback=p1_buffers.append)
    b1 = [bytes(b.raw()) for b in p1_buffers]
    items = (
        (port.port_id, early, 0, 0, 5, len(p0), len(b0)),  # after seq 5 of `early`
        (port.port_id, late, 1, 1, 0, len(p1), len(b1)),  # nothing to wait for
    )
    node.dispatch(Message(b"A" * 8, ("replies", items), memoryview(p0 + p1), [*b0, *b1], 1))
    assert [(i, s) for i, s, _ in recorder.got] == [(1, 1)]
    assert bytes(recorder.got[0][2]) == b"x" * 100
    node._note_handled(Message(early, ("log",), b"", [], 4))  # not yet the one it waits for
    assert len(recorder.got) == 1
    node._note_handled(Message(early, ("log",), b"", [], 5))
    assert recorder.got[1] == (0, 0, "first")

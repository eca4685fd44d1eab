"""``Node.in_order``: a reply that took another route than the process inbox (a thread's reply
inbox, or an agent's gathered replies) is handled only after the messages its sender sent this
process before it. In one process, over a node that is never started."""

from __future__ import annotations

from typing import Any

from actormesh.errors import ProcDeath
from actormesh.runtime.messaging.codec import Message
from actormesh.runtime.messaging.node import Node

A, B = b"A" * 8, b"B" * 8  # two senders


class _Recorder:
    def __init__(self) -> None:
        self.got: list[int] = []  # the index field of each reply handled

    def on_message(self, msg: Message) -> None:
        self.got.append(msg.envelope[2])

    def on_death(self, mailbox: bytes, death: ProcDeath) -> bool:
        return False


def _reply(sender: bytes, port_id: int, index: int, *after: int) -> Message:
    # ("reply", port, index, status[, after]): ``after`` is the sequence number of the last
    # message the sender sent this process before the reply (0: none).
    envelope: tuple[Any, ...] = ("reply", port_id, index, 0, *after)
    return Message(sender, envelope, b"", [])


def _handled_off_the_inbox(node: Node, sender: bytes, seq: int) -> None:
    # What the I/O thread does after handling each message off the process inbox.
    assert node.transport.on_handled is not None
    node.transport.on_handled(Message(sender, ("log",), b"", [], seq))


def test_a_reply_with_nothing_before_it_is_handled_at_once(node: Node) -> None:
    assert node.in_order(_reply(A, 1, 0))  # no ordering field
    assert node.in_order(_reply(A, 1, 0, 0))  # its sender sent nothing before


def test_a_reply_waits_for_what_its_sender_sent_before_and_is_then_handled_once(
    node: Node,
) -> None:
    recorder = _Recorder()
    port = node.open_port(recorder)
    assert not node.in_order(_reply(A, port.port_id, 7, 3))
    assert recorder.got == []  # held, not handled
    _handled_off_the_inbox(node, A, 2)
    assert recorder.got == []  # seq 3 not handled yet
    _handled_off_the_inbox(node, A, 3)
    assert recorder.got == [7]
    _handled_off_the_inbox(node, A, 4)
    assert recorder.got == [7]  # not handled twice
    # Once seq 3 of A was handled, later replies that name it go at once.
    assert node.in_order(_reply(A, port.port_id, 8, 3))
    assert not node.in_order(_reply(A, port.port_id, 9, 5))


class _Overtaker(_Recorder):
    """Handles reply 1 (released when seq 3 is handled) slowly: while it does, another thread
    reads reply 2 of the same sender, which names the same predecessor, and handles it at once
    if ``in_order`` lets it."""

    def __init__(self, node: Node, port_id: int) -> None:
        super().__init__()
        self.node, self.port_id = node, port_id

    def on_message(self, msg: Message) -> None:
        if msg.envelope[2] == 1 and self.node.in_order(_reply(A, self.port_id, 2, 3)):
            self.got.append(2)  # the other thread handled reply 2 first
        super().on_message(msg)


def test_a_reply_read_while_held_ones_are_released_does_not_overtake_them(node: Node) -> None:
    # Seen in a whole-suite run (test_reply_routes): replies completed as ..., 40, 39, ...
    # The I/O thread counted the large reply before them as handled, then handled the reply
    # it had held (39); the waiting thread read 40 in between, found the predecessor handled,
    # and handled it at once.
    overtaker = _Overtaker(node, 0)
    port = node.open_port(overtaker)
    overtaker.port_id = port.port_id
    assert not node.in_order(_reply(A, port.port_id, 1, 3))
    _handled_off_the_inbox(node, A, 3)
    assert overtaker.got == [1, 2]


def test_held_replies_wait_for_their_own_sender_only(node: Node) -> None:
    recorder = _Recorder()
    port = node.open_port(recorder)
    assert not node.in_order(_reply(A, port.port_id, 1, 2))
    assert not node.in_order(_reply(B, port.port_id, 2, 2))
    _handled_off_the_inbox(node, B, 5)
    assert recorder.got == [2]
    assert not node.in_order(_reply(A, port.port_id, 3, 1))  # A's seq 2 is still not handled
    _handled_off_the_inbox(node, A, 2)
    assert sorted(recorder.got) == [1, 2, 3]


def test_a_death_releases_what_was_held(node: Node) -> None:
    """A sender that died will not send what the reply waits for: it is handled at once."""
    recorder = _Recorder()
    port = node.open_port(recorder)
    assert not node.in_order(_reply(A, port.port_id, 4, 9))
    node.record_death(b"M" * 8, ProcDeath("0", "h", 1234, None, "SIGKILL"))
    assert recorder.got == [4]

"""A thread's reply inbox: the waiting thread reads its replies in a blocking receive; another
thread wakes it, the step and the deadline end it, close() ends it at once, and what the wait
left unread is read by the I/O thread afterwards."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from actormesh.runtime.messaging import codec as wire
from actormesh.runtime.messaging.actor_inbox import actor_context
from actormesh.runtime.messaging.node import Node
from actormesh.runtime.messaging.protocol import OK, REPLY
from actormesh.runtime.messaging.reply_inbox import ReplyInbox

WAIT = 10.0  # every wait in these tests ends by then


class _Done:
    """What a wait waits for: a flag that a reply (or a test) sets."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def done(self) -> bool:
        return self.event.is_set()

    def on_message(self, msg: wire.Message) -> None:
        self.event.set()


@pytest.fixture
def inbox(node: Node) -> Iterator[tuple[ReplyInbox, Node]]:
    node.transport.start()  # its I/O thread reads the socket when nobody waits
    box = ReplyInbox(node, threading.current_thread())
    try:
        yield box, node
    finally:
        box.close()


def _replier(box: ReplyInbox, node: Node) -> tuple[zmq.Socket[Any], Any]:
    push = actor_context().socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(box.address.ipc or "")
    signer = wire.Signer(node.key, wire.new_id())

    def reply(port_id: int) -> None:
        payload, _ = wire.dumps(None)
        push.send(signer.frames(box.address.mailbox, (REPLY, port_id, 0, OK), payload)[0])

    return push, reply


def test_a_reply_ends_the_wait_and_what_came_with_it_is_read_after_it(inbox: Any) -> None:
    box, node = inbox
    first, second = _Done(), _Done()
    p1, p2 = node.open_port(first, box.address), node.open_port(second, box.address)
    push, reply = _replier(box, node)
    try:
        reply(p1.port_id)
        reply(p2.port_id)  # arrives with the first; nobody waits for it
        box.wait(first, time.monotonic() + WAIT, lambda: None)
        assert first.done()
        # Left unread by the wait or read by it: either way it is handled, here by the I/O
        # thread, with no other wait on this socket.
        assert second.event.wait(WAIT), "the reply that came after the awaited one was lost"
        third = _Done()
        p3 = node.open_port(third, box.address)
        reply(p3.port_id)  # the socket is watched by the I/O thread again
        assert third.event.wait(WAIT)
    finally:
        push.close(linger=0)


def test_another_thread_wakes_the_wait(inbox: Any) -> None:
    box, _ = inbox
    done = _Done()
    woken: list[float] = []

    def on_wake() -> None:
        woken.append(time.monotonic())

    def finish() -> None:
        done.event.set()
        box.set()

    timer = threading.Timer(0.05, finish)
    timer.start()
    started = time.monotonic()
    box.wait(done, started + WAIT, on_wake, step=WAIT)
    timer.join(WAIT)
    assert done.done()
    assert time.monotonic() - started < WAIT / 2  # woken, not the end of a step


def test_the_step_calls_on_wake_and_the_deadline_ends_the_wait(inbox: Any) -> None:
    box, _ = inbox
    woken: list[float] = []
    started = time.monotonic()
    box.wait(_Done(), started + 0.3, lambda: woken.append(time.monotonic()), step=0.05)
    elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < WAIT / 2
    assert len(woken) >= 2  # every step


def test_close_from_another_thread_ends_a_wait_at_once(inbox: Any) -> None:
    box, _ = inbox
    timer = threading.Timer(0.05, box.close)
    timer.start()
    started = time.monotonic()
    box.wait(_Done(), started + WAIT, lambda: None, step=WAIT)
    timer.join(WAIT)
    assert box.closed
    assert time.monotonic() - started < WAIT / 2

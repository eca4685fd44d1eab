"""The main thread's reply inbox lives in its transport's ZeroMQ context (one I/O thread for a
call and its reply), so the transport closes it before ending that context, whichever way the
process ends, and a closed node gives no new one."""

from __future__ import annotations

import threading
import time

import zmq

from actormesh.runtime.messaging.codec import Signer
from actormesh.runtime.messaging.node import Node
from actormesh.runtime.messaging.protocol import REPLY
from actormesh.runtime.messaging.reply_inbox import reply_inbox

TIMEOUT_S = 10


def test_closing_the_transport_alone_closes_the_reply_inbox_and_does_not_hang(node: Node) -> None:
    inbox = reply_inbox(node)
    assert inbox is not None and not inbox.closed
    # What os._exit in an actor thread does (no Node.close): ZeroMQ's term waits for every
    # socket of the context, so an inbox left open would hang this forever.
    closer = threading.Thread(target=node.transport.close, kwargs={"linger": 0}, daemon=True)
    closer.start()
    closer.join(TIMEOUT_S)
    try:
        assert not closer.is_alive(), "the transport's close hung on the reply inbox's socket"
        assert inbox.closed
    finally:
        node.close()  # the node's own closers (supervision's waiter list)


def test_a_closed_node_gives_no_reply_inbox(node: Node) -> None:
    node.close()
    assert reply_inbox(node) is None


def test_a_reply_reaches_the_inbox_through_the_transports_context(node: Node) -> None:
    inbox = reply_inbox(node)
    assert inbox is not None
    try:
        # A reply signed for the inbox's mailbox, as a worker sends it, is read off its socket.
        ctx: zmq.Context[object] = zmq.Context()
        out = ctx.socket(zmq.PUSH)
        out.setsockopt(zmq.LINGER, 0)
        out.connect(inbox.address.ipc or "")
        got: list[object] = []
        node.to_port = got.append  # type: ignore[method-assign]
        frames = Signer(node.key, b"worker-0").frames(inbox.address.mailbox, (REPLY, 1, 0, "ok"))
        out.send_multipart(frames)

        class _Until:
            def done(self) -> bool:
                return bool(got)

        inbox.wait(_Until(), time.monotonic() + TIMEOUT_S, lambda: None)
        assert len(got) == 1
        out.close()
        ctx.term()
    finally:
        node.close()
    assert inbox.closed


def test_replies_due_are_read_on_and_a_late_one_still_ends_the_wait(node: Node) -> None:
    """The replies already queued are read in order by the wait's receives, and one that
    arrives after them is read by the receive that was waiting for it (else the wait would
    sleep to its deadline)."""
    inbox = reply_inbox(node)
    assert inbox is not None
    ctx: zmq.Context[object] = zmq.Context()
    out = ctx.socket(zmq.PUSH)
    try:
        out.setsockopt(zmq.LINGER, 0)
        out.connect(inbox.address.ipc or "")
        got: list[object] = []
        node.to_port = got.append  # type: ignore[method-assign]
        signer = Signer(node.key, b"worker-0")

        def reply(value: int) -> None:
            out.send_multipart(signer.frames(inbox.address.mailbox, (REPLY, 1, value, "ok")))

        for value in range(3):
            reply(value)

        class _Four:
            def done(self) -> bool:
                return len(got) >= 4

        late = threading.Timer(0.3, reply, args=(3,))
        late.start()
        started = time.monotonic()
        inbox.wait(_Four(), started + TIMEOUT_S, lambda: None)
        late.join()
        assert [msg.envelope[2] for msg in got] == [0, 1, 2, 3]  # type: ignore[attr-defined]
        assert time.monotonic() - started < TIMEOUT_S / 2, "the late reply did not wake the wait"
    finally:
        out.close()
        ctx.term()
        node.close()

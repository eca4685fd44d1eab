"""One message to several processes (``Transport.send_many``): signed once, each receiver gets it
and checks it, in order after what was sent before, and an outbox closed since it was last used
is replaced rather than written to."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from actormesh.runtime.messaging.address import Address
from actormesh.runtime.messaging.codec import Message, Verifier, new_id, new_key
from actormesh.runtime.messaging.transport import Transport

TIMEOUT_MS = 5000


class _Receiver:
    """A PULL socket standing for another process's inbox, with that process's verifier."""

    def __init__(self, ctx: zmq.Context[Any], key: bytes, run_dir: str, name: str) -> None:
        self.address = Address("this-host", f"ipc://{run_dir}/{name}", None, new_id())
        self.verifier = Verifier(key, self.address.mailbox)
        self.sock = ctx.socket(zmq.PULL)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
        self.sock.bind(self.address.ipc or "")

    def next(self) -> Message:
        return self.verifier.decode(self.sock.recv_multipart(copy=False))


@pytest.fixture
def parts() -> Iterator[tuple[Transport, list[_Receiver]]]:
    key = new_key()
    run_dir = tempfile.mkdtemp(prefix="am-unit-", dir="/tmp")
    sender = Transport(key, run_dir, "sender", host_id="this-host")
    ctx: zmq.Context[Any] = zmq.Context()
    receivers = [_Receiver(ctx, key, run_dir, f"r{i}") for i in range(3)]
    try:
        yield sender, receivers
    finally:
        sender.close(linger=0)
        for r in receivers:
            r.sock.close()
        ctx.term()
        shutil.rmtree(run_dir, ignore_errors=True)


def test_every_receiver_gets_the_message_after_what_was_sent_to_it_before(
    parts: tuple[Transport, list[_Receiver]],
) -> None:
    sender, receivers = parts
    sender.send(receivers[1].address, ("port", 7), b"before")
    dests = [r.address for r in receivers]
    sender.send_many(dests, ("port", 8), b"to all")
    sender.send_many(dests, ("port", 9), b"again")
    first = receivers[1].next()
    assert (first.envelope, bytes(first.payload)) == (("port", 7), b"before")
    for r in receivers:
        got = [r.next() for _ in range(2)]
        assert [(m.envelope, bytes(m.payload)) for m in got] == [
            (("port", 8), b"to all"),
            (("port", 9), b"again"),
        ]
        assert sender.last_seq_to(r.address.mailbox) == got[1].seq


def test_an_outbox_closed_since_its_last_use_is_replaced(
    parts: tuple[Transport, list[_Receiver]],
) -> None:
    sender, receivers = parts
    dests = [r.address for r in receivers]
    sender.send_many(dests, ("port", 1), b"one")
    # What the I/O thread does when no handle on an actor mesh is left (_forget_actor): the
    # outbox closes under the send lock while a route to it is still remembered.
    endpoint = dests[0].endpoint_from(sender.host_id)
    with sender._send_lock:  # the test plays the I/O thread's part
        sender._outboxes.pop(endpoint).close()
    sender.send_many(dests, ("port", 2), b"two")
    for r in receivers:
        assert [bytes(r.next().payload) for _ in range(2)] == [b"one", b"two"]

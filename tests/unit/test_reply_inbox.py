"""The main thread's reply inbox: a unix datagram socket that workers of its host send their
replies into (``datagrams.py``). The transport closes it, whichever way the process ends, and a
closed node gives no new one. A reply that cannot go as a datagram comes through the process
inbox, and the sender's later replies wait for it."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable

from actormesh.runtime.messaging.address import Address
from actormesh.runtime.messaging.codec import Message, dumps
from actormesh.runtime.messaging.datagrams import DATAGRAM_MAX, path_of
from actormesh.runtime.messaging.main_inbox import thread_reply_inbox
from actormesh.runtime.messaging.node import Node, Port
from actormesh.runtime.messaging.protocol import OK, REPLY
from actormesh.runtime.messaging.reply_inbox import ReplyInbox
from actormesh.runtime.messaging.transport import Transport

TIMEOUT_S = 10


def test_closing_the_transport_alone_closes_the_reply_inbox_and_removes_its_socket(
    node: Node,
) -> None:
    inbox = thread_reply_inbox(node)
    assert inbox is not None and not inbox.closed
    path = path_of(inbox.address.ipc or "")
    assert os.path.exists(path)
    # What os._exit in an actor thread does (no Node.close).
    closer = threading.Thread(target=node.transport.close, kwargs={"linger": 0}, daemon=True)
    closer.start()
    closer.join(TIMEOUT_S)
    try:
        assert not closer.is_alive(), "the transport's close hung on the reply inbox"
        assert inbox.closed
        assert not os.path.exists(path), "the reply inbox's socket was left behind"
    finally:
        node.close()  # the node's own closers (supervision's waiter list)


def test_a_closed_node_gives_no_reply_inbox(node: Node) -> None:
    node.close()
    assert thread_reply_inbox(node) is None


class _Handler:
    """A port's handler that keeps what reached it."""

    def __init__(self) -> None:
        self.got: list[Message] = []
        self.arrived = threading.Event()

    def on_message(self, msg: Message) -> None:
        self.got.append(msg)
        self.arrived.set()

    def on_death(self, mailbox: bytes, death: object) -> None:
        pass


class _Worker:
    """A worker's transport, replying to a reply inbox as an actor does (``send_reply``)."""

    def __init__(self, node: Node, address: Address) -> None:
        self.address = address
        self.caller = node.address.mailbox
        self.run_dir = tempfile.mkdtemp(prefix="am-unit-", dir="/tmp")
        self.transport = Transport(node.key, self.run_dir, "w0")

    def reply(self, port_id: int, index: int = 0, value: object = None) -> None:
        # The last message sent to the caller's process before this reply: see Node.in_order.
        after = self.transport.last_seq_to(self.caller)
        envelope = (REPLY, port_id, index, OK, after) if after else (REPLY, port_id, index, OK)
        payload, buffers = dumps(value)
        self.transport.send(self.address, envelope, payload, buffers, caller=self.caller)

    def close(self) -> None:
        self.transport.close(linger=0)
        shutil.rmtree(self.run_dir, ignore_errors=True)


def _keep_io_thread_busy(node: Node) -> threading.Event:
    """Keep the node's I/O thread busy until the event returned is set. It is busy on return,
    after its first look at any reply inbox made before (queued ahead of this)."""
    release, busy = threading.Event(), threading.Event()

    def keep_busy() -> None:
        busy.set()
        release.wait(TIMEOUT_S)

    node.transport.call_soon(keep_busy)
    assert busy.wait(TIMEOUT_S)
    return release


class _Until:
    def __init__(self, done: Callable[[], bool]) -> None:
        self.done = done


def _inbox_with_a_worker(node: Node) -> tuple[ReplyInbox, _Handler, Port, _Worker]:
    """The node's reply inbox, a port on it and a worker that sends it replies."""
    inbox = thread_reply_inbox(node)
    assert inbox is not None
    handler = _Handler()
    return inbox, handler, node.open_port(handler, inbox.address), _Worker(node, inbox.address)


def test_a_reply_reaches_the_inbox_as_a_datagram(node: Node) -> None:
    inbox, handler, port, worker = _inbox_with_a_worker(node)
    try:
        # A reply signed for the inbox's mailbox, as a worker sends it, is read off its socket
        # (the node is not started: nothing else could have read it).
        worker.reply(port.port_id)
        inbox.wait(_Until(lambda: bool(handler.got)), time.monotonic() + TIMEOUT_S, lambda: None)
        assert len(handler.got) == 1
    finally:
        worker.close()
        node.close()
    assert inbox.closed


def test_replies_due_are_read_on_and_a_late_one_still_ends_the_wait(node: Node) -> None:
    """The replies already queued are read in order by the wait's receives, and one that
    arrives after them is read by the receive that was waiting for it (else the wait would
    sleep to its deadline)."""
    inbox, handler, port, worker = _inbox_with_a_worker(node)
    try:
        for index in range(3):
            worker.reply(port.port_id, index)
        late = threading.Timer(0.3, worker.reply, args=(port.port_id, 3))
        late.start()
        started = time.monotonic()
        inbox.wait(_Until(lambda: len(handler.got) >= 4), started + TIMEOUT_S, lambda: None)
        late.join()
        assert [msg.envelope[2] for msg in handler.got] == [0, 1, 2, 3]
        assert time.monotonic() - started < TIMEOUT_S / 2, "the late reply did not wake the wait"
    finally:
        worker.close()
        node.close()


def test_a_reply_left_queued_by_a_wait_is_read_by_the_io_thread(node: Node) -> None:
    """A wait stops reading once its own reply is in; a reply to another call queued behind it
    is the I/O thread's to read."""
    node.start()
    inbox = thread_reply_inbox(node)
    assert inbox is not None
    mine, other = _Handler(), _Handler()
    my_port = node.open_port(mine, inbox.address)
    other_port = node.open_port(other, inbox.address)
    worker = _Worker(node, inbox.address)
    # The I/O thread is kept busy through the wait, so that the wait, not it, reads first.
    release = _keep_io_thread_busy(node)
    try:
        worker.reply(my_port.port_id)
        worker.reply(other_port.port_id)
        inbox.wait(_Until(lambda: bool(mine.got)), time.monotonic() + TIMEOUT_S, lambda: None)
        assert mine.got and not other.got  # the wait read its own reply only
        release.set()
        assert other.arrived.wait(TIMEOUT_S), "the reply left queued was never read"
    finally:
        release.set()
        worker.close()
        node.close()


# -- spinning for a quick call's reply (config.WAIT_SPIN_US) ------------------------------------

_LONG_NS = int(TIMEOUT_S * 1e9)  # a window no reply here outlasts


def test_a_spinning_wait_reads_its_replies_and_spins_on(node: Node) -> None:
    inbox, handler, port, worker = _inbox_with_a_worker(node)
    inbox._spin_ns = _LONG_NS
    try:
        for index in range(2):
            worker.reply(port.port_id, index)
        until = _Until(lambda: len(handler.got) >= 2)
        inbox.wait(until, time.monotonic() + TIMEOUT_S, lambda: None, spin=True)
        assert [msg.envelope[2] for msg in handler.got] == [0, 1]
        assert inbox._spin_pays  # its replies came within the window
    finally:
        worker.close()
        node.close()


def test_a_wait_outlasting_the_window_stops_spinning_until_a_reply_comes_quickly(
    node: Node,
) -> None:
    """A reply that does not come within the window stops the spinning; the next waits
    sleep at once, until one's reply comes within twice the window."""
    inbox, handler, port, worker = _inbox_with_a_worker(node)
    inbox._spin_ns = 1000  # 1 µs: nothing is sent, so the spin runs out
    try:
        inbox.wait(_Until(lambda: False), time.monotonic() + 0.05, lambda: None, spin=True)
        assert not inbox._spin_pays
        # Sleeping, it reads a reply sent just before; with a 1 µs window the receive still
        # took longer than twice the window: spinning stays off.
        worker.reply(port.port_id, 0)
        got_one = _Until(lambda: len(handler.got) >= 1)
        inbox.wait(got_one, time.monotonic() + TIMEOUT_S, lambda: None, spin=True)
        assert len(handler.got) == 1 and not inbox._spin_pays
        # With a window that no receive of a reply sent just before outlasts, the next one
        # turns it back on.
        inbox._spin_ns = _LONG_NS
        worker.reply(port.port_id, 1)
        got_two = _Until(lambda: len(handler.got) >= 2)
        inbox.wait(got_two, time.monotonic() + TIMEOUT_S, lambda: None, spin=True)
        assert len(handler.got) == 2 and inbox._spin_pays
    finally:
        worker.close()
        node.close()


def test_a_wait_not_asked_to_spin_never_does(node: Node) -> None:
    inbox, _handler, _port, worker = _inbox_with_a_worker(node)
    inbox._spin_ns = 1000
    try:
        inbox.wait(_Until(lambda: False), time.monotonic() + 0.05, lambda: None)
        assert inbox._spin_pays  # it did not spin, so it cannot have run out
    finally:
        worker.close()
        node.close()


# -- replies that cannot go as datagrams ---------------------------------------------------------


def test_replies_that_do_not_fit_come_through_the_process_inbox_and_keep_their_order(
    node: Node,
) -> None:
    """With the inbox's queue full (``net.unix.max_dgram_qlen``) or a reply larger than a
    datagram, replies go through the process inbox; a later datagram reply of the same sender
    is handled only after them."""
    node.start()
    inbox, handler, port, worker = _inbox_with_a_worker(node)
    # Neither the inbox nor the process inbox is read until the wait below reads the inbox.
    release = _keep_io_thread_busy(node)
    try:
        # More small replies than the inbox's queue holds, then one too large for a datagram.
        small = _queue_length() + 6
        for index in range(small):
            worker.reply(port.port_id, index)
        large = b"x" * (DATAGRAM_MAX + 1)
        worker.reply(port.port_id, small, large)
        queued = small + 1
        # The wait reads what came as datagrams; the rest sits in the process inbox.
        inbox.wait(_Until(lambda: False), time.monotonic() + 0.2, lambda: None)
        as_datagrams = len(handler.got)
        assert 0 < as_datagrams < small
        assert [msg.envelope[2] for msg in handler.got] == list(range(as_datagrams))
        # Room again: this one goes as a datagram, and names the last of those before it.
        worker.reply(port.port_id, queued)
        inbox.wait(_Until(lambda: False), time.monotonic() + 0.2, lambda: None)
        assert len(handler.got) == as_datagrams, "a reply overtook the ones sent before it"
        release.set()
        deadline = time.monotonic() + TIMEOUT_S
        while len(handler.got) < queued + 1 and time.monotonic() < deadline:
            handler.arrived.wait(0.05)
            handler.arrived.clear()
        assert [msg.envelope[2] for msg in handler.got] == list(range(queued + 1))
        assert handler.got[small].value() == large
    finally:
        release.set()
        worker.close()
        node.close()


def _queue_length() -> int:
    """How many datagrams Linux queues for a reader (``net.unix.max_dgram_qlen``)."""
    with open("/proc/sys/net/unix/max_dgram_qlen") as f:
        return int(f.read())

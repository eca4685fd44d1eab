"""A socket for the replies to one thread's calls, read by that thread while it waits.

A script or a notebook cell calls an actor and waits: ``actors.ping.call_one(1).get()``. If the
reply arrived on the process inbox, the I/O thread would read it and then wake the waiting
thread: two thread wake-ups where one does. So the main thread gets its own reply socket, and
while it waits in ``Future.get`` it reads that socket itself.

The socket is a unix datagram socket (``datagrams.py``), not a ZeroMQ one: a worker of this
host sends its reply straight into it, and the waiting thread, asleep in a blocking receive on
it, is the only thread woken. Through ZeroMQ, the I/O threads of both processes would have
been woken first. A reply that cannot go as a datagram (too large, or the socket's queue full)
comes through the process inbox, and the replies its sender sends after it wait for it
(``Node.in_order``); it waits, in turn, for the datagrams its sender sent before it (``drain``).
Other threads wake the waiting one (a future completed elsewhere, a
failure to raise) with an empty datagram.

Before it sleeps for the reply of a call to few ranks (``call_one``), the thread tries to receive
for a while (``config.WAIT_SPIN_US``, 300 µs): a reply that comes meanwhile saves the wake-up of
a sleeping CPU. On this project's 2-core virtual machine, whose idle CPUs halt, that took a quick
call from about 50 µs slower than raw pyzmq to about 20 µs faster (``bench/RESULTS.md``, before
the datagrams took it further).

When the thread is not waiting (it runs user code, or awaits in an event loop), the I/O thread
reads the socket instead, so futures still complete and callbacks still run on their own. The
two never read at the same time: the waiting thread holds a lock while it receives, the I/O
thread only ever tries that lock (it must never block behind a wait), stops watching the socket
while the thread waits, and looks again shortly after, so nothing is left unread.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ... import config
from .address import reply_inbox_address
from .codec import Message, Verifier, new_id
from .datagrams import DatagramInbox, DatagramSender, path_of
from .envelopes import port_id_of
from .protocol import REPLY
from .receive import decode

if TYPE_CHECKING:
    from .node import Node

logger = logging.getLogger(__name__)

# How soon the I/O thread looks at the socket again after a wait ended (seconds).
_RECHECK_S = 0.02
# How long a death waits for the owner to read the replies queued before it (seconds): the
# owner reads them at once unless a handler it runs is stuck (the death then fails them).
_DRAIN_WAIT_S = 0.5
# A datagram of this one byte (signed messages are longer) asks the thread that reads it to
# say it got this far in the queue (see drain).
_MARK = b"\0"
_now_ns = time.perf_counter_ns


class Awaited(Protocol):
    def done(self) -> bool: ...


class ReplyInbox:
    """The reply socket of one thread. See the module docstring."""

    def __init__(self, node: Node, owner: threading.Thread) -> None:
        if node.transport.closing:
            raise ConnectionError("the node is closing")
        address = reply_inbox_address(node.address, next(_numbers), new_id())
        if address is None:
            raise ConnectionError("this process has no ipc:// path short enough for an inbox")
        self.node = node
        self.owner = owner
        self.owner_ident = owner.ident  # compared on every call and wait
        self.address = address
        self.address_state = tuple(self.address)  # as a call's envelope carries it
        self._path = path_of(address.ipc or "")
        self._verifier = Verifier(node.key, self.address.mailbox)
        # Held by the reader. Reentrant: a callback run by a read may end the process (os._exit
        # in a worker closes the transport, which closes this socket) on the thread that holds it.
        self._lock = threading.RLock()
        self.waiting = False
        self.closed = False
        self._watched = False  # by the I/O thread (only it changes this)
        self._spin_ns = int(config.WAIT_SPIN_US * 1000)
        self._spin_pays = True  # see _receive
        self._reader = 0  # the thread that holds the lock to read (see drain)
        self._marks: deque[threading.Event] = deque()  # drains waiting on _MARKs, in order
        self._marks_lock = threading.Lock()
        self._inbox = DatagramInbox(self._path)
        self._fd = self._inbox.fd
        # Wakes the waiting thread, from any thread (an empty datagram).
        self._waker = DatagramSender()
        try:
            node.transport.on_close(self.close)
        except ConnectionError:
            self._waker.close()
            self._inbox.close()
            raise
        node.drains.append(self.drain)
        node.transport.call_soon(self._watch)

    # -- the owner thread ------------------------------------------------------------------------

    def wait(
        self,
        fut: Awaited,
        deadline: float | None,
        on_wake: Any,
        step: float = 1.0,
        spin: bool = False,
    ) -> None:
        """Read replies until ``fut`` (a future, or a cell waiting for its ranks) is done,
        ``deadline`` passes (then return), or ``on_wake`` raises (it runs every ``step``
        seconds and when woken by another thread: pending failures, wait hooks). ``spin``:
        each reply is tried for awhile before the thread sleeps for it (``_receive``)."""
        self.waiting = True
        try:
            if fut.done():
                return
            while not self.closed:
                left = step if deadline is None else min(step, deadline - time.monotonic())
                if left <= 0:
                    return
                with self._lock:
                    if self.closed:
                        return
                    self._reader = threading.get_ident()  # the owner's
                    try:
                        self._read(fut.done, int(left * 1000) or 1, spin)
                    finally:
                        self._reader = 0
                if fut.done():
                    return
                # Woken by another thread, or a step went by with nothing read.
                on_wake()  # not after every reply: a wait hook may cost more than one
                if fut.done():
                    return
        finally:
            self.waiting = False
            # What the wait left unread (replies to other calls) makes the socket readable:
            # the I/O thread, if it watches, reads it next.

    def _read(self, done: Callable[[], bool], timeout_ms: int, spin: bool) -> None:
        # Caller holds the lock. Replies until ``done()``; returns at a wake-up or the timeout.
        inbox = self._inbox
        node = self.node
        ports = node.ports
        in_order = node.in_order
        verifier = self._verifier
        spin_ns = self._spin_ns if spin else 0
        while True:
            # Blocks (without the GIL) up to the timeout, after spinning if asked to.
            data = self._receive(spin_ns, timeout_ms) if spin_ns else inbox.receive(timeout_ms)
            if not data:
                return  # the timeout (None), or a wake-up (empty)
            if len(data) == 1:
                self._marked()
                continue
            msg = decode(verifier, [data])  # None: dropped, and said so
            if msg is None:
                continue
            if msg.kind != REPLY:
                self._handle(node, msg)
            elif in_order(msg):
                # _handle, inline for a reply (what a waiting call reads): to its port's handler.
                port_id = port_id_of(msg)
                handler = ports.get(port_id)
                if handler is not None:
                    try:
                        handler.on_message(msg)
                    except Exception:
                        logger.exception("error handling a reply")
                else:
                    logger.debug("reply for closed port %s dropped", port_id)
            if done():
                return

    def _receive(self, spin_ns: int, timeout_ms: int) -> bytes | None:
        """The next datagram, tried for up to ``spin_ns`` before sleeping for it: a reply that
        comes meanwhile is read without a sleeping CPU's wake-up (config.WAIT_SPIN_US).

        It pays while replies come within the window. One that does not stops the spinning
        (this thread's waits on slow calls would only burn a core), until a reply comes
        within twice the window again while it sleeps (sleeping adds the wake-up: the margin).
        Only the main thread has a reply inbox, so at most one thread of a process spins.
        """
        inbox = self._inbox
        start = _now_ns()
        if self._spin_pays:
            until = start + spin_ns
            try_receive = inbox.try_receive
            while True:
                data = try_receive()  # each try releases the GIL, as the sleeping one does
                if data is not None:
                    return data
                if _now_ns() >= until:
                    break
            self._spin_pays = False
            return inbox.receive(timeout_ms)
        data = inbox.receive(timeout_ms)
        if data is not None and not self._spin_pays:
            self._spin_pays = _now_ns() - start <= 2 * spin_ns
        return data

    @staticmethod
    def _handle(node: Node, msg: Message) -> None:
        if not node.in_order(msg):
            return  # handed to the I/O thread, after what its sender sent before it
        try:
            # Replies are what this socket is for: straight to their port.
            if msg.kind == REPLY:
                node.to_port(msg)
            else:
                node.dispatch(msg)
        except Exception:
            logger.exception("error handling a %r message", msg.kind)

    def set(self) -> None:
        """Wake the owner if it waits (any thread): a future completed elsewhere, or a failure
        to raise. Named like ``threading.Event.set`` for supervision's main-thread waiters."""
        self._waker.wake(self._path)

    # -- the I/O thread --------------------------------------------------------------------------

    def hand_back(self) -> None:
        """Have the I/O thread watch the socket again now rather than at its next look (any
        thread): a reply is about to be awaited or called back, not waited for in ``get``."""
        if not self._watched and not self.waiting:
            self.node.transport.call_soon(self._watch_if_idle)

    def _watch_if_idle(self) -> None:
        if not self.waiting:
            self._watch()

    def _watch(self) -> None:
        if self.closed:
            return
        if not self._watched:
            self._watched = True
            self.node.transport.add_reader(self._fd, self._on_readable)
        self._on_readable()

    def _unwatch(self) -> None:
        if self._watched:
            self._watched = False
            self.node.transport.remove_reader(self._fd)

    def _on_readable(self) -> None:
        if self.closed:
            self._unwatch()
            return
        if self.waiting or not self._lock.acquire(blocking=False):
            # The owner reads now; look again once it is done.
            if self._watched:
                self._unwatch()
                self.node.transport.call_later(_RECHECK_S, self._recheck)
            return
        try:
            self._read_queued()
        finally:
            self._lock.release()

    def _read_queued(self) -> None:
        # Caller holds the lock: handle what is queued, without waiting.
        if self.closed:
            return
        self._reader = threading.get_ident()
        try:
            try_receive = self._inbox.try_receive
            while (data := try_receive()) is not None:
                if len(data) == 1:
                    self._marked()
                elif data:  # not a wake-up
                    msg = decode(self._verifier, [data])
                    if msg is not None:
                        self._handle(self.node, msg)
        finally:
            self._reader = 0

    def _recheck(self) -> None:
        if self.closed or self._watched:
            return
        if self.waiting:
            self.node.transport.call_later(_RECHECK_S, self._recheck)
        else:
            self._watch()

    # -- any thread --------------------------------------------------------------------------------

    def drain(self) -> None:
        """Return once the replies queued on the socket now were handled (any thread; waits
        at most ``_DRAIN_WAIT_S``). The I/O thread asks before it handles what a sender sent
        after datagrams to this socket: its death (``Node.record_death``: the replies it sent
        before it died must not fail), a reply that took the process inbox (``_on_reply``:
        it must not overtake them). Those datagrams are queued here already.

        Reads them itself when the socket is free; when the owner reads it, queues a mark
        behind them and waits for the owner to come to it."""
        if self.closed or self._reader == threading.get_ident():
            return  # this thread is reading now: a handler it ran got here, reading goes on
        mark: threading.Event | None = None
        deadline = time.monotonic() + _DRAIN_WAIT_S
        while not self.closed:
            if self._lock.acquire(blocking=False):
                try:
                    self._read_queued()
                finally:
                    self._lock.release()
                return
            if mark is None:
                # The owner reads: it will come to a mark queued behind those replies.
                mark = threading.Event()
                with self._marks_lock:
                    self._marks.append(mark)
                    if not self._waker.send(_MARK, self._path):
                        self._marks.pop()  # a full queue: its reader is busy with it anyway
            # Short waits: once the owner lets go of the socket, this thread reads it itself.
            if mark.wait(0.002) or time.monotonic() > deadline:
                return

    def _marked(self) -> None:
        with self._marks_lock:
            if self._marks:
                self._marks.popleft().set()

    def close(self) -> None:
        """Close the socket and remove its path (when the node closes). A waiting owner stops
        waiting here."""
        if self.closed:
            return
        self.closed = True  # first: a woken owner stops reading and lets go of the lock
        if self.drain in self.node.drains:
            self.node.drains.remove(self.drain)
        self._waker.wake(self._path)
        self._waker.close()
        self.node.transport.call_soon(self._unwatch)  # the poller forgets the fd
        with self._lock:
            self._inbox.close()


_numbers = itertools.count(1)

"""A socket for the replies to one thread's calls, read by that thread while it waits.

A script or a notebook cell calls an actor and waits: ``actors.ping.call_one(1).get()``. If the
reply arrived on the process inbox, the I/O thread would read it and then wake the waiting
thread: two thread wake-ups where one does. So the main thread gets its own reply socket, and
while it waits in ``Future.get`` it reads that socket itself.

When the thread is not waiting (it runs user code, or awaits in an event loop), the I/O thread
reads the socket instead, so futures still complete and callbacks still run on their own. The
two never read at the same time: a lock guards the socket, and the I/O thread stops watching it
while the thread waits (and looks again shortly after, so nothing is left unread).
"""

from __future__ import annotations

import itertools
import logging
import select
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import zmq

from ..faults import supervision
from .address import MAX_IPC_PATH, Address
from .codec import Verifier, new_id
from .protocol import REPLY
from .receive import receive
from .wake_pipe import WakePipe

if TYPE_CHECKING:
    from .node import Node

logger = logging.getLogger(__name__)

# How soon the I/O thread looks at the socket again after a wait ended (seconds).
_RECHECK_S = 0.02
_POLL_IN = select.POLLIN


class Awaited(Protocol):
    def done(self) -> bool: ...


class ReplyInbox:
    """The reply socket of one thread. See the module docstring."""

    def __init__(self, node: Node, owner: threading.Thread) -> None:
        transport = node.transport
        ipc = node.address.ipc
        assert ipc is not None
        self.node = node
        self.owner = owner
        self.owner_ident = owner.ident  # compared on every call and wait
        self.address = Address(transport.host_id, f"{ipc}.r{next(_numbers)}", None, new_id())
        self.address_state = tuple(self.address)  # as a call's envelope carries it
        self._verifier = Verifier(node.key, self.address.mailbox)
        # Reentrant: a callback run by a read may end the process (os._exit in a worker closes
        # the transport, which closes this socket) on the thread that holds it.
        self._lock = threading.RLock()
        self.waiting = False
        self.closed = False
        self._armed = False  # read until empty since anything else touched the socket
        self._watched = False  # by the I/O thread (only it changes this)
        self._wake = WakePipe()
        with self._lock:  # the transport may close it (see close) as soon as it is made
            try:
                # The transport's context: its one I/O thread moves the calls out and the
                # replies in (see transport.py's docstring).
                self._socket: zmq.Socket[Any] = transport.thread_socket(zmq.PULL, self.close)
            except ConnectionError:
                self._wake.close()
                raise
            self._socket.setsockopt(zmq.LINGER, 0)
            self._socket.setsockopt(zmq.RCVHWM, 0)
            self._socket.bind(self.address.ipc or "")
            self._fd = self._socket.fileno()
        self._wake_r = self._wake.r  # compared on every wake-up of a waiting call
        self._poller = select.poll()
        self._poller.register(self._fd, _POLL_IN)
        self._poller.register(self._wake_r, _POLL_IN)
        transport.call_soon(self._watch)

    # -- the owner thread ------------------------------------------------------------------------

    def wait(self, fut: Awaited, deadline: float | None, on_wake: Any, step: float = 1.0) -> None:
        """Read replies until ``fut`` (a future, or a cell waiting for its ranks) is done,
        ``deadline`` passes (then return), or ``on_wake`` raises (it runs every ``step``
        seconds and when woken by another thread: pending failures, wait hooks)."""
        self.waiting = True
        woken = False  # by the socket
        try:
            if fut.done():
                return
            # fut is asked again only where it may have completed: after a read, or when woken
            # by another thread or by the step's end.
            while not self.closed:
                # Armed (the last read ended empty), the socket's FD signals the next message,
                # so there is nothing to read before sleeping: the reply was only just asked for.
                if woken or not self._armed:
                    with self._lock:
                        if not self.closed:
                            self._drain(woken, fut.done)
                    if fut.done():
                        return
                left = step if deadline is None else min(step, deadline - time.monotonic())
                if left <= 0:
                    return
                events = self._poller.poll(left * 1000)
                woken = poked = False
                for fd, _ in events:
                    if fd == self._wake_r:
                        poked = True
                        self._wake.drain()
                    else:
                        woken = True
                if poked or not events:
                    if not fut.done():
                        on_wake()  # not after every reply: a wait hook may cost more than one
                    if fut.done():
                        return
        finally:
            self.waiting = False

    def set(self) -> None:
        """Wake the owner if it waits (any thread): a future completed elsewhere, or a failure
        to raise. Named like ``threading.Event.set`` for supervision's main-thread waiters."""
        self._wake.wake()

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

    def _on_readable(self) -> None:
        if self.waiting:
            # The owner reads now; look again once it is done.
            if self._watched:
                self._watched = False
                self.node.transport.remove_reader(self._fd)
                self.node.transport.call_later(_RECHECK_S, self._recheck)
            return
        with self._lock:
            if not self.closed:
                self._drain(woken=True)

    def _recheck(self) -> None:
        if self.closed or self._watched:
            return
        if self.waiting:
            self.node.transport.call_later(_RECHECK_S, self._recheck)
        else:
            self._watch()

    # -- either -----------------------------------------------------------------------------------

    def _drain(self, woken: bool = False, done: Callable[[], bool] | None = None) -> None:
        # Caller holds the lock. Read until empty: the socket's FD signals edges, not levels.
        self._armed = False
        node = self.node
        dispatch = node.dispatch
        to_port = node.to_port
        in_order = node.in_order
        for msg in receive(self._socket, self._verifier, woken=woken, done=done):
            if not in_order(msg):
                continue  # handed to the I/O thread, after what its sender sent before it
            try:
                # Replies are what this socket is for: straight to their port.
                if msg.envelope[0] == REPLY:
                    to_port(msg)
                else:
                    dispatch(msg)
            except Exception:
                logger.exception("error handling a %r message", msg.envelope[0])
        self._armed = True

    def close(self) -> None:
        """Close the socket (when the node closes). A waiting owner stops waiting here."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._socket.close(linger=0)
        self.set()


_numbers = itertools.count(1)
_main_inbox: ReplyInbox | None = None  # only the process's main thread has one


def reply_inbox(node: Node) -> ReplyInbox | None:
    """The calling thread's reply inbox, if it gets one: the process's main thread does (it is
    the one that makes calls and waits in scripts and notebooks); other threads use the
    process inbox."""
    global _main_inbox
    inbox = _main_inbox
    if (
        inbox is not None
        and inbox.owner_ident == threading.get_ident()
        and inbox.node is node
        and not inbox.closed
    ):
        return inbox  # every call after the first: no Thread objects looked up
    current = threading.current_thread()
    ipc = node.address.ipc
    if current is not threading.main_thread() or ipc is None or len(ipc) > MAX_IPC_PATH:
        return None
    inbox = _main_inbox
    if inbox is None or inbox.node is not node or inbox.closed:
        try:
            inbox = _main_inbox = ReplyInbox(node, current)
        except ConnectionError:
            return None  # the node is closing: its calls fail as they are sent
        node.on_close(inbox.close)
        # In a script, an unhandled failure elsewhere wakes the wait (fail fast). Registered
        # for good rather than for each wait: a wake-up with nobody waiting is read, and acted
        # on, by the next wait.
        if supervision.add_main_waiter(inbox):
            node.on_close(lambda: supervision.remove_main_waiter(inbox))
    return inbox


def hand_back_replies() -> None:
    """See :meth:`ReplyInbox.hand_back` (the main thread's inbox, if there is one)."""
    inbox = _main_inbox
    if inbox is not None and not inbox.closed:
        inbox.hand_back()


def waiting_inbox() -> ReplyInbox | None:
    """The calling thread's reply inbox if it has one and is not already waiting on it."""
    inbox = _main_inbox
    if inbox is None or inbox.closed or inbox.waiting:
        return None
    if inbox.owner_ident != threading.get_ident():
        return None
    return inbox

"""The inbox of one actor: its own socket, read by its own thread.

Callers on the same host send calls straight to the actor's socket (see
:func:`~actormesh.runtime.messaging.address.actor_address`), so a call reaches the endpoint
without waking the process's I/O thread first: one thread hand-off less per call, which is most
of what a small call costs. What other threads hand the actor (its spawn, calls that came
through the process inbox from other hosts, supervision events, stop) goes into a local queue,
and a byte on a pipe wakes the actor's thread if it is waiting.

Only the actor's thread touches the socket, so nothing is locked. The socket lives in a ZeroMQ
context of its own that is never terminated: terminating the process's main context must not wait
for an actor thread that is busy in user code.
"""

from __future__ import annotations

import logging
import select
import threading
from collections import deque
from typing import Any

import zmq

from .address import Address
from .codec import Message, Verifier
from .protocol import BATCH, CALL, STOP_ACTOR
from .receive import receive
from .wake_pipe import WakePipe

logger = logging.getLogger(__name__)

_context: zmq.Context[Any] | None = None
_context_lock = threading.Lock()
_POLL_IN = select.POLLIN


def actor_context() -> zmq.Context[Any]:
    """The ZeroMQ context of sockets owned by threads that may be busy in user code when the
    process ends (never terminated: the process's exit closes them)."""
    global _context
    with _context_lock:
        if _context is None:
            _context = zmq.Context()
        return _context


# What an actor's thread takes from its inbox: ``(CALL_ITEM, message)``, ``(SPAWN_ITEM,
# message)`` (its construction, first) or ``(SUPERVISE_ITEM, failure)`` (a mesh it owns failed);
# ``(STOP_ITEM, message)`` (ActorMesh.stop) ends its actor; ``(TASK_ITEM, function)`` runs a
# function of this process on its thread (ActorRunner.run_task); ``None`` ends its thread. Local
# tags, not wire kinds.
CALL_ITEM = "call"
SPAWN_ITEM = "spawn"
SUPERVISE_ITEM = "supervise"
STOP_ITEM = "stop"
TASK_ITEM = "task"
NOTHING = object()  # what try_get answers when there is no item (None is an item: the end)


class ActorInbox:
    """Items for one actor, in arrival order per sender. ``get`` is for the actor's thread only."""

    def __init__(self, key: bytes, address: Address | None) -> None:
        self.address = address
        self._verifier = Verifier(key, address.mailbox) if address is not None else None
        self._queue: deque[Any] = deque()  # handed over by other threads
        self._ready: deque[Any] = deque()  # read from the socket, not handled yet (batches)
        self._wake = WakePipe()
        self._wake_r = self._wake.r  # compared on every wake-up of the actor's thread
        self._socket: zmq.Socket[Any] | None = None
        self._poller: select.poll | None = None
        self._armed = False  # read until empty since anything else touched the socket
        self._closed = False

    def open(self) -> None:
        """Bind the socket (on the actor's thread, before it handles anything)."""
        if self.address is None:
            self._poller = select.poll()
            self._poller.register(self._wake_r, _POLL_IN)
            return
        assert self.address.ipc is not None
        sock = actor_context().socket(zmq.PULL)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.bind(self.address.ipc)
        self._socket = sock
        self._poller = select.poll()
        self._poller.register(self._wake_r, _POLL_IN)
        self._poller.register(sock.getsockopt(zmq.FD), _POLL_IN)

    def put(self, item: Any) -> None:
        """Hand the actor an item (any thread)."""
        self._queue.append(item)
        self._wake.wake()

    def get(self) -> Any:
        """The next item: handed-over ones first, then calls from the socket (actor's thread)."""
        woken = False  # by the socket
        while True:
            if self._queue:
                return self._queue.popleft()
            if self._ready:
                return self._ready.popleft()
            # Armed (the last read ended empty), the socket's FD signals the next message, so
            # there is nothing to read before sleeping.
            if woken or not self._armed:
                got = self._receive(woken)
                woken = False
                if got:
                    continue
            assert self._poller is not None
            for fd, _ in self._poller.poll():
                if fd == self._wake_r:
                    self._wake.drain()
                else:
                    woken = True

    def try_get(self) -> Any:
        """The next item, or ``NOTHING`` when there is none now (actor's thread): for an event
        loop that waits on ``fds`` instead of sleeping in ``get``."""
        self._wake.drain()  # before looking: a wake-up after the look is kept
        if self._queue:
            return self._queue.popleft()
        if not self._ready:
            self._receive(True)  # the socket's FD is edge-triggered: read until it is empty
        return self._ready.popleft() if self._ready else NOTHING

    def fds(self) -> list[int]:
        """What ``try_get`` waits on: the wake-up pipe, and the socket when there is one."""
        fds = [self._wake_r]
        if self._socket is not None:
            fds.append(int(self._socket.getsockopt(zmq.FD)))
        return fds

    def put_back(self, items: list[Any]) -> None:
        """Return items taken out of turn, to be taken first, in their order (actor's thread)."""
        self._queue.extendleft(reversed(items))

    def _receive(self, woken: bool) -> bool:
        sock = self._socket
        if sock is None:
            return False
        assert self._verifier is not None
        got = False
        self._armed = False
        for msg in receive(sock, self._verifier, woken=woken):
            got = True
            kind = msg.envelope[0]
            if kind == CALL:
                self._ready.append((CALL_ITEM, msg))
            elif kind == STOP_ACTOR:  # ActorMesh.stop, by the route of the calls it follows
                self._ready.append((STOP_ITEM, msg))
            elif kind == BATCH:
                # Back-to-back one-way calls travel as one signed message (Transport.send_one_way).
                _, items = msg.envelope
                for envelope, payload in items:
                    self._ready.append(
                        (CALL_ITEM, Message(msg.sender, envelope, payload, [], msg.seq))
                    )
            else:
                logger.warning("an actor inbox got a %r message; dropped", kind)
        self._armed = True
        return got

    def pending_calls(self) -> list[Any]:
        """The calls already read or readable from the socket, taken out of the inbox (actor's
        thread): what was sent before a stop that travelled by the other route."""
        if not self._closed:
            self._receive(False)
        items = list(self._ready)
        self._ready.clear()
        return items

    def close(self) -> None:
        """Close the socket and the pipe (actor's thread, when it ends)."""
        if self._closed:
            return
        self._closed = True
        if self._socket is not None:
            self._socket.close(linger=0)
        self._wake.close()

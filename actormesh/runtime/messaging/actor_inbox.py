"""The inbox of one actor: its own socket, read by its own thread.

Callers on the same host send calls straight to the actor's socket (see
:func:`~actormesh.runtime.messaging.address.actor_address`), so a call reaches the endpoint
without waking the process's I/O thread first: one thread hand-off less per call, which is most
of what a small call costs. What other threads hand the actor (its spawn, calls that came
through the process inbox from other hosts, supervision events, stop) goes into a local queue.

The actor's thread sleeps in a blocking ZeroMQ receive on its socket, not in ``poll()`` on the
socket's FD and a pipe: a call is then read by the receive that was already waiting for it, with
no poll result to look through and no ``EVENTS`` read before and after. To wake it for a queued
item, the handing thread sends an empty frame to the same socket (``socket_waker.py``): a
wake-up is only ever a reason to look at the queue, never something to handle. An event loop
that waits on ``fds`` instead (an actor's concurrent calls) is woken the same way, by the
socket's FD.

Order. ZeroMQ keeps each sender's messages in order, and takes turns between senders. Causal
order needs more: a script that casts to this actor and then calls another actor, which asks
this one, expects the cast to be handled first. When this actor was busy while both came,
both wait in the socket, and taking turns may hand over the later one first. So whenever more
than one message waits, all that wait are read and handled in the order they were sent (the
send time in each head: one clock for the whole host, and the socket hears only from its host).
One sender's messages keep their order, its send times being drawn in sequence.

Only the actor's thread reads the socket, so the socket is not locked; the waking socket is
shared by the handing threads, under a lock. Both live in a ZeroMQ context of their own that is
never terminated: terminating the process's main context must not wait for an actor thread that
is busy in user code.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

import zmq

from .address import Address
from .codec import Message, Verifier
from .envelopes import BatchEnvelope
from .protocol import BATCH, CALL, STOP_ACTOR
from .receive import decode, has_message, receive
from .socket_waker import SocketWaker, wake_address

logger = logging.getLogger(__name__)

_context: zmq.Context[Any] | None = None
_context_lock = threading.Lock()


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

# pyzmq's backend receive, without the Python wrapper (draft-socket options only).
_zmq_recv = zmq.backend.Socket.recv
_NOBLOCK = int(zmq.NOBLOCK)


class ActorInbox:
    """Items for one actor, in arrival order per sender. ``get`` is for the actor's thread only."""

    def __init__(self, key: bytes, address: Address | None) -> None:
        self.address = address
        self._verifier = Verifier(key, address.mailbox) if address is not None else None
        self._queue: deque[Any] = deque()  # handed over by other threads
        self._ready: deque[Any] = deque()  # read from the socket, not handled yet (batches)
        self._newest = 0  # the latest send time filed into _ready
        self._unsorted = False  # something filed was sent before something filed earlier
        self._socket: zmq.Socket[Any] | None = None
        self._waker = SocketWaker()
        self._closed = False

    def open(self) -> None:
        """Bind the socket (on the actor's thread, before it handles anything)."""
        sock = actor_context().socket(zmq.PULL)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        if self.address is not None:  # else it only carries wake-ups
            assert self.address.ipc is not None
            sock.bind(self.address.ipc)
        wake_at = wake_address()
        sock.bind(wake_at)
        self._socket = sock
        # Items put before this are in the queue, looked at first.
        self._waker.connect(actor_context().socket(zmq.PUSH), wake_at)

    def put(self, item: Any) -> None:
        """Hand the actor an item (any thread)."""
        self._queue.append(item)  # before the wake-up: the woken thread must find it
        self._waker.wake()

    def get(self) -> Any:
        """The next item: handed-over ones first, then calls from the socket (actor's thread).
        Blocks until there is one."""
        queue = self._queue
        ready = self._ready
        sock = self._socket
        assert sock is not None
        while True:
            if queue:
                return queue.popleft()
            if ready:
                return ready.popleft()
            frame = _zmq_recv(sock, 0, False)  # blocks (without the GIL) until a message
            if not frame.more:
                if not len(frame):
                    continue  # a wake-up: the queue has an item
                frames = [frame]
            else:
                frames = _rest(sock, frame)
            msg = decode(self._verifier, frames)
            if msg is None:
                continue
            if msg.kind == CALL and not queue and not has_message(sock):
                return (CALL_ITEM, msg)  # the common case, without the ready queue
            self._file(msg)
            self._receive()  # what else waits, and all of it in the order it was sent

    def try_get(self) -> Any:
        """The next item, or ``NOTHING`` when there is none now (actor's thread): for an event
        loop that waits on ``fds`` instead of sleeping in ``get``."""
        if not self._ready:
            # First: a wake-up read here was sent after its item was queued, so the queue is
            # looked at after it. Read until empty: the socket's FD signals edges, not levels.
            self._receive()
        if self._queue:
            return self._queue.popleft()
        return self._ready.popleft() if self._ready else NOTHING

    def fds(self) -> list[int]:
        """What ``try_get`` waits on: the socket, which wake-ups come to as well."""
        assert self._socket is not None
        return [int(self._socket.getsockopt(zmq.FD))]

    def put_back(self, items: list[Any]) -> None:
        """Return items taken out of turn, to be taken first, in their order (actor's thread)."""
        self._queue.extendleft(reversed(items))

    def _receive(self) -> None:
        """Read what waits, and order all that is ready by send time."""
        sock = self._socket
        if sock is None:
            return
        for msg in receive(sock, self._verifier, wakeups=True):
            self._file(msg)
        if self._unsorted:
            self._unsorted = False
            ready = self._ready
            in_order = sorted(ready, key=_sent)  # stable: a batch's calls share a send time
            ready.clear()
            ready.extend(in_order)

    def _file(self, msg: Message) -> None:
        if msg.sent < self._newest:
            self._unsorted = True  # sent before what is ready: _receive sorts
        else:
            self._newest = msg.sent
        kind = msg.kind
        if kind == CALL:
            self._ready.append((CALL_ITEM, msg))
        elif kind == STOP_ACTOR:  # ActorMesh.stop, by the route of the calls it follows
            self._ready.append((STOP_ITEM, msg))
        elif kind == BATCH:
            # Back-to-back one-way calls travel as one signed message (Transport.send_one_way).
            for envelope, payload in BatchEnvelope.of(msg).items:
                call = Message(msg.sender, envelope, payload, [], msg.seq, msg.sent)
                self._ready.append((CALL_ITEM, call))
        else:
            logger.warning("an actor inbox got a %r message; dropped", kind)

    def pending_calls(self) -> list[Any]:
        """The calls already read or readable from the socket, taken out of the inbox (actor's
        thread): what was sent before a stop that travelled by the other route."""
        if not self._closed:
            self._receive()
        items = list(self._ready)
        self._ready.clear()
        return items

    def close(self) -> None:
        """Close the socket and the waking socket (actor's thread, when it ends)."""
        if self._closed:
            return
        self._closed = True
        self._waker.close()  # later puts wake nobody: the thread is gone
        if self._socket is not None:
            # What is still queued is dropped; read first, so that its senders' shared-memory
            # slots (shm_lane.py) are free again.
            try:
                self._receive()
            except Exception:
                logger.debug("reading what a closing actor inbox held failed", exc_info=True)
            self._ready.clear()
            self._socket.close(linger=0)


def _sent(item: tuple[str, Message]) -> int:
    return item[1].sent


def _rest(sock: zmq.Socket[Any], frame: zmq.Frame) -> list[zmq.Frame]:
    # The frames after the first: a message arrives whole, so they are there already.
    frames = [frame]
    while frame.more:
        frame = _zmq_recv(sock, _NOBLOCK, False)
        frames.append(frame)
    return frames

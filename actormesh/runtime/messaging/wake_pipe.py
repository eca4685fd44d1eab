"""How one thread wakes another: ``WakePipe`` for a thread that sleeps in ``poll()`` on sockets
(the I/O thread), ``WakeSocket`` for one that sleeps in a blocking receive on its own socket (an
actor's thread, a thread waiting on its reply inbox).

ZeroMQ sockets cannot be woken from another thread, so the I/O thread also polls the read end of
a pipe; a byte written to it ends the sleep. Only wake-ups matter, not how many: a drain reads
whatever accumulated at once.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Any

import zmq


class WakePipe:
    """A non-blocking pipe: ``wake()`` from any thread, ``drain()`` by the sleeper once woken.

    ``r`` is the file descriptor to poll. Callers on a hot path keep ``r`` (and the bound
    ``wake``) in attributes of their own, so a wake-up costs what the inline code cost.
    """

    __slots__ = ("r", "w")

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)

    def wake(self) -> None:
        try:
            os.write(self.w, b"x")
        except OSError:
            pass  # closed: the sleeper is gone

    def drain(self) -> None:
        try:
            os.read(self.r, 4096)
        except OSError:
            pass  # nothing left (another drain took it), or closed under a last wake-up

    def close(self) -> None:
        for fd in (self.r, self.w):
            try:
                os.close(fd)
            except OSError:
                pass


class WakeSocket:
    """How one thread wakes another that sleeps in a blocking ZeroMQ receive on ``sock``: an
    empty frame sent to ``sock`` over ``inproc://`` (``wake()``, any thread).

    The sleeper takes an empty message for a wake-up, never for a message: signed messages are
    never empty, and one from outside that is empty is only a reason to look again. ``sock``
    must not be terminated under the sender: both live in the same context.
    """

    __slots__ = ("_lock", "_push")

    def __init__(self, ctx: zmq.Context[Any], sock: zmq.Socket[Any]) -> None:
        endpoint = f"inproc://actormesh-wake-{next(_wake_ids)}"
        sock.bind(endpoint)
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(endpoint)
        self._push: zmq.Socket[Any] | None = push
        self._lock = threading.Lock()  # the sending socket is shared by the waking threads

    def wake(self) -> None:
        with self._lock:
            push = self._push
            if push is not None:  # else closed: the sleeper is gone
                try:
                    _zmq_send(push, b"", _NOBLOCK)
                except zmq.ZMQError:
                    pass  # cannot happen (no send limit on inproc to an unlimited receiver)

    def close(self) -> None:
        with self._lock:
            if self._push is not None:
                self._push.close(linger=0)
                self._push = None


_wake_ids = itertools.count(1)
# pyzmq's backend send, without the Python wrapper (draft-socket options only).
_zmq_send = zmq.backend.Socket.send
_NOBLOCK = int(zmq.NOBLOCK)

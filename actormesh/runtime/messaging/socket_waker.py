"""``SocketWaker``: how other threads wake a thread asleep in a blocking receive on its socket.

A thread that sleeps on one ZeroMQ socket (an actor's inbox, a waiting thread's reply inbox)
sleeps in a blocking receive, not in ``poll()`` with a pipe beside it: a message is then read
by the receive that was already waiting for it. To wake it for something else, another thread
sends an empty frame to that socket over ``inproc://``; signed messages are never empty, so
the sleeper reads an empty one as "look again", never as something to handle.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import zmq

_zmq_send = zmq.backend.Socket.send  # without the Python wrapper: one call per wake-up
_NOBLOCK = int(zmq.NOBLOCK)
_numbers = itertools.count(1)


def wake_address() -> str:
    """A fresh ``inproc://`` address for a sleeper's socket to bind beside its own."""
    return f"inproc://actormesh-wake-{next(_numbers)}"


class SocketWaker:
    """Sends the wake-ups to one socket, from any thread (a PUSH socket under a lock)."""

    __slots__ = ("_lock", "_socket")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socket: zmq.Socket[Any] | None = None  # none yet, or closed: wakes nobody

    def connect(self, sock: zmq.Socket[Any], address: str) -> None:
        """Wake through ``sock`` (a PUSH socket of the sleeper's context) connected to
        ``address`` (what the sleeper's socket bound)."""
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(address)
        with self._lock:
            self._socket = sock

    def wake(self) -> None:
        with self._lock:
            sock = self._socket
            if sock is not None:
                try:
                    _zmq_send(sock, b"", _NOBLOCK)
                except zmq.ZMQError:
                    pass  # cannot happen (no send limit on inproc to an unlimited receiver)

    def close(self) -> None:
        """Close the sending socket; later wake-ups do nothing (the sleeper is gone)."""
        with self._lock:
            if self._socket is not None:
                self._socket.close(linger=0)
                self._socket = None

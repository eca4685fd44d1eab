"""Unix datagram sockets: how a reply reaches a waiting thread of a process on the same host.

A message through ZeroMQ passes four threads: the sender's, its context's I/O thread, the
receiver's I/O thread and the receiver's. Each hand-off wakes a thread, and on a machine with
few cores those wake-ups, not the sockets, are most of a small message's cost. A datagram sent
to a unix socket is in the receiver's queue when ``sendto`` returns, and wakes the thread asleep
in ``recv`` on it directly: raw pyzmq's pickled echo took 141 to 147 µs on this project's 2-core
VM where the same echo over datagrams took 16 to 19 µs (``bench/bench_datagrams.py``; RESULTS.md,
issue 22's tenth pass).

Datagrams are used where they cannot lose or reorder anything the runtime promises:

- Only for replies to a thread's reply inbox (``reply_inbox.py``) from processes on its host.
  A call's ranks each send one reply, and a port keeps no order between ranks.
- A sender never blocks. Linux queues at most ``net.unix.max_dgram_qlen`` datagrams (10 by
  default) for a reader, and a message larger than :data:`DATAGRAM_MAX` does not fit; such a
  reply goes through the caller's process inbox instead (ZeroMQ, read by its I/O thread).
  Replies of one sender are handled in the order it sent them, whichever route each took: a
  datagram names the sequence number of the last message its sender sent to the process inbox,
  and waits until that one was handled (``Node.in_order``); a reply that took the process inbox
  names the last datagram before it, and the I/O thread reads the reply inbox before handling
  it (``Node._on_reply``, ``ReplyInbox.drain``). So does a sender's death: a reply it sent just
  before is handled, not failed (``Node.record_death``).
- Nothing is unpickled before its signature is checked, as for every message (``codec.py``).

An empty datagram is a wake-up (signed messages are never empty): other threads of the
process send one to make the reader look at its state again.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading

from .address import DATAGRAM_SCHEME

# The largest message sent as one datagram. Larger replies go through ZeroMQ; the reader's
# buffer is this size, so a datagram is never cut short.
DATAGRAM_MAX = 64 * 1024

_MSG_DONTWAIT = socket.MSG_DONTWAIT


def path_of(address_ipc: str) -> str:
    """The socket path of a datagram address (``dgram://<path>``)."""
    return address_ipc[len(DATAGRAM_SCHEME) :]


class DatagramInbox:
    """A bound unix datagram socket, read by one thread at a time (its owner, or the I/O thread
    while the owner does not wait)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # left by an earlier process of this path that was killed
            self._sock.bind(path)
        except BaseException:
            self._sock.close()
            raise
        self.fd = self._sock.fileno()
        self._buffer = bytearray(DATAGRAM_MAX)
        self._view = memoryview(self._buffer)
        self._recv_into = self._sock.recv_into
        self._timeout_ms = -1
        self.closed = False

    def receive(self, timeout_ms: int) -> bytes | None:
        """The next datagram, waiting up to ``timeout_ms``; ``None`` when none came."""
        if timeout_ms != self._timeout_ms:
            # SO_RCVTIMEO rather than settimeout: a blocking recv then waits in one syscall,
            # where Python's own timeout polls first.
            seconds, ms = divmod(max(timeout_ms, 1), 1000)
            self._sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", seconds, ms * 1000)
            )
            self._timeout_ms = timeout_ms
        try:
            n = self._recv_into(self._buffer)  # a signal's handler may raise (Ctrl-C)
        except BlockingIOError:  # the timeout went by
            return None
        return self._view[:n].tobytes()

    def try_receive(self) -> bytes | None:
        """The next datagram if one is queued, else ``None`` (never waits)."""
        try:
            n = self._recv_into(self._buffer, 0, _MSG_DONTWAIT)
        except BlockingIOError:
            return None
        return self._view[:n].tobytes()

    def close(self) -> None:
        """Close the socket and remove its path (the reader's thread, or the one closing the
        node once the reader let go)."""
        if self.closed:
            return
        self.closed = True
        self._sock.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


class DatagramSender:
    """An unbound unix datagram socket that sends to readers' paths, from any thread."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sendto = self._sock.sendto
        self._lock = threading.Lock()
        self.closed = False

    def send(self, data: bytes, path: str) -> bool:
        """Queue ``data`` for the reader at ``path``; whether it was (never blocks). The caller
        keeps its datagrams to one reader in order (the transport sends under its send lock)."""
        if len(data) > DATAGRAM_MAX:
            return False
        try:
            self._sendto(data, _MSG_DONTWAIT, path)
        except OSError:
            # The reader's queue is full (EAGAIN), this socket's buffer is (ENOBUFS), the reader
            # is gone (ECONNREFUSED, ENOENT) or the system takes no datagram this large: the
            # caller sends it another way, never drops it.
            return False
        return True

    def wake(self, path: str) -> None:
        """Send a wake-up (any thread). A full queue needs none: its reader is woken already."""
        with self._lock:
            if not self.closed:
                self.send(b"", path)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._sock.close()

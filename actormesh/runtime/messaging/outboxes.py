"""A process's outboxes: one ZeroMQ PUSH socket per destination it sends to, connected on first
use, the routes to them, and the one-way messages queued on each (``transport.py`` builds the
send and receive paths on them).

An outbox is written by whichever thread sends, always under the send lock (ZeroMQ sockets are
not thread-safe; the lock is the full memory barrier ZeroMQ asks for when a socket moves between
threads, and it makes "draw a sequence number, then send" atomic, so per-sender FIFO order
holds). A sender takes an outbox before the send lock, and the outbox may be closed in between
(its process died, or no handle on its actor mesh is left here): the send then starts again,
with a new one. Closing happens under the send lock, so what is checked under it holds.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

import zmq

from . import protocol
from .address import DATAGRAM_SCHEME, Address, actor_address
from .codec import Signer, new_id
from .curve import CurveKeys
from .datagrams import path_of
from .io_loop import IoLoop
from .open_files import files_short, make_room

_SNDMORE = int(zmq.SNDMORE)
_MAX_BATCH = 256
# pyzmq's send without its Python wrapper (which only adds the routing_id and group options of
# draft sockets): one Python frame less for every message sent.
zmq_send = zmq.backend.Socket.send


class Outboxes(IoLoop):
    """The outboxes of one process, their routes and queued one-way messages; the I/O thread
    (``IoLoop``) sends what is queued as soon as it gets to it."""

    def __init__(self, name: str, key: bytes, host_id: str, curve: CurveKeys | None) -> None:
        super().__init__(f"actormesh-io-{name}")
        self.ctx = zmq.Context()
        self.host_id = host_id
        # Across hosts, tcp:// traffic may be encrypted (ipc:// never is: it stays on the host).
        self._curve = curve
        # The sender id is new for every process incarnation (a healed rank reuses its mailbox,
        # and receivers must not take its fresh sequence numbers for replays).
        self._signer = Signer(key, new_id())
        self._outboxes: dict[str, zmq.Socket[Any]] = {}
        # dest -> (endpoint, outbox), so a send skips working out the endpoint. An entry may
        # hold a socket closed since (it is then dropped and looked up again, under the lock).
        self._outbox_of: dict[Address, tuple[str, zmq.Socket[Any] | None]] = {}
        self._send_lock = threading.Lock()
        # receiver's mailbox -> sequence number of the last message sent to it (see last_seq_to)
        self._last_seq: dict[bytes, int] = {}
        # One-way messages waiting to go, per endpoint (guarded by that endpoint's lock).
        self._batches: dict[str, tuple[bytes, list[tuple[tuple[Any, ...], bytes]]]] = {}
        self._outbox_lock = threading.Lock()
        self._actor_routes: dict[tuple[Address, str], Address] = {}
        self._released: deque[tuple[Sequence[Address], str]] = deque()  # see release_actor
        self._closed = False

    def route_to_actor(self, proc: Address, key: str) -> Address:
        """Where to send calls for actor ``key`` living in ``proc``: its own inbox when it is on
        this host, else the process inbox (whose I/O thread hands them over).

        For one sender and one actor the answer never changes, so per-sender FIFO holds.
        """
        route = self._actor_routes.get((proc, key))
        if route is None:
            direct = actor_address(proc, key) if proc.host == self.host_id else None
            if len(self._actor_routes) > 65536:  # meshes come and go in a long notebook
                self._actor_routes.clear()
            route = self._actor_routes[(proc, key)] = direct or proc
        return route

    def release_actor(self, procs: Sequence[Address], key: str) -> None:
        """No handle on actor mesh ``key`` is left here: close the outboxes straight to its
        actors in ``procs``. Any thread, even one in the middle of a send (the garbage
        collector calls it): the I/O thread does it, or the next connection short of files."""
        self._released.append((procs, key))
        self.call_soon(self._forget_released)

    def _forget_released(self) -> None:
        while self._released:
            procs, key = self._released.popleft()
            self._forget_actor(procs, key)

    def _forget_actor(self, procs: Sequence[Address], key: str) -> None:
        # Unlike ``forget``, what was sent still goes: the socket lingers.
        for proc in procs:
            route = self._actor_routes.pop((proc, key), None)
            if route is None or route is proc:
                continue
            endpoint = route.endpoint_from(self.host_id)
            with self._outbox_lock, self._send_lock:
                sock = self._outboxes.pop(endpoint, None)
                if sock is not None:
                    if endpoint in self._batches:
                        self._send_batch(sock, endpoint)
                    sock.close()

    def _remember_outbox(self, dest: Address) -> tuple[str, zmq.Socket[Any] | None]:
        """The (endpoint, outbox) of ``dest``, kept for the next sends to it; for a reply
        inbox, sent datagrams, (its socket's path, no outbox)."""
        route: tuple[str, zmq.Socket[Any] | None]
        if dest.ipc is not None and dest.ipc.startswith(DATAGRAM_SCHEME):
            if dest.host != self.host_id:
                raise ConnectionError(f"reply inbox {dest.ipc} is on another host")
            route = (path_of(dest.ipc), None)
        else:
            route = self._outbox(dest)
        if len(self._outbox_of) > 65536:
            self._outbox_of.clear()
        self._outbox_of[dest] = route
        return route

    def _outbox(self, dest: Address) -> tuple[str, zmq.Socket[Any]]:
        endpoint = dest.endpoint_from(self.host_id)
        sock = self._outboxes.get(endpoint)
        if sock is None:
            sock = self._connect(endpoint)
        return endpoint, sock

    def _connect(self, endpoint: str) -> zmq.Socket[Any]:
        if endpoint not in self._outboxes and files_short() is not None:
            make_room(endpoint, self._forget_released)
        with self._outbox_lock:
            existing = self._outboxes.get(endpoint)
            if existing is None:
                if self._closed:
                    raise ConnectionError("transport is closed")
                sock = self.ctx.socket(zmq.PUSH)
                sock.setsockopt(zmq.LINGER, 2000)
                sock.setsockopt(zmq.SNDHWM, 10000)
                # An actor's own inbox is bound when its spawn arrives, which can be just after
                # the first call to it connects: retry soon, then back off.
                sock.setsockopt(zmq.RECONNECT_IVL, 2)
                sock.setsockopt(zmq.RECONNECT_IVL_MAX, 200)
                if self._curve is not None and endpoint.startswith("tcp://"):
                    sock.setsockopt(zmq.CURVE_SERVERKEY, self._curve.server_public)
                    sock.setsockopt(zmq.CURVE_PUBLICKEY, self._curve.client_public)
                    sock.setsockopt(zmq.CURVE_SECRETKEY, self._curve.client_secret)
                sock.connect(endpoint)
                self._outboxes[endpoint] = existing = sock
            return existing

    def forget(self, dest: Address) -> None:
        """Close the outboxes to a process that is gone and to its actors (queued messages are
        dropped: a healed rank must not receive calls meant for its previous incarnation)."""
        routes = [route for (proc, _), route in list(self._actor_routes.items()) if proc == dest]
        for address in (dest, *routes):
            try:
                endpoint = address.endpoint_from(self.host_id)
            except ConnectionError:
                continue
            with self._outbox_lock, self._send_lock:
                sock = self._outboxes.pop(endpoint, None)
                self._batches.pop(endpoint, None)
                if sock is not None:
                    sock.close(linger=0)

    # -- one-way messages (any thread) -----------------------------------------------------------

    def send_one_way(self, dest: Address, envelope: tuple[Any, ...], payload: bytes) -> None:
        """Send a message nobody answers (a broadcast), possibly batched with the next ones.

        Back-to-back one-way messages to one process travel as one signed ZeroMQ message:
        the I/O thread sends what has accumulated as soon as it gets to it, and any other send
        of this process (to any process) sends the batches first, so per-sender order is kept,
        and so is causal order: what this message makes happen elsewhere cannot reach a
        receiver of the batch before the batch does.
        """
        if protocol.CHECK:
            protocol.check_envelope(envelope)
        while True:
            endpoint, sock = self._outbox(dest)
            with self._send_lock:
                if sock.closed:
                    continue  # closed since: see the module docstring
                pending = self._batches.get(endpoint)
                if pending is not None:
                    pending[1].append((envelope, payload))
                    if len(pending[1]) >= _MAX_BATCH:
                        self._send_batch(sock, endpoint)
                    return
                self._batches[endpoint] = (dest.mailbox, [(envelope, payload)])
                break
        self.call_soon(lambda: self._flush(endpoint))

    def _flush(self, endpoint: str) -> None:
        with self._send_lock:
            sock = self._outboxes.get(endpoint)
            if sock is None:
                self._batches.pop(endpoint, None)
            elif endpoint in self._batches:
                self._send_batch(sock, endpoint)

    def _send_batches(self) -> None:
        # Caller holds the send lock. Every batch, not only one to the same process: a message
        # to anyone may start a chain (a call to an actor that calls the batch's receiver) that
        # must not overtake what this process sent before it (Monarch's causal order).
        for endpoint in list(self._batches):
            sock = self._outboxes.get(endpoint)
            if sock is None:
                self._batches.pop(endpoint, None)
            else:
                self._send_batch(sock, endpoint)

    def _send_batch(self, sock: zmq.Socket[Any], endpoint: str) -> None:
        # Caller holds the send lock.
        mailbox, items = self._batches.pop(endpoint)
        if len(items) == 1:
            envelope, payload = items[0]
        else:
            envelope, payload = (protocol.BATCH, items), b""
        self._send_frames(sock, self._signer.frames(mailbox, envelope, payload))
        self._last_seq[mailbox] = self._signer.last_seq

    @staticmethod
    def _send_frames(sock: zmq.Socket[Any], frames: list[Any]) -> None:
        # Small frames are cheaper copied; only bulk buffers go zero-copy.
        last = len(frames) - 1
        for i, frame in enumerate(frames):
            flags = 0 if i == last else _SNDMORE
            if i == 0:
                zmq_send(sock, frame, flags)
            else:
                zmq_send(sock, frame, flags, False)

    def last_seq_to(self, mailbox: bytes) -> int:
        """The sequence number of the last message this process sent to ``mailbox`` (0: none).

        A reply that travels by another socket than earlier messages to the caller's process
        carries it, so the caller handles those messages first (see ``Node.in_order``).
        """
        if not self._batches:
            # Every message this thread sent is recorded; one that another thread is sending
            # now is not ordered before this reply either way.
            return self._last_seq.get(mailbox, 0)
        with self._send_lock:
            for endpoint, (to, _) in list(self._batches.items()):
                if to == mailbox:  # queued one-way messages go first
                    self._send_batch(self._outboxes[endpoint], endpoint)
            return self._last_seq.get(mailbox, 0)

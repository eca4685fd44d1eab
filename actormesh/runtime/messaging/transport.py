"""The ZeroMQ sockets of one process: its inbox, its outboxes, and what sends and reads them.

Socket ownership (ZeroMQ sockets are not thread-safe):
- The *inbox* (a PULL socket bound on ``ipc://`` for this host and, when asked, ``tcp://`` for
  other hosts) is read only by the I/O thread.
- An *outbox* (a PUSH socket connected to one destination) is written by whichever thread sends,
  always under the transport's send lock. The lock is a full memory barrier, which is what
  ZeroMQ asks for when a socket moves between threads, and it also makes "draw a sequence
  number, then send" atomic, so per-sender FIFO order holds. One lock rather than one per
  destination, because a cast to many receivers is signed once with one sequence number.
- An actor's own inbox and a thread's reply inbox (``actor_inbox.py``, ``reply_inbox.py``) are
  read by their own threads, so calls and replies skip the I/O thread.
- A thread's reply inbox is not a ZeroMQ socket but a unix datagram socket (``datagrams.py``):
  replies from processes of this host reach the waiting thread without waking an I/O thread
  on either side. A reply that cannot go as a datagram comes through the process inbox.

The I/O thread (``io_loop.py``, which ``Transport`` is built on) never runs user code: it
authenticates, decodes envelopes and dispatches to the handler, which must only do short work
(complete a future, queue a message for an actor).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from . import protocol
from .address import DATAGRAM_SCHEME, Address, actor_address, local_host_id, process_of_inbox
from .codec import Message, Signer, Verifier, new_id
from .curve import CurveKeys
from .datagrams import DatagramSender, path_of
from .envelopes import ReplyEnvelope
from .io_loop import IoLoop
from .open_files import files_short, make_room
from .receive import receive
from .run_dir import forget_shared_memory, note_shared_memory
from .shm_lane import SendLane

logger = logging.getLogger(__name__)

_DRAIN_BATCH = 512
_SNDMORE = int(zmq.SNDMORE)
_MAX_BATCH = 256
# pyzmq's send without its Python wrapper (which only adds the routing_id and group options of
# draft sockets): one Python frame less for every message sent.
_zmq_send = zmq.backend.Socket.send


def _all_here(dests: Sequence[Address], host: str) -> bool:
    """Whether ``dests`` are all on ``host`` (reached over ipc://), each once: a destination
    named twice would find only its first place, and leave its second byte of a lane's slot
    unread (shm_lane.py)."""
    for dest in dests:  # a loop: cheaper than all() over a generator
        if dest.host != host or dest.ipc is None:
            return False
    return len({dest.mailbox for dest in dests}) == len(dests)


def _after_datagrams(envelope: tuple[Any, ...], seq: int) -> tuple[Any, ...]:
    """A REPLY envelope that names ``seq``, its sender's last datagram to the reply inbox the
    reply was meant for (its ``datagrams`` field; ``after`` 0 when it had none)."""
    reply = ReplyEnvelope.read(envelope)
    return tuple(reply._replace(after=reply.after or 0, datagrams=seq))


def _unattached(msg: Message) -> None:
    logger.warning("dropped a %r message: no node handles this transport's messages", msg.kind)


class Transport(IoLoop):
    """The inbox, the outboxes and the I/O thread of one process."""

    def __init__(
        self,
        key: bytes,
        run_dir: str,
        name: str,
        tcp_host: str | None = None,
        host_id: str | None = None,
        mailbox: bytes | None = None,
        ipc: str | None = None,
        tcp_port: int = 0,
        curve: CurveKeys | None = None,
        shm_lane: bool = False,
    ) -> None:
        super().__init__(f"actormesh-io-{name}")
        self.ctx = zmq.Context()
        self.key = key
        self.run_dir = run_dir
        # Across hosts, tcp:// traffic may be encrypted (ipc:// never is: it stays on the host).
        self._curve = curve
        self.mailbox = mailbox or new_id()
        self.host_id = host_id or local_host_id()
        # The sender id is new for every process incarnation (a healed rank reuses its mailbox,
        # and receivers must not take its fresh sequence numbers for replays).
        self._signer = Signer(key, new_id())
        self._verifier = Verifier(key, self.mailbox)
        # Large tensors to processes of this host go through shared memory (shm_lane.py).
        self._lane = SendLane(self.mailbox) if shm_lane else None
        # Its files (and TensorBuffers') outlive a process killed with its whole tree: the
        # run dir's next sweep removes them (run_dir.py). The note goes as the transport closes.
        self._pid = os.getpid()
        note_shared_memory(run_dir, self.mailbox)
        # Handles each message off the process inbox, on the I/O thread: the Node built on this
        # transport sets it (Node.dispatch) before the transport starts.
        self.on_message: Callable[[Message], None] = _unattached
        self._inbox = self.ctx.socket(zmq.PULL)
        self._inbox.setsockopt(zmq.LINGER, 0)
        self._inbox.setsockopt(zmq.RCVHWM, 0)
        ipc = ipc or f"ipc://{run_dir}/{name}"
        self._inbox.bind(ipc)
        tcp = None
        if tcp_host is not None:
            tcp = self._bind_tcp(tcp_host, tcp_port)
        self.address = Address(self.host_id, ipc, tcp, self.mailbox)
        self._outboxes: dict[str, zmq.Socket[Any]] = {}
        # dest -> (endpoint, outbox), so a send skips working out the endpoint. An entry may
        # hold a socket closed since (it is then dropped and looked up again, under the lock).
        self._outbox_of: dict[Address, tuple[str, zmq.Socket[Any] | None]] = {}
        self._send_lock = threading.Lock()
        self._datagrams = DatagramSender()  # replies to reply inboxes of this host
        # reply inbox's path -> sequence number of the last datagram sent to it
        self._last_datagram: dict[str, int] = {}
        # receiver's mailbox -> sequence number of the last message sent to it (see last_seq_to)
        self._last_seq: dict[bytes, int] = {}
        # Called on the I/O thread after each message off the process inbox is handled.
        self.on_handled: Callable[[Message], None] | None = None
        # One-way messages waiting to go, per endpoint (guarded by that endpoint's lock).
        self._batches: dict[str, tuple[bytes, list[tuple[tuple[Any, ...], bytes]]]] = {}
        self._outbox_lock = threading.Lock()
        self._actor_routes: dict[tuple[Address, str], Address] = {}
        self._released: deque[tuple[Sequence[Address], str]] = deque()  # see release_actor
        self.add_reader(self._inbox, self._drain)
        self._closed = False
        self._closing = False
        self._closers: list[Callable[[], None]] = []  # see on_close

    def _bind_tcp(self, host: str, port: int) -> str:
        # Socket options are copied when a bind happens, so the ipc:// bind made before stays
        # plain while this one requires Curve.
        # No ZMQ_MAXMSGSIZE: tensors travel as frames of any size in signed messages, and the
        # signature is checked only once the whole message is in. With Curve, a peer without
        # the key fails the handshake before it can send a byte; without it
        # (ACTORMESH_CURVE=0), whoever can connect can make this process allocate a frame as
        # large as it sends: use that only on a network nobody else reaches.
        if self._curve is not None:
            self._inbox.setsockopt(zmq.CURVE_SERVER, 1)
            self._inbox.setsockopt(zmq.CURVE_SECRETKEY, self._curve.server_secret)
        if port:
            self._inbox.bind(f"tcp://{host}:{port}")
        else:
            port = self._inbox.bind_to_random_port(f"tcp://{host}")
        return f"tcp://{host}:{port}"

    def listen_tcp(self, host: str, advertise: str, curve: CurveKeys | None) -> Address:
        """Also accept messages over tcp:// (for other hosts); returns the new address.

        Any thread: the bind runs on the I/O thread, which owns the inbox.
        """
        if self.address.tcp is not None:
            return self.address
        done = threading.Event()
        result: list[Any] = []

        def bind() -> None:
            try:
                self._curve = curve
                endpoint = self._bind_tcp(host, 0)
                result.append(f"tcp://{advertise}:{endpoint.rsplit(':', 1)[1]}")
            except Exception as exc:
                result.append(exc)
            done.set()

        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self.call_soon(bind)
            if not done.wait(10):
                raise TimeoutError("the I/O thread did not bind the tcp inbox")
        else:
            bind()
        if isinstance(result[0], Exception):
            raise result[0]
        self.address = self.address._replace(tcp=result[0])
        return self.address

    # -- sending (any thread) --------------------------------------------------------------------

    def send(
        self,
        dest: Address,
        envelope: tuple[Any, ...],
        payload: bytes = b"",
        buffers: Sequence[Any] = (),
        digest: bytes | None = None,
        caller: bytes | None = None,
    ) -> None:
        """Send one message. Never blocks for long: ZeroMQ queues until the peer is reachable.

        ``caller``: for a reply to a thread's reply inbox (a datagram address), the mailbox of
        that thread's process, where the reply goes when it cannot go as a datagram."""
        if protocol.CHECK:
            protocol.check_envelope(envelope)
        lane: bytes | None = None
        while True:
            route = self._outbox_of.get(dest)
            if route is None:
                route = self._remember_outbox(dest)
            endpoint, sock = route
            if buffers and lane is None and self._lane is not None and endpoint[:6] != "tcp://":
                # Copied before the lock: other sends go on.
                lane = self._lane.put(buffers, (dest.mailbox,))
            if sock is None:  # a reply inbox of this host
                # The route of a reply inbox is its socket's path (no outbox).
                if self._send_datagram(dest, endpoint, envelope, payload, buffers, digest, lane):
                    return
                if caller is None:
                    self._release_unsent(lane)
                    logger.error("a reply to %s could not be sent: no route but datagrams", dest)
                    return
                # Its queue is full, or the reply too large: through the caller's process inbox.
                # The sender's later replies name it, so they are handled after it (in_order);
                # it names the last datagram sent before it, handled before it (Node._on_reply).
                dest = process_of_inbox(dest, caller)
                sent = self._last_datagram.get(endpoint)
                if sent:
                    envelope = _after_datagrams(envelope, sent)
                continue
            try:
                with self._send_lock:
                    if sock.closed:
                        self._outbox_of.pop(dest, None)
                        continue  # closed since: see the note after send_one_way
                    if self._batches:  # earlier one-way messages first (causal order)
                        self._send_batches()
                    frames = self._signer.frames(
                        dest.mailbox, envelope, payload, buffers, digest, lane
                    )
                    if len(frames) == 1:
                        _zmq_send(sock, frames[0])
                    else:
                        self._send_frames(sock, frames)
                    self._last_seq[dest.mailbox] = self._signer.last_seq
                    return
            except BaseException:
                self._release_unsent(lane)
                raise

    def _send_datagram(
        self,
        dest: Address,
        path: str,
        envelope: tuple[Any, ...],
        payload: bytes,
        buffers: Sequence[Any],
        digest: bytes | None,
        lane: bytes | None,
    ) -> bool:
        """Send a message to a reply inbox as one datagram; whether it went (datagrams.py)."""
        if buffers and lane is None:
            return False  # its buffers would be frames of their own
        try:
            with self._send_lock:
                if self._datagrams.closed:
                    raise ConnectionError("transport is closed")
                if self._batches:  # earlier one-way messages first (causal order)
                    self._send_batches()
                frames = self._signer.frames(dest.mailbox, envelope, payload, buffers, digest, lane)
                if not self._datagrams.send(frames[0], path):
                    return False
                if len(self._last_datagram) > 4096:  # reply inboxes come and go (controllers)
                    self._last_datagram.clear()
                self._last_datagram[path] = self._signer.last_seq
                return True
        except BaseException:
            self._release_unsent(lane)
            raise

    def send_many(
        self,
        dests: Sequence[Address],
        envelope: tuple[Any, ...],
        payload: bytes = b"",
        buffers: Sequence[Any] = (),
        digest: bytes | None = None,
    ) -> None:
        """Send one message to several processes: signed once, then sent back to back. Its
        tensors, to processes of this host, are copied once into a slot they all read
        (shm_lane.py)."""
        if protocol.CHECK:
            protocol.check_envelope(envelope)
        if len(dests) == 1:
            self.send(dests[0], envelope, payload, buffers, digest)
            return
        lane: bytes | None = None
        if buffers and self._lane is not None and _all_here(dests, self.host_id):
            lane = self._lane.put(buffers, [dest.mailbox for dest in dests])
        sent = [0]  # how many of dests it reached
        try:
            self._send_to_many(dests, envelope, payload, buffers, digest, lane, sent)
        except BaseException:
            self._release_unsent(lane, sent[0])
            raise

    def _release_unsent(self, lane: bytes | None, sent: int = 0) -> None:
        if lane is not None and self._lane is not None:
            # Not sent to the receivers from place ``sent`` on: those will not read the slot.
            self._lane.release(lane, sent)

    def forget_receiver(self, mailbox: bytes) -> None:
        """The process of ``mailbox`` died: free its places in this process's lane slots, for
        messages to it and to its actors' own inboxes (any thread)."""
        if self._lane is not None:
            routes = list(self._actor_routes.items())
            inboxes = {route.mailbox for (proc, _), route in routes if proc.mailbox == mailbox}
            self._lane.forget_receiver({mailbox, *inboxes})

    def _send_to_many(
        self,
        dests: Sequence[Address],
        envelope: tuple[Any, ...],
        payload: bytes,
        buffers: Sequence[Any],
        digest: bytes | None,
        lane: bytes | None,
        sent: list[int],
    ) -> None:
        while True:
            known = self._outbox_of
            routes: list[tuple[str, zmq.Socket[Any]]] = []
            for dest in dests:  # a loop, not a comprehension: this runs for every call()
                route = known.get(dest)
                endpoint, sock = self._remember_outbox(dest) if route is None else route
                if sock is None:
                    raise ConnectionError(f"{endpoint} is a reply inbox: it takes replies only")
                routes.append((endpoint, sock))
            with self._send_lock:
                closed = [d for d, (_, sock) in zip(dests, routes, strict=True) if sock.closed]
                if closed:
                    for dest in closed:
                        known.pop(dest, None)
                    continue  # closed since: see the note after send_one_way
                if self._batches:  # earlier one-way messages first (causal order)
                    self._send_batches()
                mailboxes = [dest.mailbox for dest in dests]
                frames = self._signer.frames(mailboxes, envelope, payload, buffers, digest, lane)
                if len(frames) == 1:  # a call without tensors: one frame, sent inline
                    frame = frames[0]
                    if lane is None:
                        for _, sock in routes:
                            _zmq_send(sock, frame)
                    else:  # each receiver not reached must not hold the slot (send_many)
                        for _, sock in routes:
                            _zmq_send(sock, frame)
                            sent[0] += 1
                else:
                    for _, sock in routes:
                        self._send_frames(sock, frames)
                seq = self._signer.last_seq
                for mailbox in mailboxes:
                    self._last_seq[mailbox] = seq
                return

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
                    continue  # closed since: see the note after send_one_way
                pending = self._batches.get(endpoint)
                if pending is not None:
                    pending[1].append((envelope, payload))
                    if len(pending[1]) >= _MAX_BATCH:
                        self._send_batch(sock, endpoint)
                    return
                self._batches[endpoint] = (dest.mailbox, [(envelope, payload)])
                break
        self.call_soon(lambda: self._flush(endpoint))

    # An outbox is taken before the send lock, and may be closed in between (its
    # process died, or no handle on its actor mesh is left here): the send starts again, with
    # a new one. Closing happens under the send lock, so what is checked under it holds.

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
                _zmq_send(sock, frame, flags)
            else:
                _zmq_send(sock, frame, flags, False)

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

    def on_close(self, close: Callable[[], None]) -> None:
        """Run ``close`` (safe from any thread) when the transport closes, however the process
        ends (``Node.close``, or ``os._exit`` in an actor thread): how a thread's reply inbox
        wakes its waiting owner and removes its socket."""
        with self._outbox_lock:
            if self._closed:
                raise ConnectionError("transport is closed")
            self._closers.append(close)

    # -- reading (the I/O thread) ------------------------------------------------------------------

    def _drain(self) -> None:
        # zmq_poll said POLLIN: a message is waiting
        for msg in receive(self._inbox, self._verifier, _DRAIN_BATCH, woken=True):
            try:
                self.on_message(msg)
            except Exception:
                logger.exception("error handling a %r message", msg.kind)
            if self.on_handled is not None:
                self.on_handled(msg)

    # -- closing ---------------------------------------------------------------------------------

    @property
    def closing(self) -> bool:
        """Whether ``close`` began: nothing is sent or received any more."""
        return self._closing

    def close(self, linger: float = 1.0) -> None:
        """Stop the I/O thread and close every socket (queued sends get ``linger`` seconds)."""
        if self._closing:
            return
        self._closing = True
        self.stop_loop()
        with self._outbox_lock:
            self._closed = True
            outboxes = list(self._outboxes.items())
            self._outboxes.clear()
        for close in self._closers:
            self._guard(close)
        with self._send_lock:
            for endpoint, sock in outboxes:
                if endpoint in self._batches:  # unsent one-way messages go before we close
                    self._send_batch(sock, endpoint)
                sock.close(linger=int(linger * 1000))
        self._inbox.close(linger=0)
        with self._send_lock:
            self._datagrams.close()
        self.ctx.term()
        self.close_wake_pipe()
        if self._lane is not None:
            self._lane.close(linger)
        if os.getpid() == self._pid:  # not a forked child's copy
            forget_shared_memory(self.run_dir, self.mailbox.hex(), self._pid)

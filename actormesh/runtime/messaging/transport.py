"""The ZeroMQ sockets of one process: its inbox, its outboxes, and what sends and reads them.

Socket ownership (ZeroMQ sockets are not thread-safe):
- The *inbox* (a PULL socket bound on ``ipc://`` for this host and, when asked, ``tcp://`` for
  other hosts) is read only by the I/O thread.
- An *outbox* (a PUSH socket connected to one destination: ``outboxes.py``) is written by
  whichever thread sends, always under the transport's send lock. The lock is a full memory
  barrier, which is what ZeroMQ asks for when a socket moves between threads, and it also makes
  "draw a sequence number, then send" atomic, so per-sender FIFO order holds. One lock rather
  than one per destination, because a cast to many receivers is signed once with one sequence
  number.
- An actor's own inbox and a thread's reply inbox (``actor_inbox.py``, ``reply_inbox.py``) are
  read by their own threads, so calls and replies skip the I/O thread.
- A thread's reply inbox is not a ZeroMQ socket but a unix datagram socket (``datagrams.py``):
  replies from processes of this host reach the waiting thread without waking an I/O thread
  on either side. A reply that cannot go as a datagram comes through the process inbox.

``Transport`` is built on ``Outboxes`` (the outboxes, their routes and the one-way messages
queued on them) and adds the inbox, the send paths (one destination, many, a reply inbox) and
closing. The I/O thread (``io_loop.py``, under both) never runs user code: it authenticates,
decodes envelopes and dispatches to the handler, which must only do short work (complete a
future, queue a message for an actor).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from . import protocol
from .address import Address, local_host_id, process_of_inbox
from .codec import Message, Verifier, new_id
from .curve import CurveKeys
from .datagrams import DatagramSender
from .envelopes import ReplyEnvelope
from .outboxes import Outboxes, zmq_send
from .receive import receive
from .run_dir import forget_shared_memory, note_shared_memory
from .shm_lane import SendLane

logger = logging.getLogger(__name__)

_DRAIN_BATCH = 512


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


class Transport(Outboxes):
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
        super().__init__(name, key, host_id or local_host_id(), curve)
        self.key = key
        self.run_dir = run_dir
        self.mailbox = mailbox or new_id()
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
        self._datagrams = DatagramSender()  # replies to reply inboxes of this host
        # reply inbox's path -> sequence number of the last datagram sent to it
        self._last_datagram: dict[str, int] = {}
        # Called on the I/O thread after each message off the process inbox is handled.
        self.on_handled: Callable[[Message], None] | None = None
        self.add_reader(self._inbox, self._drain)
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
                        continue  # closed since: see outboxes.py
                    if self._batches:  # earlier one-way messages first (causal order)
                        self._send_batches()
                    frames = self._signer.frames(
                        dest.mailbox, envelope, payload, buffers, digest, lane
                    )
                    if len(frames) == 1:
                        zmq_send(sock, frames[0])
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
                    continue  # closed since: see outboxes.py
                if self._batches:  # earlier one-way messages first (causal order)
                    self._send_batches()
                mailboxes = [dest.mailbox for dest in dests]
                frames = self._signer.frames(mailboxes, envelope, payload, buffers, digest, lane)
                if len(frames) == 1:  # a call without tensors: one frame, sent inline
                    frame = frames[0]
                    if lane is None:
                        for _, sock in routes:
                            zmq_send(sock, frame)
                    else:  # each receiver not reached must not hold the slot (send_many)
                        for _, sock in routes:
                            zmq_send(sock, frame)
                            sent[0] += 1
                else:
                    for _, sock in routes:
                        self._send_frames(sock, frames)
                seq = self._signer.last_seq
                for mailbox in mailboxes:
                    self._last_seq[mailbox] = seq
                return

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

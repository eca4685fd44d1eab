"""The actormesh runtime of one process: its transport, ports, hosted actors and supervision view.

Every process that takes part (the controller, each worker, each host agent) has exactly one
``Node``. The controller's is created on first use; a worker's is created by ``worker.main``.
Handlers run on the I/O thread and must stay short.
"""

from __future__ import annotations

import itertools
import logging
import threading
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, overload

from ...errors import ProcDeath
from . import shm_lane
from .address import Address
from .codec import Message
from .curve import CurveKeys
from .envelopes import (
    BatchEnvelope,
    DiedEnvelope,
    RepliesEnvelope,
    ReplyEnvelope,
    port_id_of,
)
from .protocol import (
    BATCH,
    BUF_DONE,
    DIED,
    KINDS,
    PORT,
    REPLIES,
    REPLY,
    ProtocolError,
    ReplyTo,
)
from .transport import Transport

logger = logging.getLogger(__name__)


class Port(NamedTuple):
    """Where a value can be sent: a process and one of its open ports. Picklable.

    What is sent carries the sender's rank (its position in the slice that messaged it, when
    sent from an endpoint), which ``PortReceiver.ranked()`` gives with each value.
    """

    address: Address
    port_id: int

    def send(self, value: Any) -> None:
        """Send ``value`` to the receiver of this port (non-blocking, from any thread)."""
        self._send(value, OK_VALUE)

    def exception(self, exc: BaseException) -> None:
        """Make the receiver's pending (or next) ``recv()`` fail with ``exc``, as an
        ``ActorError`` naming its type, message and traceback (failures travel as text)."""
        from ...errors import RemoteFailure

        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        etype = type(exc)
        name = etype.__qualname__
        if etype.__module__ not in ("builtins", "__main__"):
            name = f"{etype.__module__}.{name}"
        rank = sender_rank[0]()
        where = "" if rank is None else str(rank)
        self._send(RemoteFailure(where, "port", "exception", name, str(exc), text), FAILED_VALUE)

    def forward(self, value: Any, rank: int | None, failed: bool = False) -> None:
        """Send ``value`` as rank ``rank``'s (a rendered failure when ``failed``): how the
        runtime hands a port the answers of a ``send`` (meshes/endpoint.py)."""
        self._send(value, FAILED_VALUE if failed else OK_VALUE, rank)

    def _send(self, value: Any, status: int, rank: int | None = None) -> None:
        from .codec import dumps

        payload, buffers = dumps(value)
        transport = current_node().transport
        rank = sender_rank[0]() if rank is None else rank
        envelope = (PORT, self.port_id, rank, status)
        if buffers:
            transport.send(self.address, envelope, payload, buffers)
        else:
            transport.send_one_way(self.address, envelope, payload)


OK_VALUE, FAILED_VALUE = 0, 1  # the status of a PORT message
# Who is sending, as a rank: set by the actors layer (which knows the running endpoint).
sender_rank: list[Callable[[], int | None]] = [lambda: None]


_addresses: dict[tuple[Any, ...], Address] = {}


@overload
def reply_port(reply: None) -> None: ...
@overload
def reply_port(reply: tuple[Any, ...]) -> Port: ...
def reply_port(reply: tuple[Any, ...] | None) -> Port | None:
    """The Port of a reply, from the plain tuple an envelope carries (every call carries one:
    its Address is built once per caller)."""
    return None if reply is None else port_of(ReplyTo.read(reply))


def port_of(to: ReplyTo) -> Port:
    """The Port of a reply field read by name (``reply_port`` for one that is not)."""
    address = _addresses.get(to.address)
    if address is None:
        if len(_addresses) > 4096:
            _addresses.clear()
        address = _addresses[to.address] = Address(*to.address)
    return tuple.__new__(Port, (address, to.port_id))  # not Port(): its constructor is Python


class PortHandler(Protocol):
    def on_message(self, msg: Message) -> None: ...

    def on_death(self, mailbox: bytes, death: ProcDeath) -> bool | None: ...


class Node:
    """Process-wide runtime state. See the module docstring."""

    def __init__(self, transport: Transport, role: str) -> None:
        """The node of this process over ``transport`` (built, not started): from now on it
        handles what arrives there."""
        self.key = transport.key
        self.role = role
        self.run_dir = transport.run_dir
        self.transport = transport
        transport.on_message = self.dispatch
        self.address = self.transport.address
        # kind -> handler; read on every message, so a plain dict. Add to it with register().
        self.handlers: dict[str, Callable[[Message], None]] = {}
        self.register(REPLY, self._on_reply)
        self.register(REPLIES, self._on_replies)
        self.register(PORT, self.to_port)
        self.register(DIED, self._on_died)
        self.register(BATCH, self._on_batch)
        self.register(BUF_DONE, self.to_port)
        # port id -> its handler; read directly on the reply paths (one call less per reply).
        self.ports: dict[int, PortHandler] = {}
        self._port_ids = itertools.count(1)
        self.last_port_id = 0  # read as a mark: ports opened later have greater ids
        self._lock = threading.Lock()
        self.dead: dict[bytes, ProcDeath] = {}
        # Where rank-labelled output and unhandled failures go: the owner of this process.
        self.controller: Address | None = None
        self.mesh_id: str | None = None  # a worker's proc mesh
        self._on_close: list[Callable[[], None]] = []
        # Replies that overtook earlier messages from their sender (see in_order).
        self._handled: dict[bytes, int] = {}  # sender -> last seq handled off the process inbox
        self._held: list[tuple[bytes, int, Message]] = []
        self._held_lock = threading.Lock()
        self.transport.on_handled = self._note_handled
        # Each reads what a thread's reply inbox holds now, before the I/O thread handles what
        # must come after it: a death (record_death), a reply that took the process inbox after
        # datagrams of its sender (_on_reply). The reply inbox adds its own.
        self.drains: list[Callable[[], None]] = []

    def start(self) -> None:
        self.transport.start()

    def listen_tcp(self, host: str, advertise: str, curve: CurveKeys | None) -> Address:
        """Make this node reachable from other hosts (see ``Transport.listen_tcp``).

        Ports opened afterwards carry the tcp:// address, so other hosts can answer them."""
        self.address = self.transport.listen_tcp(host, advertise, curve)
        return self.address

    # -- ports -----------------------------------------------------------------------------------

    def open_port(self, handler: PortHandler, address: Address | None = None) -> Port:
        """A port for ``handler``, received on the process inbox or on ``address`` (a thread's
        reply inbox in this process)."""
        port_id = self.last_port_id = next(self._port_ids)
        self.ports[port_id] = handler
        # tuple.__new__: a NamedTuple's own constructor is a Python function (one per call)
        return tuple.__new__(Port, (address or self.address, port_id))

    def handlers_since(self, mark: int) -> list[PortHandler]:
        """The handlers of the ports still open that were opened after ``mark`` (a
        ``last_port_id`` read earlier): the calls made since then that await replies."""
        return [h for port_id, h in list(self.ports.items()) if port_id > mark]

    def close_port(self, port: Port) -> None:
        self.ports.pop(port.port_id, None)

    def to_port(self, msg: Message) -> None:
        """Hand a REPLY, PORT or BUF_DONE message to its port's handler, on the thread that read
        it (a reply inbox calls it for replies directly, rather than through ``dispatch``)."""
        port_id = port_id_of(msg)
        handler = self.ports.get(port_id)
        if handler is None:
            logger.debug("message for closed port %s dropped", port_id)
            return
        handler.on_message(msg)

    def _on_reply(self, msg: Message) -> None:
        """A REPLY off the process inbox. One that its sender could not send as a datagram
        (too large, or the inbox's queue full) names the last datagram the sender sent to
        that inbox before it: that one may still be queued, and is handled first."""
        if ReplyEnvelope.of(msg).datagrams is not None:
            self.read_reply_inboxes()
        self.to_port(msg)

    def read_reply_inboxes(self) -> None:
        """Handle what threads' reply inboxes hold now (returns once they did, see
        ``ReplyInbox.drain``)."""
        for drain in list(self.drains):
            try:
                drain()
            except Exception:
                logger.exception("reading a reply inbox failed")

    def _on_replies(self, msg: Message) -> None:
        """Replies that a host agent gathered from its workers, in one message (relay.py).

        Each is handled as if its worker had sent it here: the agent signed the whole message,
        covering every payload, so nothing here is unpickled before a signature was checked.
        """
        payload, buffers = msg.payload, msg.buffers
        start = first = 0
        for port_id, sender, index, status, after, size, nbuf in RepliesEnvelope.of(msg).items:
            reply = Message(
                sender,
                (REPLY, port_id, index, status, after),
                payload[start : start + size],
                buffers[first : first + nbuf],
            )
            start += size
            first += nbuf
            # It took another route than what its worker sent here directly before it.
            if self.in_order(reply):
                self.to_port(reply)

    # -- order across sockets --------------------------------------------------------------------

    def in_order(self, msg: Message) -> bool:
        """Whether a reply that took another route than the process inbox may be handled now:
        read off a thread's reply inbox, or gathered by a host agent (``_on_replies``).

        Its sender may have sent this process other messages before it (an endpoint's printed
        lines, port messages), which travel through the process inbox. A reply that names the
        sequence number of the last of them waits until the I/O thread has handled that one;
        the I/O thread then handles the reply itself.
        """
        after = ReplyEnvelope.of(msg).after
        if not after:
            return True
        # What was handled only grows (the I/O thread raises it), so a read without the lock
        # that finds the reply's predecessor handled is final; the lock is for holding it.
        if self._handled.get(msg.sender, 0) >= after:
            return True
        with self._held_lock:
            if self._handled.get(msg.sender, 0) >= after:
                return True
            self._held.append((msg.sender, after, msg))
            return False

    def _note_handled(self, msg: Message) -> None:
        # The held replies it releases are handled before it counts as handled: a reply read
        # meanwhile on another thread must be held behind them too, not overtake them.
        while True:
            with self._held_lock:
                ready = [m for s, seq, m in self._held if s == msg.sender and seq <= msg.seq]
                if not ready:
                    self._handled[msg.sender] = msg.seq
                    return
                self._held = [h for h in self._held if h[2] not in ready]
            for reply in ready:
                self.dispatch(reply)

    def _release_held(self) -> None:
        # The sender died: what it sent before the reply will not come.
        with self._held_lock:
            held, self._held = self._held, []
        for _, _, reply in held:
            self.dispatch(reply)

    # -- supervision view ------------------------------------------------------------------------

    def record_death(self, mailbox: bytes, death: ProcDeath) -> bool:
        """Mark a process dead and fail everything waiting on it (any thread).

        Returns whether some pending call observed the death (then it is handled)."""
        with self._lock:
            if mailbox in self.dead:
                return True
            self.dead[mailbox] = death
        shm_lane.forget_sender(mailbox)
        self.transport.forget_receiver(mailbox)  # its unread places in our slots
        # A reply the process sent just before it died may wait, unread, in a reply inbox: it
        # was queued there before its sender's exit was even noticed. Handle it first, so that
        # a call it answers completes rather than fails.
        self.read_reply_inboxes()
        if self._held:
            self._release_held()
        observed = False
        for handler in list(self.ports.values()):
            try:
                observed = bool(handler.on_death(mailbox, death)) or observed
            except Exception:
                logger.exception("port handler failed on a death notice")
        return observed

    def _on_died(self, msg: Message) -> None:
        died = DiedEnvelope.of(msg)
        self.record_death(died.mailbox, died.death)

    # -- dispatch (I/O thread) -------------------------------------------------------------------

    def register(self, kind: str, handler: Callable[[Message], None]) -> None:
        """Handle messages of ``kind`` (a kind of ``protocol.py``) with ``handler``, on the thread
        that reads them (usually the I/O thread). One handler per kind and process."""
        if kind not in KINDS:
            raise ProtocolError(f"no message kind {kind!r} in runtime/messaging/protocol.py")
        current = self.handlers.get(kind)
        if current is not None:
            raise ProtocolError(f"{kind!r} messages are handled already, by {current!r}")
        self.handlers[kind] = handler

    def dispatch(self, msg: Message) -> None:
        """Run the handler of a received message (on whichever thread read it)."""
        handler = self.handlers.get(msg.kind)
        if handler is None:
            logger.warning("no handler for message kind %r", msg.kind)
            return
        handler(msg)

    def _on_batch(self, msg: Message) -> None:
        # One signed message carrying several one-way ones (see Transport.send_one_way); the
        # payloads were covered by the signature of the head that carried them.
        for envelope, payload in BatchEnvelope.of(msg).items:
            self.dispatch(Message(msg.sender, envelope, payload, [], msg.seq, msg.sent))

    def send(
        self,
        dest: Address,
        envelope: tuple[Any, ...],
        payload: bytes = b"",
        buffers: Any = (),
        digest: bytes | None = None,
    ) -> None:
        self.transport.send(dest, envelope, payload, buffers, digest)

    def on_close(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` when this node closes (before its transport does)."""
        self._on_close.append(fn)

    def close(self) -> None:
        for fn in self._on_close:
            try:
                fn()
            except Exception:
                logger.exception("closing %r failed", fn)
        self.transport.close()


_node: Node | None = None
_node_lock = threading.Lock()
_node_factory: Callable[[], Node] | None = None


def set_node(node: Node | None) -> None:
    global _node
    _node = node


def set_node_factory(factory: Callable[[], Node]) -> None:
    """How ``current_node`` makes the node on first use (the controller registers one)."""
    global _node_factory
    _node_factory = factory


def current_node() -> Node:
    """This process's node; in the controller it is created on first use."""
    node = _node
    if node is not None:
        return node
    with _node_lock:
        if _node is None:
            if _node_factory is None:
                raise RuntimeError(
                    "no node in this process: import actormesh (its controller registers how "
                    "to make one) before using the runtime"
                )
            set_node(_node_factory())
        assert _node is not None
        return _node


def node_if_started() -> Node | None:
    return _node


# Why nothing can be spawned once this process's controller shut down (shutdown_context()).
SHUT_DOWN = (
    "actormesh was shut down in this process (shutdown_context() or exit), so nothing can be "
    "spawned any more; restart the kernel or the script"
)


def spawn_hint(what: str) -> str:
    """What to tell a user who used a stopped mesh: to spawn ``what``, unless this process's
    node is closing (``shutdown_context()``), after which nothing can be spawned."""
    node = _node
    if node is not None and node.transport.closing:
        return SHUT_DOWN
    return f"spawn {what}"

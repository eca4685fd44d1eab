"""Casts to meshes that span hosts: one message per remote host, fanned out by its host agent.

A proc mesh's table says, per rank, which host agent *relays* to it (``ProcTable.relays``; none
for ranks on the controller's own host). A sender on another host than a rank never sends to it
directly: every message of a cast, call or control request from that sender to that rank goes
through the rank's host agent, in one message per host that names the mesh and the shape. The
agent hands it to its local workers in the shape, in arrival order (calls straight to each
actor's own inbox, as senders on that host do). So there is exactly one route from each sender
to each receiver, and per-sender FIFO order holds as on one host; the sender's cost per cast
grows with hosts, not with processes or actors.

Replies to a ``call()`` come back the same way, gathered: the agent points the reply port of the
call it fans out at itself, and sends the caller one ``replies`` message carrying the answers of
all its ranks (each with its index, status and payload as the worker sent them) as soon as they
all answered, or at the latest ``window`` seconds (``config.REPLY_WINDOW``, a few ms) after it
got an answer it still holds: a slow rank delays its siblings' replies by no more than that, and
the caller's futures still see each rank separately (pending ranks, timeouts, failures). A
worker that exits answers no more: its siblings' replies are sent before the agent reports the
exit. ``call_one``, ``choose`` and ``stream`` replies stay direct (one reply, or replies wanted
as they come: gathering saves nothing).

Authenticity: the agent checked each worker's reply like any message it receives (signature,
destination, sequence number, payload digest) and never unpickles it; it signs the gathered
message itself, whose digest covers every payload and whose head lists every buffer's size, so
the caller still checks a signature before unpickling anything. Forwarding the workers' signed
frames instead would cost the caller one check per reply, which is what gathering saves, and
would trip its replay check: a worker's forwarded replies and its direct messages reach the
caller by different routes, so not in sequence order. The job key is shared by every process of
the job, so a worker's own signature never proved more than the agent's does.

Order: what a worker sent the caller directly before a reply (printed lines, port messages)
still comes first: the reply names the sequence number of the last of them and the caller holds
it until that one is handled (``Node.in_order``). Replies of one worker keep their order: the
agent reads them in order and sends its messages to one caller in order. What a worker sends the
caller directly *after* a gathered reply is not held back for it, and may arrive up to the
window before it.

Senders on the rank's own host (its siblings) keep sending directly, over ipc://.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...errors import SupervisionError
from ..messaging import Address, Message, payload_digest, reply_port
from ..messaging.envelopes import (
    CallEnvelope,
    RelayEnvelope,
    ReplyEnvelope,
    StopActorEnvelope,
    kind_of,
)
from ..messaging.protocol import CALL, RELAY, REPLIES, STOP_ACTOR, ReplyTo, shape_from_state
from .proc_table import Plan, ProcTable

if TYPE_CHECKING:
    from ...errors import ProcDeath
    from ..messaging import Node, Port
    from ..shape import Shape
    from .collect import Collector

logger = logging.getLogger(__name__)

# A gathered message stays well under what a receiver accepts (wire.Verifier: 1,024 buffers),
# and large payloads go at once: batching them saves nothing.
_MAX_BATCH_BUFFERS = 1000
_MAX_BATCH_BYTES = 1 << 20


def plan(procs: ProcTable, shape: Shape, state: tuple[Any, ...], sender_host: str) -> Plan:
    """Which ranks of ``shape`` a sender on ``sender_host`` reaches directly, and which agents
    it sends one message to for the rest (cached per shape: a cast computes it once)."""
    key = (state, sender_host)
    cached = procs.routes.get(key)
    if cached is not None:
        return cached
    relays = procs.relays
    direct: list[int] = []
    agents: dict[bytes, Address] = {}
    for rank in shape.ranks():
        relay = relays[rank] if relays is not None else None
        if relay is None or relay.host == sender_host:
            direct.append(rank)
        else:
            agents.setdefault(relay.mailbox, relay)
    result: Plan = (tuple(direct), tuple(agents.values()))
    if len(procs.routes) > 256:
        procs.routes.clear()
    procs.routes[key] = result
    return result


def send(
    node: Node,
    procs: ProcTable,
    shape: Shape,
    state: tuple[Any, ...],
    envelope: tuple[Any, ...],
    payload: bytes = b"",
    buffers: Sequence[Any] = (),
    digest: bytes | None = None,
    collector: Collector[Any] | None = None,
    one_way: bool = False,
    what: str = "",
    window: float = 0.0,
) -> None:
    """Send ``envelope`` to every rank of ``shape`` of a mesh that has relays (see the module
    docstring). Dead ranks fail ``collector`` at once; with no collector (a broadcast), a dead
    rank raises ``SupervisionError`` before anything is sent. ``one_way``: nobody answers, so
    back-to-back messages may travel batched. ``window`` > 0: the agents gather the replies of
    their ranks (a ``call`` envelope), holding one at most that many seconds."""
    dead = node.dead
    if dead:
        deaths = [
            (procs.addresses[r].mailbox, dead[procs.addresses[r].mailbox])
            for r in shape.ranks()
            if procs.addresses[r].mailbox in dead
        ]
        if deaths and collector is None and what:
            raise SupervisionError([deaths[0][1]], f"cannot broadcast to {what}")
        for mailbox, death in deaths:
            if collector is not None:
                collector.on_death(mailbox, death)
    direct, agents = plan(procs, shape, state, node.transport.host_id)
    transport = node.transport
    if buffers and digest is None:
        digest = payload_digest(payload)
    actor = None
    kind = kind_of(envelope)
    if kind == CALL:
        actor = CallEnvelope.read(envelope).key
    elif kind == STOP_ACTOR:  # the route of that actor's calls: it comes after them
        actor = StopActorEnvelope.read(envelope).key
    for rank in direct:
        address = procs.addresses[rank]
        if dead and address.mailbox in dead:
            continue
        if actor is not None:  # the same route as casts to meshes on one host take
            address = transport.route_to_actor(address, actor)
        if one_way and not buffers:
            transport.send_one_way(address, envelope, payload)
        else:
            transport.send(address, envelope, payload, buffers, digest)
    if agents:
        relayed = (RELAY, procs.mesh_id, state, one_way, envelope, window)
        for agent in agents:
            if one_way and not buffers:
                transport.send_one_way(agent, relayed, payload)
            else:
                transport.send(agent, relayed, payload, buffers, digest)


class Relayer:
    """The host agent's side: fans relayed messages out to its local workers, in arrival order,
    and gathers the replies of relayed calls (see the module docstring).

    ``add``/``remove`` keep the map of this host's workers (mesh id, rank) -> address; the
    ``relay`` handler, the gathering ports and their timers all run on the agent's I/O thread,
    which keeps each sender's order (and needs no locks).
    """

    def __init__(self, node: Node) -> None:
        self.node = node
        self.workers: dict[str, dict[int, Address]] = {}
        self._targets: dict[tuple[str, tuple[Any, ...]], tuple[tuple[int, Address], ...]] = {}
        self._gathers: dict[int, _Gathering] = {}  # by the port id the workers answer
        self._batches: dict[bytes, _Batch] = {}  # by the mailbox of the caller's inbox
        node.register(RELAY, self.on_relay)

    def add(self, mesh_id: str, rank: int, address: Address) -> None:
        self.workers.setdefault(mesh_id, {})[rank] = address
        self._targets.clear()

    def remove(self, mesh_id: str, rank: int) -> None:
        """Forget a worker that exited. Calls stop waiting for its reply, and what this agent
        holds goes out now: before the exit report, which fails the calls still waiting on it."""
        ranks = self.workers.get(mesh_id)
        if ranks is not None:
            address = ranks.pop(rank, None)
            if address is not None:
                # What is still queued for it (and its actors) must not reach a rank healed in
                # place: that is a new incarnation.
                self.node.transport.forget(address)
            if not ranks:
                del self.workers[mesh_id]
        self._targets.clear()
        for gather in list(self._gathers.values()):
            index = gather.shape.local_index(rank) if gather.mesh_id == mesh_id else None
            if index in gather.waiting:
                gather.waiting.discard(index)
                if not gather.waiting:
                    self._close(gather)
        for batch in list(self._batches.values()):
            self._flush(batch)

    def targets(self, mesh_id: str, state: tuple[Any, ...]) -> tuple[tuple[int, Address], ...]:
        """(rank, address) of this host's workers in the shape ``state``."""
        key = (mesh_id, state)
        found = self._targets.get(key)
        if found is None:
            mine = self.workers.get(mesh_id, {})
            shape = shape_from_state(state)
            found = tuple((r, mine[r]) for r in shape.ranks() if r in mine)
            if len(self._targets) > 1024:
                self._targets.clear()
            self._targets[key] = found
        return found

    def on_relay(self, msg: Message) -> None:
        relayed = RelayEnvelope.of(msg)
        mesh_id, state, envelope = relayed.mesh_id, relayed.shape, relayed.envelope
        kind = kind_of(envelope)
        targets = self.targets(mesh_id, state)
        if not targets:
            logger.debug("relayed %r for %s reached no worker here", kind, mesh_id)
            return
        transport = self.node.transport
        payload, buffers = msg.payload, msg.buffers
        addresses = [address for _, address in targets]
        key = reply = None
        if kind == CALL:
            call = CallEnvelope.read(envelope)
            key, reply = call.key, call.reply
        elif kind == STOP_ACTOR:
            key = StopActorEnvelope.read(envelope).key
        if key is not None:
            # Straight to each actor's own inbox, as senders on this host call it (every call
            # from this agent to that actor takes that route, so its order holds, and a stop
            # comes after the calls sent before it).
            addresses = [transport.route_to_actor(a, key) for a in addresses]
        if relayed.one_way and not buffers:
            payload = bytes(payload)  # it may travel inside a batch's (pickled) envelope
            for address in addresses:
                transport.send_one_way(address, envelope, payload)
            return
        window = relayed.window
        if window > 0 and len(targets) > 1 and reply is not None:
            envelope = self._gather(mesh_id, state, envelope, targets, window)
        transport.send_many(addresses, envelope, payload, buffers, payload_digest(payload))

    # -- gathering replies -----------------------------------------------------------------------

    def _gather(
        self,
        mesh_id: str,
        state: tuple[Any, ...],
        envelope: tuple[Any, ...],
        targets: tuple[tuple[int, Address], ...],
        window: float,
    ) -> tuple[Any, ...]:
        """Open a port here for the replies of this call; the envelope that points at it."""
        call = CallEnvelope.read(envelope)
        to = reply_port(call.reply)
        # The caller's process mailbox: the reply's after, when it names one (its inbox is then
        # a thread's own), else the mailbox of the inbox.
        after = ReplyTo.read(call.reply).after
        caller = after if after is not None else to.address.mailbox
        shape = shape_from_state(state)
        gather = _Gathering(self, mesh_id, shape, targets, to, window)
        port = gather.port = self.node.open_port(gather)
        self._gathers[port.port_id] = gather
        # The workers still name the caller's process: each reply then says what it must come
        # after there (Node.in_order), although it travels through this agent.
        new_reply = (tuple(port.address), port.port_id, caller)
        return (CALL, call.key, call.endpoint, call.shape, new_reply)

    def on_reply(self, gather: _Gathering, msg: Message) -> None:
        reply = ReplyEnvelope.of(msg)
        index, status = reply.index, reply.status
        dest = gather.caller.address
        batch = self._batches.get(dest.mailbox)
        nbuf = len(msg.buffers)
        if batch is not None and len(batch.buffers) + nbuf > _MAX_BATCH_BUFFERS:
            self._flush(batch)
            batch = None
        if batch is None:
            batch = self._batches[dest.mailbox] = _Batch(dest)
        after = reply.after or 0  # sent only when it is not 0 (response_port.send_reply)
        size = len(msg.payload)
        batch.items.append((gather.caller.port_id, msg.sender, index, status, after, size, nbuf))
        batch.payloads.append(msg.payload)
        batch.buffers.extend(msg.buffers)
        batch.size += size
        gather.waiting.discard(index)
        if not gather.waiting:
            self._close(gather)
        elif batch.size > _MAX_BATCH_BYTES:
            self._flush(batch)
        else:
            due = time.monotonic() + gather.window
            if due < batch.due:  # calls may name different windows: the shortest holds
                batch.due = due
                self.node.transport.call_later(gather.window, lambda: self._flush(batch))

    def _close(self, gather: _Gathering) -> None:
        port = gather.port
        assert port is not None
        del self._gathers[port.port_id]
        self.node.close_port(port)
        # Every rank here answered (or exited): send their replies once the I/O thread is done
        # with what it has read (replies of other calls read with them go in the same message),
        # not after the window.
        batch = self._batches.get(gather.caller.address.mailbox)
        if batch is not None:
            self._flush_soon(batch)

    def _flush_soon(self, batch: _Batch) -> None:
        if not batch.soon:
            batch.soon = True
            self.node.transport.call_soon(lambda: self._flush(batch))

    def _flush(self, batch: _Batch) -> None:
        if self._batches.get(batch.dest.mailbox) is not batch:
            return  # sent already (a timer or a call_soon of a batch that went earlier)
        del self._batches[batch.dest.mailbox]
        payload = b"".join(batch.payloads)
        envelope = (REPLIES, tuple(batch.items))
        try:
            self.node.transport.send(batch.dest, envelope, payload, batch.buffers)
        except Exception:
            logger.exception("could not send %d gathered replies", len(batch.items))


class _Gathering:
    """One relayed call whose replies this agent gathers: the handler of a port of its node."""

    __slots__ = ("caller", "mesh_id", "port", "relayer", "shape", "waiting", "window")

    def __init__(
        self,
        relayer: Relayer,
        mesh_id: str,
        shape: Shape,
        targets: tuple[tuple[int, Address], ...],
        caller: Port,
        window: float,
    ) -> None:
        self.relayer = relayer
        self.mesh_id = mesh_id
        self.shape = shape
        self.waiting = {shape.local_index(rank) for rank, _ in targets}  # indices in `shape`
        self.caller = caller  # the port of the call's collector, in the caller's process
        self.window = window
        self.port: Port | None = None  # this agent's port that the workers answer

    def on_message(self, msg: Message) -> None:
        self.relayer.on_reply(self, msg)

    def on_death(self, mailbox: bytes, death: ProcDeath) -> None:
        return None  # the agent learns its workers' exits from the fork server (Relayer.remove)


class _Batch:
    """Replies on their way to one caller's inbox, in the order they reached this agent."""

    __slots__ = ("buffers", "dest", "due", "items", "payloads", "size", "soon")

    def __init__(self, dest: Address) -> None:
        self.dest = dest
        # (port id, worker's sender id, index, status, after, payload size, number of buffers)
        self.items: list[tuple[Any, ...]] = []
        self.payloads: list[Any] = []
        self.buffers: list[Any] = []
        self.size = 0
        self.due = math.inf  # when a flush after the window is scheduled for
        self.soon = False  # a flush as soon as the I/O thread is free is scheduled


def cast(
    node: Node,
    procs: ProcTable,
    shape: Shape,
    envelope: tuple[Any, ...],
    payload: bytes,
    buffers: Sequence[Any],
    digest: bytes,
    collector: Collector[Any] | None,
    what: str,
    window: float = 0.0,
) -> None:
    """An endpoint's cast (``Endpoint.cast``): a broadcast when there is no collector."""
    state = CallEnvelope.read(envelope).shape
    one_way = collector is None
    args = (node, procs, shape, state, envelope, payload, buffers, digest, collector, one_way)
    send(*args, what=what, window=window)

"""Casts to meshes that span hosts: one message per remote host, fanned out by its host agent.

A proc mesh's table says, per rank, which host agent *relays* to it (``ProcTable.relays``; none
for ranks on the controller's own host). A sender on another host than a rank never sends to it
directly: every message of a cast, call or control request from that sender to that rank goes
through the rank's host agent, in one message per host that names the mesh and the shape. The
agent hands it to its local workers in the shape, in arrival order. So there is exactly one route
from each sender to each receiver, and per-sender FIFO order holds as on one host; the sender's
cost per cast grows with hosts, not with processes or actors. Replies do not come back this
way: workers answer the caller's port directly.

Senders on the rank's own host (its siblings) keep sending directly, over ipc://.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..errors import SupervisionError
from .transport import Address
from .wire import Message, payload_digest, shape_from_state

if TYPE_CHECKING:
    from .node import Node
    from .proc_table import ProcTable
    from .shape import Shape

logger = logging.getLogger(__name__)

# (ranks sent to directly, relay agents to send one message each)
Plan = tuple[tuple[int, ...], tuple[Address, ...]]


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
    buffers: Any = (),
    digest: bytes | None = None,
    collector: Any = None,
    one_way: bool = False,
    what: str = "",
) -> None:
    """Send ``envelope`` to every rank of ``shape`` of a mesh that has relays (see the module
    docstring). Dead ranks fail ``collector`` at once; with no collector (a broadcast), a dead
    rank raises ``SupervisionError`` before anything is sent. ``one_way``: nobody answers, so
    back-to-back messages may travel batched."""
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
    actor = envelope[1] if envelope[0] == "call" else None
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
        relayed = ("relay", procs.mesh_id, state, one_way, envelope)
        for agent in agents:
            if one_way and not buffers:
                transport.send_one_way(agent, relayed, payload)
            else:
                transport.send(agent, relayed, payload, buffers, digest)


class Relayer:
    """The host agent's side: fans relayed messages out to its local workers, in arrival order.

    ``add``/``remove`` keep the map of this host's workers (mesh id, rank) -> address; the
    ``relay`` handler runs on the agent's I/O thread, which keeps each sender's order.
    """

    def __init__(self, node: Node) -> None:
        self.node = node
        self.workers: dict[str, dict[int, Address]] = {}
        self._targets: dict[tuple[str, tuple[Any, ...]], tuple[Address, ...]] = {}
        node.handlers["relay"] = self.on_relay

    def add(self, mesh_id: str, rank: int, address: Address) -> None:
        self.workers.setdefault(mesh_id, {})[rank] = address
        self._targets.clear()

    def remove(self, mesh_id: str, rank: int) -> None:
        ranks = self.workers.get(mesh_id)
        if ranks is not None:
            ranks.pop(rank, None)
            if not ranks:
                del self.workers[mesh_id]
        self._targets.clear()

    def targets(self, mesh_id: str, state: tuple[Any, ...]) -> tuple[Address, ...]:
        key = (mesh_id, state)
        found = self._targets.get(key)
        if found is None:
            mine = self.workers.get(mesh_id, {})
            shape = shape_from_state(state)
            found = tuple(mine[r] for r in shape.ranks() if r in mine)
            if len(self._targets) > 1024:
                self._targets.clear()
            self._targets[key] = found
        return found

    def on_relay(self, msg: Message) -> None:
        _, mesh_id, state, one_way, envelope = msg.envelope
        targets = self.targets(mesh_id, state)
        if not targets:
            logger.debug("relayed %r for %s reached no worker here", envelope[0], mesh_id)
            return
        transport = self.node.transport
        payload, buffers = msg.payload, msg.buffers
        if one_way and not buffers:
            payload = bytes(payload)  # it may travel inside a batch's (pickled) envelope
            for address in targets:
                transport.send_one_way(address, envelope, payload)
            return
        digest = payload_digest(payload)
        for address in targets:
            transport.send(address, envelope, payload, buffers, digest)


def cast(
    node: Node,
    procs: ProcTable,
    shape: Shape,
    envelope: tuple[Any, ...],
    payload: bytes,
    buffers: Any,
    digest: bytes,
    collector: Any,
    what: str,
) -> None:
    """An endpoint's cast (``Endpoint._cast``): a broadcast when there is no collector."""
    state = envelope[3]
    one_way = collector is None
    send(node, procs, shape, state, envelope, payload, buffers, digest, collector, one_way, what)

"""Healing onto another host: the ranks of a lost host move to a spare host's agent.

A rank whose process died on a live host is respawned in place (same agent, same addresses). A
rank whose *host* is lost (agent gone or silent) cannot be: it moves, with the other ranks of
that host, to a spare agent — one from ``heal(hosts=...)``, or else one that dialled in and is
not in any host mesh yet (``Controller.find_spare``). A moved rank gets new addresses (and, as
every healed rank, a new mailbox: ``MeshRecord.heal``); every live worker is told (``moved``),
so the copies of the proc table that actors hold follow it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...errors import SupervisionError
from ..messaging import Address, Message
from ..messaging.envelopes import MovedEnvelope
from ..messaging.protocol import MOVED
from .agent_handle import AgentHandle
from .record_parts import HealedMesh

if TYPE_CHECKING:
    from ..messaging import Node

logger = logging.getLogger(__name__)


def move_lost_hosts(
    record: HealedMesh, dead: Sequence[int], spares: Sequence[AgentHandle] | None
) -> list[int]:
    """Give each lost host among ``dead``'s a spare agent and new addresses for its ranks.

    Returns the ranks that moved. Raises ``SupervisionError`` (before changing anything) when
    there are not enough spare hosts, saying how to provide one.
    """
    lost_slots = sorted({r // record.per_host for r in dead if record.agent_of(r).dead})
    if not lost_slots:
        return []
    in_use = {id(a) for a in record.agents}
    offered = [a for a in (spares or ()) if not a.dead and id(a) not in in_use]
    chosen: list[AgentHandle] = []
    for _ in lost_slots:
        agent = offered.pop(0) if offered else None
        if agent is None and spares is None and record.ctl.find_spare is not None:
            agent = record.ctl.find_spare()
        if agent is None:
            names = ", ".join(record.agents[s].name for s in lost_slots)
            raise SupervisionError(
                [],
                f"cannot heal {record.table.mesh_id}: host {names} was lost and no spare host "
                f"is available ({len(chosen)} of {len(lost_slots)} found); start a host agent "
                "that dials in (python -m actormesh host --connect ...) and heal again, or "
                "pass heal(hosts=listener.wait_for_hosts(1))",
            )
        chosen.append(agent)
    moved: list[int] = []
    table = record.table
    if table.relays is None:
        table.relays = [None] * record.n
    for slot, agent in zip(lost_slots, chosen, strict=True):
        assert agent.address is not None
        logger.info("moving the ranks of lost host %s to %s", record.agents[slot].name, agent.name)
        record.agents[slot] = agent
        run_dir = agent.run_dir or record.ctl.run_dir
        for rank in range(slot * record.per_host, (slot + 1) * record.per_host):
            old = table.addresses[rank]
            ipc = f"ipc://{run_dir}/{table.mesh_id}-{rank}"
            table.addresses[rank] = Address(agent.address.host, ipc, None, old.mailbox)
            table.relays[rank] = agent.address if agent.run_dir is not None else None
            moved.append(rank)
    if not any(table.relays):
        table.relays = None
    table.routes.clear()
    return moved


def announce(record: HealedMesh, ranks: Sequence[int]) -> None:
    """Tell every live worker where moved ranks are now (after they started: their tcp://
    address is known only then)."""
    table = record.table
    relays = table.relays
    for rank in ranks:
        relay = relays[rank] if relays is not None else None
        record.ctl.broadcast_to_workers((MOVED, table.mesh_id, rank, table.addresses[rank], relay))


def on_moved(node: Node, msg: Message) -> None:
    """A worker's handler of ``moved``: update this process's copy of the proc table."""
    from ..meshes import live_table

    moved = MovedEnvelope.of(msg)
    rank, relay = moved.rank, moved.relay
    table = live_table(moved.mesh_id)
    if table is None:
        return
    old: Any = table.addresses[rank]
    table.addresses[rank] = moved.address
    if relay is not None and table.relays is None:
        table.relays = [None] * len(table.addresses)
    if table.relays is not None:
        table.relays[rank] = relay
    table.routes.clear()
    node.transport.forget(old)

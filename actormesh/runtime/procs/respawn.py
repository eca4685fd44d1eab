"""The second half of a heal (``MeshRecord.heal``): once the restarted processes are up, the
actors that lived on them are created again, each from the spawn that first created it.

Which spawns go where is decided under the record's lock (``spawns_to_send``); sending them
and gathering the answers is not (``send_spawns``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..actors import Future
from ..meshes import ActorSpawn, Gather, ProcTable, no_values
from ..messaging import Node
from ..messaging.protocol import SPAWN_ACTOR


def spawns_to_send(
    actor_spawns: list[ActorSpawn],
    stopped_actors: dict[str, set[int]],
    lacking: dict[int, set[str]],
    exited: set[int],
    ranks: list[int],
) -> list[tuple[ActorSpawn, list[int]]]:
    """Each actor spawn with the ranks of ``ranks`` it goes to again. An actor that
    ActorMesh.stop stopped stays stopped: healing brings back what died. Each spawn goes once to
    each process: its key leaves ``lacking`` as it is sent (a rank that dies again is given
    every key by the next heal)."""
    sends = []
    for spawn in actor_spawns:
        stopped = stopped_actors.get(spawn.key, ())
        mine = []
        for rank in ranks:
            keys = lacking.get(rank)
            if keys is None or spawn.key not in keys or rank in exited:
                continue
            keys.discard(spawn.key)
            if spawn.shape.local_index(rank) is not None and rank not in stopped:
                mine.append(rank)
        if mine:
            sends.append((spawn, mine))
    for rank in ranks:
        if not lacking.get(rank, True):
            del lacking[rank]
    return sends


def send_spawns(
    node: Node, table: ProcTable, sends: list[tuple[ActorSpawn, list[int]]]
) -> Iterator[Future[None]]:
    """Send each spawn to its ranks, yielding its future (done when those ranks answered) as
    soon as it is sent: the caller records it before the next goes, so a heal that starts
    meanwhile waits for it."""
    for spawn, mine in sends:
        shape = spawn.shape
        gather: Gather[None] = Gather(f"{spawn.name}.__init__", table, shape, no_values)
        # Only the respawned ranks answer; the others count as done already.
        for index, rank in enumerate(shape.ranks()):
            if rank not in mine:
                gather.deliver(index, False, None)
        reply = gather.port = node.open_port(gather)
        envelope: tuple[Any, ...] = (SPAWN_ACTOR, spawn.key, spawn.name, shape, reply)
        if spawn.owner is not None:
            envelope += (spawn.owner,)
        for rank in mine:
            node.send(table.addresses[rank], envelope, spawn.payload, spawn.buffers, spawn.digest)
        yield gather.future

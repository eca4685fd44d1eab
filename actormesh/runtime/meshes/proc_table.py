"""The addresses of a proc mesh's processes, shared by every slice and actor mesh on it."""

from __future__ import annotations

import threading
import weakref
from typing import Any

from ..messaging import Address

# How a cast reaches a mesh's ranks (relay.py's plan, cached here per view): the ranks it sends
# to directly, and the relay agents it sends one message each.
Plan = tuple[tuple[int, ...], tuple[Address, ...]]

_live: weakref.WeakValueDictionary[str, ProcTable] = weakref.WeakValueDictionary()
_live_lock = threading.Lock()


class ProcTable:
    """``addresses[global_rank]`` for one proc mesh. Picklable: a copy unpickled in the process
    that owns the mesh is the live table itself, so state like ``closed`` is seen everywhere."""

    def __init__(
        self,
        mesh_id: str,
        addresses: list[Address],
        labels: list[str],
        relays: list[Address | None] | None = None,
        name: str = "",
    ) -> None:
        self.mesh_id = mesh_id
        # What messages call the mesh: spawn_procs's name, numbered when that name was taken
        # (``procs``, ``procs-2``), so that two meshes of one shape read differently. Only the
        # controller's table has it; a copy elsewhere says its id.
        self.name = name or mesh_id
        self.addresses = addresses
        self.labels = labels  # "gpus=1", for messages and output
        # Per rank, the host agent that fans casts out to it from other hosts (None: the
        # controller's host, reached directly); see relay.py. None when no rank has one.
        self.relays = relays
        # relay.py's cache of cast plans, per (shape state, sender's host)
        self.routes: dict[tuple[tuple[Any, ...], str], Plan] = {}
        self.pids: list[int] = [0] * len(addresses)
        self.closed = False
        # Actor-mesh key -> the global ranks whose actor ActorMesh.stop stopped (in this process).
        self.stopped_actors: dict[str, set[int]] = {}
        with _live_lock:
            _live[mesh_id] = self

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (self.mesh_id, self.addresses, self.labels, self.relays))


def live_table(mesh_id: str) -> ProcTable | None:
    """This process's table of ``mesh_id``, if it holds one."""
    with _live_lock:
        return _live.get(mesh_id)


def _restore(
    mesh_id: str,
    addresses: list[Address],
    labels: list[str],
    relays: list[Address | None] | None = None,
) -> ProcTable:
    with _live_lock:
        table = _live.get(mesh_id)
    if table is not None:
        return table
    return ProcTable(mesh_id, addresses, labels, relays)

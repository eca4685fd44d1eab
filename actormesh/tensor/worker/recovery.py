"""The ranks' side of live recovery (controller/recovery.py): snapshots of the last completed
step, freeing a rank stuck in a collective with a dead peer, and the restore that gives a
respawned rank its values from a surviving replica.

- **Snapshot** (op ``snapshot``, recorded by ``commit()`` right after a step's sync point, so
  it runs before any collective of the next step): each rank copies its local shards of the
  training state. The copy replaces the previous one whole (a rank holds one generation), and
  a value that failed is never snapshotted (the op refuses and keeps the previous copy).
- **Unblock** (``_RecoveryAgent.unblock``, on the agent's own thread): a survivor's engine
  thread may wait in a gloo collective on a peer that died, or on a survivor that already gave
  up. Gloo has no abort that wakes such a wait (``abort()`` and ``shutdown()`` return and the
  wait goes on), so the agent shuts down the process groups' connected TCP sockets, those the
  process opened since ``_SocketBaseline`` looked, just before the group formed (the runtime's
  own are older, or unix sockets): every pending collective then fails at once. The engine is
  marked abandoned first, so it skips the rest of what it was sent.
- **Restore** (op ``restore``, on the new engine): survivors copy their snapshot back; a rank
  that has none (respawned) receives each value from a survivor holding the same shard (equal
  coordinates along the value's sharded mesh dimensions), point to point over the new group.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..compat import Actor, endpoint
from .local import REGISTRY

if TYPE_CHECKING:
    from .engine import _TensorEngine


@dataclass
class Snap:
    """One value's local shard at a committed step, and where it lives on the mesh."""

    local: Any
    dims: tuple[str, ...]  # the mesh dimensions of the value's DeviceMesh
    placements: tuple[Any, ...]
    shape: tuple[int, ...]  # global
    stride: tuple[int, ...]


@dataclass
class Generation:
    gen: int
    values: dict[int, Snap]


# lineage (one per controller TensorMesh, kept across engine restarts) -> this rank's snapshot
SNAPSHOTS: dict[str, Generation] = {}


def _snap(engine: _TensorEngine, v: Any) -> Snap:
    from torch.distributed.tensor import DTensor

    if not isinstance(v, DTensor):
        raise RuntimeError(f"a training state value on {engine.rank_str} is not global")
    mesh = v.device_mesh
    dims = tuple(mesh.mesh_dim_names or engine.labels)
    return Snap(v.to_local().detach().clone(), dims, tuple(v.placements), tuple(v.shape),
                tuple(v.stride()))  # fmt: skip


def run_snapshot(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    lineage, gen, ids = payload
    bad = [i for i in ids if i in engine.poison]
    if bad:
        root = engine.poison[bad[0]]
        raise RuntimeError(
            f"step not committed: {len(bad)} value(s) of the training state failed on "
            f"{engine.rank_str} ({root.exc_type}: {root.message}, op {root.op} issued at "
            f"{root.site}); recovery keeps the state of the last committed step"
        )
    fresh = Generation(gen, {i: _snap(engine, engine.value(i)) for i in ids})
    SNAPSHOTS[lineage] = fresh  # whole, after every copy was made
    return []


def _mesh_for(engine: _TensorEngine, dims: tuple[str, ...]) -> Any:
    return engine.mesh if dims == tuple(engine.labels) else engine.mesh[dims]


def run_restore(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    """``payload``: (lineage, gen, metas, transfers). ``metas[id]`` = (dims, placements, shape,
    stride, dtype); ``transfers``: ``(id, dst, src)`` engine indices, the same list on every
    rank. Answers the restored values, in ``out``'s order."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    from .shard_ops import as_dtensor

    lineage, gen, metas, transfers = payload
    mine = SNAPSHOTS.get(lineage)
    have = mine.values if mine is not None and mine.gen == gen else {}
    received: dict[int, Any] = {}
    requests = []
    for id, dst, src in transfers:
        if src == engine.index:
            requests.append(dist.P2POp(dist.isend, have[id].local.contiguous(), dst))
        elif dst == engine.index:
            dims, placements, shape, _stride, dtype = metas[id]
            local_shape, _ = compute_local_shape_and_global_offset(
                shape, _mesh_for(engine, dims), placements
            )
            received[id] = torch.empty(local_shape, dtype=dtype, device=engine.device)
            requests.append(dist.P2POp(dist.irecv, received[id], src))
    if requests:
        for work in dist.batch_isend_irecv(requests):
            work.wait()
    values = []
    fresh: dict[int, Snap] = {}
    for id in out[:-1]:
        dims, placements, shape, stride, _dtype = metas[id]
        data = received[id] if id in received else have[id].local
        value = as_dtensor(data.clone(), _mesh_for(engine, dims), placements, shape, stride)
        fresh[id] = Snap(value.to_local().detach().clone(), dims, placements, shape, stride)
        values.append(value)
    SNAPSHOTS[lineage] = Generation(gen, fresh)  # the respawned rank is a replica again
    return [*values, True]


def run_allocate(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    """On a restarted engine: a value under each id of ``out`` with the metadata the survivors'
    snapshots gave (``metas[id]``: dims, placements, shape, stride, dtype), its numbers still
    to come (a checkpoint load writes into it next)."""
    import torch
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    from .shard_ops import as_dtensor

    (metas,) = payload
    values = []
    for id in out:
        dims, placements, shape, stride, dtype = metas[id]
        mesh = _mesh_for(engine, dims)
        local_shape, _ = compute_local_shape_and_global_offset(shape, mesh, placements)
        local = torch.zeros(local_shape, dtype=dtype, device=engine.device)
        values.append(as_dtensor(local, mesh, placements, shape, stride))
    return values


# -- freeing a survivor ---------------------------------------------------------------------------


def tcp_sockets() -> set[int]:
    """The fds of this process's connected TCP sockets (a process group's pairs). Listening
    ones are left out: gloo's listener aborts the process when its socket is shut down."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if fields[3] != "0A":  # 0A: LISTEN
                        inodes.add(int(fields[9]))
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and int(link[8:-1]) in inodes:
            fds.add(int(fd))
    return fds


def _shut_down(fds: set[int]) -> int:
    done = 0
    for fd in fds:
        try:
            s = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            s.shutdown(socket.SHUT_RDWR)
            done += 1
        except OSError:
            pass
        finally:
            s.detach()  # the fd stays gloo's: it closes it when the group is destroyed
    return done


# This process's connected TCP sockets just before its process group formed (None: not known).
BASELINE: set[int] | None = None


class _SocketBaseline(Actor):
    """Spawned just before a tensor mesh forms its process group: remembers which sockets the
    process had, so that recovery touches only the group's."""

    def __init__(self) -> None:
        global BASELINE
        BASELINE = tcp_sockets()


class _RecoveryAgent(Actor):
    """One per process while a mesh recovers (its own thread: the engine's may be stuck)."""

    @endpoint
    def unblock(self, engine_key: str, lineage: str, timeout: float) -> tuple[int, list[Any]]:
        """Free the old engine (see the module docs); answer this rank's snapshot: its
        generation (-1: none) and each value's metadata."""
        engine = REGISTRY.get(engine_key)
        if engine is not None:
            engine.abandoned = True
            if BASELINE is not None:
                _shut_down(tcp_sockets() - BASELINE)
            if not engine.lock.acquire(timeout=timeout):
                raise TimeoutError(
                    f"the tensor engine on {engine.rank_str} did not stop within {timeout:g} s "
                    "after its process groups were shut down"
                )
            engine.lock.release()
            REGISTRY.pop(engine_key, None)
        mine = SNAPSHOTS.get(lineage)
        if mine is None:
            return -1, []
        metas = [(i, s.dims, s.placements, s.shape, s.stride, s.local.dtype)
                 for i, s in mine.values.items()]  # fmt: skip
        return mine.gen, metas

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
from typing import TYPE_CHECKING, Any, NamedTuple

from ..compat import Actor, endpoint
from .local import REGISTRY
from .snapshots import ANCHORS, SNAPSHOTS

if TYPE_CHECKING:
    from .state import EngineState


class ValueMeta(NamedTuple):
    """Where a snapshotted value lives: its DeviceMesh's dimensions, the placements of the
    local copy kept (``placements``) and of the value itself (``target``: they differ for a
    copy gathered along a dimension that changes size), its global shape, stride and dtype."""

    dims: tuple[str, ...]
    placements: tuple[Any, ...]
    target: tuple[Any, ...]
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: Any


@dataclass
class Generation:
    """This rank's copy of the training state at one committed step: each value's local
    shard, and where this rank was when it copied them (its coordinates, the mesh's sizes)."""

    gen: int
    coords: dict[str, int]
    sizes: dict[str, int]
    values: dict[int, tuple[Any, ValueMeta]]


def _snap(engine: EngineState, v: Any, gather: str | None) -> tuple[Any, ValueMeta]:
    from torch.distributed.tensor import DTensor, Replicate

    if not isinstance(v, DTensor):
        raise RuntimeError(f"a training state value on {engine.rank_str} is not global")
    mesh = v.device_mesh
    dims = tuple(mesh.mesh_dim_names or engine.labels)
    target = tuple(v.placements)
    if gather is not None and gather in dims:
        # The whole along ``gather`` (a collective over it: every rank of the engine runs it),
        # so that a mesh with another size along it can take its own slice.
        placements = list(target)
        placements[dims.index(gather)] = Replicate()
        v = v.redistribute(mesh, placements)
    meta = ValueMeta(dims, tuple(v.placements), target, tuple(v.shape), tuple(v.stride()),
                     v.dtype)  # fmt: skip
    return v.to_local().detach().clone(), meta


def run_snapshot(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    """``payload``: (lineage, gen, ids, gather, anchor): ``gather`` names a mesh dimension whose
    size changes next (``FaultTolerant.grow``), along which each value is copied whole;
    ``anchor``: the id whose drop frees the copy (snapshots.py). ``out``: a receipt, when the
    controller waits for the copy."""
    lineage, gen, ids, gather, anchor = payload
    ANCHORS[anchor] = lineage
    bad = [i for i in ids if i in engine.poison]
    if bad:
        root = engine.poison[bad[0]]
        raise RuntimeError(
            f"step not committed: {len(bad)} value(s) of the training state failed on "
            f"{engine.rank_str} ({root.exc_type}: {root.message}, op {root.op} issued at "
            f"{root.site}); recovery keeps the state of the last committed step"
        )
    values = {i: _snap(engine, engine.value(i), gather) for i in ids}
    SNAPSHOTS[lineage] = Generation(gen, dict(engine.coords), _sizes(engine), values)  # whole
    return [True] * len(out)


def _sizes(engine: EngineState) -> dict[str, int]:
    return dict(zip(engine.labels, engine.sizes, strict=True))


def _mesh_for(engine: EngineState, dims: tuple[str, ...]) -> Any:
    return engine.mesh if dims == tuple(engine.labels) else engine.mesh[dims]


def run_restore(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    """``payload``: (lineage, gen, metas, transfers). ``metas[id]``: a ``ValueMeta``;
    ``transfers``: ``(id, dst, src)`` engine indices, the same list on every rank (a rank that
    is no ``dst`` of a value has it in its own snapshot). Answers the restored values, in
    ``out``'s order, then a receipt."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    from .dtensors import as_dtensor

    lineage, gen, metas, transfers = payload
    mine = SNAPSHOTS.get(lineage)
    have = mine.values if mine is not None and mine.gen == gen else {}
    received: dict[int, Any] = {}
    requests = []
    for id, dst, src in transfers:
        if src == engine.index:
            requests.append(dist.P2POp(dist.isend, have[id][0].contiguous(), dst))
        elif dst == engine.index:
            meta = metas[id]
            local_shape, _ = compute_local_shape_and_global_offset(
                meta.shape, _mesh_for(engine, meta.dims), meta.placements
            )
            received[id] = torch.empty(local_shape, dtype=meta.dtype, device=engine.device)
            requests.append(dist.P2POp(dist.irecv, received[id], src))
    if requests:
        for work in dist.batch_isend_irecv(requests):
            work.wait()
    values = []
    fresh: dict[int, tuple[Any, ValueMeta]] = {}
    for id in out[:-1]:
        meta = metas[id]
        data = received[id] if id in received else have[id][0]
        mesh = _mesh_for(engine, meta.dims)
        value = as_dtensor(data.clone(), mesh, meta.placements, meta.shape, meta.stride)
        if meta.target != meta.placements:
            value = value.redistribute(mesh, meta.target)  # its slice of a whole: no collective
        kept = ValueMeta(meta.dims, meta.target, meta.target, meta.shape, meta.stride, meta.dtype)
        fresh[id] = (value.to_local().detach().clone(), kept)
        values.append(value)
    # Every rank is a replica again, at its place in this engine's mesh.
    SNAPSHOTS[lineage] = Generation(gen, dict(engine.coords), _sizes(engine), fresh)
    return [*values, True]


def run_allocate(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    """On a restarted engine: a value under each id of ``out`` placed as ``metas[id]`` (a
    ``ValueMeta``; its ``target``) says, holding zeros: a checkpoint load writes into it next."""
    import torch
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    from .dtensors import as_dtensor

    (metas,) = payload
    values = []
    for id in out:
        meta = metas[id]
        mesh = _mesh_for(engine, meta.dims)
        local_shape, _ = compute_local_shape_and_global_offset(meta.shape, mesh, meta.target)
        local = torch.zeros(local_shape, dtype=meta.dtype, device=engine.device)
        values.append(as_dtensor(local, mesh, meta.target, meta.shape, meta.stride))
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
    def unblock(
        self, engine_key: str, lineage: str, stuck: bool, timeout: float
    ) -> tuple[int, dict[str, int], dict[str, int], dict[int, ValueMeta]]:
        """Free the old engine (see the module docs; ``stuck``: it may wait in a collective on
        a dead peer, so the group's sockets are shut down first) and answer this rank's
        snapshot: its generation (-1: none), where the rank was, and each value's metadata."""
        engine = REGISTRY.get(engine_key)
        if engine is not None:
            engine.abandoned = True
            if stuck and BASELINE is not None:
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
            return -1, {}, {}, {}
        return mine.gen, mine.coords, mine.sizes, {i: m for i, (_, m) in mine.values.items()}

"""``torch.distributed`` process groups over actor meshes.

``init_process_group(trainers).get()`` makes the processes of an actor mesh (or proc mesh, or a
slice of either) one ``torch.distributed`` default process group: gloo on CPU, ``cpu:gloo,
cuda:nccl`` where the processes see a GPU. Afterwards every actor living on those processes can
call collectives, wrap models in ``DistributedDataParallel`` and so on, unchanged.

Why a helper actor. The runtime only ever calls endpoints, and the user's class has no endpoint
for this. But torch.distributed's default group is per-process state, and all actors of one
process share that process; so a small helper actor (``_DistSetup``), spawned on the same
processes, forms the group on behalf of every actor that lives there. The alternatives were
worse: a mixin or ``Actor`` subclass forces user classes to inherit from it (Monarch code would
no longer port by changing the import line), and a hidden runtime message needs a new handler in
every worker. The helper needs nothing from the runtime but ``spawn`` and ``call``.

Rendezvous, without a port race. Rank 0's helper starts a ``TCPStore`` server on port 0: the
kernel picks a free port and the server holds it from that moment, so nothing can take it
between "choose" and "bind" (the usual find-a-free-port-then-close-it dance has that race).
Every rank, rank 0 included, then connects to that store as a client, exactly as torchrun's
workers connect to their agent's store (``TORCHELASTIC_USE_AGENT_STORE``). Each group gets a
fresh store, so a re-formed group never sees keys of the previous one.

Ranks (``rank_layout.py``). ``RANK`` is the position in the (flattened) mesh, row-major;
``LOCAL_RANK`` the position among the members on the same host (the ``hosts`` coordinate when the
mesh has that dimension, else the host the process runs on); ``GROUP_RANK`` the index of that host.
Each member also gets ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` and
``GROUP_WORLD_SIZE`` in its environment, so code that reads them (or calls ``init_process_group``
again after ``destroy_process_group``) finds what torchrun would have set.

Several groups. Each process has one default group, so meshes on different processes (two proc
meshes, or disjoint slices of one) each get their own group at the same time. Forming a second
group over a process that already has one fails with a clear ``ActorError``: call
``destroy_process_group(mesh)`` first.

Lifetime. The group lives as long as its processes. Stopping the proc mesh ends them with
``os._exit`` after the actors' threads were given ``ACTORMESH_STOP_GRACE / 2`` seconds, so no
process group destructor (nor a collective blocked on a dead peer) can hang the exit. The helper
is not re-created by ``heal()``: a healed mesh forms a new group (destroy, then init).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from ...errors import MeshError, MeshUsageError
from ..actors import Actor, Future, completed_future, context, endpoint, then, when_all
from ..mesh_shape import view_shape
from ..meshes import ActorMesh, ProcMesh, ProcTable, ValueMesh, new_proc_mesh, proc_table_of
from ..procs import visible_gpus
from ..shape import Shape
from .rank_layout import RankLayout, choose_backend, gpu_of, layout

logger = logging.getLogger(__name__)

X = TypeVar("X")
Y = TypeVar("Y")

# How long the members of a new group wait for each other (store connection and rendezvous).
RENDEZVOUS_TIMEOUT = 120.0


@dataclass(frozen=True)
class GroupMember:
    """What one member reports once it joined: its ranks, the backend and the rendezvous."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str
    master_addr: str
    master_port: int
    pid: int


def mesh_layout(mesh: ActorMesh[Any] | ProcMesh) -> list[RankLayout]:
    """``layout`` of a mesh, using the hosts its processes run on."""
    procs, shape = _parts(mesh)
    return layout(shape, [procs.addresses[r].host for r in shape.ranks()])


def member_hosts(mesh: ActorMesh[Any] | ProcMesh) -> list[str]:
    procs, shape = _parts(mesh)
    return [procs.addresses[r].host for r in shape.ranks()]


def single_host(mesh: ActorMesh[Any] | ProcMesh) -> bool:
    procs, shape = _parts(mesh)
    return len({procs.addresses[r].host for r in shape.ranks()}) <= 1


def _parts(mesh: ActorMesh[Any] | ProcMesh) -> tuple[ProcTable, Shape]:
    if not isinstance(mesh, (ActorMesh, ProcMesh)):
        raise MeshUsageError(
            f"expected an actor mesh or a proc mesh, got {type(mesh).__name__}; "
            "pass the mesh whose processes should form the group"
        )
    return proc_table_of(mesh), view_shape(mesh)


def helper_mesh(mesh: ActorMesh[Any] | ProcMesh, name: str, cls: type[Actor]) -> ActorMesh[Any]:
    """Spawn ``cls`` on exactly the processes of ``mesh`` (not re-created by ``heal``)."""
    procs, shape = _parts(mesh)
    return new_proc_mesh(procs, shape, None).spawn(name, cls)


def rank0(mesh: ActorMesh[Any]) -> ActorMesh[Any]:
    """The one-actor slice of ``mesh`` at its first point."""
    return mesh.slice(**dict.fromkeys(view_shape(mesh).labels, 0))


# -- the controller's side ---------------------------------------------------------------------


def init_process_group(
    mesh: ActorMesh[Any] | ProcMesh,
    backend: str | None = None,
    *,
    timeout: float | None = None,
    master_addr: str | None = None,
) -> Future[ValueMesh[GroupMember]]:
    """Form one ``torch.distributed`` default process group over the processes of ``mesh``.

    Does not block: the future completes (with each member's :class:`GroupMember`) once every
    member has joined; wait on it before using collectives. Any thread may call it.

    Args:
        mesh: an actor mesh, a proc mesh, or a slice of either; its ranks, in row-major order,
            become the group's ranks.
        backend: as for ``torch.distributed.init_process_group``; ``None`` picks ``gloo``, or
            ``cpu:gloo,cuda:nccl`` in processes that see a GPU, or ``cpu:gloo,cuda:gloo`` when
            members would share a GPU (NCCL refuses that; naming NCCL then is an error, raised
            before anyone joins). CUDA's current device is per
            thread: on a mesh with a ``gpus`` dimension each process sees just its own GPU
            (device 0, the default); otherwise an actor should call
            ``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`` before using NCCL.
        timeout: seconds, the process group's timeout for collectives (torch's default when
            ``None``). Members wait at most ``RENDEZVOUS_TIMEOUT`` seconds for each other.
        master_addr: the address other hosts reach rank 0 at; default ``127.0.0.1`` when all
            members share a host, else the address rank 0's host agent advertises (the route
            to the controller: a host name may resolve to 127.0.0.1), else its host name.

    The future fails with ``ActorError`` when a member cannot join (it already belongs to a
    group, the backend is unavailable, the rendezvous timed out) and with ``SupervisionError``
    as soon as a member's process dies.
    """
    members = mesh_layout(mesh)
    if master_addr is None and single_host(mesh):
        master_addr = "127.0.0.1"
    helpers = helper_mesh(mesh, "_dist_setup", _DistSetup)
    prepared = helpers.prepare.call(backend)
    store = rank0(helpers).serve_store.call_one(master_addr)

    hosts = member_hosts(mesh)

    def join(
        ready: tuple[ValueMesh[tuple[str, list[str]]], tuple[str, int]],
    ) -> Future[ValueMesh[GroupMember]]:
        answers, (addr, port) = ready
        placed = zip(answers.values(), members, hosts, strict=True)
        gpus = [gpu_of(visible, m.local_rank, host) for (_, visible), m, host in placed]
        chosen = choose_backend(backend, answers.values()[0][0], gpus)
        envs = [m.env(addr, port) for m in members]
        # The store server stays up until the group is destroyed: members keep their client
        # connections to it (new_group, barriers and monitored_barrier use it).
        joined: Future[ValueMesh[GroupMember]] = helpers.join.call(envs, chosen, timeout)
        return joined

    joined = then(both(prepared, store), join)
    release_on_failure(joined, helpers, store)
    return joined


def destroy_process_group(mesh: ActorMesh[Any] | ProcMesh) -> Future[ValueMesh[bool]]:
    """Destroy the default process group in every process of ``mesh``; rank 0's process also
    stops the group's store.

    Does not block; the future gives, per member, whether there was a group to destroy. Call
    it on the same mesh the group was formed over (members destroy their group locally; a
    member left out would keep a group whose peers are gone).
    """
    left: Future[ValueMesh[bool]] = helper_mesh(mesh, "_dist_teardown", _DistSetup).leave.call()
    return left


def release_on_failure(
    result: Future[Any], helpers: ActorMesh[Any], store: Future[tuple[str, int]]
) -> None:
    """When ``result`` fails after rank 0 started a store for it, stop that store."""

    def stop(served: Future[tuple[str, int]]) -> None:
        if served.exception() is not None:
            return
        try:
            rank0(helpers).release_store.call_one(served.get()[1])
        except MeshError:
            pass  # the mesh was stopped or rank 0 is dead: the store went with its process

    def failed(done: Future[Any]) -> None:
        # Callbacks run on the I/O thread: never wait here, chain on the store instead.
        if done.exception() is not None:
            store.add_done_callback(stop)

    result.add_done_callback(failed)


# -- small future combinators (the I/O thread runs the steps; they only send) ------------------


def both(a: Future[X], b: Future[Y]) -> Future[tuple[X, Y]]:
    """A future for the pair of results; fails with whichever fails first."""
    return then(when_all([a, b]), lambda pair: completed_future((pair[0], pair[1])))


# -- the worker's side -------------------------------------------------------------------------


class _ProcessState:
    """Per-process: the store servers this process hosts, by port."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.servers: dict[int, Any] = {}
        self.joined_port: int | None = None  # the store port of the group this process joined


_state = _ProcessState()


def default_backend() -> str:
    import torch

    if torch.cuda.is_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def serve_store(master_addr: str | None) -> tuple[str, int]:
    """Start a TCPStore server on a free port of this process; keep it until released."""
    import torch.distributed as dist

    # A remote host agent tells its workers the address other hosts reach it at.
    addr = master_addr or os.environ.get("ACTORMESH_HOST_ADDR") or socket.getfqdn()
    # Port 0: the kernel picks the port and the server holds it at once (no race).
    server = dist.TCPStore(
        addr,
        0,
        world_size=None,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=RENDEZVOUS_TIMEOUT),
    )
    port = int(server.port)
    with _state.lock:
        _state.servers[port] = server
    logger.debug("store for a new group serves on %s:%d", addr, port)
    return addr, port


def release_store(port: int) -> bool:
    """Stop the store server on ``port`` if this process serves it (other groups' stay up)."""
    with _state.lock:
        return _state.servers.pop(port, None) is not None


def check_can_join(backend: str | None) -> str:
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError("this build of torch has no torch.distributed")
    if dist.is_initialized():
        raise RuntimeError(
            f"this process already belongs to a process group (rank {dist.get_rank()} of "
            f"{dist.get_world_size()}); call actormesh.runtime.dataplane.distributed."
            "destroy_process_group(mesh) on the mesh it was formed over first, or form the "
            "new group over other processes"
        )
    resolved = backend or default_backend()
    for part in resolved.split(","):
        name = part.split(":")[-1].strip().lower()
        known = [b for b in dist.Backend.backend_list if b not in ("undefined", "fake")]
        if name not in dist.Backend.backend_list or name == "undefined":
            raise ValueError(
                f"unknown torch.distributed backend {name!r} in {resolved!r}; "
                f"known: {', '.join(known)} (or 'cpu:gloo,cuda:nccl' per device)"
            )
        if not dist.is_backend_available(name):
            raise RuntimeError(
                f"backend {name!r} is not available in this process (this torch build lacks "
                "it, or there is no device for it); use gloo on CPU"
            )
    return resolved


def join_group(env: dict[str, str], backend: str | None, timeout: float | None) -> GroupMember:
    """Set the torchrun variables, then join the group whose store ``env`` points at."""
    import torch
    import torch.distributed as dist

    resolved = check_can_join(backend)
    os.environ.update(env)
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    local_rank = int(env["LOCAL_RANK"])
    if ("nccl" in resolved or "cuda" in resolved) and torch.cuda.is_available():
        # This thread's device only (see init_process_group); NCCL creates its communicators
        # lazily, on the device of the first tensor a collective gets.
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    store = dist.TCPStore(
        env["MASTER_ADDR"],
        int(env["MASTER_PORT"]),
        world_size=world,
        is_master=False,
        timeout=timedelta(seconds=RENDEZVOUS_TIMEOUT),
    )
    pg_timeout = None if timeout is None else timedelta(seconds=timeout)
    dist.init_process_group(resolved, store=store, rank=rank, world_size=world, timeout=pg_timeout)
    if pg_timeout is not None:
        store.set_timeout(pg_timeout)
    _state.joined_port = int(env["MASTER_PORT"])
    return GroupMember(
        rank,
        world,
        local_rank,
        int(env["LOCAL_WORLD_SIZE"]),
        str(dist.get_backend()),
        env["MASTER_ADDR"],
        int(env["MASTER_PORT"]),
        os.getpid(),
    )


def leave_group() -> bool:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return False
    dist.destroy_process_group()
    if _state.joined_port is not None:
        # Only rank 0's process serves it; a group a script formed itself has none here.
        release_store(_state.joined_port)
        _state.joined_port = None
    return True


class _DistSetup(Actor):
    """Forms, and tears down, the default process group of the process it lives in."""

    @endpoint
    def prepare(self, backend: str | None) -> tuple[str, list[str]]:
        return check_can_join(backend), visible_gpus()

    @endpoint
    def serve_store(self, master_addr: str | None) -> tuple[str, int]:
        return serve_store(master_addr)

    @endpoint
    def join(
        self, envs: list[dict[str, str]], backend: str | None, timeout: float | None
    ) -> GroupMember:
        # The position in the called mesh is the rank: the helper mesh has the user's shape.
        return join_group(envs[context().message_rank.rank], backend, timeout)

    @endpoint
    def set_env(self, envs: list[dict[str, str]]) -> None:
        os.environ.update(envs[context().message_rank.rank])

    @endpoint
    def leave(self) -> bool:
        return leave_group()

    @endpoint
    def release_store(self, port: int) -> bool:
        return release_store(port)

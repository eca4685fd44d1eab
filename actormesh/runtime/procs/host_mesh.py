"""``HostMesh``, ``this_host()`` and ``this_proc()``: where proc meshes come from."""

from __future__ import annotations

import os
import sys
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from ... import config
from ...errors import MeshTypeError, MeshUsageError, SupervisionError
from ..actors import BOOTSTRAP_NAME, Bootstrap, Future, local_actor_host, settle, when_all
from ..extent import Extent
from ..mesh_shape import MeshShape, NoPublicConstructor
from ..meshes import ActorMesh, ProcMesh, ProcTable, new_proc_mesh, one_proc_mesh
from ..messaging import Address, new_id, rank_label
from ..shape import Shape
from .agent_handle import AgentHandle
from .controller import Controller, get_controller
from .mesh_record import MeshRecord
from .spawn_request import SpawnRequest

_names_taken: set[str] = set()
_names_lock = threading.Lock()


def _unique_name(name: str) -> str:
    """``name`` the first time, then ``name-2``, ``name-3``...: a mesh's name in messages."""
    with _names_lock:
        candidate, n = name, 1
        while candidate in _names_taken:
            n += 1
            candidate = f"{name}-{n}"
        _names_taken.add(candidate)
        return candidate


class HostMesh(MeshShape, metaclass=NoPublicConstructor):
    """Hosts, each with a host agent that starts and watches worker processes.

    Not constructed by users: ``this_host()`` gives the local machine as a mesh of extent
    ``{hosts: 1}``.
    """

    _ctl: Controller
    _agents: list[AgentHandle]
    _spawned: list[MeshRecord]  # shared by the slices of one host mesh (for shutdown)

    _not_constructed = "HostMesh is not constructed directly; use actormesh.this_host()"

    @classmethod
    def _create(
        cls,
        ctl: Controller,
        agents: list[AgentHandle],
        shape: Shape,
        spawned: list[MeshRecord] | None = None,
    ) -> HostMesh:
        self = object.__new__(cls)
        self._ctl = ctl
        self._agents = agents
        self._shape = shape
        self._spawned = [] if spawned is None else spawned
        return self

    def _new_with_shape(self, shape: Shape) -> HostMesh:
        return HostMesh._create(self._ctl, self._agents, shape, self._spawned)

    def agent_handles(self) -> list[AgentHandle]:
        """The host agents of this view's hosts, in rank order."""
        return [self._agents[r] for r in self._shape.ranks()]

    def __repr__(self) -> str:
        return f"<HostMesh {self._shape.extent}>"

    def shutdown(self) -> Future[None]:
        """Stop every proc mesh spawned through this host mesh (or a slice of it); the future
        completes when their processes have exited. Other host meshes over the same hosts
        (another ``this_host()``, say) keep theirs: the host agents are shared by them all,
        and stay."""
        stops = [record.stop() for record in self._spawned]
        done: Future[None] = Future(lambda: "the proc meshes of the host mesh to stop")
        when_all(stops).add_done_callback(lambda f: settle(f, done, None))
        return done

    def __enter__(self) -> HostMesh:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown().get(timeout=30)

    async def __aenter__(self) -> HostMesh:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def _procs_per_host(self, per_host: Mapping[str, int] | None) -> dict[str, int]:
        """``per_host`` without the entries that name this host mesh's own dimensions with its
        own sizes (Monarch code writes ``{"hosts": 1, "gpus": 2}`` for one host)."""
        out = {}
        host_sizes = dict(zip(self._shape.labels, self._shape.sizes, strict=True))
        for dim, size in (per_host or {}).items():
            if dim not in host_sizes:
                out[dim] = size
            elif size != host_sizes[dim]:
                raise MeshUsageError(
                    f"per_host={{{dim!r}: {size!r}}}: {dim!r} is a dimension of this host mesh, "
                    f"of size {host_sizes[dim]}; it may only repeat that size (or be left out: "
                    f"per_host gives the processes on each host)"
                )
        return out

    def spawn_procs(
        self,
        per_host: Mapping[str, int] | None = None,
        env: Mapping[str, str] | None = None,
        name: str = "procs",
        bootstrap: Callable[[], object] | None = None,
    ) -> ProcMesh:
        """Start worker processes: ``per_host`` gives the extent of procs on each host.

        ``this_host().spawn_procs(per_host={"gpus": 4})`` has extent ``{hosts: 1, gpus: 4}``, as
        has ``per_host={"hosts": 1, "gpus": 4}`` (Monarch's tests write it so): an entry that
        names a dimension of this host mesh must give its size.
        Blocks until every process has started (at most ``ACTORMESH_SPAWN_TIMEOUT`` seconds) and
        raises ``SupervisionError`` with the stderr of a process that failed to start. With GPUs
        on the host, a ``gpus`` dimension gives each process its own device
        (``CUDA_VISIBLE_DEVICES``). ``env`` is added to every process's environment.
        ``name`` is what its repr and messages call the mesh; a name already taken in this
        process gets a number (``procs``, ``procs-2``), so two meshes never read the same.

        ``bootstrap`` (Monarch's): a picklable callable, sync or async, that every process runs
        before any actor is built on it (to set environment variables before CUDA starts, say);
        it may spawn actors itself (on ``this_proc()``) and call them.
        ``spawn_procs`` does not wait for it: ``initialized`` completes once it ran everywhere
        and fails with its ``ActorError`` if it raised; actors spawned on the mesh then fail
        their ``__init__`` with that failure.
        """
        if bootstrap is not None and not callable(bootstrap):
            raise MeshTypeError(f"bootstrap must be a callable, got {bootstrap!r}")
        per_host = self._procs_per_host(per_host)
        request_env = _spawn_env(env)
        host_extent = self._shape.extent
        extent = Extent(
            list(host_extent.labels) + list(per_host),
            list(host_extent.sizes) + list(per_host.values()),
        )
        per = Extent(list(per_host), list(per_host.values())).nelem
        self._ctl.raise_if_shut_down()
        agents = self._ready_agents()
        ctl = self._ctl
        shape = Shape.from_extent(extent)
        table = _proc_table(ctl.run_dir, agents, shape, per, name)
        request = SpawnRequest(os.getcwd(), list(sys.path), request_env, extent)
        record = MeshRecord(ctl, table, agents, per, request)
        ctl.register(record)
        record.spawn_ranks(list(range(len(shape))))
        try:
            record.ready.get(timeout=config.SPAWN_TIMEOUT)
        except BaseException:
            record.stop()
            raise
        record.host_mesh = self
        self._spawned.append(record)
        procs = new_proc_mesh(table, shape, record)
        if bootstrap is not None:
            record.initialized = _bootstrap(procs, bootstrap, table.mesh_id)
        return procs

    def _ready_agents(self) -> list[AgentHandle]:
        """The agents of this mesh's hosts, once each is up (raises for one that died)."""
        agents = [self._agents[r] for r in self._shape.ranks()]
        for agent in agents:
            agent.ready.get(timeout=config.SPAWN_TIMEOUT)
            if agent.dead:
                again = "call this_host() again" if agent.run_dir is None else "get new hosts"
                raise SupervisionError(
                    [], f"the host agent of {agent.name} in this host mesh died; {again}"
                )
        return agents


def _spawn_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """What every process of a new proc mesh adds to its environment: ``env`` (checked), and
    this process's ``PYTHONBREAKPOINT``, so that ``breakpoint()`` works on ranks of other hosts
    too (the debugger sets it)."""
    if env is not None and not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise MeshUsageError("env must map str to str")
    spawn_env = dict(env or {})
    hook = os.environ.get("PYTHONBREAKPOINT")
    if hook:
        spawn_env.setdefault("PYTHONBREAKPOINT", hook)
    return spawn_env


def _proc_table(
    run_dir: str, agents: list[AgentHandle], shape: Shape, per: int, name: str
) -> ProcTable:
    """Where each rank of a new proc mesh of ``shape`` will live (``per`` ranks per host, in
    its agent's run directory, or the controller's ``run_dir``), under a new mesh id."""
    mesh_id = f"{name}-{uuid.uuid4().hex[:8]}"
    addresses: list[Address] = []
    labels: list[str] = []
    # Casts from other hosts reach a remote host's ranks through its agent (relay.py).
    relays: list[Address | None] = []
    for rank in range(len(shape)):
        agent = agents[rank // per]
        assert agent.address is not None
        where = agent.run_dir or run_dir
        addresses.append(
            Address(agent.address.host, f"ipc://{where}/{mesh_id}-{rank}", None, new_id())
        )
        labels.append(rank_label(shape.point(rank)))
        relays.append(agent.address if agent.run_dir is not None else None)
    return ProcTable(
        mesh_id, addresses, labels, relays if any(relays) else None, _unique_name(name)
    )


def _bootstrap(procs: ProcMesh, bootstrap: Callable[[], object], mesh_id: str) -> Future[bool]:
    """Run ``bootstrap`` as the first actor of every process of ``procs`` (the ones spawned
    after it wait for it there): what ``ProcMesh.initialized`` completes with."""
    boot: ActorMesh[Any] = procs.spawn(BOOTSTRAP_NAME, Bootstrap, bootstrap)
    initialized: Future[bool] = Future(lambda: f"the bootstrap of {mesh_id} to run")
    boot.initialized.add_done_callback(lambda f: settle(f, initialized, True))
    return initialized


def new_host_mesh(ctl: Controller, agents: list[AgentHandle], shape: Shape) -> HostMesh:
    """A ``HostMesh`` of the hosts of ``agents`` (``shape``: their extent), whose proc meshes
    ``ctl`` controls."""
    return HostMesh._create(ctl, agents, shape)  # noqa: SLF001  the factory of this module's class


def this_host() -> HostMesh:
    """The machine the controller runs on, as a host mesh of extent ``{hosts: 1}``.

    Its host agent (and fork server) starts in the background on first use.
    """
    ctl = get_controller()
    agent = ctl.local_agent()
    return new_host_mesh(ctl, [agent], Shape.from_extent({"hosts": 1}))


def this_proc() -> ProcMesh:
    """This process itself as a one-proc mesh: its actors run on threads here.

    Its table id names this process, so a copy passed to another process (which may hold a
    ``this_proc()`` of its own) still names this one.
    """
    ctl = get_controller()
    ctl.raise_if_shut_down()
    address = ctl.node.address
    # In a worker, the process's own rank in its proc mesh: what its actor host spawns for
    # (a worker of rank 1 whose this_proc() said rank 0 had its spawns ignored).
    host = local_actor_host()
    rank = 0 if host is None else host.proc_rank
    return one_proc_mesh(f"proc-{address.mailbox.hex()[:16]}", address, rank, "controller")

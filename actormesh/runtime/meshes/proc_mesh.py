"""``ProcMesh``: worker processes, one per rank, that actors are spawned on."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

from ... import config
from ...errors import MeshClosedError, MeshUsageError
from ..actors import (
    Actor,
    Future,
    Owner,
    completed_future,
    current_runner,
    endpoint_names,
    plain_method_names,
)
from ..faults import STOPPED_HINT, stopped
from ..mesh_shape import MeshShape, NoPublicConstructor, view_shape
from ..messaging import (
    LogSink,
    MetricsLog,
    current_node,
    in_worker,
    local_log,
    payload_digest,
    spawn_hint,
)
from ..messaging.protocol import INTERRUPT, SPAWN_ACTOR, STACKS, shape_state
from ..shape import Shape
from . import relay
from .actor_mesh import ActorMesh, new_actor_mesh, refuse_hidden_endpoints
from .arguments import pickle_arguments
from .collect import MISSING, Collector, Gather
from .endpoint import no_values
from .proc_table import ProcTable
from .rank_table import rank_table
from .tensor_seam import tensor_layer
from .value_mesh import ValueMesh, new_value_mesh

if TYPE_CHECKING:
    from ..procs import HostMesh  # the type users get from ProcMesh.host_mesh (see MeshOwner)

A = TypeVar("A", bound=Actor)


class ActorSpawn(NamedTuple):
    """One ``ProcMesh.spawn`` as it was sent: sent again, with a new reply port, to the ranks
    of the mesh that are healed."""

    key: str
    name: str
    shape: Shape
    payload: bytes
    buffers: list[Any]
    digest: bytes
    owner: Owner | None = None


class MeshOwner(Protocol):
    """The controller's record of a proc mesh it spawned (``procs/mesh_record.py``'s
    ``MeshRecord``, a higher layer), as the ``ProcMesh`` views of that mesh use it: views in
    other processes, or of ``this_proc()``, have none."""

    @property
    def initialized(self) -> Future[bool] | None: ...
    @property
    def host_mesh(self) -> HostMesh | None: ...
    @property
    def actor_spawns(self) -> list[ActorSpawn]: ...
    @property
    def metrics(self) -> MetricsLog: ...
    @property
    def logs(self) -> LogSink: ...

    def dump_stacks(self, rank: int, reply: tuple[Any, ...], index: int) -> None: ...

    def heal(self, spares: Sequence[Any] | None = None) -> Future[None]: ...  # AgentHandles

    def stop(self) -> Future[None]: ...


class ProcMesh(MeshShape, metaclass=NoPublicConstructor):
    """Worker processes, one per rank, made by ``HostMesh.spawn_procs``. Not built by users.

    ``spawn`` puts one actor per rank. ``stop()`` ends the processes; afterwards any call on
    the mesh or its actors raises :class:`MeshClosedError`. Usable as a context manager that
    stops the mesh on exit. Slicing is bookkeeping (no message is sent).
    """

    _procs: ProcTable
    _record: MeshOwner | None

    _not_constructed = "ProcMesh is not constructed directly; use this_host().spawn_procs(...)"

    @classmethod
    def _create(cls, procs: ProcTable, shape: Shape, record: MeshOwner | None) -> ProcMesh:
        self = object.__new__(cls)
        self._procs = procs
        self._shape = shape
        self._record = record
        return self

    def _new_with_shape(self, shape: Shape) -> ProcMesh:
        return ProcMesh._create(self._procs, shape, self._record)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (self._procs, self._shape))

    def __repr__(self) -> str:
        state = " (stopped)" if self._procs.closed else ""
        return f"<ProcMesh {self._procs.name!r} {self._shape.extent}{state}>"

    def __enter__(self) -> ProcMesh:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop().get(timeout=30)

    async def __aenter__(self) -> ProcMesh:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def initialized(self) -> Future[bool]:
        """Completes with ``True`` once every process has started and run the ``bootstrap``
        given to ``spawn_procs`` (Monarch's ``ProcMesh.initialized``); fails with the
        ``ActorError`` of the ranks whose bootstrap raised. Processes have started by the time
        ``spawn_procs`` returns, so without a bootstrap it is complete at once."""
        record = self._record
        if record is None or record.initialized is None:
            return completed_future(True)
        return record.initialized

    @property
    def host_mesh(self) -> HostMesh:
        """The host mesh these processes were spawned on (all of its hosts, also for a slice)."""
        if self._record is None or self._record.host_mesh is None:
            raise MeshUsageError("only the process that spawned a proc mesh knows its host mesh")
        return self._record.host_mesh

    # -- actors ----------------------------------------------------------------------------------

    def spawn(
        self, name: str, cls: type[A] | Callable[..., A], *args: Any, **kwargs: Any
    ) -> ActorMesh[A]:
        """Create one ``cls(*args, **kwargs)`` actor on every rank of this mesh; don't wait.

        ``__init__`` runs in each worker before the first message it handles; if it raises,
        the first call (and ``mesh.initialized``) fails with its ``ActorError``, which also
        goes to the mesh's owner (``__supervise__``, else the fault hook), as in Monarch.
        Classes from ``__main__`` or a notebook cell are sent by value; others are imported by
        the workers.
        """
        if not isinstance(name, str) or not name:
            raise MeshUsageError(f"an actor mesh needs a non-empty name, got {name!r}")
        if not (isinstance(cls, type) and issubclass(cls, Actor)):
            raise MeshUsageError(
                f"spawn expects a subclass of actormesh.Actor, got {cls!r}; "
                "derive your class from am.Actor and mark its methods with @am.endpoint"
            )
        if self._procs.closed:
            raise MeshClosedError(
                f"cannot spawn on proc mesh {self._procs.name!r}: it was stopped; "
                f"{spawn_hint('new procs with this_host().spawn_procs(...)')}"
            )
        endpoints = frozenset(endpoint_names(cls))
        refuse_hidden_endpoints(cls, endpoints)
        shape = self._shape
        to = (self._procs, shape.ranks())
        payload, buffers = pickle_arguments((cls, *args), kwargs, f"spawn of {name!r}", to)
        key = f"{name}-{uuid.uuid4().hex[:12]}"
        gather: Gather[Any] = Gather(f"{name}.__init__", self._procs, shape, no_values)
        methods = plain_method_names(cls) - endpoints
        mesh: ActorMesh[A] = new_actor_mesh(
            self._procs, shape, key, name, cls.__qualname__, endpoints, gather.future, None, methods
        )
        node = current_node()
        reply = gather.port = node.open_port(gather)
        # Spawned inside an actor: that actor owns the mesh (its failures go to it, and it
        # stops with that actor), whoever made these procs.
        runner = current_runner()
        owner = None if runner is None else Owner(node.address, runner.key, runner.actor_instance)
        envelope: tuple[Any, ...] = (SPAWN_ACTOR, key, name, shape, reply)
        if owner is not None:
            envelope += (owner,)
            runner.ownership.children.append(mesh)  # type: ignore[union-attr]
        digest = payload_digest(payload)
        # Straight to ranks on this host, one message per other host (its agent fans it out):
        # the route every later call to these ranks takes, so the spawn arrives first.
        state = shape_state(shape)
        relay.send(node, self._procs, shape, state, envelope, payload, buffers, digest, gather)
        if self._record is not None:
            spawn = ActorSpawn(key, name, shape, payload, buffers, digest, owner)
            self._record.actor_spawns.append(spawn)
        return mesh

    def to_table(self) -> str:
        """Monarch's ``to_table()``: this mesh's processes as a text grid, one row per point
        of all its dimensions but the last, a column per index of the last; each cell is the
        process's rank in the proc mesh as spawned. Sends nothing."""
        shape = self._shape
        return rank_table(shape.labels, shape.sizes, shape.ranks())

    # -- tensors (actormesh.tensor) ---------------------------------------------------------------

    def activate(self) -> Any:
        """``with procs.activate():`` torch factories make per-rank MeshTensors on this mesh
        (PyTorch Monarch's tensor-engine style); see ``actormesh.tensor.activate``. The first
        use starts the mesh's tensor engine (forms a process group: seconds)."""
        return tensor_layer("ProcMesh.activate").activate(self)

    def rank(self, dims: str | tuple[str, ...]) -> Any:
        """Each rank's coordinate along ``dims`` as a per-rank MeshTensor (an int64 scalar;
        row-major over several dims); see ``actormesh.tensor.rank``."""
        return tensor_layer("ProcMesh.rank").rank(self, dims)

    # -- supervision ---------------------------------------------------------------------------

    def health(self) -> ValueMesh[str]:
        """Per-rank health, known without sending anything: ``"alive"``, how the process died,
        or (a rank on this host that SIGSTOP or a tracer stopped) ``"stopped: ..."``."""
        dead = current_node().dead
        procs = self._procs
        values = []
        for rank in self._shape.ranks():
            death = dead.get(procs.addresses[rank].mailbox)
            if death is not None:
                values.append(f"dead: {death.describe()}")
            elif (procs.relays is None or procs.relays[rank] is None) and stopped(procs.pids[rank]):
                values.append(f"stopped: {STOPPED_HINT}")
            else:
                values.append("alive")
        return new_value_mesh(self._shape, values)

    def stacks(self, timeout: float = 1.0) -> Future[ValueMesh[str]]:
        """The Python stacks of every rank of this mesh (or slice), as text per rank.

        Answered by each worker's message thread, so ranks busy in a long endpoint answer too.
        A rank that does not answer within ``timeout`` seconds (a thread holding the GIL in C
        code) is dumped by its host agent with faulthandler instead. Dead ranks say how they
        died. ``actormesh.runtime.faults.stacks.render_grouped(mesh)`` groups identical stacks.
        """
        shape = self._shape
        gather: Gather[ValueMesh[str]] = Gather(
            "stacks", self._procs, shape, partial(new_value_mesh, shape)
        )
        gather.deaths_as_values = True
        node = current_node()
        port = gather.port = node.open_port(gather)
        reply = (tuple(port.address), port.port_id)
        self._control((STACKS, shape_state(shape), reply), gather)
        record = self._record
        if record is not None:

            def fallback() -> None:
                for index, value in enumerate(list(gather.values)):
                    if value is MISSING:
                        record.dump_stacks(shape.global_rank(index), reply, index)

            node.transport.call_soon(lambda: node.transport.call_later(timeout, fallback))
        return gather.future

    def interrupt(self) -> None:
        """Raise ``KeyboardInterrupt`` in the endpoints running on this mesh's (slice's) ranks.

        The actors survive and keep serving. Pure-Python code stops at once; a blocking call in
        C (``time.sleep``, a collective) is interrupted when it returns to Python.
        """
        self._control((INTERRUPT,), None)

    def heal(self, hosts: HostMesh | None = None) -> Future[None]:
        """Respawn the dead ranks of this mesh in place and re-create their actors (with their
        original constructor arguments), so existing ``ActorMesh`` handles work again. The
        future completes when every re-created actor has run ``__init__``.

        The ranks of a host that was lost (its agent died or stopped answering) move to a spare
        host: one of ``hosts`` when given (e.g. ``listener.wait_for_hosts(1)``), else a host
        agent that dialled in and is in no host mesh yet. Without one, the future fails with a
        ``SupervisionError`` saying so."""
        if self._record is None:
            raise MeshUsageError("only the process that spawned a proc mesh can heal it")
        spares = None
        if hosts is not None:
            spares = hosts.agent_handles()
            for agent in spares:
                agent.ready.get(timeout=config.SPAWN_TIMEOUT)
        return self._record.heal(spares)

    def _control(self, envelope: tuple[Any, ...], collector: Collector[Any] | None) -> None:
        if self._procs.closed:
            raise MeshClosedError(f"the proc mesh was stopped; {spawn_hint('a new one')}")
        node = current_node()
        if self._procs.relays is not None:  # the same route as casts, so interrupts keep order
            state = shape_state(self._shape)
            relay.send(node, self._procs, self._shape, state, envelope, collector=collector)
            return
        for rank in self._shape.ranks():
            address = self._procs.addresses[rank]
            death = node.dead.get(address.mailbox)
            if death is not None:
                if collector is not None:
                    collector.on_death(address.mailbox, death)
                continue
            node.send(address, envelope)

    def metrics(self, *names: str) -> Any:
        """What this mesh's ranks logged with ``am.log_metrics``, oldest first: one row per
        value, with ``name``, ``value``, ``step``, ``time``, ``rank`` (the flat rank in this
        mesh) and one column per mesh dimension. A pandas ``DataFrame`` when pandas is
        installed, else a list of dicts. ``names`` keeps only those metrics.

        Values an endpoint logged are here once its call returned; a long-running endpoint's
        arrive every half second. Does not block (nothing is asked of the ranks).
        """
        if self._record is not None:
            log = self._record.metrics
        elif in_worker():
            raise MeshUsageError("metrics() is read in the process that spawned the mesh")
        else:
            log = local_log()  # this_proc(): what the controller logged itself
        return log.table(self._shape, names)

    def logging_option(
        self,
        stream_to_client: bool = True,
        aggregate_window_sec: float | None = 3,
        level: int = logging.INFO,
    ) -> Future[None]:
        """How this mesh's output is shown here (Monarch's options; a completed future, to
        ``await`` or ``get()`` as Monarch code does). ``stream_to_client=False`` hides it
        (failures still quote the last lines of stderr); ``aggregate_window_sec``: lines
        that several ranks print alike within that many seconds are shown once, with the
        ranks; ``None`` (actormesh's default) shows each line as it comes. ``level`` is
        checked and otherwise left to the ranks' own ``logging`` setup: what they print
        is what is shown."""
        if not 0 <= level <= 255:
            raise MeshUsageError(f"invalid logging level: {level}")
        if self._record is None:
            raise MeshUsageError("logging_option is set in the process that spawned the mesh")
        senders = [self._procs.addresses[r].mailbox for r in self._shape.ranks()]
        self._record.logs.set_mode(senders, stream_to_client, aggregate_window_sec)
        return completed_future(None)

    # -- lifetime --------------------------------------------------------------------------------

    def stop(self) -> Future[None]:
        """Stop every process of the whole mesh (not just this slice); the future completes when
        they have all exited. Stopping twice is harmless."""
        if self._record is None:
            raise MeshUsageError("only the process that spawned a proc mesh can stop it")
        return self._record.stop()


def new_proc_mesh(procs: ProcTable, shape: Shape, record: MeshOwner | None) -> ProcMesh:
    """A ``ProcMesh`` on the processes of ``procs``, the view ``shape``; ``record``: the
    controller's record of the mesh when this process spawned it (it can stop and heal it)."""
    return ProcMesh._create(procs, shape, record)  # noqa: SLF001  the factory of this module's class


def _restore(procs: ProcTable, shape: Shape) -> ProcMesh:
    return new_proc_mesh(procs, shape, None)


def proc_table_of(mesh: ProcMesh | ActorMesh[Any]) -> ProcTable:
    """The processes under a proc or actor mesh: for tools that group meshes by proc mesh (the
    kernel, the sidebar, process groups). A function, not an attribute: see ``actor_key``."""
    return mesh._procs  # noqa: SLF001  the one reader outside the mesh classes


def unrecorded(procs: ProcMesh) -> ProcMesh:
    """A view of ``procs`` whose spawns are not recorded for ``heal``: for a helper actor that
    a healed process cannot host (the tensor engine: a healed process never joined its process
    group, tensor/compat.py)."""
    return _restore(proc_table_of(procs), view_shape(procs))


def subset(procs: ProcMesh, indices: list[int], sizes: dict[str, int]) -> ProcMesh:
    """The processes of ``procs`` at ``indices`` (row-major), as a mesh of shape ``sizes``.

    For a tensor mesh that goes on without some of its processes (``FaultTolerant.shrink``):
    a slice is a strided view, which cannot leave out an inner rank, so its shape maps each
    point to its process (``Shape.of_ranks``). Not recorded for ``heal`` (``procs`` is healed)."""
    ranks = view_shape(procs).ranks()
    return new_proc_mesh(
        proc_table_of(procs), Shape.of_ranks(sizes, [ranks[i] for i in indices]), None
    )

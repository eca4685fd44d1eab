"""One proc mesh as its controller sees it (``MeshRecord``: start-up, exits, stop)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ... import config
from ...errors import (
    ActorError,
    MeshClosedError,
    MeshError,
    MeshFailure,
    ProcDeath,
    SupervisionError,
)
from ..actors import (
    ActorRunner,
    Future,
    Owner,
    current_runner,
    send_to_owner,
    set_exception,
    set_result,
    settle,
    when_all,
)
from ..extent import Extent
from ..faults import unhandled_fault_hook
from ..meshes import ActorSpawn, ProcMesh, ProcTable, new_proc_mesh
from ..messaging import LogSink, MetricsLog, new_id, spawn_hint
from ..messaging.protocol import DUMP, MOVED, REAP, REVIVED, SPAWN_ACTOR, SPAWN_PROCS, STOP
from ..shape import Shape
from . import rehost
from .agent_handle import AgentHandle
from .record_parts import MeshController
from .sampling import ResourceHistory

if TYPE_CHECKING:
    from .host_mesh import HostMesh

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpawnRequest:
    """What every process of one proc mesh starts with; each rank adds its own part
    (``MeshRecord.proc_request``). Kept to start a rank again when it is healed.

    It goes to host agents as the plain dict of ``wire()``: the agent merges it with each
    rank's part into the JSON line a worker reads at start-up (``worker.main``), so the dict
    *is* the form the far end uses, and an agent needs no class of ours to read it.
    """

    cwd: str
    sys_path: list[str]
    env: dict[str, str]  # added to each worker's environment
    extent: Extent  # of the whole proc mesh: host dimensions, then per-host ones

    def wire(self) -> dict[str, Any]:
        return {
            "cwd": self.cwd,
            "sys_path": self.sys_path,
            "env": self.env,
            "extent": [list(self.extent.labels), list(self.extent.sizes)],
        }


class MeshRecord:
    """A proc mesh owned by this controller: start-up, exits and stop."""

    def __init__(
        self,
        ctl: MeshController,
        table: ProcTable,
        agents: list[AgentHandle],
        per_host: int,
        request: SpawnRequest,
    ) -> None:
        self.ctl = ctl
        self.table = table
        self.agents = agents
        self.per_host = per_host
        n = len(table.addresses)
        self.started = 0
        self.exited: set[int] = set()
        self.ready: Future[None] = Future(self._describe_missing)
        self.stopping = False
        self.stopped: Future[None] = Future(lambda: f"the processes of {table.mesh_id} to exit")
        self.lock = threading.Lock()
        self.n = n
        self._is_ready = [False] * n
        # What it takes to rebuild a rank: its spawn request and every actor spawned on it.
        self.request = request
        self.actor_spawns: list[ActorSpawn] = []
        # The actor that spawned this mesh (when spawned inside a worker): it supervises it.
        self.owner: ActorRunner | None = current_runner()
        self.metrics = MetricsLog()  # what its ranks logged (log_metrics)
        self.resources = ResourceHistory()  # what its ranks use, sampled by their agents
        self.host_mesh: HostMesh | None = None  # where it was spawned (ProcMesh.host_mesh)
        # rank -> the actors that own actor meshes on it (OWNED): they hear of its loss.
        self.owned: dict[int, dict[tuple[bytes, str], Owner]] = {}
        # ProcMesh.initialized when spawned with a bootstrap: True once it ran on every rank.
        self.initialized: Future[bool] | None = None

    def _describe_missing(self) -> str:
        missing = [self.table.labels[i] for i, ok in enumerate(self._is_ready) if not ok]
        return f"processes {', '.join(missing[:8])} to start"

    @property
    def logs(self) -> LogSink:
        """Where the output of the controller's ranks goes (``ProcMesh.logging_option``)."""
        return self.ctl.logs

    @property
    def shape(self) -> Shape:
        """The whole mesh's shape, as spawned."""
        return Shape.from_extent(self.request.extent)

    def proc_mesh(self, shape: Shape | None = None) -> ProcMesh:
        """A ``ProcMesh`` on this record's processes (the view ``shape``, default the whole
        mesh): for tools that find a mesh by its id and did not keep the user's object."""
        return new_proc_mesh(self.table, self.shape if shape is None else shape, self)

    def agent_of(self, rank: int) -> AgentHandle:
        return self.agents[rank // self.per_host]

    def on_ready(self, rank: int, pid: int) -> None:
        with self.lock:
            if self._is_ready[rank]:
                return
            self._is_ready[rank] = True
            self.table.pids[rank] = pid
            self.started += 1
            done = self.started == self.n
        if done:
            set_result(self.ready, None)

    def on_exit(self, rank: int, death: ProcDeath, report: bool = True) -> bool:
        """Record the exit of ``rank``; returns whether it is left unhandled (and, when
        ``report``, hands it to the owner or the fault hook)."""
        with self.lock:
            if rank in self.exited:
                return False
            self.exited.add(rank)
            all_gone = len(self.exited) == self.n
        address = self.table.addresses[rank]
        if not self.ready.done():
            set_exception(
                self.ready,
                SupervisionError([death], "a process of the new proc mesh failed to start"),
            )
        observed = self.ctl.node.record_death(address.mailbox, death)
        self.ctl.node.transport.forget(address)
        if self.stopping:
            if all_gone:
                self.ctl.meshes.pop(self.table.mesh_id, None)
                set_result(self.stopped, None)
            return False
        self.ctl.notify_death(self, address, death)
        unhandled = not observed and self.ready.done()
        if unhandled and report:
            self.report_lost([rank], [death], "a worker died while no call waited on it")
        return unhandled

    def on_owned(self, rank: int, owner: Owner) -> None:
        self.owned.setdefault(rank, {})[(owner.address.mailbox, owner.key)] = owner

    def report_lost(self, ranks: list[int], deaths: list[ProcDeath], summary: str) -> None:
        """Processes lost while nothing waited on them: to the actors that own actor meshes
        on them (each hears of it once), as in Monarch; failing those, to this proc mesh's
        owner or the fault hook. ``mesh_name`` is the proc mesh's id either way."""
        gone = {self.table.addresses[r].mailbox for r in ranks} | set(self.ctl.node.dead)
        owners: dict[tuple[bytes, str], Owner] = {}
        for rank in ranks:
            owners.update(self.owned.get(rank, {}))
        # An owner that died with the rank (or before) hears nothing: others must.
        alive = [o for o in owners.values() if o.address.mailbox not in gone]
        if not alive:
            self.report_unhandled(SupervisionError(deaths, summary))
            return
        for owner in alive:
            failure = SupervisionError(deaths, summary)
            failure.mesh_name = self.table.mesh_id
            failure.mesh = self.proc_mesh()
            send_to_owner(self.ctl.node, owner, failure)

    def report_unhandled(self, failure: MeshError) -> None:
        """A failure nobody waited for: to the owning actor's ``__supervise__``, else the hook."""
        if isinstance(failure, MeshFailure) and failure.mesh_name is None:
            # The actor mesh whose endpoint raised, else the proc mesh that lost a process.
            actor = failure.failures[0].actor if isinstance(failure, ActorError) else None
            failure.mesh_name = actor or self.table.mesh_id
            failure.mesh = self.proc_mesh()
        if self.owner is not None:
            self.owner.supervise(failure)
        else:
            unhandled_fault_hook(failure)

    def proc_request(self, rank: int) -> dict[str, Any]:
        address = self.table.addresses[rank]
        return {
            "rank": rank,
            "label": self.table.labels[rank],
            "mailbox": address.mailbox.hex(),
            "ipc": address.ipc,
            # A rank healed in place binds its old tcp port again, so copies of the proc table
            # held by other processes stay valid.
            "tcp_port": int(address.tcp.rsplit(":", 1)[1]) if address.tcp else 0,
            **((self.ctl.local_tcp or {}) if self.agent_of(rank).run_dir is None else {}),
        }

    def spawn_ranks(self, ranks: list[int]) -> None:
        by_agent: dict[int, tuple[AgentHandle, list[dict[str, Any]]]] = {}
        for rank in ranks:
            agent = self.agent_of(rank)
            by_agent.setdefault(id(agent), (agent, []))[1].append(self.proc_request(rank))
        for agent, procs in by_agent.values():
            assert agent.address is not None
            request = self.request.wire()
            self.ctl.node.send(agent.address, (SPAWN_PROCS, self.table.mesh_id, procs, request))

    def heal(self, spares: Sequence[AgentHandle] | None = None) -> Future[None]:
        """Respawn dead ranks at their old addresses, each under a new mailbox (the ranks of a
        lost host on a spare host: see rehost.py), then re-create their actors."""
        healed: Future[None] = Future(lambda: f"the dead ranks of {self.table.mesh_id} to heal")
        try:
            self._restart_local_agent()
        except MeshError as exc:
            set_exception(healed, exc)
            return healed
        with self.lock:
            if self.stopping:
                set_exception(
                    healed,
                    MeshClosedError(
                        f"cannot heal proc mesh {self.table.name!r}: it was stopped (stop() "
                        "ends every process for good, heal() respawns ranks that died); "
                        f"{spawn_hint('new procs with this_host().spawn_procs(...)')}"
                    ),
                )
                return healed
            dead = sorted(self.exited)
            if not dead:
                set_result(healed, None)
                return healed
            try:
                moved = rehost.move_lost_hosts(self, dead, spares)
            except SupervisionError as exc:
                set_exception(healed, exc)
                return healed
            for rank in dead:
                self.exited.discard(rank)
                self._is_ready[rank] = False
            self.started = sum(self._is_ready)
            self.ready = Future(self._describe_missing)
        node = self.ctl.node
        table = self.table
        for rank in dead:
            # A new incarnation gets a new mailbox, the id that every message to it signs as
            # its destination: frames signed for its previous life (whose replay window the
            # new process does not have) are then addressed to another process, and dropped.
            old = table.addresses[rank]
            table.addresses[rank] = old._replace(mailbox=new_id())
            node.forget_death(old.mailbox)
            self.ctl.logs.forget(old.mailbox, table.addresses[rank].mailbox)
            relay = table.relays[rank] if table.relays is not None else None
            # Copies of the table held by workers follow (before the old mailbox is cleared
            # from their deaths: they never take the old incarnation for alive).
            self.ctl.broadcast_to_workers(
                (MOVED, table.mesh_id, rank, table.addresses[rank], relay)
            )
            self.ctl.broadcast_to_workers((REVIVED, old.mailbox))
        table.routes.clear()
        logger.info("healing ranks %s of %s", dead, self.table.mesh_id)
        self.spawn_ranks(dead)
        self.ready.add_done_callback(lambda ready: self._respawn_actors(ready, dead, healed, moved))
        return healed

    def _restart_local_agent(self) -> None:
        """This host's agent died: its ranks heal in place under a new one (started here, as
        ``this_host()`` would), rather than waiting for a spare host to dial in."""
        lost = [i for i, a in enumerate(self.agents) if a.dead and a.proc is not None]
        if not lost:
            return
        agent = self.ctl.local_agent()
        agent.ready.get(timeout=config.SPAWN_TIMEOUT)
        for i in lost:
            self.agents[i] = agent

    def _respawn_actors(
        self, ready: Future[None], ranks: list[int], healed: Future[None], moved: list[int]
    ) -> None:
        exc = ready.exception()
        if exc is not None:
            set_exception(healed, exc)
            return
        rehost.announce(self, moved)
        node = self.ctl.node
        pending = []
        for spawn in self.actor_spawns:
            shape = spawn.shape
            # An actor that ActorMesh.stop stopped stays stopped: healing brings back what died.
            stopped = self.table.stopped_actors.get(spawn.key, ())
            mine = [r for r in ranks if shape.local_index(r) is not None and r not in stopped]
            if not mine:
                continue
            from ..meshes import Gather, no_values

            gather: Gather[None] = Gather(f"{spawn.name}.__init__", self.table, shape, no_values)
            # Only the respawned ranks answer; the others count as done already.
            for index, rank in enumerate(shape.ranks()):
                if rank not in mine:
                    gather.deliver(index, False, None)
            reply = gather.port = node.open_port(gather)
            envelope: tuple[Any, ...] = (SPAWN_ACTOR, spawn.key, spawn.name, shape, reply)
            if spawn.owner is not None:
                envelope += (spawn.owner,)
            for rank in mine:
                address = self.table.addresses[rank]
                node.send(address, envelope, spawn.payload, spawn.buffers, spawn.digest)
            pending.append(gather.future)
        all_done = when_all(pending)
        all_done.add_done_callback(lambda f: settle(f, healed, None))

    def dump_stacks(self, rank: int, reply: tuple[Any, ...], index: int) -> None:
        agent = self.agent_of(rank)
        if agent.address is not None:
            self.ctl.node.send(agent.address, (DUMP, self.table.mesh_id, rank, reply, index))

    def stop(self) -> Future[None]:
        with self.lock:
            if self.stopping:
                return self.stopped
            self.stopping = True
            self.ctl.stopped_ids.add(self.table.mesh_id)
            self.table.closed = True
            alive = [r for r in range(self.n) if r not in self.exited]
        if not alive:
            self.ctl.meshes.pop(self.table.mesh_id, None)
            set_result(self.stopped, None)
            return self.stopped
        node = self.ctl.node
        for rank in alive:
            try:
                node.send(self.table.addresses[rank], (STOP,))
            except Exception:
                logger.debug("could not send stop to rank %s", rank, exc_info=True)
        for agent in {id(a): a for a in self.agents}.values():
            if agent.address is not None:
                node.send(agent.address, (REAP, self.table.mesh_id, config.STOP_GRACE))
        return self.stopped

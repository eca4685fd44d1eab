"""One proc mesh as its controller sees it (``MeshRecord``: start-up, exits, stop)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
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
    failed_future,
    send_to_owner,
    set_exception,
    set_result,
    settle,
    when_all,
)
from ..faults import unhandled_fault_hook
from ..meshes import ActorSpawn, ProcMesh, ProcTable, new_proc_mesh
from ..messaging import Address, LogSink, MetricsLog, new_id, spawn_hint
from ..messaging.protocol import DUMP, MOVED, REAP, SPAWN_PROCS, STOP
from ..shape import Shape
from . import rehost, respawn
from .agent_handle import AgentHandle
from .record_parts import MeshController
from .sampling import ResourceHistory
from .spawn_request import SpawnRequest, rank_request

if TYPE_CHECKING:
    from .host_mesh import HostMesh

logger = logging.getLogger(__name__)


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
        self.exited: set[int] = set()
        # Whether the processes being started are up: at spawn, every rank; during a heal, the
        # ranks it restarts. The death of a rank in ``_starting`` fails it (with
        # ``_start_failure``): at spawn, until every rank has started.
        self.ready: Future[None] = Future(self._describe_missing)
        self._starting: set[int] = set(range(n))
        self._start_failure = "a process of the new proc mesh failed to start"
        self.stopping = False
        self.stopped: Future[None] = Future(lambda: f"the processes of {table.mesh_id} to exit")
        self.lock = threading.Lock()
        self.n = n
        self._is_ready = [False] * n
        # What it takes to rebuild a rank: its spawn request and every actor spawned on it.
        self.request = request
        self.actor_spawns: list[ActorSpawn] = []
        # rank -> keys of the actor spawns not yet sent to the process that heal() started for
        # it. A heal that fails part way (a rank it restarts dies) leaves them to the next
        # heal, which re-creates them even on ranks that it does not restart itself.
        self.lacking: dict[int, set[str]] = {}
        # The re-creations of actors that heals sent and that have not answered yet.
        self._respawning: list[Future[Any]] = []
        # The deaths of this mesh's processes, past incarnations included, by mailbox; and the
        # ranks that heal() gave another address. A process started later learns both
        # (Controller.catch_up): the arguments its actors are re-created with may name ranks
        # as they were before.
        self.deaths: dict[bytes, ProcDeath] = {}
        self.moved: set[int] = set()
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
            ready = self.ready
            done = all(self._is_ready[r] for r in self._starting)
            if done:
                self._starting = set()
        # Before anything else reaches it (its actors' spawns wait for ``ready``).
        self.ctl.catch_up(self.table.addresses[rank])
        if done:
            set_result(ready, None)

    def on_exit(self, rank: int, death: ProcDeath, report: bool = True) -> bool:
        """Record the exit of ``rank``; returns whether it is left unhandled (and, when
        ``report``, hands it to the owner or the fault hook)."""
        with self.lock:
            if rank in self.exited:
                return False
            self.exited.add(rank)
            all_gone = len(self.exited) == self.n
            address = self.table.addresses[rank]  # the incarnation that died
            self.deaths[address.mailbox] = death
            failed_start = rank in self._starting
            ready, summary = self.ready, self._start_failure
        if failed_start:
            set_exception(ready, SupervisionError([death], summary))
        node = self.ctl.node
        observed = node.record_death(address.mailbox, death)
        with self.lock:
            # Not once heal() gave the rank its next process: the sockets to the path they
            # share carry messages for that one now (heal closed these itself).
            if self.table.addresses[rank].mailbox == address.mailbox:
                node.transport.forget(address)
        if self.stopping:
            if all_gone:
                self.ctl.meshes.pop(self.table.mesh_id, None)
                set_result(self.stopped, None)
            return False
        self.ctl.notify_death(self, address, death)
        unhandled = not observed
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
        remote = self.agent_of(rank).run_dir is not None
        extra = {} if remote else (self.ctl.local_tcp or {})
        return rank_request(rank, self.table.addresses[rank], self.table.labels[rank], extra)

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
        lost host on a spare host: see rehost.py), then re-create their actors, and those that
        an earlier heal which failed part way left out."""
        healed: Future[None] = Future(lambda: f"the dead ranks of {self.table.mesh_id} to heal")
        try:
            self._restart_local_agent()
        except MeshError as exc:
            set_exception(healed, exc)
            return healed
        table = self.table
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
            restore = sorted(set(dead) | {r for r, keys in self.lacking.items() if keys})
            earlier = [f for f in self._respawning if not f.done()]
            self._respawning = earlier
            if not restore and not earlier:
                set_result(healed, None)
                return healed
            previous = [table.addresses[r] for r in dead]
            try:
                moved = rehost.move_lost_hosts(self, dead, spares)
            except SupervisionError as exc:
                set_exception(healed, exc)
                return healed
            ready, up = self._expect_restarts(dead, restore)
        self._readdress(dead, previous)
        logger.info("healing ranks %s of %s", restore, self.table.mesh_id)
        self.spawn_ranks(dead)
        if up:
            set_result(ready, None)
        ready.add_done_callback(
            lambda ready: self._respawn_actors(ready, restore, earlier, healed, moved)
        )
        return healed

    def _expect_restarts(self, dead: list[int], restore: list[int]) -> tuple[Future[None], bool]:
        """Under the lock: the ranks ``dead`` restart (and lack every actor), the heal waits
        for those of ``restore`` not up yet; the future of that, and whether all are up."""
        keys = {spawn.key for spawn in self.actor_spawns}
        for rank in dead:
            self.exited.discard(rank)
            self._is_ready[rank] = False
            self.lacking[rank] = set(keys)
        self.moved.update(dead)
        # What this heal waits for: its ranks that have not started yet (some an earlier,
        # failed heal restarted may be starting still), along with any heal under way.
        if self.ready.done():
            self.ready = Future(self._describe_missing)
            self._starting = set()
        self._starting.update(r for r in restore if not self._is_ready[r])
        self._start_failure = "a process that heal() restarted failed to start"
        # Only actors to re-create, on processes that are up: nothing to wait for.
        return self.ready, not self._starting

    def _readdress(self, dead: list[int], previous: list[Address]) -> None:
        """Bury the incarnations ``previous`` of the ranks ``dead``, give each rank a new
        mailbox, and tell the workers where the ranks live now."""
        node = self.ctl.node
        table = self.table
        for old in previous:
            # Buried before it is replaced (on_exit may be doing the same on the I/O thread):
            # what waits on the old incarnation fails, here and in the workers, before anyone
            # learns of the next one. Its mailbox is never used again, so it stays dead.
            death = self.deaths[old.mailbox]
            node.record_death(old.mailbox, death)
            self.ctl.notify_death(self, old, death)
        with self.lock:
            for rank, old in zip(dead, previous, strict=True):
                node.transport.forget(old)
                # A new incarnation gets a new mailbox, the id that every message to it signs
                # as its destination: frames signed for its previous life (whose replay window
                # the new process does not have) are then addressed to another process, and
                # dropped.
                table.addresses[rank] = table.addresses[rank]._replace(mailbox=new_id())
                self.ctl.logs.forget(old.mailbox, table.addresses[rank].mailbox)
            table.routes.clear()
        # Copies of the table held by workers follow, once every rank has its new address
        # (none of these goes to an incarnation that died).
        for rank in dead:
            relay = table.relays[rank] if table.relays is not None else None
            self.ctl.broadcast_to_workers(
                (MOVED, table.mesh_id, rank, table.addresses[rank], relay)
            )

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
        self,
        ready: Future[None],
        ranks: list[int],
        earlier: list[Future[Any]],
        healed: Future[None],
        moved: list[int],
    ) -> None:
        exc = ready.exception()
        if exc is not None:
            set_exception(healed, exc)
            return
        rehost.announce(self, moved)
        pending = list(earlier)  # re-creations an earlier heal sent: this one waits for them too
        with self.lock:
            lost = [self.deaths[self.table.addresses[r].mailbox] for r in ranks if r in self.exited]
            sends = respawn.spawns_to_send(
                self.actor_spawns, self.table.stopped_actors, self.lacking, self.exited, ranks
            )
        if lost:
            summary = "a process that heal() restarted died before its actors were re-created"
            pending.append(failed_future(SupervisionError(lost, summary)))
        for gathered in respawn.send_spawns(self.ctl.node, self.table, sends):
            pending.append(gathered)
            with self.lock:
                self._respawning.append(gathered)
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

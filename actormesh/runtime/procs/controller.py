"""The controller's side of the runtime: its node, its host agents and the meshes it owns.

The controller is the process that runs the user's script or notebook. Its node is created on
first use; host agents report process starts and exits here, and workers send their output here.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ... import config
from ...errors import (
    MeshClosedError,
    MeshTimeoutError,
    ProcDeath,
    SupervisionError,
)
from ..actors import ActorHost, Future, completed_future, failed_future, set_exception, set_result
from ..messaging import (
    SHUT_DOWN,
    Address,
    LogSink,
    Message,
    Node,
    Transport,
    make_run_dir,
    new_key,
    node_if_started,
    set_node_factory,
)
from ..messaging.envelopes import (
    AgentReadyEnvelope,
)
from ..messaging.protocol import (
    AGENT_READY,
    DIED,
    MOVED,
)
from .agent_handle import AgentHandle, send_start_up, start_local_agent
from .mesh_record import MeshRecord
from .osutil import raise_fd_limit
from .tensorboard import TensorBoardExport
from .worker_reports import WorkerReports

logger = logging.getLogger(__name__)

_Agent = TypeVar("_Agent", bound=AgentHandle)


class Controller:
    """Process-wide controller state (one per controller process)."""

    def __init__(self) -> None:
        existing = node_if_started()
        if existing is not None:
            # Inside a worker: an actor spawning procs makes this process a controller too. It
            # shares the worker's node, so replies to its calls and its meshes' reports meet.
            self.key = existing.key
            self.run_dir = existing.run_dir
            self.node = existing
        else:
            raise_fd_limit()
            self.key = job_key()
            self.run_dir = make_run_dir()
            self.node = Node(
                Transport(self.key, self.run_dir, "ctl", shm_lane=True), role="controller"
            )
            self.node.controller = self.node.address
            ActorHost(self.node, proc_rank=0)  # this_proc(): actors in the controller itself
        self.logs = LogSink()
        self.meshes: dict[str, MeshRecord] = {}
        self.stopped_ids: set[str] = set()  # meshes stop() was called on (ids are unique)
        self.agents: list[AgentHandle] = []
        # Set by listen_for_hosts: workers on this host then also get a tcp:// inbox
        # ({"tcp_host": address, "curve": bool}), so actors on other hosts can reach them.
        self.local_tcp: dict[str, Any] | None = None
        # Set by listen_for_hosts: a host agent in no host mesh yet, for heal() (or None).
        self.find_spare: Callable[[], AgentHandle | None] | None = None
        self._local_agent: AgentHandle | None = None
        self._lock = threading.Lock()
        self.tensorboard = TensorBoardExport.from_environment()
        self.node.register(AGENT_READY, self._on_agent_ready)
        WorkerReports(self.node, self.meshes, self.logs, self.stopped_ids, self.tensorboard)
        if existing is None:
            self.node.start()
        self._closed = False
        atexit.register(self.shutdown)

    # -- agents ----------------------------------------------------------------------------------

    def local_agent(self) -> AgentHandle:
        """The host agent of this machine, started on first use (it starts its fork server)."""
        self.raise_if_shut_down()
        with self._lock:
            if self._local_agent is None:
                self._local_agent = self._start_local_agent()
            return self._local_agent

    def add_agent(self, make: Callable[[int], _Agent]) -> _Agent:
        """Append the agent ``make(host_rank)`` builds (its host rank is its index in
        ``agents``), under the lock that starting this machine's own agent takes too."""
        self.raise_if_shut_down()
        with self._lock:
            agent = make(len(self.agents))
            self.agents.append(agent)
            return agent

    def _start_local_agent(self) -> AgentHandle:
        handle, watch_r = start_local_agent(len(self.agents))
        self.agents.append(handle)
        transport = self.node.transport
        transport.call_soon(
            lambda: transport.add_reader(watch_r, lambda: self._on_agent_eof(handle, watch_r))
        )
        # Removed by the agent if we are killed; not when we only borrow a worker's.
        owns = self.node.role == "controller"
        send_start_up(handle, self.key, self.node.address, self.run_dir, owns)
        return handle

    def _on_agent_eof(self, agent: AgentHandle, fd: int) -> None:
        """The host agent died: its workers die with it (parent-death signals); say so now."""
        try:
            if os.read(fd, 1):
                return
        except BlockingIOError:
            return
        self.node.transport.remove_reader(fd)
        os.close(fd)
        if self._local_agent is agent:
            self._local_agent = None  # the next this_host() starts a new one
        if not self._closed:
            logger.warning("the host agent (pid %s) died", agent.proc.pid if agent.proc else "?")
        self.lose_agent(agent, "its host agent died", "the host agent died")

    def lose_agent(self, agent: AgentHandle, reason: str, summary: str) -> None:
        """A host agent is gone (died, or a remote host stopped answering): fail its ranks."""
        if agent.dead:
            return
        agent.dead = True
        if not agent.ready.done():
            set_exception(agent.ready, SupervisionError([], "the host agent exited at start-up"))
        if self._closed:
            return
        for record in list(self.meshes.values()):
            lost, ranks = [], []
            for rank in range(record.n):
                if record.agent_of(rank) is agent and rank not in record.exited:
                    address = record.table.addresses[rank]
                    death = ProcDeath(
                        rank=record.table.labels[rank],
                        host=address.host if agent.run_dir is None else agent.name,
                        pid=record.table.pids[rank],
                        exitcode=None,
                        signal="SIGKILL",
                        stderr_tail=self.logs.stderr_tail(address.mailbox),
                        reason=reason,
                    )
                    if record.on_exit(rank, death, report=False):
                        lost.append(death)
                        ranks.append(rank)
            if lost:  # one event, one report: not one per rank
                record.report_lost(ranks, lost, summary)

    def _on_agent_ready(self, msg: Message) -> None:
        ready = AgentReadyEnvelope.of(msg)
        agent = self.agents[ready.host_rank]
        agent.address = ready.address
        agent.hostname = ready.hostname
        set_result(agent.ready, agent)

    # -- meshes ----------------------------------------------------------------------------------

    def register(self, record: MeshRecord) -> None:
        self.meshes[record.table.mesh_id] = record
        export = self.tensorboard
        if export is not None:
            mesh_id = record.table.mesh_id
            record.stopped.add_done_callback(lambda _: export.close(mesh_id))

    def live_record(self, mesh_id: str) -> MeshRecord | None:
        """The record of ``mesh_id`` while it can still be used: ``None`` once its mesh is
        stopping or stopped, or if this controller never spawned it."""
        record = self.meshes.get(mesh_id)
        if record is None or record.stopping or record.table.closed:
            return None
        return record

    def live_records(self) -> list[MeshRecord]:
        """Every mesh of this controller that is not stopping (a snapshot: safe to iterate
        while meshes come and go on the I/O thread)."""
        return [r for r in list(self.meshes.values()) if not (r.stopping or r.table.closed)]

    def notify_death(self, record: MeshRecord, address: Address, death: ProcDeath) -> None:
        """Tell every other live worker (their pending calls to it must fail too)."""
        self.broadcast_to_workers((DIED, address.mailbox, death))

    def broadcast_to_workers(self, envelope: tuple[Any, ...]) -> None:
        dead = self.node.dead
        for rec in list(self.meshes.values()):
            if rec.stopping:
                continue
            for rank, addr in enumerate(rec.table.addresses):
                if rank in rec.exited or addr.mailbox in dead:
                    continue
                try:
                    self.node.send(addr, envelope)
                except Exception:
                    logger.debug("could not reach %s", rec.table.labels[rank], exc_info=True)

    def catch_up(self, address: Address) -> None:
        """Tell a process that just started what happened before it, in the live meshes: which
        processes died (their past incarnations too), and where healed ranks live now. The
        arguments its actors are created with may name them as they were when pickled (a
        healed rank's actors are re-created from their first spawn): a call to a dead
        incarnation then fails at once, and handles reach the new one, rather than the call
        reaching the process that took the old one's place, which drops it."""
        for rec in self.live_records():
            table = rec.table
            for mailbox, death in list(rec.deaths.items()):
                self.node.send(address, (DIED, mailbox, death))
            for rank in sorted(rec.moved):
                relay = table.relays[rank] if table.relays is not None else None
                self.node.send(address, (MOVED, table.mesh_id, rank, table.addresses[rank], relay))

    # -- shutdown --------------------------------------------------------------------------------

    def raise_if_shut_down(self) -> None:
        """Refuse to start hosts or processes once ``shutdown_context()`` ran: its node is
        closed, so a new agent could never report back and the spawn would wait its timeout."""
        if self._closed:
            raise MeshClosedError(SHUT_DOWN)

    def shutdown(self) -> None:
        """Stop every mesh and agent (at exit, or explicitly). Leaves no process behind."""
        if self._closed:
            return
        self._closed = True
        stops = [rec.stop() for rec in list(self.meshes.values())]
        deadline = time.monotonic() + config.STOP_GRACE
        for fut in stops:
            try:
                fut.get(timeout=max(0.1, deadline - time.monotonic()))
            except (MeshTimeoutError, Exception):
                break
        for agent in self.agents:
            agent.close()
        if self.node.role == "controller":
            self.node.close()
            shutil.rmtree(self.run_dir, ignore_errors=True)
        # A script with an unhandled failure still exits 1: supervision's own atexit handler
        # sees to that after the script's handlers ran (not here: this runs before them).


def job_key() -> bytes:
    """The job's key: from ``ACTORMESH_KEY_FILE`` when set (so host agents started by a
    scheduler, e.g. from a Kubernetes secret, can share it), else a fresh random one."""
    path = os.environ.get("ACTORMESH_KEY_FILE")
    if not path:
        return new_key()
    from ..messaging import read_key_file

    return read_key_file(path)


_controller: Controller | None = None
_controller_lock = threading.Lock()
_controller_hooks: list[Callable[[Controller], None]] = []


def get_controller() -> Controller:
    """This process's controller, made (with its node) on first use."""
    global _controller
    with _controller_lock:
        if _controller is None:
            _controller = Controller()
            for hook in _controller_hooks:
                hook(_controller)
        return _controller


def shutdown_context() -> Future[None]:
    """Monarch's ``shutdown_context()``: stop every proc mesh and host agent this process
    started, now rather than at exit; a completed future (for ``get()`` or ``await``). Meshes
    cannot be spawned afterwards: ``this_host()`` and ``spawn_procs`` then raise
    ``MeshClosedError``."""
    ctl = controller_if_started()
    if ctl is not None:
        try:
            ctl.shutdown()
        except Exception as exc:
            return failed_future(exc)
    return completed_future(None)


def controller_if_started() -> Controller | None:
    """This process's controller, or ``None`` if nothing made one yet (never makes one: for
    tools that only look, like the sidebar, the debugger and the kernel's shutdown)."""
    return _controller


def on_controller(hook: Callable[[Controller], None]) -> None:
    """Run ``hook(controller)`` now if this process has a controller, else when it is made.

    How optional parts (the debugger) add message handlers without the runtime importing them.
    A hook must be quick: it runs under the controller lock."""
    with _controller_lock:
        _controller_hooks.append(hook)
        if _controller is not None:
            hook(_controller)


def _make_node() -> Node:
    return get_controller().node


set_node_factory(_make_node)

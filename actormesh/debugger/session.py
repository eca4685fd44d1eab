"""The kernel side of the debugger: the ranks under it, what they report, and operations on a
selection of them (one rank's DAP connection is :class:`~.rank_debug.RankDebug`).

A rank that calls ``breakpoint()`` sends a signed ``("debugger", "paused", ...)`` message to the
controller; the handler (on the I/O thread) hands the attach to a small thread pool, which
connects a :class:`~actormesh.debugger.dap.DapClient` to the rank's debugpy on loopback (through
the rank's host agent when it runs on another host), configures it (breakpoints by location
included) and lets the rank stop. From then on the rank's DAP events (``stopped``,
``continued``, connection closed) keep :class:`RankDebug` up to date, and listeners are told of
every change. The kernel-initiated paths (``%mesh dbg on``, breakpoints by location, pause)
first ask the rank's ``_mesh_debug`` actor to start debugpy.

Nothing here blocks the I/O thread or a DAP reader thread: requests that need an answer are
made from the pool or from the caller's (cell) thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from .. import config
from ..errors import MeshError
from ..runtime.actors import Future as MeshFuture
from ..runtime.meshes import ActorMesh
from ..runtime.messaging import Message
from ..runtime.messaging.envelopes import DebuggerEnvelope
from ..runtime.messaging.protocol import DEBUGGER
from ..runtime.procs import MeshRecord, controller_if_started, get_controller, on_controller
from .daemon_pool import DaemonPool
from .dap import DapError
from .rank import ATTACH_TIMEOUT, DEBUG_AGENT_NAME, DebugAgent
from .rank_debug import Key, RankDebug

logger = logging.getLogger(__name__)

# The stepping commands a user types (%mesh dbg, the widget's buttons) and their DAP requests.
STEP_COMMANDS = {"continue": "continue", "next": "next", "step": "stepIn", "out": "stepOut"}


class Debugger:
    """Every debugged rank of this controller. One per kernel; see :func:`get_debugger`."""

    def __init__(self) -> None:
        self.ranks: dict[Key, RankDebug] = {}
        self._breakpoints: dict[Key, dict[str, set[int]]] = {}
        self._listeners: list[Callable[[], None]] = []
        self._agents: dict[str, ActorMesh[DebugAgent]] = {}
        self._lock = threading.RLock()
        self.pool = DaemonPool()
        # How a code file shows to the user; the kernel's glue maps cells to "In [N]".
        self.label: Callable[[str], str] = default_label
        # Notebook cells' source, put into each rank's linecache when it is attached.
        self.sources: Callable[[], dict[str, str]] = dict
        self.notices: Callable[[str], None] = lambda text: None
        # Runs before a paused rank is attached, while it waits for us: the kernel starts the
        # actors its widget asks there (a thread started later, as the rank stops, would make
        # pydevd print "thread._ident is None in _get_related_thread!" into the cell).
        self.before_attach: Callable[[str, int], None] = lambda mesh_id, rank: None

    # -- listeners -------------------------------------------------------------------------------

    def add_listener(self, callback: Callable[[], None]) -> Callable[[], None]:
        with self._lock:
            self._listeners.append(callback)

        def remove() -> None:
            with self._lock:
                if callback in self._listeners:
                    self._listeners.remove(callback)

        return remove

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run ``fn(*args)`` on the debugger's pool (a daemon thread per task)."""
        return self.pool.submit(fn, *args)

    def changed(self) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for callback in listeners:
            try:
                callback()
            except Exception:
                logger.exception("a debugger listener failed")

    # -- ranks -----------------------------------------------------------------------------------

    def rank(self, mesh_id: str, rank: int) -> RankDebug:
        with self._lock:
            key = (mesh_id, rank)
            rd = self.ranks.get(key)
            if rd is None:
                rd = self.ranks[key] = RankDebug(self, mesh_id, rank)
            return rd

    def is_dead(self, mesh_id: str, rank: int) -> bool:
        """Whether the rank's process is gone (as the controller's supervision knows it)."""
        ctl = controller_if_started()
        if ctl is None:
            return False
        record = ctl.meshes.get(mesh_id)
        if record is None or not 0 <= rank < len(record.table.addresses):
            return True  # its mesh is gone
        return record.table.addresses[rank].mailbox in ctl.node.dead

    def describe(self, mesh_id: str, rank: int) -> str:
        """A rank's state for listings, whether or not the debugger has seen it."""
        rd = self.ranks.get((mesh_id, rank))
        if rd is not None:
            return rd.describe()
        return "dead" if self.is_dead(mesh_id, rank) else "running"

    def rank_label(self, mesh_id: str, rank: int) -> str:
        """``rank 2 {gpus=2}``."""
        ctl = controller_if_started()
        record = None if ctl is None else ctl.meshes.get(mesh_id)
        if record is None or not 0 <= rank < len(record.table.labels):
            return f"rank {rank}"
        return f"rank {rank} {{{record.table.labels[rank]}}}"

    def paused(self) -> list[RankDebug]:
        self._forget_stopped_meshes()
        with self._lock:
            ranks = sorted(self.ranks.values(), key=lambda r: r.key)
        return [r for r in ranks if r.status == "paused"]

    def paused_in(self, mesh_id: str) -> dict[int, RankDebug]:
        return {r.rank: r for r in self.paused() if r.mesh_id == mesh_id}

    def _forget_stopped_meshes(self) -> None:
        ctl = controller_if_started()
        if ctl is None:
            return
        with self._lock:
            for key in list(self.ranks):
                if ctl.live_record(key[0]) is None:
                    self.ranks.pop(key).status = "dead"
                    self._agents.pop(key[0], None)

    # -- the rank's report (I/O thread: hand off at once) ----------------------------------------

    def on_message(self, msg: Message) -> None:
        report = DebuggerEnvelope.of(msg)
        event, mesh_id, rank, where = report.event, report.mesh_id, report.rank, report.where
        if event != "paused":
            logger.warning("unknown debugger event %r from rank %s", event, rank)
            return
        rd = self.rank(mesh_id, rank)
        rd.pg_timeout = where.get("pg_timeout")
        self.pool.submit(self._attach_reported, rd, where)

    def _attach_reported(self, rd: RankDebug, where: dict[str, Any]) -> None:
        if rd.pg_timeout:  # now, while the cell that hit the breakpoint still shows output
            rd.paused_since = time.monotonic()
            self.notices(
                f"warning: rank {rd.rank} is in a torch.distributed process group with a "
                f"{rd.pg_timeout:g} s timeout: peers waiting for it in a collective fail when "
                "it runs out (%mesh dbg list shows the time left)"
            )
        if rd.port is None:  # never attached: its `_mesh_debug` actor may not run yet
            try:
                # That actor first, while the rank waits for us: started as the rank stops,
                # its thread could be suspended along with the rank's other threads before it
                # has an ident, and pydevd then prints "thread._ident is None in
                # _get_related_thread!" into the cell's output. Its answer says it runs.
                self.agent(rd.mesh_id, rd.rank).listen.call_one().get(timeout=ATTACH_TIMEOUT)
            except MeshError as exc:
                logger.debug("rank %s: its debug agent did not answer: %s", rd.rank, exc)
            try:
                self.before_attach(rd.mesh_id, rd.rank)
            except Exception as exc:  # the attach matters more than what the widget shows
                logger.debug("rank %s: before_attach failed: %s", rd.rank, exc)
        try:
            rd.attach(int(where["port"]))
        except Exception as exc:
            self.notices(
                f"the debugger could not attach to rank {rd.rank} paused at "
                f"{self.label(str(where.get('file')))}:{where.get('line')}: {exc!r}"
            )
            return
        self._push_sources([rd])

    # -- meshes and their debug agents -----------------------------------------------------------

    def _record(self, mesh_id: str) -> MeshRecord:
        record = get_controller().live_record(mesh_id)
        if record is None:
            raise MeshError(f"proc mesh {mesh_id} is stopped")
        return record

    def _agents_of(self, mesh_id: str) -> ActorMesh[DebugAgent]:
        with self._lock:
            agents = self._agents.get(mesh_id)
            if agents is None:
                procs = self._record(mesh_id).proc_mesh()
                agents = self._agents[mesh_id] = procs.spawn(DEBUG_AGENT_NAME, DebugAgent)
            return agents

    def agent(self, mesh_id: str, rank: int) -> ActorMesh[DebugAgent]:
        return self._agents_of(mesh_id).rank_view(rank)

    def attach(self, mesh_id: str, ranks: Sequence[int], timeout: float = 60) -> list[RankDebug]:
        """Start debugpy on ``ranks`` (if needed) and attach to each; blocks."""
        return self._attach_each(mesh_id, ranks, None, timeout)

    def _attach_each(
        self,
        mesh_id: str,
        ranks: Sequence[int],
        then: Callable[[RankDebug], None] | None,
        timeout: float,
    ) -> list[RankDebug]:
        """Attach to every rank of ``ranks`` and run ``then`` on it, all ranks at once; blocks.

        Each rank goes on as soon as its own debugpy listens: on a loaded host the ranks start
        it at very different times, and the first need not wait for the last. With ``then``
        (an operation on the rank's threads) every rank's agent is asked to listen, attached
        or not: that also marks the actors spawned since as the runtime's."""
        rds = [self.rank(mesh_id, r) for r in ranks]
        sources = self.sources()
        calls: dict[int, tuple[MeshFuture[dict[str, Any]], MeshFuture[None] | None]] = {}
        for rd in rds:
            fresh = not rd.attached
            if fresh or then is not None:
                agent = self.agent(mesh_id, rd.rank)
                # The same actor takes both in order: the sources arrive right after it listens.
                listening = agent.listen.call_one()
                adding = agent.add_sources.call_one(sources) if fresh and sources else None
                calls[rd.rank] = (listening, adding)

        def one(rd: RankDebug) -> None:
            info = calls[rd.rank][0].get(timeout=timeout)
            rd.attach(int(info["port"]))  # at once if attached already
            if then is not None:
                then(rd)

        deadline = time.monotonic() + timeout
        for f in [self.pool.submit(one, rd) for rd in rds if rd.rank in calls]:
            f.result(timeout=max(deadline - time.monotonic(), 0))
        for _, adding in calls.values():
            if adding is not None:
                try:
                    adding.get(timeout=max(deadline - time.monotonic(), 1))
                except MeshError as exc:
                    logger.debug("could not send cell sources to a rank: %s", exc)
        return rds

    def _push_sources(self, ranks: Sequence[RankDebug]) -> None:
        sources = self.sources()
        if not sources:
            return
        for rd in ranks:
            try:
                self.agent(rd.mesh_id, rd.rank).add_sources.call_one(sources).get(timeout=30)
            except MeshError as exc:
                logger.debug("could not send cell sources to rank %s: %s", rd.rank, exc)

    def detach_all(self) -> None:
        with self._lock:
            ranks = list(self.ranks.values())
        for rd in ranks:
            if rd.status == "paused":
                try:
                    rd.resume("continue")
                except DapError:
                    pass
            rd.detach()

    # -- breakpoints by location -----------------------------------------------------------------

    def breakpoints_of(self, key: Key) -> dict[str, set[int]]:
        with self._lock:
            return {p: set(lines) for p, lines in self._breakpoints.get(key, {}).items()}

    def set_breakpoint(
        self, mesh_id: str, ranks: Sequence[int], path: str, line: int, remove: bool = False
    ) -> dict[int, bool]:
        """Add (or remove) a breakpoint at ``path:line`` on ``ranks``; ``{rank: verified}``."""
        with self._lock:
            for r in ranks:
                lines = self._breakpoints.setdefault((mesh_id, r), {}).setdefault(path, set())
                (lines.discard if remove else lines.add)(line)
        source = self.sources().get(path)
        if source is not None and not path.startswith("<"):
            waits = [self.agent(mesh_id, r).materialize.call_one(path, source) for r in ranks]
            for fut in waits:
                fut.get(timeout=30)
        out = {}
        for rd in self.attach(mesh_id, ranks):
            got = rd.set_breakpoints(path, sorted(self.breakpoints_of(rd.key).get(path, ())))
            out[rd.rank] = all(b.get("verified", False) for b in got) if got else remove
        return out

    def clear_breakpoints(self) -> None:
        with self._lock:
            keys = {k: list(v) for k, v in self._breakpoints.items()}
            self._breakpoints.clear()
        for key, paths in keys.items():
            rd = self.ranks.get(key)
            if rd is not None and rd.attached:
                for path in paths:
                    rd.set_breakpoints(path, [])

    # -- operations on a selection ---------------------------------------------------------------

    def pause(self, mesh_id: str, ranks: Sequence[int]) -> None:
        """Pause every rank of ``ranks``; blocks until each has been told (not until each has
        stopped: ``wait_paused`` does that)."""

        def pause(rd: RankDebug) -> None:
            if rd.status != "paused":
                rd.pause()

        self._attach_each(mesh_id, ranks, pause, timeout=60)

    def resume(self, mesh_id: str, ranks: Sequence[int], command: str = "continue") -> None:
        for r in ranks:
            rd = self.ranks.get((mesh_id, r))
            if rd is not None and rd.status == "paused":
                rd.resume(command)

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def shutdown(self) -> None:
        self.detach_all()
        self.pool.closed = True


class RanksPaused(MeshError):
    """A notebook cell waited on a call whose remaining ranks are all paused in the debugger.

    The call itself goes on: once the ranks continue, ``get()`` on the same future returns its
    result. Raised in the cell's thread only, so that the notebook stays usable."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines

    def _render_traceback_(self) -> list[str]:
        return [
            *self.lines,
            "(the call goes on when they continue: %mesh dbg continue, then .get() again)",
        ]


def default_label(path: str) -> str:
    """``<mesh-cell-7>`` shows as ``In [7]``; a file as its name."""
    if path.startswith("<mesh-cell-"):
        return f"In [{path[len('<mesh-cell-') : -1].split('.')[0]}]"
    if path.startswith("<"):
        return path
    return os.path.basename(path)


_debugger: Debugger | None = None
_debugger_lock = threading.Lock()


def get_debugger() -> Debugger:
    """This process's debugger, made on first use; it registers its message handler with the
    controller (now, or when the controller is created)."""
    global _debugger
    with _debugger_lock:
        if _debugger is None:
            _debugger = Debugger()
            on_controller(_install_handler)
        return _debugger


def _install_handler(ctl: Any) -> None:
    debugger = _debugger
    if debugger is not None:
        ctl.node.register(DEBUGGER, debugger.on_message)


BREAKPOINT_HOOK = "actormesh.debugger.rank.breakpoint_hook"
PRELOAD_MODULE = "actormesh.debugger.preload"


def enable_breakpoints() -> None:
    """Route ``breakpoint()`` on every rank started from now on into the debugger (the
    workers inherit this process's environment through their host agent), and have the fork
    servers of host agents started from now on import pydevd ahead for their ranks."""
    get_debugger()
    os.environ["PYTHONBREAKPOINT"] = BREAKPOINT_HOOK
    if PRELOAD_MODULE not in config.PRELOAD:
        config.PRELOAD.append(PRELOAD_MODULE)

"""The kernel side of the debugger: one DAP client per debugged rank, and what they report.

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
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from .. import config
from ..errors import MeshError
from ..runtime.actors.future import Future as MeshFuture
from ..runtime.meshes.actor_mesh import ActorMesh
from ..runtime.messaging.codec import Message
from ..runtime.messaging.protocol import DEBUGGER
from ..runtime.messaging.tunnel import open_tunnel
from ..runtime.procs.controller import controller_if_started, get_controller, on_controller
from ..runtime.procs.mesh_record import MeshRecord
from .dap import DEFAULT_TIMEOUT, DapClient, DapError, PendingRequest
from .rank import DEBUG_AGENT_NAME, DebugAgent, access_token

logger = logging.getLogger(__name__)

ATTACH_TIMEOUT = 20.0
STEP_TIMEOUT = 10.0
# The stepping commands a user types (%mesh dbg, the widget's buttons) and their DAP requests.
STEP_COMMANDS = {"continue": "continue", "next": "next", "step": "stepIn", "out": "stepOut"}
Key = tuple[str, int]  # (mesh_id, flat rank)
_NOISE_TYPES = frozenset({"module", "function", "builtin_function_or_method", "type"})


@dataclass(frozen=True)
class Frame:
    """One frame of a paused rank's stack, innermost first."""

    frame_id: int
    path: str
    line: int
    function: str


class RankDebug:
    """One rank under the debugger: its DAP client and where it stands.

    ``status`` is ``running`` (attached or not), ``paused``, or ``dead`` (its process is gone).
    Updated from DAP reader threads and the pool; read from anywhere."""

    def __init__(self, debugger: Debugger, mesh_id: str, rank: int) -> None:
        self.debugger = debugger
        self.mesh_id = mesh_id
        self.rank = rank
        self.status = "running"
        self.reason = ""
        self.client: DapClient | None = None
        self.thread_id: int | None = None
        self.frames: list[Frame] = []
        self.pg_timeout: float | None = None  # of its torch.distributed group, if any
        self.paused_since: float | None = None  # when it reported, for the time left
        self.port: int | None = None
        self.stops = 0  # stopped events seen so far: steps wait for the next one
        self._generation = 0  # bumped when it runs again: a late answer about a stop is stale
        self.pause_requested = False
        self.initialized = threading.Event()
        self._attach_lock = threading.Lock()
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)

    @property
    def key(self) -> Key:
        return (self.mesh_id, self.rank)

    @property
    def attached(self) -> bool:
        client = self.client
        return client is not None and not client.closed.is_set()

    @property
    def location(self) -> Frame | None:
        return self.frames[0] if self.frames else None

    def describe(self) -> str:
        """``paused at In [3]:4 in <module>`` / ``running`` / ``dead``."""
        if self.debugger.is_dead(self.mesh_id, self.rank):
            return "dead"
        where = self.location
        if self.status == "paused" and where is not None:
            text = f"paused at {self.debugger.label(where.path)}:{where.line} in {where.function}"
            if self.pg_timeout and self.paused_since is not None:
                left = self.pg_timeout - (time.monotonic() - self.paused_since)
                text += f" (process group timeout in {max(left, 0):.0f} s)"
            return text
        if self.status == "paused":
            return "paused"
        if self.pause_requested and self.status == "running":
            return "running (pause requested)"
        return self.status

    # -- attaching (pool thread) -----------------------------------------------------------------

    def _connect(self, port: int) -> socket.socket:
        """A connection to the rank's debugpy, which listens on its host's loopback: straight
        there on this host, else through the rank's host agent (``runtime/messaging/tunnel.py``)."""
        ctl = get_controller()
        record = ctl.meshes.get(self.mesh_id)
        if record is None or record.table.closed:
            raise DapError(f"proc mesh {self.mesh_id} is stopped")
        if record.table.addresses[self.rank].host == ctl.node.transport.host_id:
            return socket.create_connection(("127.0.0.1", port), timeout=DEFAULT_TIMEOUT)
        agent = record.agent_of(self.rank).address
        if agent is None:
            raise DapError(f"the host agent of rank {self.rank} is gone")
        return open_tunnel(ctl.node, agent, port)

    def attach(self, port: int) -> None:
        """Connect and configure; returns once the rank's debugpy has its client.

        Serialized by its own lock, not the state lock: the rank may stop (and its reader
        thread take the state lock) before the handshake's last answer is read."""
        with self._attach_lock:
            if self.attached:
                return
            self.initialized.clear()
            client = DapClient(self._connect(port), self._on_event, name=f"rank-{self.rank}")
            try:
                # pydevd answers requests one at a time, in the order they came: the handshake
                # goes out in two batches, one round trip each, rather than one per request (a
                # round trip to a busy rank waits for its CPU and its GIL).
                token = access_token(get_controller().key)
                authorize = client.send_request(
                    "pydevdAuthorize", {"debugServerAccessToken": token}
                )
                initialize = client.send_request(
                    "initialize",
                    {
                        "clientID": "actormesh",
                        "adapterID": "python",
                        "linesStartAt1": True,
                        "columnsStartAt1": True,
                        "pathFormat": "path",
                    },
                )
                attach = client.send_request("attach", {"justMyCode": True})
                client.wait(authorize)
                client.wait(initialize)
                self.client = client
                self.port = port
                if not self.initialized.wait(ATTACH_TIMEOUT):
                    raise DapError(f"rank {self.rank}: debugpy did not initialize")
                configure = [
                    self._send_breakpoints(path, lines)
                    for path, lines in self.debugger.breakpoints_of(self.key).items()
                ]
                configure.append(client.send_request("configurationDone"))
                for pending in configure:
                    client.wait(pending)
                client.wait(attach, ATTACH_TIMEOUT)
            except BaseException:
                self.client = None
                client.close()
                raise
        self.debugger.changed()

    def detach(self) -> None:
        client = self.client
        if client is None:
            return
        try:
            client.request("disconnect", {"terminateDebuggee": False}, timeout=3)
        except DapError:
            pass
        client.close()
        with self._lock:
            self.client = None
            self.status = "running" if self.status != "dead" else "dead"
            self.frames = []
        self.debugger.changed()

    # -- DAP events (reader thread: no requests here) --------------------------------------------

    def _on_event(self, event: str, body: dict[str, Any]) -> None:
        if event == "initialized":
            self.initialized.set()
        elif event == "stopped":
            thread_id = body.get("threadId")
            with self._lock:
                if thread_id is not None:
                    self.thread_id = int(thread_id)
                self.reason = str(body.get("reason", ""))
                generation = self._generation
            self.debugger.pool.submit(self._fetch_location, thread_id, generation)
        elif event == "continued":
            with self._changed:
                self._generation += 1
                self.status = "running"
                self.paused_since = None
                self.frames = []
                self._changed.notify_all()
            self.debugger.changed()
        elif event in ("_closed", "terminated"):
            with self._changed:
                self._generation += 1
                self.client = None
                if self.status == "paused":
                    self.status = "running"
                self.frames = []
                self._changed.notify_all()
            self.debugger.changed()

    def _fetch_location(self, thread_id: int | None, generation: int) -> None:
        frames: list[Frame] = []
        if thread_id is not None:
            try:
                frames = self.stack(int(thread_id))
            except DapError as exc:
                logger.debug("rank %s: no stack after a stop: %s", self.rank, exc)
        with self._changed:
            if generation != self._generation:
                return  # it was resumed (or detached) while we asked where it stopped
            self.frames = frames
            self.status = "paused"
            if self.paused_since is None:
                self.paused_since = time.monotonic()
            self.pause_requested = False
            self.stops += 1
            self._changed.notify_all()
        self.debugger.changed()

    # -- requests (any thread but the DAP reader) ------------------------------------------------

    def _client(self) -> DapClient:
        client = self.client
        if client is None or client.closed.is_set():
            raise DapError(f"rank {self.rank} has no debugger attached")
        return client

    def stack(self, thread_id: int | None = None) -> list[Frame]:
        tid = self.thread_id if thread_id is None else thread_id
        if tid is None:
            raise DapError(f"rank {self.rank} is not paused")
        body = self._client().request("stackTrace", {"threadId": tid})
        return [
            Frame(
                int(f["id"]),
                str((f.get("source") or {}).get("path", "?")),
                int(f.get("line", 0)),
                str(f.get("name", "?")),
            )
            for f in body.get("stackFrames", [])
        ]

    def require_paused(self) -> None:
        if self.status != "paused":
            raise DapError(f"rank {self.rank} is not paused ({self.describe()})")

    def evaluate(self, expression: str, frame: int = 0, context: str = "repl") -> dict[str, Any]:
        """Evaluate in the paused frame ``frame`` (0: innermost); the DAP body."""
        self.require_paused()
        frames = self.frames or self.stack()
        if not frames:
            raise DapError(f"rank {self.rank} is paused without a Python frame")
        if not 0 <= frame < len(frames):
            raise DapError(f"rank {self.rank} has {len(frames)} frames; no frame {frame}")
        return self._client().request(
            "evaluate",
            {"expression": expression, "frameId": frames[frame].frame_id, "context": context},
            timeout=30,
        )

    def variables(self, frame: int = 0) -> list[tuple[str, str, str]]:
        """``(name, type, value)`` of the locals of a paused frame."""
        self.require_paused()
        frames = self.frames or self.stack()
        client = self._client()
        scopes = client.request("scopes", {"frameId": frames[frame].frame_id})["scopes"]
        out: list[tuple[str, str, str]] = []
        for scope in scopes[:1]:  # Locals; Globals of a cell are the whole namespace
            body = client.request("variables", {"variablesReference": scope["variablesReference"]})
            for v in body.get("variables", []):
                name, kind = str(v["name"]), str(v.get("type", ""))
                # pydevd's groups ("special variables", ...), and the modules and functions a
                # cell's namespace is full of, say nothing about the paused state
                if name.endswith(" variables") or kind in _NOISE_TYPES or name == "__builtins__":
                    continue
                out.append((name, kind, str(v.get("value", ""))))
        return out

    def resume(self, command: str = "continue") -> None:
        """``continue``, ``next``, ``stepIn``, ``stepOut`` (returns once the rank has it)."""
        self.require_paused()
        assert self.thread_id is not None
        client = self._client()
        # Running from now on, before the rank is told: what it does next (finish a call,
        # stop again) must never be seen before this (pydevd's "continued" comes late).
        with self._changed:
            self._generation += 1
            self.status = "running"
            self.frames = []
        self.debugger.changed()
        client.request(command, {"threadId": self.thread_id})

    def step(self, command: str, timeout: float = STEP_TIMEOUT) -> bool:
        """Step and wait for the next stop; False if the rank ran on (finished its code)."""
        with self._lock:
            before = self.stops
        self.resume(command)
        with self._changed:
            return self._changed.wait_for(lambda: self.stops > before, timeout)

    def wait_stopped_after(self, stops: int, timeout: float) -> bool:
        """Wait until the rank stopped again after having stopped ``stops`` times."""
        with self._changed:
            return self._changed.wait_for(lambda: self.stops > stops, timeout)

    def pause(self) -> None:
        self.pause_requested = True
        self._client().request("pause", {"threadId": "*"})  # pydevd: every user thread
        self.debugger.changed()

    def wait_paused(self, timeout: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self.status == "paused", timeout)

    def set_breakpoints(self, path: str, lines: Iterable[int]) -> list[dict[str, Any]]:
        body = self._client().wait(self._send_breakpoints(path, lines))
        return list(body.get("breakpoints", []))

    def _send_breakpoints(self, path: str, lines: Iterable[int]) -> PendingRequest:
        return self._client().send_request(
            "setBreakpoints",
            {
                "source": {"path": path},
                "breakpoints": [{"line": line} for line in sorted(lines)],
            },
        )


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

    # -- listeners -------------------------------------------------------------------------------

    def add_listener(self, callback: Callable[[], None]) -> Callable[[], None]:
        with self._lock:
            self._listeners.append(callback)

        def remove() -> None:
            with self._lock:
                if callback in self._listeners:
                    self._listeners.remove(callback)

        return remove

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
        _, event, mesh_id, rank, where = msg.envelope
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


class DaemonPool:
    """``submit(fn, *args) -> Future`` on a daemon thread per task.

    Debugger work is rare and short (an attach, a refresh), but it may be waiting on a rank
    when the kernel exits: a ``ThreadPoolExecutor`` would hold the exit until it finished."""

    def __init__(self) -> None:
        self.closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        if self.closed:
            future.set_exception(MeshError("the debugger is shut down"))
            return future

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)

        threading.Thread(target=run, name="actormesh-dbg", daemon=True).start()
        return future


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

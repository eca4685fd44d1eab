"""One rank's debug connection: a DAP client to the rank's debugpy and where the rank stands.

:class:`RankDebug` connects (straight to the rank's loopback on this host, through its host
agent's tunnel on another), configures the session (breakpoints by location included), follows
the rank's DAP events on the client's reader thread and makes requests (stack, evaluate, step)
from any other thread. The :class:`~actormesh.debugger.session.Debugger` keeps one per rank.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from ..runtime.messaging import open_tunnel
from ..runtime.procs import get_controller
from .dap import DEFAULT_TIMEOUT, DapClient, DapError, PendingRequest
from .rank import access_token

logger = logging.getLogger(__name__)

ATTACH_TIMEOUT = 20.0
STEP_TIMEOUT = 10.0
Key = tuple[str, int]  # (mesh_id, flat rank)
_NOISE_TYPES = frozenset({"module", "function", "builtin_function_or_method", "type"})


class Session(Protocol):
    """The debugger session that keeps the ranks (``session.Debugger``), as one rank uses it:
    ``session.py`` imports this module, so it is typed here rather than imported."""

    @property
    def label(self) -> Callable[[str], str]: ...

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run ``fn(*args)`` on the session's pool of daemon threads."""
        ...

    def changed(self) -> None: ...

    def is_dead(self, mesh_id: str, rank: int) -> bool: ...

    def breakpoints_of(self, key: Key) -> dict[str, set[int]]: ...


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

    def __init__(self, debugger: Session, mesh_id: str, rank: int) -> None:
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
        self._detaching = False  # a close we asked for is not a lost connection
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
            left = self.timeout_left()
            if left is not None:
                text += f" (process group timeout in {left:.0f} s)"
            return text
        if self.status == "paused":
            return "paused"
        if self.pause_requested and self.status == "running":
            return "running (pause requested)"
        return self.status

    def timeout_left(self) -> float | None:
        """Seconds left, while paused, before peers waiting for this rank in a collective give
        up (its process group's timeout); None without one."""
        if self.status != "paused" or not self.pg_timeout or self.paused_since is None:
            return None
        return max(self.pg_timeout - (time.monotonic() - self.paused_since), 0.0)

    # -- attaching (pool thread) -----------------------------------------------------------------

    def _connect(self, port: int) -> socket.socket:
        """A connection to the rank's debugpy, which listens on its host's loopback: straight
        there on this host, else through the rank's host agent (``runtime/messaging/tunnel.py``)."""
        ctl = get_controller()
        record = ctl.live_record(self.mesh_id)
        if record is None:
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
        self._detaching = True
        try:
            try:
                client.request("disconnect", {"terminateDebuggee": False}, timeout=3)
            except DapError:
                pass
            client.close()
            with self._lock:
                self.client = None
                self.status = "running" if self.status != "dead" else "dead"
                self.frames = []
        finally:
            self._detaching = False
        self.debugger.changed()

    def _recover(self, was_paused: bool, thread_id: int | None) -> None:
        """Attach again after the connection was lost (pool thread): the rank's suspended
        threads stay suspended for the next client, so a paused rank is paused again."""
        port = self.port
        if port is None or self.debugger.is_dead(self.mesh_id, self.rank):
            return
        try:
            self.attach(port)
            frames = self.stack(thread_id) if was_paused and thread_id is not None else []
        except (DapError, OSError) as exc:
            log = logger.warning if was_paused else logger.debug  # a stopped mesh: nothing lost
            log("rank %s lost its debugger connection; attaching again failed: %s", self.rank, exc)
            return
        if frames:
            with self._changed:
                self.thread_id = thread_id
                self.frames = frames
                self.status = "paused"
                if self.paused_since is None:
                    self.paused_since = time.monotonic()
                self._changed.notify_all()
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
            self.debugger.submit(self._fetch_location, thread_id, generation)
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
                # Lost, not ended by us (detach, a failed attach): the rank is still there.
                lost = event == "_closed" and self.client is not None and not self._detaching
                was_paused, thread_id = self.status == "paused", self.thread_id
                self._generation += 1
                self.client = None
                if self.status == "paused":
                    self.status = "running"
                self.frames = []
                self._changed.notify_all()
            self.debugger.changed()
            if lost:
                self.debugger.submit(self._recover, was_paused, thread_id)

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

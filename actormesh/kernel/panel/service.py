"""The kernel's side of the JupyterLab panel: requests in, pushed snapshots out.

Requests come as ``actormesh_panel_request`` messages on the kernel's *control* channel, which
ipykernel serves on its own thread: the panel's buttons and its subscription work while a cell
keeps the shell busy. Updates go out on a comm that the kernel opens (``subscribe``): comm
messages travel on iopub, which any thread may use, so a background thread pushes a new
snapshot whenever something changed (checked every ``POLL`` seconds, at once when the debugger
reports a pause). A snapshot is only sent when it differs from the last one sent. The charts'
data follows each check as a ``series`` message of the points that are new (``series.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import MeshError
from ...runtime.actors import Future, when_all
from ...runtime.faults import without_busy_time
from ...runtime.procs import MeshRecord, controller_if_started
from .. import debugger_seam
from ..debugger_seam import Debugger
from ..targets import MeshRegistry, MeshTools
from . import protocol
from .protocol import PanelRequestError, Request
from .series import SeriesFeed
from .watch import MeshWatcher, paused_ranks

logger = logging.getLogger(__name__)

POLL = 0.4  # seconds between checks for news (a death shows within POLL + one round trip)
STACKS_TIMEOUT = 2.0


class PanelService:
    """Serves every panel subscribed to this kernel. Thread-safe: requests arrive on the
    control thread, updates leave from the update thread."""

    def __init__(self, registry: MeshRegistry, user_ns: dict[str, Any] | None) -> None:
        self.registry = registry
        self.watcher = MeshWatcher(registry, user_ns)
        self.series = SeriesFeed()
        self._comms: dict[str, Any] = {}  # client token -> comm
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._last: dict[str, Any] | None = None
        self._unlisten: Callable[[], None] | None = None

    # -- requests (control thread) -----------------------------------------------------------

    def handle(self, content: Any) -> dict[str, Any]:
        """Answer one request: the reply content. Never raises."""
        request_id = content.get("request_id", "") if isinstance(content, dict) else ""
        try:
            request = protocol.parse_request(content)
            if request.op == "subscribe":
                assert request.client is not None
                self.subscribe(request.client)
            else:
                self._operate(request)
        except (PanelRequestError, MeshError) as exc:
            return protocol.reply(str(request_id), str(exc))
        except Exception as exc:
            logger.exception("panel request %r failed", content)
            return protocol.reply(str(request_id), f"{type(exc).__name__}: {exc}")
        return protocol.reply(request.request_id)

    def subscribe(self, client: str) -> None:
        """Open a comm to the panel ``client`` and send it the current state."""
        from comm import create_comm

        debugger, _ = paused_ranks()
        comm = create_comm(target_name=protocol.COMM_TARGET, data=protocol.hello(client, debugger))
        comm.on_close(lambda _msg: self._forget(client, comm))
        with self._lock:
            old = self._comms.pop(client, None)
            self._comms[client] = comm
            self._last = None  # the new panel needs a full snapshot
            self.series.reset()  # and the charts' whole history
        if old is not None:
            old.close()
        self._start()
        self._wake.set()

    def _forget(self, client: str, comm: Any) -> None:
        with self._lock:
            if self._comms.get(client) is comm:
                del self._comms[client]

    def _operate(self, request: Request) -> None:
        op, mesh_id, ranks = request.op, request.mesh_id, request.ranks
        assert mesh_id is not None
        record = self._record(mesh_id)
        if ranks is not None:
            bad = [r for r in ranks if r >= record.n]
            if bad:
                raise PanelRequestError(f"mesh {mesh_id} has ranks 0-{record.n - 1}, not {bad}")
        targets = list(ranks) if ranks is not None else list(range(record.n))
        if op == "interrupt":
            self._tools(record).interrupt(targets)
            self._result(request, True, f"interrupted {_ranks_text(targets, record.n)}")
        elif op == "stacks":
            self._stacks(request, self._tools(record), targets)
        elif op in ("pause", "resume"):
            state = _debugger()
            (state.pause if op == "pause" else state.resume)(mesh_id, targets)
        elif op == "respawn":
            dead = sorted(record.exited)
            if not dead:
                raise PanelRequestError(f"mesh {mesh_id} has no dead rank to respawn")
            done = record.heal()
            self._when_done(request, done, f"respawned {_ranks_text(dead, record.n)}")
        elif op == "stop":
            self._when_done(request, record.stop(), f"stopped mesh {mesh_id}")
        self._wake.set()

    def _record(self, mesh_id: str) -> MeshRecord:
        ctl = controller_if_started()
        record = None if ctl is None else ctl.live_record(mesh_id)
        if record is None:
            raise PanelRequestError(
                f"no live proc mesh {mesh_id} in this kernel; it was stopped or never existed"
            )
        return record

    def _tools(self, record: Any) -> MeshTools:
        return self.registry.tools(record.table)

    def _stacks(self, request: Request, tools: MeshTools, ranks: list[int]) -> None:
        futures = [tools.proc(r).stacks(timeout=STACKS_TIMEOUT) for r in ranks]
        mesh_id = tools.table.mesh_id
        labels = tools.table.labels

        def done(_: Future[Any]) -> None:
            groups: dict[str, dict[str, Any]] = {}
            for rank, fut in zip(ranks, futures, strict=True):
                exc = fut.exception()
                text = str(next(iter(fut.result().values()))) if exc is None else f"({exc})"
                key = without_busy_time(text)  # how long each rank was busy is not the stack
                group = groups.setdefault(key, {"ranks": [], "labels": [], "text": text})
                group["ranks"].append(rank)
                group["labels"].append(labels[rank])
            ordered = sorted(groups.values(), key=lambda g: (-len(g["ranks"]), g["ranks"][0]))
            self._send(protocol.stacks(request.request_id, mesh_id, ordered))

        when_all(futures).add_done_callback(done)

    def _when_done(self, request: Request, fut: Future[Any], what: str) -> None:
        def done(f: Future[Any]) -> None:
            exc = f.exception()
            self._result(request, exc is None, what if exc is None else str(exc))
            self._wake.set()

        fut.add_done_callback(done)

    def _result(self, request: Request, ok: bool, message: str) -> None:
        self._send(protocol.result(request.request_id, request.op, ok, message))

    # -- updates (update thread) ---------------------------------------------------------------

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(target=self._run, name="actormesh-panel", daemon=True)
            self._thread.start()
        try:
            state = _debugger()
        except PanelRequestError:
            return
        self._unlisten = state.add_listener(self._wake.set)

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(POLL)
            self._wake.clear()
            self.watcher.changed.clear()
            try:
                self.watcher.ask()
                self.push()
                self.push_series()
            except Exception:
                logger.exception("the panel's update failed")

    def push(self) -> None:
        """Send a snapshot to every panel, if it differs from the last one sent."""
        with self._lock:
            if not self._comms:
                return
        debugger, _ = paused_ranks()
        snap = protocol.snapshot(round(time.time(), 1), debugger, self.watcher.meshes())
        with self._lock:
            same = self._last is not None and {**self._last, "time": 0} == {**snap, "time": 0}
            if same:
                return
            self._last = snap
        self._send(snap)

    def push_series(self) -> None:
        """Send the chart points that came since the last ``series`` message, if any."""
        with self._lock:
            if not self._comms:
                return
        ctl = controller_if_started()
        msg = self.series.update([] if ctl is None else ctl.live_records())
        if msg is not None:
            self._send(msg)

    def _send(self, msg: dict[str, Any]) -> None:
        with self._lock:
            comms = list(self._comms.values())
        for comm in comms:
            try:
                comm.send(msg)
            except Exception:
                logger.debug("a panel comm could not be sent to", exc_info=True)

    def close(self) -> None:
        """Stop the update thread and close every comm (kernel shutdown)."""
        self._closed = True
        self._wake.set()
        if self._unlisten is not None:
            self._unlisten()
        with self._lock:
            comms = list(self._comms.values())
            self._comms.clear()
        for comm in comms:
            try:
                comm.close()
            except Exception:
                pass
        if self._thread is not None:
            self._thread.join(timeout=2)


def _debugger() -> Debugger:
    state = debugger_seam.installed()
    if state is None:
        raise PanelRequestError(
            "pause and continue need actormesh's debugger, which this installation lacks"
        )
    return state


def _ranks_text(ranks: Sequence[int], n: int) -> str:
    if len(ranks) == n:
        return f"all {n} ranks"
    return "rank " + ", ".join(map(str, ranks)) if len(ranks) == 1 else f"ranks {list(ranks)}"

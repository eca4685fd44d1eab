"""What the panel shows: the live meshes of this kernel's controller, rank by rank.

The controller itself knows which meshes exist, which ranks are starting or dead and how they
died. What a live rank is doing (busy in which cell or endpoint, since when, its memory) comes
from the ``MeshStatus`` actor on each rank, which answers on its own thread while a cell runs;
the watcher keeps one such question in flight per rank and remembers the last answer.
Paused ranks come from ``actormesh.debugger.state`` when that module exists.

Everything here runs on the panel's update thread, except the status replies (I/O thread).
"""

from __future__ import annotations

import logging
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ...runtime.actors import Future
from ...runtime.faults import TOOL_ACTOR_PREFIX
from ...runtime.mesh_shape import with_shape
from ...runtime.meshes import ActorMesh, ProcMesh, proc_table_of
from ...runtime.procs import MeshRecord, controller_if_started
from .. import debugger_seam
from ..debugger_seam import PausedRank
from ..targets import MeshRegistry, MeshTools

logger = logging.getLogger(__name__)

_CELL_FILE = re.compile(r"<mesh-cell-(\d+)(?:\.\d+)?>")


def cell_label(filename: str) -> str:
    """``<mesh-cell-7>`` -> ``In [7]``: how the notebook labels that cell."""
    m = _CELL_FILE.fullmatch(filename)
    return f"In [{m.group(1)}]" if m else filename


@dataclass
class RankView:
    """What the panel last knew about one rank; ``since`` is kept while the state stays."""

    key: tuple[Any, ...] = ()  # the state and what it is doing: a change restarts `since`
    since: float | None = None
    status: dict[str, Any] | None = None  # the last MeshStatus answer
    answered_at: float = 0.0  # when it came (time.time())
    asking: bool = False


@dataclass
class MeshView:
    ranks: dict[int, RankView] = field(default_factory=dict)


def paused_ranks() -> tuple[bool, dict[tuple[str, int], PausedRank]]:
    """``(debugger available, {(mesh_id, rank): PausedRank})``; the debugger is optional."""
    debugger = debugger_seam.installed()
    if debugger is None:
        return False, {}
    try:
        return True, {(p.mesh_id, p.rank): p for p in debugger.paused_ranks()}
    except Exception:
        logger.exception("asking the debugger for paused ranks failed")
        return True, {}


class MeshWatcher:
    """Builds snapshots (``protocol.snapshot`` meshes) and keeps rank statuses fresh."""

    def __init__(self, registry: MeshRegistry, user_ns: dict[str, Any] | None) -> None:
        self.registry = registry
        self.user_ns = user_ns
        self.views: dict[str, MeshView] = {}
        self.changed = threading.Event()  # set when a status answer brought news
        self._lock = threading.Lock()

    # -- snapshots -------------------------------------------------------------------------------

    def meshes(self) -> list[dict[str, Any]]:
        ctl = controller_if_started()
        if ctl is None:
            self.views.clear()
            return []
        node = ctl.node
        _, paused = paused_ranks()
        names = self._names()
        out = []
        live = set()
        for record in ctl.live_records():
            mesh_id = record.table.mesh_id
            live.add(mesh_id)
            view = self.views.setdefault(mesh_id, MeshView())
            out.append(self._mesh(record, view, node.dead, paused, names.get(mesh_id, [])))
        for gone in set(self.views) - live:
            del self.views[gone]
        return out

    def _mesh(
        self,
        record: MeshRecord,
        view: MeshView,
        dead: dict[bytes, Any],
        paused: dict[tuple[str, int], Any],
        names: list[str],
    ) -> dict[str, Any]:
        table = record.table
        now = time.time()
        ready = record.ready.done()
        hosts: dict[int, dict[str, Any]] = {}
        for rank in range(record.n):
            agent = record.agent_of(rank)
            host = hosts.setdefault(
                agent.host_rank,
                {
                    "host_rank": agent.host_rank,
                    "hostname": agent.hostname or socket.gethostname(),
                    "ranks": [],
                },
            )
            rv = view.ranks.setdefault(rank, RankView())
            death = dead.get(table.addresses[rank].mailbox)
            host["ranks"].append(
                self._rank(table, rank, rv, death, paused.get((table.mesh_id, rank)), ready, now)
            )
        actors = sorted(
            {
                spawn.name
                for spawn in record.actor_spawns
                if not spawn.name.startswith(TOOL_ACTOR_PREFIX)
            }
        )
        return {
            "mesh_id": table.mesh_id,
            "names": names,
            "extent": dict(record.shape.extent),
            "actors": actors,
            "hosts": [hosts[k] for k in sorted(hosts)],
            "recovery": _recovery(table.mesh_id),
        }

    def _rank(
        self,
        table: Any,
        rank: int,
        rv: RankView,
        death: Any,
        paused: Any,
        ready: bool,
        now: float,
    ) -> dict[str, Any]:
        pid = table.pids[rank] or None
        row: dict[str, Any] = {
            "rank": rank,
            "label": table.labels[rank],
            "state": "idle",
            "since": None,
            "pid": pid,
            "rss": None,
            "gpu_mem": None,
            "busy": None,
            "paused": None,
            "dead": None,
        }
        status = rv.status if death is None else None
        if status is not None:
            row["rss"] = _mib(status.get("rss"))
            row["gpu_mem"] = _mib(status.get("gpu_mem"))
        key, since = _state(row, rv, status, death, paused, ready, now)
        if key != rv.key:
            rv.key = key
            rv.since = since if key[0] == "busy" else now
        elif key[0] == "busy" and rv.since is not None:
            rv.since = min(rv.since, since)  # the first answer saw it late
        row["since"] = round(rv.since, 1) if rv.since is not None else None
        return row

    def _names(self) -> dict[str, list[str]]:
        """The notebook variables holding each proc mesh (or an actor mesh on it)."""
        names: dict[str, list[str]] = {}
        if self.user_ns is None:
            return names
        try:
            items = list(self.user_ns.items())
        except RuntimeError:  # a cell assigned a variable while we copied: next time
            return names
        for name, value in items:
            if name.startswith("_") or not isinstance(value, (ProcMesh, ActorMesh)):
                continue
            names.setdefault(proc_table_of(value).mesh_id, []).append(name)
        return names

    # -- status questions --------------------------------------------------------------------------

    def ask(self) -> None:
        """Send a status question to every live rank that has none in flight (non-blocking)."""
        ctl = controller_if_started()
        if ctl is None:
            return
        node = ctl.node
        for record in list(ctl.meshes.values()):
            if record.stopping or not record.ready.done():
                continue
            view = self.views.get(record.table.mesh_id)
            if view is None:
                continue
            try:
                tools = self.registry.tools(record.table)
                actors = tools.status_actors()
            except Exception:
                logger.debug("no status actors on %s", record.table.mesh_id, exc_info=True)
                continue
            for rank in range(record.n):
                rv = view.ranks.get(rank)
                if rv is None or rv.asking:
                    continue
                if record.table.addresses[rank].mailbox in node.dead:
                    rv.status = None
                    continue
                self._ask_one(tools, actors, rank, rv)

    def _ask_one(self, tools: MeshTools, actors: Any, rank: int, rv: RankView) -> None:
        with self._lock:
            rv.asking = True
        try:
            fut: Future[dict[str, Any]] = with_shape(
                actors, tools.rank_shape(rank)
            ).status.call_one()
        except Exception:
            rv.asking = False
            return

        def answered(f: Future[dict[str, Any]]) -> None:
            rv.asking = False
            if f.exception() is not None:
                return  # died or stopped: the controller's view says so
            before = rv.status
            rv.status = f.result()
            rv.answered_at = time.time()
            if before is None or _busy(before)[0] != _busy(rv.status)[0]:
                self.changed.set()

        fut.add_done_callback(answered)


def _state(
    row: dict[str, Any],
    rv: RankView,
    status: Any,
    death: Any,
    paused: Any,
    ready: bool,
    now: float,
) -> tuple[tuple[Any, ...], float]:
    """A rank's state in ``row`` (dead, paused in the debugger, starting, busy or idle), and
    the key that says when it changed, with the time it began (``now`` unless it was busy
    before the answer that tells it)."""
    pid = row["pid"]
    since = now
    if death is not None:
        row["state"] = "dead"
        row["pid"] = death.pid or pid
        row["dead"] = {
            "exitcode": death.exitcode,
            "signal": death.signal,
            "reason": death.reason,
        }
        key: tuple[Any, ...] = ("dead", death.pid)
    elif paused is not None:
        row["state"] = "paused"
        row["paused"] = {
            "file": str(paused.file),
            "line": int(paused.line),
            "function": str(paused.function),
        }
        key = ("paused", paused.file, paused.line)
    elif pid is None or (not ready and status is None):
        row["state"] = "starting"
        key = ("starting",)
    else:
        busy, busy_for = _busy(status)
        if busy is not None:
            row["state"] = "busy"
            row["busy"] = busy
            key = ("busy", busy["kind"], busy["what"])
            since = rv.answered_at - busy_for
        else:
            key = ("idle",)
    return key, since


def _recovery(mesh_id: str) -> dict[str, Any] | None:
    """A training run's last recovery on this mesh (``am.FaultTolerant``), when the tensor layer
    is loaded (a kernel that never used it does not import torch for the panel)."""
    if "actormesh.tensor.controller.recovery" not in sys.modules:
        return None
    from ...tensor.tools import recovery_of

    return recovery_of(mesh_id)


def _mib(n: Any) -> int | None:
    """Memory rounded to MiB, so that a few pages more do not count as news."""
    return None if n is None else int(n) >> 20 << 20


def activity(status: dict[str, Any]) -> str:
    """``busy`` or ``idle``, as the sidebar says it, from a rank's status answer (the debugger's
    widget says it the same way)."""
    return "busy" if _busy(status)[0] is not None else "idle"


def busy_with(status: dict[str, Any]) -> str:
    """What a status answer says the rank is busy with, as the sidebar writes it ("tensor
    engine (pp=1, stage 1 of 2): op 12 aten.mm", "In [3]"); "" when it is idle."""
    busy, _ = _busy(status)
    return "" if busy is None else str(busy["what"])


def _busy(status: dict[str, Any] | None) -> tuple[dict[str, Any] | None, float]:
    """What a status answer says the rank is busy with, and for how long (s)."""
    if status is None:
        return None, 0.0
    if status.get("cell"):
        return (
            {"kind": "cell", "what": cell_label(status["cell"]), "line": status.get("cell_line")},
            float(status.get("cell_for") or 0.0),
        )
    for actor, endpoint_name, busy_for, *text in status.get("busy") or ():
        # An actor that says what it does (the tensor engine: "tensor engine: op 12 aten.mm")
        what = text[0] if text else f"{actor}.{endpoint_name}"
        return {"kind": "endpoint", "what": what, "line": None}, busy_for
    return None, 0.0

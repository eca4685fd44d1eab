"""The debugger widget: every rank's state, a selected rank's stack and locals, and controls.

Built from ipywidgets, so it lives in the notebook and needs no JupyterLab extension. It
follows the debugger through a listener: any change (a rank paused, stepped, continued) makes
it refresh on the debugger's pool, never on the thread that reported the change (a DAP reader
must not wait on its own connection).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from ..errors import MeshError
from ..kernel.magics import MeshMagics
from ..kernel.panel.watch import activity, busy_with
from ..runtime.mesh_shape import with_shape
from .cell_files import CellFiles
from .dap import DapError
from .session import Debugger
from .tensors import Comparison
from .widget_html import MeshRows, RankRow, locals_table, note, rank_table, stack_table, wrap

logger = logging.getLogger(__name__)

STATUS_AGAIN = 2.0  # seconds between the widget's status questions to the ranks

_ACTIONS = (("continue", "continue"), ("next", "step over"), ("step", "step in"),
            ("out", "step out"), ("pause", "pause"))  # fmt: skip


class WidgetSource(Protocol):
    """The ``%mesh dbg`` magics (``magics.DebugMagics``) as the widget uses them: ``magics.py``
    imports this module, so it is typed here rather than imported."""

    @property
    def debugger(self) -> Debugger: ...
    @property
    def files(self) -> CellFiles: ...
    @property
    def magics(self) -> MeshMagics: ...
    @property
    def shell(self) -> Any: ...

    def compare(self, mesh_id: str, ranks: list[int], name: str, frame: int = 0) -> Comparison: ...


class DebuggerWidget:
    """One per kernel (``%mesh dbg widget``); shown again it is the same live widget."""

    def __init__(self, debug: WidgetSource) -> None:
        import ipywidgets as w

        self.debug = debug
        self.debugger = debug.debugger
        self.table = w.HTML()
        self.rank = w.Dropdown(
            description="rank", options=[], layout=w.Layout(width="21em"),
            style={"description_width": "3em"},
        )  # fmt: skip
        self.scope = w.ToggleButtons(
            options=["this rank", "selection", "all"], value="this rank",
            style={"button_width": "auto"},
        )  # fmt: skip
        self.selection = w.Text(placeholder="SEL, e.g. 0,2 or 1:4", layout=w.Layout(width="12em"))
        self.buttons = []
        for command, text in _ACTIONS:
            button = w.Button(description=text, layout=w.Layout(width="auto"))
            button.on_click(lambda _, c=command: self._act(c))
            self.buttons.append(button)
        self.stack = w.HTML(layout=w.Layout(margin="0 24px 0 0"))
        self.locals = w.HTML()
        self.name = w.Text(
            placeholder="variable, e.g. loss or model", description="inspect",
            layout=w.Layout(width="24em"), style={"description_width": "4.5em"},
        )  # fmt: skip
        inspect = w.Button(description="compare ranks", layout=w.Layout(width="auto"))
        inspect.on_click(lambda _: self._inspect())
        self.summary = w.HTML()
        self.status = w.HTML()
        self._meshes: list[tuple[Any, str, dict[int, str]]] = []
        self.rank.observe(lambda _: self._show_rank(), names="value")
        flow = w.Layout(flex_flow="row wrap", align_items="flex-start")
        self.box = w.VBox(
            [
                self.table,
                w.HBox([self.rank, self.scope, self.selection], layout=flow),
                w.HBox(self.buttons, layout=flow),
                w.HBox([self.stack, self.locals], layout=flow),
                w.HBox([self.name, inspect], layout=flow),
                self.summary,
                self.status,
            ]
        )
        self.box.add_class("jp-actormesh-debugger")
        self._pending = threading.Lock()
        # (mesh id, rank) -> "busy"/"idle" from the rank's last status answer, for the ranks the
        # debugger does not hold: the sidebar's words for them, where the debugger knows only
        # that they are not paused. Asked on each refresh, and every STATUS_AGAIN seconds.
        self._activity: dict[tuple[str, int], str] = {}
        # (mesh id, rank) -> what the rank's last status answer said it runs (the sidebar's
        # words: a tensor engine's mesh, pipeline stage and op), shown in the row's note
        self._doing: dict[tuple[str, int], str] = {}
        self._asking: set[tuple[str, int]] = set()
        self._again: threading.Timer | None = None
        self.unsubscribe = self.debugger.add_listener(self._changed)
        self.refresh()

    def show(self) -> Any:
        self.refresh()
        return self.box

    # -- following the debugger ------------------------------------------------------------------

    def _changed(self) -> None:
        if self._pending.acquire(blocking=False):  # one refresh queued at a time is enough
            self.debugger.pool.submit(self._refresh_queued)

    def _refresh_queued(self) -> None:
        self._pending.release()
        try:
            self.refresh()
        except Exception:
            logger.exception("the debugger widget could not refresh")

    def refresh(self) -> None:
        """Rebuild the rank table and the selected rank's view (any thread but a DAP reader)."""
        live = self.debug.magics.registry.live()
        names = self._mesh_names() if len(live) > 1 else {}
        meshes: list[tuple[Any, str, dict[int, str]]] = []
        options = []
        for tools in live:
            mesh_id = tools.table.mesh_id
            name = ", ".join(names.get(mesh_id, [])) or mesh_id
            lines: dict[int, str] = {}
            for r in tools.shape.ranks():
                lines[r] = f"rank {r} {{{tools.table.labels[r]}}} "
                lines[r] += self.debugger.describe(mesh_id, r)
                options.append((f"{name}: {lines[r]}" if len(live) > 1 else lines[r], (mesh_id, r)))
            meshes.append((tools, f"{name} {tools.shape.extent}", lines))
        current = self.rank.value
        self.rank.options = options
        values = [v for _, v in options]
        if current in values:
            self.rank.value = current
        else:
            paused = [rd.key for rd in self.debugger.paused()]
            self.rank.value = paused[0] if paused else (values[0] if values else None)
        self._meshes = meshes
        self._show_rank()

    def _show_rank(self) -> None:
        """The table (the chosen rank highlighted) and the chosen rank's stack and locals."""
        self.table.value = rank_table(
            [
                MeshRows(title, [self._row(tools, r, line) for r, line in lines.items()])
                for tools, title, lines in self._meshes
            ]
        )
        self._refresh_rank()

    def _row(self, tools: Any, rank: int, line: str) -> RankRow:
        """A rank's state, where it is paused (``In [2]:3``, as the sidebar writes it)."""
        mesh_id, point = tools.table.mesh_id, tools.table.labels[rank]
        title, selected = line, self.rank.value == (mesh_id, rank)
        if self.debugger.is_dead(mesh_id, rank):
            return RankRow(rank, point, "dead", title=title, selected=selected)
        rd = self.debugger.ranks.get((mesh_id, rank))
        if rd is None or rd.status in ("running", "paused"):
            self._ask_status(tools, rank)
        doing = self._doing.get((mesh_id, rank), "")
        if rd is None:
            return RankRow(
                rank, point, self._state_of(mesh_id, rank), note=doing, title=title,
                selected=selected,
            )  # fmt: skip
        where = rd.location if rd.status == "paused" else None
        left = rd.timeout_left()
        if left is not None:
            detail = f"process group timeout in {left:.0f} s"
        elif rd.pause_requested and rd.status == "running":
            detail = "pause requested"
        elif rd.status == "running" or doing.startswith("tensor engine"):
            detail = doing  # a rank paused in a tensor op: the engine's slice, stage and op
        else:
            detail = ""
        return RankRow(
            rank,
            point,
            self._state_of(mesh_id, rank) if rd.status == "running" else rd.status,
            "" if where is None else f"{self.debug.files.label(where.path)}:{where.line}",
            "" if where is None else where.function,
            detail,
            title,
            selected,
        )

    def _state_of(self, mesh_id: str, rank: int) -> str:
        """A rank the debugger does not hold: busy or idle as its last status answer said
        (``running`` until the first answer)."""
        return self._activity.get((mesh_id, rank), "running")

    def _ask_status(self, tools: Any, rank: int) -> None:
        """Ask the rank what it runs (non-blocking, as the sidebar does); a changed answer
        refreshes the widget, and the ranks are asked again every two seconds (a rank that
        starts a cell sends the debugger no event)."""
        key = (tools.table.mesh_id, rank)
        if key in self._asking:
            return
        actors = tools.status_actors_if_spawned()
        if actors is None and self._holds_a_rank_of(key[0]):
            # Spawning them starts a thread on every rank, and one that starts as a rank stops
            # in the debugger makes pydevd print "thread._ident is None in
            # _get_related_thread!" into the cell: the debugger starts them before it attaches
            # (DebugMagics._start_status_actors), and the widget asks once they run.
            return
        self._asking.add(key)
        try:
            if actors is None:
                actors = tools.status_actors()
            future = with_shape(actors, tools.rank_shape(rank)).status.call_one()
        except Exception:  # a stopped mesh, a dead rank: the debugger's own words stay
            self._asking.discard(key)
            return

        def answered(done: Any) -> None:
            self._asking.discard(key)
            if done.exception() is not None:
                return
            state, doing = activity(done.result()), busy_with(done.result())
            if self._activity.get(key) != state or self._doing.get(key) != doing:
                self._activity[key] = state
                self._doing[key] = doing
                self._changed()
            if self._again is None:
                self._again = threading.Timer(STATUS_AGAIN, self._ask_again)
                self._again.daemon = True
                self._again.start()

        future.add_done_callback(answered)

    def _holds_a_rank_of(self, mesh_id: str) -> bool:
        return any(
            rd.mesh_id == mesh_id and rd.status != "dead"
            for rd in list(self.debugger.ranks.values())
        )

    def _ask_again(self) -> None:
        self._again = None
        self._changed()

    def _mesh_names(self) -> dict[str, list[str]]:
        """The notebook variables holding each proc mesh (or an actor mesh on it), as the
        sidebar names meshes."""
        from ..runtime.meshes import ActorMesh, ProcMesh, proc_table_of

        names: dict[str, list[str]] = {}
        try:
            items = list(self.debug.shell.user_ns.items())
        except (AttributeError, RuntimeError):  # no shell; a cell assigned as we copied
            return names
        for name, value in items:
            if not name.startswith("_") and isinstance(value, (ProcMesh, ActorMesh)):
                names.setdefault(proc_table_of(value).mesh_id, []).append(name)
        return names

    def _refresh_rank(self) -> None:
        key = self.rank.value
        rd = None if key is None else self.debugger.ranks.get(key)
        if rd is None or rd.status != "paused":
            self.stack.value = note("not paused")
            self.locals.value = ""
            return
        try:
            frames = rd.frames or rd.stack()
            self.stack.value = stack_table(
                [(f"{self.debug.files.label(f.path)}:{f.line}", f.function) for f in frames]
            )
            self.locals.value = locals_table(rd.variables())
        except DapError as exc:
            self.stack.value = note(str(exc), error=True)

    # -- controls --------------------------------------------------------------------------------

    def _targets(self) -> tuple[str, list[int]] | None:
        key = self.rank.value
        if key is None:
            return None
        mesh_id, rank = key
        if self.scope.value == "this rank":
            return mesh_id, [rank]
        tools = next(
            (t for t in self.debug.magics.registry.live() if t.table.mesh_id == mesh_id), None
        )
        if tools is None:
            return None
        if self.scope.value == "all":
            return mesh_id, list(tools.shape.ranks())
        from ..kernel.selection import SelectionError, select

        try:
            return mesh_id, list(select(tools.shape, self.selection.value or None).ranks)
        except SelectionError as exc:
            self.status.value = note(str(exc), error=True)
            return None

    def _act(self, command: str) -> None:
        targets = self._targets()
        if targets is None:
            return
        mesh_id, ranks = targets
        self.status.value = note(f"{command} {ranks}…")
        self.debugger.pool.submit(self._act_now, command, mesh_id, ranks)

    def _act_now(self, command: str, mesh_id: str, ranks: list[int]) -> None:
        from .session import STEP_COMMANDS

        try:
            if command == "pause":
                self.debugger.pause(mesh_id, ranks)
            else:
                self.debugger.resume(mesh_id, ranks, STEP_COMMANDS[command])
            self.status.value = note(f"{command}: sent to ranks {', '.join(map(str, ranks))}")
        except (DapError, MeshError) as exc:
            self.status.value = note(str(exc), error=True)

    def _inspect(self) -> None:
        targets = self._targets()
        name = self.name.value.strip()
        if targets is None or not name:
            return
        mesh_id, ranks = targets
        try:
            comparison = self.debug.compare(mesh_id, ranks, name)
        except (DapError, MeshError, ValueError) as exc:
            self.summary.value = note(str(exc), error=True)
            return
        self.summary.value = wrap(comparison._repr_html_())

"""The debugger widget: every rank's state, a selected rank's stack and locals, and controls.

Built from ipywidgets, so it lives in the notebook and needs no JupyterLab extension. It
follows the debugger through a listener: any change (a rank paused, stepped, continued) makes
it refresh on the debugger's pool, never on the thread that reported the change (a DAP reader
must not wait on its own connection).
"""

from __future__ import annotations

import html
import logging
import threading
from typing import TYPE_CHECKING, Any

from ..errors import MeshError
from .dap import DapError

if TYPE_CHECKING:
    from .magics import DebugMagics

logger = logging.getLogger(__name__)

_ACTIONS = (("continue", "continue"), ("next", "step over"), ("step", "step in"),
            ("out", "step out"), ("pause", "pause"))  # fmt: skip


class DebuggerWidget:
    """One per kernel (``%mesh dbg widget``); shown again it is the same live widget."""

    def __init__(self, debug: DebugMagics) -> None:
        import ipywidgets as w

        self.debug = debug
        self.debugger = debug.debugger
        self.table = w.HTML()
        self.rank = w.Dropdown(description="rank", options=[])
        self.scope = w.ToggleButtons(options=["this rank", "selection", "all"], value="this rank")
        self.selection = w.Text(placeholder="SEL, e.g. 0,2 or 1:4", layout=w.Layout(width="14em"))
        self.buttons = []
        for command, text in _ACTIONS:
            button = w.Button(description=text, layout=w.Layout(width="auto"))
            button.on_click(lambda _, c=command: self._act(c))
            self.buttons.append(button)
        self.stack = w.HTML()
        self.locals = w.HTML()
        self.name = w.Text(placeholder="variable, e.g. loss or model", description="inspect")
        inspect = w.Button(description="compare ranks", layout=w.Layout(width="auto"))
        inspect.on_click(lambda _: self._inspect())
        self.summary = w.HTML()
        self.status = w.HTML()
        self.rank.observe(lambda _: self._refresh_rank(), names="value")
        self.box = w.VBox(
            [
                self.table,
                w.HBox([self.rank, self.scope, self.selection]),
                w.HBox(self.buttons),
                w.HBox([self.stack, self.locals]),
                w.HBox([self.name, inspect]),
                self.summary,
                self.status,
            ]
        )
        self.box.add_class("jp-actormesh-debugger")
        self._pending = threading.Lock()
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
        rows, options = [], []
        for tools in self.debug.magics.registry.live():
            mesh_id = tools.table.mesh_id
            for r in tools.shape.ranks():
                state = self.debugger.describe(mesh_id, r)
                css = state.split(" ")[0]
                label = f"rank {r} {{{tools.table.labels[r]}}}"
                rows.append(
                    f"<tr class='jp-actormesh-dbg-{css}'><td>{html.escape(label)}</td>"
                    f"<td>{html.escape(state)}</td></tr>"
                )
                options.append((f"{label}: {state}", (mesh_id, r)))
        self.table.value = (
            "<table class='jp-actormesh-dbg-ranks'><tr><th>rank</th><th>state</th></tr>"
            + "".join(rows)
            + "</table>"
        )
        current = self.rank.value
        self.rank.options = options
        values = [v for _, v in options]
        if current in values:
            self.rank.value = current
        else:
            paused = [rd.key for rd in self.debugger.paused()]
            self.rank.value = paused[0] if paused else (values[0] if values else None)
        self._refresh_rank()

    def _refresh_rank(self) -> None:
        key = self.rank.value
        rd = None if key is None else self.debugger.ranks.get(key)
        if rd is None or rd.status != "paused":
            self.stack.value = "<i>not paused</i>"
            self.locals.value = ""
            return
        try:
            frames = rd.frames or rd.stack()
            items = "".join(
                f"<li>{html.escape(self.debug.label(f.path))}:{f.line} in "
                f"<b>{html.escape(f.function)}</b></li>"
                for f in frames
            )
            self.stack.value = f"<b>stack</b><ol>{items}</ol>"
            variables = rd.variables()
            cells = "".join(
                f"<tr><td>{html.escape(n)}</td><td>{html.escape(t)}</td>"
                f"<td>{html.escape(v[:120])}</td></tr>"
                for n, t, v in variables
            )
            self.locals.value = f"<b>locals</b><table>{cells}</table>"
        except DapError as exc:
            self.stack.value = f"<i>{html.escape(str(exc))}</i>"

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
            self.status.value = f"<span style='color:#c00'>{html.escape(str(exc))}</span>"
            return None

    def _act(self, command: str) -> None:
        targets = self._targets()
        if targets is None:
            return
        mesh_id, ranks = targets
        self.status.value = f"{command} {ranks}…"
        self.debugger.pool.submit(self._act_now, command, mesh_id, ranks)

    def _act_now(self, command: str, mesh_id: str, ranks: list[int]) -> None:
        from .session import STEP_COMMANDS

        try:
            if command == "pause":
                self.debugger.pause(mesh_id, ranks)
            else:
                self.debugger.resume(mesh_id, ranks, STEP_COMMANDS[command])
            self.status.value = f"{command}: sent to ranks {', '.join(map(str, ranks))}"
        except (DapError, MeshError) as exc:
            self.status.value = f"<span style='color:#c00'>{html.escape(str(exc))}</span>"

    def _inspect(self) -> None:
        targets = self._targets()
        name = self.name.value.strip()
        if targets is None or not name:
            return
        mesh_id, ranks = targets
        try:
            comparison = self.debug.compare(mesh_id, ranks, name)
        except (DapError, MeshError, ValueError) as exc:
            self.summary.value = f"<span style='color:#c00'>{html.escape(str(exc))}</span>"
            return
        self.summary.value = comparison._repr_html_()

"""``%mesh plot NAME...``: the metrics ranks logged (``am.log_metrics``), drawn inline.

One panel per metric, one line per rank (x: the step, or the time since the first value when
no step was given). With ``--live`` the figure is redrawn in place as values arrive, also while
a later cell trains: a listener on each mesh's metrics log wakes a drawing thread, which redraws
at most twice a second and updates the output by its display id. Drawing never happens on the
I/O thread that delivers the values. A live figure stops with ``%mesh plot --stop``; a mesh
that stopped sends nothing more, and its figure's thread sleeps.
"""

from __future__ import annotations

import base64
import io
import itertools
import threading
from collections.abc import Callable, Sequence
from typing import Any

from IPython.display import display, update_display

from ..runtime.meshes import ProcMesh
from ..runtime.messaging import MetricsLog

REDRAW_EVERY = 0.5  # seconds between two redraws of a live figure
_ids = itertools.count(1)


def rows_of(procs: ProcMesh, names: Sequence[str]) -> list[dict[str, Any]]:
    table = procs.metrics(*names)
    return list(table.to_dict("records")) if hasattr(table, "to_dict") else list(table)


def render(meshes: Sequence[tuple[str, ProcMesh]], names: Sequence[str]) -> dict[str, Any]:
    """A PNG (as display data) of ``names`` for every rank of every mesh."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6.4, 2.4 * len(names)), layout="constrained")
    canvas = FigureCanvasAgg(figure)
    axes = figure.subplots(len(names), 1, squeeze=False)[:, 0]
    total = 0
    for ax, name in zip(axes, names, strict=True):
        for mesh_name, procs in meshes:
            rows = rows_of(procs, [name])
            total += len(rows)
            wide = [d for d, size in procs.extent.items() if size > 1] or list(procs.extent)
            lines: dict[str, tuple[list[float], list[float]]] = {}
            start = rows[0]["time"] if rows else 0.0
            for row in rows:
                label = ",".join(f"{d}={row[d]}" for d in wide) or "controller"
                xs, ys = lines.setdefault(label, ([], []))
                xs.append(row["step"] if row["step"] is not None else row["time"] - start)
                ys.append(row["value"])
            prefix = f"{mesh_name} " if len(meshes) > 1 else ""
            for label, (xs, ys) in lines.items():
                ax.plot(xs, ys, label=prefix + label, linewidth=1.2)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=8)
        if ax.lines:
            ax.legend(fontsize=7, loc="best")
        else:
            ax.text(0.5, 0.5, f"no values of {name!r} yet", ha="center", va="center",
                    transform=ax.transAxes, fontsize=9, color="gray")  # fmt: skip
    buffer = io.BytesIO()
    canvas.print_png(buffer)
    text = f"<%mesh plot of {', '.join(names)}: {total} values>"
    return {"image/png": base64.b64encode(buffer.getvalue()).decode(), "text/plain": text}


def show(meshes: Sequence[tuple[str, ProcMesh]], names: Sequence[str]) -> None:
    display(render(meshes, names), raw=True)


class LivePlot:
    """A figure that redraws itself as values arrive, until ``stop()`` or its meshes stop."""

    def __init__(
        self,
        meshes: Sequence[tuple[str, ProcMesh]],
        names: Sequence[str],
        logs: Sequence[MetricsLog],
    ) -> None:
        self.meshes = list(meshes)
        self.logs = list(logs)
        self.names = list(names)
        self.display_id = f"actormesh-plot-{next(_ids)}"
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._unlisten: list[Callable[[], Any]] = []
        self._thread = threading.Thread(target=self._run, name="actormesh-plot", daemon=True)

    def start(self) -> None:
        display(render(self.meshes, self.names), raw=True, display_id=self.display_id)
        for log in self.logs:
            self._unlisten.append(log.listen(self._wake.set))
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        for undo in self._unlisten:
            undo()
        self._unlisten.clear()

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait()
            self._wake.clear()
            if self._stopped.is_set():
                break
            try:
                update_display(
                    render(self.meshes, self.names), raw=True, display_id=self.display_id
                )
            except Exception:  # the kernel is shutting down, or matplotlib failed: stop
                break
            self._stopped.wait(REDRAW_EVERY)  # at most twice a second, however fast values come
        self.stop()

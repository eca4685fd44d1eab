"""``%mesh status``: one row per rank (host, pid, state, what it runs and for how long, memory),
asked of the ranks' status actors, shown as a text and an HTML table."""

from __future__ import annotations

import html

from ..errors import MeshError
from ..runtime.mesh_shape import with_shape
from .targets import MeshTools, Target


def status_rows(t: MeshTools | Target) -> list[list[str]]:
    tools = t if isinstance(t, MeshTools) else t.tools
    ranks = tools.shape.ranks() if isinstance(t, MeshTools) else t.shape.ranks()
    health = tools.procs.health().values()
    actors = tools.status_actors()
    futures = {
        r: with_shape(actors, tools.rank_shape(r)).status.call_one()
        for r in ranks
        if health[r] == "alive"
    }
    rows = []
    for r in ranks:
        label = tools.table.labels[r]
        pid = str(tools.table.pids[r])
        host = tools.table.addresses[r].host.split(":")[0]
        if health[r] != "alive":
            rows.append([f"{r} ({label})", host, pid, health[r], "", "", "", ""])
            continue
        try:
            info = futures[r].get(timeout=3)
        except MeshError as exc:
            rows.append([f"{r} ({label})", host, pid, "not answering", str(exc)[:60], "", "", ""])
            continue
        running, since = "", ""
        if "cell" in info:
            at = f" line {info['cell_line']}" if info.get("cell_line") else ""
            running, since = f"{info['cell'].strip('<>')}{at}", f"{info['cell_for']:.1f} s"
        elif info["busy"]:
            name, ep, secs, *what = info["busy"][0]
            running, since = (what[0] if what else f"{name}.{ep}"), f"{secs:.1f} s"
        state = "busy" if running else "idle"
        gpu = "" if info["gpu_mem"] is None else _mib(info["gpu_mem"])
        rows.append(
            [f"{r} ({label})", info["host"], str(info["pid"]), state, running, since,
             _mib(info["rss"]), gpu]
        )  # fmt: skip
    return rows


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


def show_table(header: list[str], rows: list[list[str]]) -> None:
    from IPython.display import publish_display_data

    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    text = "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    table = f"<table class='jp-actormesh-status'><thead><tr>{cells}</tr></thead>{body}</table>"
    publish_display_data({"text/plain": text, "text/html": table})

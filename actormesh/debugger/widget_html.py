"""The debugger widget's HTML: compact tables, state badges as the sidebar draws them.

Pure functions of plain values, so that what the widget shows is testable without a kernel.
The widget's parts are ipywidgets ``HTML`` views, outside JupyterLab's rendered-HTML styles
and out of reach of the labextension's CSS (the widget also works without it): each part
carries its own ``<style>``, every rule under ``.jp-actormesh-dbg``. Colours are the
sidebar's (``labextension/style/base.css``); the rest follows JupyterLab's theme variables,
with fallbacks for other front ends.

Locations read as the sidebar writes them: ``In [2]:3`` (a notebook cell, line 3).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from ..runtime.meshes import value_cell

# The sidebar's state colours. A rank the debugger does not hold is idle or busy as its status
# says (the sidebar's words); "running" only until its first status answer, drawn as busy.
STATE_COLOURS = {
    "idle": "#4a9a5c",
    "busy": "#2f74c0",
    "running": "#2f74c0",
    "paused": "#b0701a",
    "dead": "#c23b3b",
    "starting": "#888",
}
VALUE_CHARS = 120  # of a local's value in the locals table (all of it on hover)
_VALUE_ATTRS = " class='code value'"

STYLE = (
    "<style>"
    ".jp-actormesh-dbg{font-family:var(--jp-ui-font-family,sans-serif);"
    "font-size:var(--jp-ui-font-size1,13px);color:var(--jp-ui-font-color1,#222)}"
    ".jp-actormesh-dbg table{border-collapse:collapse;margin:2px 0 4px;line-height:1.35}"
    ".jp-actormesh-dbg th{font-weight:600;text-align:left;white-space:nowrap;"
    "font-size:var(--jp-ui-font-size0,11px);color:var(--jp-ui-font-color2,#666)}"
    ".jp-actormesh-dbg th,.jp-actormesh-dbg td{padding:1px 8px 1px 0;vertical-align:baseline;"
    "border-bottom:1px solid var(--jp-border-color3,#eee)}"
    ".jp-actormesh-dbg thead th{border-bottom-color:var(--jp-border-color2,#ddd)}"
    ".jp-actormesh-dbg .num{text-align:right}"
    ".jp-actormesh-dbg .code{font-family:var(--jp-code-font-family,monospace);"
    "font-size:var(--jp-code-font-size,12px);white-space:nowrap}"
    ".jp-actormesh-dbg .value{white-space:pre;max-width:48em;overflow:hidden;"
    "text-overflow:ellipsis}"
    ".jp-actormesh-dbg .note,.jp-actormesh-dbg .empty{color:var(--jp-ui-font-color2,#666);"
    "font-size:var(--jp-ui-font-size0,11px)}"
    ".jp-actormesh-dbg tr.selected td{background:var(--jp-brand-color3,#e3f0fc)}"
    ".jp-actormesh-dbg tr.mesh th{padding-top:5px;color:var(--jp-ui-font-color1,#222);"
    "font-family:var(--jp-code-font-family,monospace)}"
    ".jp-actormesh-dbg .title{font-weight:600;margin-right:6px}"
    ".jp-actormesh-dbg .badge{display:inline-block;border-radius:8px;padding:0 6px;"
    "font-size:var(--jp-ui-font-size0,11px);line-height:16px;color:white;white-space:nowrap}"
    ".jp-actormesh-dbg .error{color:var(--jp-error-color1,#c00)}"
    + "".join(f".jp-actormesh-dbg .state-{s}{{background:{c}}}" for s, c in STATE_COLOURS.items())
    + "</style>"
)


@dataclass(frozen=True)
class RankRow:
    """One rank in the widget's table."""

    rank: int
    point: str  # its coordinates: "gpus=2"
    state: str  # running / paused / dead
    location: str = ""  # where it is paused: "In [2]:3"
    function: str = ""
    note: str = ""  # "pause requested", the process group's time left
    title: str = ""  # the whole line, as %mesh dbg list says it (the row's tooltip)
    selected: bool = False


@dataclass(frozen=True)
class MeshRows:
    name: str  # shown above its ranks when the kernel has several meshes
    rows: Sequence[RankRow]


def wrap(body: str) -> str:
    """HTML of one of the widget's parts, under its style."""
    return f"<div class='jp-actormesh-dbg'>{STYLE}{body}</div>"


def badge(state: str, text: str | None = None) -> str:
    css = state if state in STATE_COLOURS else "starting"
    return f"<span class='badge state-{css}'>{html.escape(text or state)}</span>"


def rank_table(meshes: Sequence[MeshRows]) -> str:
    """Every rank of every mesh: state counts above, a row per rank."""
    counts: dict[str, int] = {}
    for mesh in meshes:
        for row in mesh.rows:
            counts[row.state] = counts.get(row.state, 0) + 1
    head = "<span class='title'>ranks</span>" + " ".join(
        badge(state, f"{n} {state}") for state, n in counts.items()
    )
    if not counts:
        return wrap(f"{head}<span class='empty'>no live proc mesh</span>")
    notes = any(row.note for mesh in meshes for row in mesh.rows)
    columns = ["rank", "point", "state", "location", "function"] + (["note"] if notes else [])
    body = []
    for mesh in meshes:
        if len(meshes) > 1:
            body.append(f"<tr class='mesh'><th colspan='{len(columns)}'>"
                        f"{html.escape(mesh.name)}</th></tr>")  # fmt: skip
        for row in mesh.rows:
            cells = [
                f"<td class='num code'>{row.rank}</td>",
                f"<td class='code'>{html.escape(row.point)}</td>",
                f"<td>{badge(row.state)}</td>",
                f"<td class='code'>{html.escape(row.location)}</td>",
                f"<td class='code'>{html.escape(row.function)}</td>",
            ]
            if notes:
                cells.append(f"<td class='note'>{html.escape(row.note)}</td>")
            body.append(
                f"<tr data-rank='{row.rank}' data-state='{html.escape(row.state)}'"
                f"{' class=selected' if row.selected else ''}"
                f" title='{html.escape(row.title)}'>{''.join(cells)}</tr>"
            )
    thead = "".join(f"<th{' class=num' if c == 'rank' else ''}>{c}</th>" for c in columns)
    return wrap(
        f"<div>{head}</div><table class='jp-actormesh-dbg-ranks'><thead><tr>{thead}</tr>"
        f"</thead><tbody>{''.join(body)}</tbody></table>"
    )


def stack_table(frames: Sequence[tuple[str, str]]) -> str:
    """``(location, function)`` per frame, innermost first."""
    rows = "".join(
        f"<tr><td class='num code'>{i}</td><td class='code'>{html.escape(where)}</td>"
        f"<td class='code'>{html.escape(function)}</td></tr>"
        for i, (where, function) in enumerate(frames)
    )
    return wrap(
        "<span class='title'>stack</span><table class='jp-actormesh-dbg-stack'><thead><tr>"
        f"<th class='num'>#</th><th>location</th><th>function</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def locals_table(variables: Sequence[tuple[str, str, str]]) -> str:
    """``(name, type, value)`` per local; values shown rounded and cut, exact on hover."""
    rows = "".join(
        f"<tr><td class='code'>{html.escape(name)}</td><td class='note'>{html.escape(kind)}</td>"
        f"{value_cell(value, VALUE_CHARS, _VALUE_ATTRS)}</tr>"
        for name, kind, value in variables
    )
    if not rows:
        return wrap("<span class='title'>locals</span><span class='empty'>none</span>")
    return wrap(
        "<span class='title'>locals</span><table class='jp-actormesh-dbg-locals'><thead><tr>"
        f"<th>name</th><th>type</th><th>value</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def note(text: str, error: bool = False) -> str:
    """A line of text in the widget (a status, a failure)."""
    return wrap(f"<span class='{'error' if error else 'empty'}'>{html.escape(text)}</span>")

"""How a ``%%mesh`` cell shows what its ranks did: grouped output, the status strip (its errors
are in ``cell_errors.py``).

Rank output reaches the kernel on the runtime's I/O thread (``LogSink.writer`` for printed
lines, a port for rich output). :class:`OutputGrouper` only queues it there; the cell's own
thread flushes the queue every few tens of milliseconds, so what it writes lands in the right
cell. A line is held for a short window so that identical lines from several ranks, which never
arrive at exactly the same time, are shown once with their rank range.
"""

from __future__ import annotations

import html
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import (
    coordinates,
    rank_ranges,
)

# -- grouped output ------------------------------------------------------------------------------

RankKey = int | str  # a rank of the cell's mesh, or the label of a rank of another mesh


@dataclass
class _Event:
    seq: int
    t: float
    kind: str  # "line" or "display"
    stream: str
    text: str  # the line (with its newline), or a display bundle's identity for grouping
    data: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


def prefix(keys: Sequence[RankKey]) -> str:
    """``[rank 2]``, ``[ranks 0-3]``; labels of other meshes' ranks as they are."""
    ints = [k for k in keys if isinstance(k, int)]
    labels = [k for k in keys if isinstance(k, str)]
    parts = []
    if ints:
        parts.append(f"rank {ints[0]}" if len(ints) == 1 else f"ranks {rank_ranges(ints)}")
    parts.extend(labels)
    return f"[{', '.join(parts)}]"


def output_prefix(keys: Sequence[RankKey], names: Mapping[int, str]) -> str:
    """What rank output is prefixed with: the ranks' coordinates, as endpoint output is
    (``[gpus=2]``, ``[gpus=0-3]``); ``names`` gives the cell's ranks' labels."""
    ours = [names.get(k, f"rank {k}") for k in keys if isinstance(k, int)]
    parts = [coordinates(ours)] if ours else []
    parts.extend(k for k in keys if isinstance(k, str))
    return f"[{', '.join(parts)}]"


class OutputGrouper:
    """Rank output queued from the I/O thread, written grouped by the cell's thread.

    Per-rank order is kept: only the oldest pending item of each rank is ever written, and it
    is written together with the identical oldest items of other ranks. An item waits at least
    ``window`` seconds for such twins, and up to ``max_hold`` seconds while a *peer* rank (one
    that has printed the same things so far) is still running and has printed nothing newer:
    ranks of one cell drift apart by more than a tick, but usually print the same lines. A rank
    whose item went out alone after the long wait stops counting its silent peers as peers, so
    output of one rank (``if rank == 0: print(...)``) is only held for ``window``.
    """

    def __init__(
        self,
        labels: Mapping[str, int],
        write: Callable[[str, str], None],
        show: Callable[[dict[str, Any], dict[str, Any]], None],
        dedup: bool = True,
        window: float = 0.1,
        max_hold: float = 1.0,
        ranks: Sequence[int] = (),
    ) -> None:
        self._labels = labels
        self._names = {rank: label for label, rank in labels.items()}
        self._write = write
        self._show = show
        self.dedup = dedup
        self.window = window
        self.max_hold = max_hold
        self._lock = threading.Lock()
        self._queues: dict[RankKey, deque[_Event]] = {}
        self._seq = 0
        self.pending = 0  # items queued and not yet written
        everyone = frozenset(ranks)
        self._peers: dict[RankKey, frozenset[RankKey]] = {r: everyone for r in ranks}
        self._running: set[RankKey] = set(ranks)
        self._emitted: dict[RankKey, int] = {}  # items written per rank: a head's position

    # -- I/O thread ------------------------------------------------------------------------------

    def writer(self, label: str, stream: str, text: str) -> None:
        """A ``LogSink.writer``: queue ``text`` (one or more lines) from rank ``label``."""
        key: RankKey = self._labels.get(label, label)
        now = time.monotonic()
        with self._lock:
            queue = self._queues.setdefault(key, deque())
            for line in text.splitlines(keepends=True):
                self._seq += 1
                queue.append(_Event(self._seq, now, "line", stream, line))
                self.pending += 1

    def display(self, rank: RankKey, data: dict[str, Any], metadata: dict[str, Any]) -> None:
        identity = json.dumps(data, sort_keys=True, default=str) if self.dedup else ""
        with self._lock:
            self._seq += 1
            event = _Event(self._seq, time.monotonic(), "display", "", identity, data, metadata)
            self._queues.setdefault(rank, deque()).append(event)
            self.pending += 1

    def finished(self, rank: RankKey) -> None:
        """Rank ``rank`` is done with the cell (everything it printed has arrived)."""
        with self._lock:
            self._running.discard(rank)

    # -- the cell's thread -----------------------------------------------------------------------

    def flush(self, final: bool = False) -> None:
        """Write what has waited long enough (everything when ``final``)."""
        if not self.pending:
            return
        out: list[tuple[str, str, _Event]] = []  # (stream or "display", prefix, event)
        now = time.monotonic()
        held: set[RankKey] = set()
        with self._lock:
            queues = self._queues
            while True:
                # Lowest position first (then arrival): identical lines of ranks that print the
                # same things meet at the heads of their queues.
                emitted = self._emitted
                heads = [
                    (emitted.get(key, 0), q[0].seq, key)
                    for key, q in queues.items()
                    if q and key not in held
                ]
                if not heads:
                    break
                _, _, key = min(heads)
                head = queues[key][0]
                group = [key]
                if self.dedup:
                    group += [o for o, q in queues.items() if o != key and q and _same(q[0], head)]
                age = now - min(queues[k][0].t for k in group)
                behind = self._behind(group) if self.dedup else set()
                if not final and (age < self.window or (behind and age < self.max_hold)):
                    held.update(group)
                    continue
                for k in group:
                    queues[k].popleft()
                    self._emitted[k] = self._emitted.get(k, 0) + 1
                self.pending -= len(group)
                self._learn(group, behind)
                held.clear()  # ranks held for these may be able to go now
                group.sort(key=_rank_order)
                kind = head.stream if head.kind == "line" else "display"
                out.append((kind, output_prefix(group, self._names), head))
        self._emit(out)

    def _behind(self, group: list[RankKey]) -> set[RankKey]:
        """Peers of the group that have not reached its position yet: its twins may yet come.

        A peer is behind when it has written fewer items than the group's ranks and still has
        something to say (it is running, or has items queued), or when it has written as many
        and is running with nothing queued. A peer whose item at this position differs has
        diverged: no wait."""
        members = set(group)
        position = max(self._emitted.get(k, 0) for k in group)
        peers: set[RankKey] = set()
        for k in group:
            peers |= self._peers.get(k, frozenset())
        behind = set()
        for p in peers - members:
            done = self._emitted.get(p, 0)
            queued = bool(self._queues.get(p))
            running = p in self._running
            if (done < position and (running or queued)) or (
                done == position and running and not queued
            ):
                behind.add(p)
        return behind

    def _learn(self, group: list[RankKey], behind: set[RankKey]) -> None:
        members = frozenset(group)
        for k in group:
            if k in self._peers:
                # Ranks that wrote this together are peers; those we gave up waiting for are not.
                self._peers[k] = (self._peers[k] | members) - behind

    def _emit(self, out: list[tuple[str, str, _Event]]) -> None:
        """Write runs of one stream in one call; a display shows its label, then its bundle."""
        chunk: list[str] = []
        stream = ""
        for kind, label, event in out:
            if kind != stream and chunk:
                self._write(stream, "".join(chunk))
                chunk = []
            if kind == "display":
                self._write("stdout", label + "\n")
                self._show(event.data or {}, event.metadata or {})
                stream = ""
                continue
            stream = kind
            text = event.text if event.text.endswith("\n") else event.text + "\n"
            chunk.append(f"{label} {text}")
        if chunk:
            self._write(stream, "".join(chunk))


def _rank_order(k: RankKey) -> tuple[int, int, str]:
    return (1, 0, k) if isinstance(k, str) else (0, k, "")


def _same(a: _Event, b: _Event) -> bool:
    return a.kind == b.kind and a.stream == b.stream and a.text == b.text


# -- the status strip ------------------------------------------------------------------------------

_COLORS = {
    "running": "#1976d2",
    "done": "#388e3c",
    "error": "#d32f2f",
    "interrupted": "#f57c00",
    "dead": "#424242",
    "paused": "#7b1fa2",
}


def render_strip(states: Mapping[int, str], elapsed: float, title: str) -> str:
    """The strip as HTML: one coloured cell per rank, with a legend of counts."""
    cells = "".join(
        f"<span class='jp-actormesh-rank' data-rank='{r}' data-state='{s}' title='rank {r}: {s}'"
        f" style='display:inline-block;min-width:1.6em;margin:1px;padding:0 3px;"
        f"text-align:center;color:white;border-radius:3px;background:{_COLORS.get(s, '#999')}'>"
        f"{r}</span>"
        for r, s in sorted(states.items())
    )
    counts: dict[str, int] = {}
    for s in states.values():
        counts[s] = counts.get(s, 0) + 1
    legend = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    return (
        f"<div class='jp-actormesh-status-strip' style='font-family:monospace;font-size:12px'>"
        f"{cells} <span style='color:#666'>{html.escape(title)} · {legend} · "
        f"{elapsed:.1f} s</span></div>"
    )


class StatusStrip:
    """An ipywidgets strip that shows each rank's state while a long cell runs."""

    def __init__(self, title: str) -> None:
        import ipywidgets
        from IPython.display import display

        self.title = title
        self.widget = ipywidgets.HTML()
        self.widget.add_class("jp-actormesh-status")
        self._last = ""
        display(self.widget)

    def update(self, states: Mapping[int, str], elapsed: float, final: bool = False) -> None:
        if not final:
            elapsed = int(elapsed * 2) / 2  # the clock moves in half seconds: fewer messages
        value = render_strip(states, elapsed, self.title)
        if value != self._last:
            self._last = value
            self.widget.value = value


def make_strip(title: str) -> StatusStrip | None:
    """The status strip of a cell, when a notebook front end shows one (else ``None``)."""
    shell = _shell()
    if shell is None or getattr(shell, "kernel", None) is None:
        return None
    try:
        return StatusStrip(title)
    except ImportError:
        return None


def _shell() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()

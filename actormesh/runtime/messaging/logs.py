"""Rank-labelled output: workers' prints travel to the controller, which shows them prefixed.

In a worker, ``sys.stdout``/``sys.stderr`` are replaced by streams that send complete lines to
the controller over the control plane, from the printing thread. A reply is sent only after the
actor thread's output is flushed, and both go through the same ordered pipe, so what an endpoint
printed arrives before that call's reply. Output written straight to the file descriptors (C
code, subprocesses, a crash) reaches the controller through the host agent instead.
"""

from __future__ import annotations

import io
import os
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from ... import config
from .metrics import flush_metrics
from .protocol import LOG

if TYPE_CHECKING:
    from ..extent import Point
    from .node import Node


# Starts a line of fd 2 that already went to the controller as a message. Not a character that
# str.splitlines() treats as a line break (\x1c-\x1e are), or the mark would become a line.
TEE_MARK = "\x02"


def rank_label(point: Point) -> str:
    """``gpus=1`` for ``{hosts=0, gpus=1}`` of extent ``{hosts: 1, gpus: 4}``: size-1 dims are
    dropped unless every dim has size 1."""
    dims = [(k, v) for k, v in point.items() if point.extent[k] > 1] or list(point.items())
    return ",".join(f"{k}={v}" for k, v in dims)


class RankStream(io.TextIOBase):
    """A worker's ``sys.stdout`` or ``sys.stderr``: lines go to the controller."""

    def __init__(self, node: Node, stream: str, label: str, original: TextIO) -> None:
        super().__init__()
        self._node = node
        self._stream = stream
        self._label = label
        self._original = original
        self._pending: list[str] = []
        self._lock = threading.Lock()

    encoding = "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._original.fileno()

    def write(self, s: str) -> int:
        if not s:
            return 0
        with self._lock:
            self._pending.append(s)
            if "\n" not in s:
                return len(s)
            text = "".join(self._pending)
            cut = text.rfind("\n") + 1
            self._pending = [text[cut:]] if cut < len(text) else []
        self._send(text[:cut])
        return len(s)

    def flush(self) -> None:
        if not self._pending:  # nothing written: the common case, after every endpoint
            return
        with self._lock:
            text = "".join(self._pending)
            self._pending = []
        if text:
            self._send(text)

    def _send(self, text: str) -> None:
        if self._stream == "stderr":
            # Also to fd 2, marked: the host agent keeps these lines for the stderr tail of a
            # crash report (a message still queued in ZeroMQ dies with the process) and does
            # not forward them a second time.
            try:
                marked = "".join(TEE_MARK + line for line in text.splitlines(keepends=True))
                os.write(2, marked.encode("utf-8", "replace"))
            except OSError:
                pass
        controller = self._node.controller
        if controller is None:
            self._original.write(text)
            return
        try:
            envelope = (LOG, self._node.address.mailbox, self._label, self._stream, text)
            # Sent at once, not batched: a process about to crash should not take its last
            # words with it.
            self._node.send(controller, envelope)
        except Exception:
            self._original.write(text)


_streams: list[RankStream] = []


def capture_output(node: Node, label: str) -> None:
    """Replace this worker's ``sys.stdout``/``sys.stderr`` (called once at worker start)."""
    out = RankStream(node, "stdout", label, sys.__stdout__ or sys.stdout)
    err = RankStream(node, "stderr", label, sys.__stderr__ or sys.stderr)
    _streams[:] = [out, err]
    sys.stdout, sys.stderr = out, err


def flush_output() -> None:
    """Send what this process printed, and the metrics it logged, that are still here."""
    # Looked at before calling anything: this runs before every reply, and nothing is pending
    # after almost all of them.
    for s in _streams:
        if s._pending:  # noqa: SLF001  this module's class
            s.flush()
    flush_metrics()


# -- the controller's side ----------------------------------------------------------------------

LogWriter = Callable[[str, str, str], None]  # (label, stream, text)


def _default_writer(label: str, stream: str, text: str) -> None:
    target = sys.stderr if stream == "stderr" else sys.stdout
    prefix = f"[{label}] "
    lines = text.splitlines(keepends=True)
    try:
        target.write(
            "".join(
                prefix + line if line.endswith("\n") else prefix + line + "\n" for line in lines
            )
        )
        target.flush()
    except Exception:  # a closed stdout must not break the I/O thread
        pass


class LogSink:
    """Where rank output lands in the controller; also keeps each process's stderr tail."""

    def __init__(self) -> None:
        self.writer: LogWriter = _default_writer
        self._tails: dict[bytes, deque[str]] = {}
        # ProcMesh.logging_option, per sender: None (hidden) or an Aggregator (0 s: none).
        self._modes: dict[bytes, Aggregator | None] = {}

    def write(self, sender: bytes, label: str, stream: str, text: str) -> None:
        if stream == "stderr":
            tail = self._tails.get(sender)
            if tail is None:
                tail = self._tails[sender] = deque(maxlen=config.STDERR_TAIL_LINES)
            tail.extend(text.splitlines())
        if sender not in self._modes:
            self.writer(label, stream, text)
            return
        mode = self._modes[sender]
        if mode is not None:  # not streamed to the client: only the stderr tail keeps it
            mode.add(label, stream, text)

    def set_mode(self, senders: list[bytes], stream: bool, window: float | None) -> None:
        """How the output of ``senders`` is shown (``ProcMesh.logging_option``)."""
        mode = Aggregator(self, window or 0.0) if stream else None
        for sender in senders:
            self._modes[sender] = mode

    def stderr_tail(self, sender: bytes) -> tuple[str, ...]:
        return tuple(self._tails.get(sender, ()))

    def forget(self, sender: bytes, successor: bytes | None = None) -> None:
        """``sender`` is gone (a healed rank answers as ``successor``, shown the same way)."""
        self._tails.pop(sender, None)
        mode = self._modes.pop(sender, _NO_MODE)
        if successor is not None and mode is not _NO_MODE:
            self._modes[successor] = mode  # type: ignore[assignment]


_NO_MODE = object()


class Aggregator:
    """Lines that several ranks print alike within ``window`` seconds, shown once with the
    ranks that printed them (Monarch's ``aggregate_window_sec``); 0: each line as it comes."""

    def __init__(self, sink: LogSink, window: float) -> None:
        self.sink = sink
        self.window = window
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str], list[str]] = {}  # (stream, line) -> labels
        self._timer: threading.Timer | None = None

    def add(self, label: str, stream: str, text: str) -> None:
        if self.window <= 0:
            self.sink.writer(label, stream, text)
            return
        with self._lock:
            for line in text.splitlines():
                self._pending.setdefault((stream, line), []).append(label)
            if self._timer is None:
                self._timer = threading.Timer(self.window, self.flush)
                self._timer.daemon = True
                self._timer.start()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending, self._timer = self._pending, {}, None
        for (stream, line), labels in pending.items():
            label = labels[0] if len(labels) == 1 else f"{len(labels)} ranks: {', '.join(labels)}"
            self.sink.writer(label, stream, line + "\n")

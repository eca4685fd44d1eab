"""A small Debug Adapter Protocol client: one socket to one rank's debugpy.

DAP messages are JSON bodies framed by a ``Content-Length`` header (the same framing as the
Language Server Protocol). A reader thread parses incoming messages: responses complete the
request waiting on their ``request_seq``; events go to one callback. Requests may be sent from
any thread and block for at most their timeout.

Written here rather than depended upon: no Python DAP client library is maintained, and the
part we need (requests, responses, events) is a hundred lines.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import MeshError

logger = logging.getLogger(__name__)

EventHandler = Callable[[str, dict[str, Any]], None]
DEFAULT_TIMEOUT = 10.0
_TRACE = os.environ.get("ACTORMESH_DAP_TRACE")  # a file to append every DAP message to


def _trace(direction: str, name: str, message: dict[str, Any]) -> None:
    if _TRACE:
        with open(_TRACE, "a") as f:
            f.write(f"{time.monotonic():.4f} {name} {direction} {json.dumps(message)[:300]}\n")


class DapError(MeshError):
    """A DAP request failed, timed out, or the connection to the rank's debugpy is gone."""


def encode(message: dict[str, Any]) -> bytes:
    """One framed DAP message."""
    body = json.dumps(message, separators=(",", ":")).encode("utf-8")
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class FrameReader:
    """Splits a byte stream into DAP messages (pure: fed bytes, yields dicts)."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buf += data
        out: list[dict[str, Any]] = []
        while True:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                return out
            length = None
            for line in self._buf[:end].split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            if length is None:
                raise DapError(f"DAP header without Content-Length: {self._buf[:end]!r}")
            start = end + 4
            if len(self._buf) < start + length:
                return out
            body, self._buf = self._buf[start : start + length], self._buf[start + length :]
            out.append(json.loads(body))


class PendingRequest:
    """A request sent and not answered yet: ``DapClient.wait`` gets its answer."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.done = threading.Event()
        self.response: dict[str, Any] | None = None


class DapClient:
    """One connection to a debug adapter (here: pydevd inside a rank, listening on loopback)."""

    def __init__(self, sock: socket.socket, on_event: EventHandler, name: str = "dap") -> None:
        """Speak DAP over ``sock``, a connected stream socket (see :func:`connect`)."""
        self.name = name
        self._sock = sock
        self._sock.settimeout(None)
        self._on_event = on_event
        self._seq = itertools.count(1)
        self._send_lock = threading.Lock()
        self._pending: dict[int, PendingRequest] = {}
        self._lock = threading.Lock()
        self.closed = threading.Event()
        self._reader = threading.Thread(
            target=self._read, name=f"actormesh-dap-{name}", daemon=True
        )
        self._reader.start()

    # -- any thread ------------------------------------------------------------------------------

    def send_request(self, command: str, arguments: dict[str, Any] | None = None) -> PendingRequest:
        """Send a request without waiting; ``wait(pending)`` gets its body."""
        seq = next(self._seq)
        pending = PendingRequest(command)
        with self._lock:
            if self.closed.is_set():
                raise DapError(f"{self.name}: the debugger connection is closed")
            self._pending[seq] = pending
        message: dict[str, Any] = {"seq": seq, "type": "request", "command": command}
        if arguments is not None:
            message["arguments"] = arguments
        _trace("->", self.name, message)
        try:
            with self._send_lock:
                self._sock.sendall(encode(message))
        except OSError as exc:
            self._close()
            raise DapError(f"{self.name}: sending {command!r} failed: {exc}") from exc
        return pending

    def wait(self, pending: PendingRequest, timeout: float = DEFAULT_TIMEOUT) -> dict[str, Any]:
        command = pending.command
        if not pending.done.wait(timeout):
            raise DapError(f"{self.name}: no answer to {command!r} within {timeout:g} s")
        response = pending.response
        if response is None:
            raise DapError(f"{self.name}: the connection closed before {command!r} was answered")
        if not response.get("success", False):
            raise DapError(f"{self.name}: {command} failed: {response.get('message', response)}")
        return dict(response.get("body") or {})

    def request(
        self,
        command: str,
        arguments: dict[str, Any] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> dict[str, Any]:
        """Send a request and block until its response (``DapError`` if it failed)."""
        return self.wait(self.send_request(command, arguments), timeout)

    def close(self) -> None:
        self._close()
        self._reader.join(2.0)

    # -- reader thread ---------------------------------------------------------------------------

    def _read(self) -> None:
        reader = FrameReader()
        try:
            while True:
                data = self._sock.recv(65536)
                if not data:
                    break
                for message in reader.feed(data):
                    self._dispatch(message)
        except (OSError, ValueError) as exc:
            if not self.closed.is_set():
                logger.debug("%s: reading failed: %s", self.name, exc)
        finally:
            self._close()
            try:
                self._on_event("_closed", {})
            except Exception:
                logger.exception("%s: close handler failed", self.name)

    def _dispatch(self, message: dict[str, Any]) -> None:
        _trace("<-", self.name, message)
        kind = message.get("type")
        if kind == "response":
            with self._lock:
                pending = self._pending.pop(message.get("request_seq", -1), None)
            if pending is not None:
                pending.response = message
                pending.done.set()
        elif kind == "event":
            try:
                self._on_event(message.get("event", ""), dict(message.get("body") or {}))
            except Exception:
                logger.exception("%s: event handler failed on %s", self.name, message.get("event"))

    def _close(self) -> None:
        with self._lock:
            if self.closed.is_set():
                return
            self.closed.set()
            pending, self._pending = list(self._pending.values()), {}
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        for p in pending:
            p.done.set()  # response stays None: the waiter raises "closed"


def connect(host: str, port: int, on_event: EventHandler, name: str = "dap") -> DapClient:
    """A client for the debug adapter listening on ``host:port``."""
    return DapClient(
        socket.create_connection((host, port), timeout=DEFAULT_TIMEOUT), on_event, name
    )

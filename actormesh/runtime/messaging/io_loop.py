"""The I/O thread of one process: a poll loop over ZeroMQ sockets and file descriptors, with
work handed over by other threads and timers.

Other threads hand it work with ``call_soon`` (a deque and a byte on a ``WakePipe``, the only
thread-safe entry); ``call_later``, ``add_reader`` and ``remove_reader`` are for the I/O thread
itself (or before it starts). Whatever it runs must be short and never user code: a reader, a
call or a timer that raises is logged, and the loop goes on.

``Transport`` is built on it: the process inbox is its first reader.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq

from .wake_pipe import WakePipe

logger = logging.getLogger(__name__)


class IoLoop:
    """A thread polling sockets and fds, running calls handed over and timers as they fall due."""

    def __init__(self, name: str) -> None:
        self._calls: deque[Callable[[], None]] = deque()
        self._wake = WakePipe()
        self._wake_r = self._wake.r  # compared on every poll event of the I/O thread
        self._wake_up = self._wake.wake  # call_soon is on the path of every broadcast
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._timer_seq = itertools.count()
        # socket or fd -> its reader; the poller holds the same ones
        self._readers: dict[Any, Callable[[], None]] = {}
        self._poller = zmq.Poller()
        self._poller.register(self._wake_r, zmq.POLLIN)
        self._running = True
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the I/O thread, after what was handed to it before (any thread)."""
        self._calls.append(fn)
        self._wake_up()

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the I/O thread after ``delay`` seconds (I/O thread only)."""
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._timer_seq), fn))

    def add_reader(self, what: zmq.Socket[Any] | int, fn: Callable[[], None]) -> None:
        """Call ``fn`` on the I/O thread whenever ``what`` (a ZeroMQ socket or an fd) is
        readable (I/O thread only)."""
        self._readers[what] = fn
        self._poller.register(what, zmq.POLLIN)

    def remove_reader(self, what: zmq.Socket[Any] | int) -> None:
        if self._readers.pop(what, None) is not None:
            self._poller.unregister(what)

    def _run(self) -> None:
        poller = self._poller
        readers = self._readers
        while self._running:
            timeout: int | None = None
            if self._timers:
                timeout = max(0, int((self._timers[0][0] - time.monotonic()) * 1000) + 1)
            if self._calls:
                timeout = 0
            try:
                events = poller.poll(timeout)
            except zmq.ZMQError as exc:
                if exc.errno == zmq.ETERM:
                    break
                raise
            for what, _ in events:
                if what == self._wake_r:
                    self._wake.drain()
                else:
                    reader = readers.get(what)
                    if reader is not None:
                        self._guard(reader)
            while self._calls:
                self._guard(self._calls.popleft())
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                self._guard(heapq.heappop(self._timers)[2])

    @staticmethod
    def _guard(fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:
            logger.exception("error on the actormesh I/O thread")

    def stop_loop(self, timeout: float = 5.0) -> None:
        """End the loop after what it is running now, and wait for its thread (any thread)."""
        self._running = False
        self.call_soon(lambda: None)
        if threading.current_thread() is not self._thread and self._thread.is_alive():
            self._thread.join(timeout=timeout)

    def close_wake_pipe(self) -> None:
        """Once the loop has stopped: its wake-up pipe's fds are freed."""
        self._wake.close()

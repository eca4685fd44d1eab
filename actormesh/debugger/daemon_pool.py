"""A pool of daemon threads for the debugger's short background work (an attach, a refresh)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ..errors import MeshError


class DaemonPool:
    """``submit(fn, *args) -> Future`` on a daemon thread per task.

    Debugger work is rare and short (an attach, a refresh), but it may be waiting on a rank
    when the kernel exits: a ``ThreadPoolExecutor`` would hold the exit until it finished."""

    def __init__(self) -> None:
        self.closed = False

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        if self.closed:
            future.set_exception(MeshError("the debugger is shut down"))
            return future

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)

        threading.Thread(target=run, name="actormesh-dbg", daemon=True).start()
        return future

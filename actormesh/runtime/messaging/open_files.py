"""This process's open files against its limit, checked before a new connection is made.

At the limit, libzmq aborts the process when its ipc:// listener cannot accept (an assertion on
EMFILE), and other sockets fail half-made: a new connection is refused while there is still
room for the ones others make to us. So the transport checks before it connects, frees what it
can, and refuses with a message that says what to do.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable


def files_short() -> tuple[int, int] | None:
    """``(open, limit)`` when this process is close to its limit on open files, else None."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return None
        in_use = len(os.listdir("/proc/self/fd"))
    except (ImportError, OSError):
        return None  # not Linux: no cheap count
    return (in_use, soft) if in_use + max(64, soft // 16) > soft else None


def make_room(endpoint: str, free: Callable[[], None]) -> None:
    """Before connecting to ``endpoint`` when files are short: ``free`` closes the sockets of
    actor meshes nobody holds (one held in a reference cycle waits for a full collection, so
    one runs first); raise ``ConnectionError`` if that was not enough."""
    import gc

    gc.collect()
    free()
    deadline = time.monotonic() + 1.0  # ZeroMQ closes their files in the background
    while (short := files_short()) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    if short is not None:
        raise ConnectionError(
            f"not connecting to {endpoint}: this process has {short[0]} files open of its "
            f"limit of {short[1]} (ulimit -n); stop the meshes you no longer use (an actor "
            "mesh's are freed once no handle on it is left), or raise the limit"
        )

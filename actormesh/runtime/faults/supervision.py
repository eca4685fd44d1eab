"""Where failures that nobody waited for go: the owner's ``__supervise__``, else the fault hook.

A failure is *handled* when a caller receives it: a call pending on a rank that dies gets the
``SupervisionError`` and that is the end of it. A death that no pending call observed, and an
exception raised by a ``broadcast`` (nobody waits for its result), are *unhandled*. They go to
the mesh's owner: an actor that spawned the mesh may handle them in ``__supervise__(failure)``
(return True); otherwise they reach the controller's ``unhandled_fault_hook``.

The default hook prints the failure plainly. In a script it also fails fast: the failure is
raised in the main thread at its next wait on a future or call to a mesh, and if the script ends
first, it exits with status 1 (after the script's own ``atexit`` handlers ran, as long as they
were registered after ``import actormesh``). In an interactive session (IPython, Jupyter) it is
only shown.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Protocol

from ...errors import MeshError, SupervisionError, actor_error

logger = logging.getLogger(__name__)

FaultHook = Callable[[MeshError], None]

_pending: list[MeshError] = []  # unhandled failures the main thread has not seen yet
_lock = threading.Lock()


class Waker(Protocol):
    """What a waiting thread sleeps on: ``threading.Event`` or a reply inbox."""

    def set(self) -> None: ...


_main_waiters: set[Waker] = set()
_exit_with_failure = False


def is_interactive() -> bool:
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return True
    ipython = sys.modules.get("IPython")
    return bool(ipython is not None and getattr(ipython, "get_ipython", lambda: None)())


def default_fault_hook(failure: MeshError) -> None:
    """Print ``failure``; in a script, also raise it in the main thread (see module docs)."""
    global _exit_with_failure
    text = str(failure).lstrip("\n")
    print(f"actormesh: unhandled failure:\n{text}", file=sys.stderr, flush=True)
    if is_interactive():
        return
    with _lock:
        _pending.append(failure)
        _exit_with_failure = True
        waiters = list(_main_waiters)
    for event in waiters:
        event.set()


_hook: list[FaultHook] = [default_fault_hook]


def unhandled_fault_hook(failure: MeshError) -> None:
    """Called with every failure that no caller and no ``__supervise__`` handled.

    Replace it with ``actormesh.unhandled_fault_hook = fn`` (as in Monarch) or
    ``set_fault_hook(fn)``; ``fn`` receives a ``MeshFailure``: an ``ActorError`` (a broadcast
    raised) or a ``SupervisionError`` (a process died while nothing waited on it).
    """
    try:
        _hook[0](failure)
    except Exception:
        logger.exception("the fault hook raised while handling %r", failure)


def current_fault_hook() -> FaultHook:
    """The hook installed now (``actormesh.unhandled_fault_hook`` reads it)."""
    return _hook[0]


def set_fault_hook(hook: FaultHook | None) -> FaultHook:
    """Install ``hook`` for unhandled failures (``None`` restores the default); returns the
    previous one."""
    previous = _hook[0]
    _hook[0] = hook or default_fault_hook
    return previous


def raise_pending() -> None:
    """Raise an unhandled failure in the main thread (no-op elsewhere, or if there is none)."""
    if not _pending or threading.current_thread() is not threading.main_thread():
        return
    with _lock:
        if not _pending:
            return
        failure = _pending.pop(0)
    raise failure


def add_main_waiter(event: Waker) -> bool:
    if threading.current_thread() is not threading.main_thread() or is_interactive():
        return False
    with _lock:
        _main_waiters.add(event)
    return True


def remove_main_waiter(event: Waker) -> None:
    with _lock:
        _main_waiters.discard(event)


def exit_status_override() -> int | None:
    """1 if an unhandled failure happened in a script (checked at exit)."""
    return 1 if _exit_with_failure else None


def _exit_with_status() -> None:
    # Registered when actormesh is imported, so it is among the first atexit handlers and runs
    # among the last (they run in reverse): the user's own handlers, registered after the
    # import, and the controller's shutdown have run by now. Only os._exit can still change
    # the exit status at this point.
    status = exit_status_override()
    if status is not None and threading.current_thread() is threading.main_thread():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


atexit.register(_exit_with_status)


def failure_of_broadcast(failure: object) -> MeshError:
    from ...errors import RemoteFailure

    if isinstance(failure, RemoteFailure):
        return actor_error([failure])
    if isinstance(failure, MeshError):
        return failure
    return SupervisionError([], f"unhandled failure: {failure!r}")

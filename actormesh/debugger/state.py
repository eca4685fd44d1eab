"""Which ranks are paused, for other parts of the kernel (the sidebar): a small, stable surface.

Everything here may be called from any thread and returns at once; ``pause`` and ``resume`` do
their work on the debugger's pool, and listeners hear about the outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from ..kernel.debugger_seam import PausedRank
from .session import get_debugger

logger = logging.getLogger(__name__)


def paused_ranks() -> list[PausedRank]:
    """Every rank paused now, all meshes of this controller, ordered by mesh and rank."""
    debugger = get_debugger()
    out = []
    for rd in debugger.paused():
        where = rd.location
        if where is None:
            out.append(PausedRank(rd.mesh_id, rd.rank, "?", 0, "?"))
        else:
            out.append(
                PausedRank(rd.mesh_id, rd.rank, debugger.label(where.path), where.line,
                           where.function)
            )  # fmt: skip
    return out


def add_listener(callback: Callable[[], None]) -> Callable[[], None]:
    """Call ``callback()`` (on any thread; it must be quick) whenever the set of paused ranks
    or their locations change. Returns a function that unsubscribes."""
    return get_debugger().add_listener(callback)


def pause(mesh_id: str, ranks: Sequence[int]) -> None:
    """Ask ``ranks`` of ``mesh_id`` to pause (starting the debugger there if needed). Returns at
    once; listeners fire when they are paused. Failures are logged."""
    debugger = get_debugger()
    chosen = list(ranks)
    future = debugger.pool.submit(debugger.pause, mesh_id, chosen)
    future.add_done_callback(_log_failure(f"pause of ranks {chosen} of {mesh_id}"))


def resume(mesh_id: str, ranks: Sequence[int]) -> None:
    """Let paused ``ranks`` of ``mesh_id`` continue (others are left alone). Returns at once."""
    debugger = get_debugger()
    chosen = list(ranks)
    future = debugger.pool.submit(debugger.resume, mesh_id, chosen, "continue")
    future.add_done_callback(_log_failure(f"resume of ranks {chosen} of {mesh_id}"))


def _log_failure(what: str) -> Callable[[object], None]:
    def check(future: object) -> None:
        exc = future.exception()  # type: ignore[attr-defined]
        if exc is not None:
            logger.warning("%s failed: %s", what, exc)

    return check

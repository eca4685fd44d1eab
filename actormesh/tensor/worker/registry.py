"""The worker's table of op handlers: op kind -> code (filled by handlers.py, module_worker.py).

Its own module so that the handlers and the engine that runs them need not import each other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

# (engine, payload, output ids) -> one value per output id
Handler = Callable[[Any, Any, tuple[int, ...]], Sequence[Any]]
HANDLERS: dict[str, Handler] = {}


def handler(kind: str) -> Callable[[Handler], Handler]:
    """Register the worker's code for one kind of op (each returns one value per output id)."""

    def register(fn: Handler) -> Handler:
        HANDLERS[kind] = fn
        return fn

    return register


class StoodIn(Exception):
    """Raised by a handler whose op failed on this rank but that still computed ``values`` to
    stand in for its results (so that the rank took part in the op's collectives): the engine
    keeps them, and reports ``cause`` as the op's failure."""

    def __init__(self, values: Sequence[Any], cause: Exception) -> None:
        super().__init__(str(cause))
        self.values = values
        self.cause = cause

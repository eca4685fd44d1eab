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

"""Who am I? ``current_rank()``, ``current_size()`` and ``context()`` inside an actor."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from .shape import Extent, Point


@dataclass(frozen=True)
class ActorInstance:
    """The actor running the current message.

    ``rank`` is its position in the whole actor mesh; ``proc_rank`` its process's position in
    the proc mesh; ``name`` the name given to ``spawn``.
    """

    name: str
    rank: Point
    actor_id: str

    @property
    def extent(self) -> Extent:
        return self.rank.extent


@dataclass(frozen=True)
class Context:
    """What ``context()`` returns: the actor instance and the rank of the current message.

    ``message_rank`` is the position of this actor within the slice that was messaged (it equals
    ``actor_instance.rank`` when the whole mesh was called).
    """

    actor_instance: ActorInstance
    message_rank: Point


_EMPTY = Point(0, Extent([], []))
_CONTROLLER = Context(ActorInstance("controller", _EMPTY, "controller"), _EMPTY)
_tls = threading.local()


def set_current(ctx: Context | None) -> None:
    _tls.context = ctx


def context() -> Context:
    """The current actor and message. Outside any actor (in the controller) the rank is empty."""
    ctx: Context | None = getattr(_tls, "context", None)
    if ctx is None:
        ctx = getattr(_process, "context", None) or _CONTROLLER
    return ctx


def current_rank() -> Point:
    """The rank of the current actor in its mesh, e.g. ``{hosts=0, gpus=3}``."""
    return context().actor_instance.rank


def current_size() -> dict[str, int]:
    """The sizes of the current actor's mesh, e.g. ``{"hosts": 1, "gpus": 4}``."""
    return dict(context().actor_instance.rank.extent)


class _Process:
    context: Context | None = None


# Threads that the user starts inside a worker see the process's rank (set by the worker).
_process = _Process()


def set_process_context(ctx: Context) -> None:
    _process.context = ctx

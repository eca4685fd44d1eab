"""Who am I? ``current_rank()``, ``current_size()`` and ``context()`` inside an actor."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...errors import MeshUsageError
from ..extent import Extent, Point, point_label
from ..messaging import sender_rank
from ..shape import Shape


@dataclass(frozen=True)
class ActorInstance:
    """The actor running the current message.

    ``rank`` is its position in the whole actor mesh; ``proc_rank`` its process's position in
    the proc mesh; ``name`` the name given to ``spawn``.
    """

    name: str
    rank: Point
    actor_id: str
    # The ActorRunner running it (none for the controller's and a worker's own threads).
    _runner: Any = field(default=None, compare=False, repr=False)

    @property
    def extent(self) -> Extent:
        return self.rank.extent

    @property
    def creator(self) -> ActorInstance | None:
        """The actor that spawned this one's mesh; ``None`` when the script spawned it."""
        owner = self._runner.ownership.owner if self._runner is not None else None
        return None if owner is None else owner.instance

    @property
    def proc(self) -> Any:
        """This actor's process as a one-proc ``ProcMesh``: spawn on it to put actors beside
        this one."""
        if self._runner is None:
            raise MeshUsageError("actor_instance.proc is for actors; the script has this_proc()")
        return proc_factory[0](self._runner)

    def abort(self, reason: str | None = None) -> None:
        """End this actor after the current message, as a failure its owner hears of (which
        names ``reason``, or says that none was given)."""
        if self._runner is None:
            raise MeshUsageError("abort() is for actors; the script can raise")
        self._runner.abort(reason)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ActorInstance, (self.name, self.rank, self.actor_id))


def _no_procs(runner: Any) -> Any:
    raise MeshUsageError("actor_instance.proc needs actormesh's meshes (import actormesh)")


# Set by the meshes layer (proc_mesh.py), which this layer does not import.
proc_factory: list[Callable[[Any], Any]] = [_no_procs]


class Context:
    """What ``context()`` returns: the actor instance and the rank of the current message.

    ``message_rank`` is the position of this actor within the slice that was messaged (it equals
    ``actor_instance.rank`` when the whole mesh was called).
    """

    __slots__ = ("_index", "_message_rank", "_shape", "actor_instance")

    def __init__(
        self,
        actor_instance: ActorInstance,
        message_rank: Point | None = None,
        shape: Shape | None = None,
        index: int | None = None,
    ) -> None:
        self.actor_instance = actor_instance
        self._message_rank = message_rank
        # Built on demand: most endpoints never ask, and a Point costs microseconds per message.
        self._shape = shape
        self._index = index

    @property
    def message_rank(self) -> Point:
        if self._message_rank is None:
            if self._shape is not None and self._index is not None:
                self._message_rank = self._shape.point(self._index)
            else:
                self._message_rank = self.actor_instance.rank
        return self._message_rank

    def __repr__(self) -> str:
        return f"Context(actor={self.actor_instance.name!r}, message_rank={self.message_rank})"


_EMPTY = Point(0, Extent([], []))
_CONTROLLER = Context(ActorInstance("controller", _EMPTY, "controller"), _EMPTY)
_tls = threading.local()


# A concurrent endpoint's call is a task on its actor's loop, with its own message; the
# thread-local context is that of the message the actor's thread handles (if any).
_task_context: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "actormesh_context", default=None
)


def set_current(ctx: Context | None) -> None:
    _tls.context = ctx


def current() -> Context | None:
    """The context the actor's thread set, if any (to restore after a nested handler)."""
    return getattr(_tls, "context", None)


def set_task_context(ctx: Context) -> None:
    """The context of the current asyncio task (a concurrent call), whatever the thread's."""
    _task_context.set(ctx)


def context() -> Context:
    """The current actor and message. Outside any actor (in the controller) the rank is empty."""
    ctx: Context | None = _task_context.get() or getattr(_tls, "context", None)
    if ctx is None:
        ctx = getattr(_process, "context", None) or _CONTROLLER
    return ctx


def current_rank() -> Point:
    """The rank of the current actor in its mesh, e.g. ``{'hosts': 0/1, 'gpus': 3/4}``."""
    return context().actor_instance.rank


def current_actor_name() -> str:
    """A name unique to the current actor: its mesh's name and key, and its rank, e.g.
    ``counter-1f2e3d4c5b6a{hosts=0, gpus=3}``; ``"controller"`` outside any actor."""
    instance = context().actor_instance
    if instance is _CONTROLLER.actor_instance:
        return "controller"
    return f"{instance.actor_id}{point_label(instance.rank)}"


def _sender_rank() -> int | None:
    ctx: Context | None = _task_context.get() or getattr(_tls, "context", None)
    return None if ctx is None else ctx.message_rank.rank


sender_rank[0] = _sender_rank


def current_size() -> dict[str, int]:
    """The sizes of the current actor's mesh, e.g. ``{"hosts": 1, "gpus": 4}``."""
    return dict(context().actor_instance.rank.extent)


class _Process:
    context: Context | None = None


# Threads that the user starts inside a worker see the process's rank (set by the worker).
_process = _Process()


def set_process_context(ctx: Context) -> None:
    _process.context = ctx


def process_context() -> Context | None:
    """The context of the worker's own actor (its rank), as its other threads see it; ``None``
    outside a worker."""
    return _process.context

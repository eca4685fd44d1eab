"""Actors, the ``@endpoint`` decorator, and the thread that runs one actor's messages.

An actor handles one message at a time, in arrival order. Arrival order is per-sender FIFO:
every message from one process to another goes through one ZeroMQ pipe, sent under one lock.
Sync endpoints run on the actor's own thread; async endpoints run on the actor's own event loop
(driven by that same thread), so an ``await`` inside an endpoint never lets another message in.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")


class Actor:
    """Base class of actors. Subclass it and mark methods with ``@endpoint``.

    An actor lives in one worker process, built there with the arguments given to
    ``ProcMesh.spawn``; ``__init__`` runs before the first message is handled.
    """


class EndpointProperty(Generic[P, R]):
    """What ``@endpoint`` puts on the class. On an actor instance it is the plain method; on an
    ``ActorMesh`` it becomes an :class:`~actormesh.runtime.meshes.endpoint.Endpoint` with the
    adverbs."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.is_async = inspect.iscoroutinefunction(fn)
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    @overload
    def __get__(self, instance: None, owner: type) -> EndpointProperty[P, R]: ...
    @overload
    def __get__(self, instance: object, owner: type) -> Callable[P, R]: ...
    def __get__(self, instance: object | None, owner: type) -> Any:
        if instance is None:
            return self
        return self.fn.__get__(instance, owner)


@overload
def endpoint(fn: Callable[..., R]) -> EndpointProperty[..., R]: ...
@overload
def endpoint(
    fn: None = None, **options: Any
) -> Callable[[Callable[..., R]], EndpointProperty[..., R]]: ...
def endpoint(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Mark an actor method (``def`` or ``async def``) as callable through meshes.

    Usable bare (``@endpoint``) or called (``@endpoint()``); keyword options are accepted for
    Monarch compatibility and ignored.
    """
    if fn is None:
        return lambda f: EndpointProperty(f)
    return EndpointProperty(fn)


def endpoint_names(cls: type) -> list[str]:
    return sorted(
        name
        for klass in cls.__mro__
        for name, value in vars(klass).items()
        if isinstance(value, EndpointProperty)
    )

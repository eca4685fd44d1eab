"""Actors, the ``@endpoint`` decorator, and the thread that runs one actor's messages.

An actor handles one message at a time, in arrival order. Arrival order is per-sender FIFO:
every message from one process to another goes through one ZeroMQ pipe, sent under one lock.
Sync endpoints run on the actor's own thread; async endpoints run on the actor's own event loop
(driven by that same thread), so an ``await`` inside an endpoint never lets another message in,
except in a ``@concurrent_endpoint`` (and for ``__supervise__``, which runs at an await).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, Generic, Literal, ParamSpec, Protocol, TypeVar, overload

from ...errors import MeshTypeError

logger = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Actor:
    """Base class of actors. Subclass it and mark methods with ``@endpoint``.

    An actor lives in one worker process, built there with the arguments given to
    ``ProcMesh.spawn``; ``__init__`` runs before the first message is handled.
    """

    @functools.cached_property
    def logger(self) -> logging.Logger:
        """A logger named after the actor's class, at level DEBUG (Monarch's ``Actor.logger``);
        what it writes reaches the controller labelled with the rank, as all output does."""
        named = logging.getLogger(type(self).__name__)
        named.setLevel(logging.DEBUG)
        return named


# How endpoints are typed. ``P`` is what a caller passes (the method's parameters without
# ``self``), ``R`` what a caller gets back: the return value, awaited for an ``async def``.
# On an actor instance an endpoint is the plain method (``self.step(...)`` inside the actor
# runs it directly), so ``__get__`` on an instance gives ``Callable[P, R]`` (a coroutine
# function for ``async def``), never an ``Endpoint``: we do not copy Monarch, whose ``__get__``
# answers ``Endpoint[P, R]`` for every access and types the mesh as the actor class itself
# (``spawn -> TActor``), which its own comment calls "a total lie". Here ``spawn`` gives an
# ``ActorMesh[T]``; ``mesh.step`` goes through ``ActorMesh.__getattr__``, which is
# ``Endpoint[Any, Any]`` to a bare type checker and ``Endpoint[P, R]`` of ``T.step`` with the
# mypy plugin ``actormesh.mypy_plugin`` (see there): that is what checks
# ``mesh.step.call(lr=0.1)`` against ``def step(self, lr: float)``.


class EndpointProperty(Generic[P, R]):
    """What ``@endpoint`` puts on the class. On an actor instance it is the plain method; on an
    ``ActorMesh`` it becomes an :class:`~actormesh.runtime.meshes.endpoint.Endpoint` with the
    adverbs."""

    def __init__(
        self, fn: Callable[..., Any], explicit_response_port: bool = False, concurrent: bool = False
    ) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.is_async = inspect.iscoroutinefunction(fn)
        # The endpoint takes a port as its first argument and answers through it (Monarch's
        # ``explicit_response_port``); what it returns is ignored.
        self.explicit_response_port = explicit_response_port
        # While it awaits, the actor takes other messages (``concurrent_endpoint``).
        self.concurrent = concurrent
        # Copies __doc__, __name__, __wrapped__...: help() and inspect see the method. typeshed
        # types update_wrapper's first argument as a function, which this descriptor is not.
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    @overload
    def __get__(self, instance: None, owner: type) -> EndpointProperty[P, R]: ...
    @overload
    def __get__(self, instance: object, owner: type) -> Callable[P, R]: ...
    def __get__(self, instance: object | None, owner: type) -> Any:
        if instance is None:
            return self
        return self.fn.__get__(instance, owner)


class AsyncEndpointProperty(EndpointProperty[P, R]):
    """``@endpoint`` on an ``async def``: callers get ``R`` (awaited remotely); on an actor
    instance it is the coroutine function itself."""

    # On an instance it is the coroutine function, where a sync endpoint is the function giving
    # R: that difference is the point of this class, so the override is knowingly narrower.
    @overload  # type: ignore[override]
    def __get__(self, instance: None, owner: type) -> AsyncEndpointProperty[P, R]: ...
    @overload
    def __get__(self, instance: object, owner: type) -> Callable[P, Coroutine[Any, Any, R]]: ...
    def __get__(self, instance: object | None, owner: type) -> Any:
        if instance is None:
            return self
        return self.fn.__get__(instance, owner)


class _EndpointDecorator(Protocol):
    """``endpoint(**options)``: the decorator ``@endpoint()`` applies."""

    @overload
    def __call__(
        self, fn: Callable[Concatenate[Any, P], Coroutine[Any, Any, R_co]]
    ) -> AsyncEndpointProperty[P, R_co]: ...
    @overload
    def __call__(self, fn: Callable[Concatenate[Any, P], R_co]) -> EndpointProperty[P, R_co]: ...


class _PortedEndpointDecorator(Protocol):
    """``endpoint(explicit_response_port=True)``: callers pass what follows the port, and get
    what the method sends to it (not typed: whatever ``port.send`` is given)."""

    @overload
    def __call__(
        self, fn: Callable[Concatenate[Any, Any, P], Coroutine[Any, Any, object]]
    ) -> AsyncEndpointProperty[P, Any]: ...
    @overload
    def __call__(
        self, fn: Callable[Concatenate[Any, Any, P], object]
    ) -> EndpointProperty[P, Any]: ...


@overload
def endpoint(
    fn: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
) -> AsyncEndpointProperty[P, R]: ...
@overload
def endpoint(fn: Callable[Concatenate[Any, P], R]) -> EndpointProperty[P, R]: ...


@overload
def endpoint(
    fn: None = None,
    *,
    explicit_response_port: Literal[True],
    propagate: Any = None,
    instrument: bool = True,
) -> _PortedEndpointDecorator: ...
@overload
def endpoint(fn: None = None, **options: Any) -> _EndpointDecorator: ...
def endpoint(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Mark an actor method (``def`` or ``async def``) as callable through meshes.

    Usable bare (``@endpoint``) or called (``@endpoint(...)``) with Monarch's options:
    ``explicit_response_port=True`` (the method gets a ``Port`` first and answers with
    ``port.send(value)`` or ``port.exception(exc)``); ``propagate`` and ``instrument`` are
    accepted and have no effect (they serve Monarch's tensor engine and tracing). Any other
    option is refused here, where the endpoint is defined.
    """
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise MeshTypeError(
            f"@endpoint got unknown option{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))}; its options are "
            f"{', '.join(map(repr, sorted(_OPTIONS)))}"
        )
    explicit = bool(options.get("explicit_response_port", False))
    if fn is None:
        return lambda f: _make_property(f, explicit)
    return _make_property(fn, explicit)


_OPTIONS = frozenset({"explicit_response_port", "propagate", "instrument"})


@overload
def concurrent_endpoint(
    fn: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
) -> AsyncEndpointProperty[P, R]: ...
@overload
def concurrent_endpoint(fn: None = None, **options: Any) -> _EndpointDecorator: ...
def concurrent_endpoint(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Mark an ``async def`` actor method as an endpoint during whose awaits the actor takes
    other messages (Monarch's ``concurrent_endpoint``): two actors can call each other back
    (a ping that awaits a pong that calls ping again), and slow awaits overlap.

    Calls start in the order they arrive; nothing else is ordered: a call may finish before an
    earlier one, and the actor's state may change across each ``await``. A ``def`` endpoint or
    an ordinary ``@endpoint`` arriving meanwhile runs alone, as always. Outstanding calls are
    cancelled (their callers get the ``CancelledError``) before ``__cleanup__`` runs. Takes
    ``@endpoint``'s options.
    """
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        endpoint(**options)  # refuses them, with endpoint's message

    def make(f: Callable[..., Any]) -> EndpointProperty[..., Any]:
        if not inspect.iscoroutinefunction(f):
            raise MeshTypeError(
                f"@concurrent_endpoint {f.__qualname__} must be an async def: only an await "
                "lets other messages in"
            )
        return _make_property(f, bool(options.get("explicit_response_port", False)), True)

    return make if fn is None else make(fn)


def _make_property(
    fn: Callable[..., Any], explicit: bool = False, concurrent: bool = False
) -> EndpointProperty[..., Any]:
    if inspect.iscoroutinefunction(fn):
        return AsyncEndpointProperty(fn, explicit, concurrent)
    return EndpointProperty(fn, explicit)


def endpoint_names(cls: type) -> list[str]:
    return sorted(
        name
        for klass in cls.__mro__
        for name, value in vars(klass).items()
        if isinstance(value, EndpointProperty)
    )


def plain_method_names(cls: type) -> frozenset[str]:
    """The public methods of ``cls`` that are not endpoints: what ``as_endpoint`` can call."""
    names = set()
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if name.startswith("_") or isinstance(value, EndpointProperty):
                names.discard(name)
            elif inspect.isfunction(value):
                names.add(name)
            else:
                names.discard(name)
    return frozenset(names)


def explicit_port_endpoints(cls: type) -> frozenset[str]:
    """The endpoints of ``cls`` declared with ``explicit_response_port=True``."""
    return _endpoints_where(cls, lambda e: e.explicit_response_port)


def concurrent_endpoints(cls: type) -> frozenset[str]:
    """The endpoints of ``cls`` declared with ``@concurrent_endpoint``."""
    return _endpoints_where(cls, lambda e: e.concurrent)


def _endpoints_where(
    cls: type, test: Callable[[EndpointProperty[..., Any]], bool]
) -> frozenset[str]:
    found = set()
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, EndpointProperty) and test(value):
                found.add(name)
            elif name in found:
                found.discard(name)  # overridden by a plain method or endpoint
    return frozenset(found)

"""``ActorMesh``: one actor per rank of a (slice of a) proc mesh, called through its endpoints."""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Generic, TypeVar

from ...errors import MeshUsageError, UnknownEndpointError
from ..actors import Future, completed_future
from ..mesh_shape import MeshShape, NoPublicConstructor
from ..messaging import current_node, node_if_started
from ..messaging.protocol import STOP_ACTOR, shape_state
from ..shape import Shape
from . import relay
from .collect import Gather
from .endpoint import Endpoint, NotAnEndpoint, no_values
from .proc_table import ProcTable
from .value_mesh import ValueMesh, new_value_mesh

logger = logging.getLogger(__name__)

A = TypeVar("A")


class ActorMesh(MeshShape, Generic[A], metaclass=NoPublicConstructor):
    """Actors of one class, one per rank, made by ``ProcMesh.spawn``. Not constructed by users.

    ``mesh.<endpoint>`` gives an :class:`Endpoint` with the adverbs (``call``, ``call_one``,
    ``choose``, ``broadcast``, ``stream``). Slicing (``mesh.slice(gpus=0)``) is bookkeeping; it
    sends nothing. Actor meshes are picklable: an actor that receives one can call it, and the
    replies go straight to that actor.

    ``initialized`` is a future that completes once every rank ran ``__init__`` (or fails with
    the ``ActorError`` of the ranks whose ``__init__`` raised).
    """

    _procs: ProcTable
    _key: str
    _name: str
    _class_name: str
    _endpoints: frozenset[str]
    _initialized: Future[Any] | None
    _spawned: Shape  # the whole mesh, as spawned: ranks are named by their coordinates in it
    _routes: _Routes
    _methods: frozenset[str]  # the class's plain methods: ``as_endpoint(mesh.method)`` calls them

    _not_constructed = "ActorMesh is not constructed directly; use proc_mesh.spawn(name, Cls)"

    @classmethod
    def _create(
        cls,
        procs: ProcTable,
        shape: Shape,
        key: str,
        name: str,
        class_name: str,
        endpoints: frozenset[str],
        initialized: Future[Any] | None,
        spawned: Shape | None = None,
        methods: frozenset[str] = frozenset(),
    ) -> ActorMesh[A]:
        self = object.__new__(cls)
        self._procs = procs
        self._shape = shape
        self._key = key
        self._name = name
        self._class_name = class_name
        self._endpoints = endpoints
        self._initialized = initialized
        self._spawned = shape if spawned is None else spawned
        self._routes = _routes_of(procs, key)
        self._methods = methods
        return self

    def _new_with_shape(self, shape: Shape) -> ActorMesh[A]:
        return ActorMesh._create(
            self._procs,
            shape,
            self._key,
            self._name,
            self._class_name,
            self._endpoints,
            self._initialized,
            self._spawned,
            self._methods,
        )

    @property
    def initialized(self) -> Future[ValueMesh[None]]:
        if self._initialized is None:
            return completed_future(new_value_mesh(self._shape, [None] * len(self._shape)))
        return self._initialized

    def stop(self) -> Future[None]:
        """Stop the actors of this mesh (or slice), leaving their processes running; the
        future completes when each has run its ``__cleanup__(None)`` (sync or async), or fails
        with the ``ActorError`` of those whose ``__cleanup__`` raised. Calls sent before the
        stop are handled first; calls after it raise ``MeshClosedError`` here (elsewhere, an
        ``ActorSupervisionError`` from the stopped actor). Stopping twice is harmless. An actor
        still in its ``__init__`` is interrupted, or stopped without it (stand_in.py)."""
        procs, shape = self._procs, self._shape
        stopped = procs.stopped_actors.setdefault(self._key, set())
        ranks = [r for r in shape.ranks() if r not in stopped]
        if not ranks:
            return completed_future(None)
        stopped.update(ranks)
        gather: Gather[None] = Gather(f"{self._name}.stop", procs, shape, no_values)
        for index, rank in enumerate(shape.ranks()):
            if rank not in ranks:
                gather.deliver(index, False, None)  # stopped by an earlier stop()
        node = current_node()
        port = gather.port = node.open_port(gather)
        envelope = (STOP_ACTOR, self._key, shape_state(shape), (tuple(port.address), port.port_id))
        # The route calls take (relay.py), so the stop arrives after the calls sent before it.
        relay.send(node, procs, shape, shape_state(shape), envelope, collector=gather)
        return gather.future

    # Endpoint[Any, Any] to a type checker; with the mypy plugin actormesh.mypy_plugin it is
    # Endpoint[P, R] of A's @endpoint method ``name`` (why not Monarch's way: actors/actor.py).
    def __getattr__(self, name: str) -> Endpoint[Any, Any]:
        if name.startswith("__") or name not in self._endpoints:
            if name.startswith("_"):
                raise AttributeError(name)
            if name in self._methods:
                return NotAnEndpoint(self._endpoint(name), self._class_name, name)  # type: ignore[return-value]
            known = ", ".join(sorted(self._endpoints)) or "(none)"
            raise UnknownEndpointError(
                f"{self._class_name} has no endpoint {name!r}; its endpoints are: {known} "
                f"(mark a method with @actormesh.endpoint to call it through a mesh)"
            )
        endpoint = self._endpoint(name)
        self.__dict__[name] = endpoint  # made once: ``mesh.ping`` is on every call's path
        return endpoint

    def _endpoint(self, name: str) -> Endpoint[Any, Any]:
        return Endpoint(
            self._procs, self._shape, self._key, self._name, name, self._spawned, self._routes
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _restore,
            (
                self._procs,
                self._shape,
                self._key,
                self._name,
                self._class_name,
                self._endpoints,
                self._spawned,
                self._methods,
            ),
        )

    def __repr__(self) -> str:
        return f"<ActorMesh {self._name}: {self._class_name} on {self._shape.extent}>"


def new_actor_mesh(
    procs: ProcTable,
    shape: Shape,
    key: str,
    name: str,
    class_name: str,
    endpoints: frozenset[str],
    initialized: Future[Any] | None,
    spawned: Shape | None = None,
    methods: frozenset[str] = frozenset(),
) -> ActorMesh[Any]:
    """An ``ActorMesh`` on the actors of mesh ``key`` (spawned as ``name``, of class
    ``class_name``) in the processes of ``procs``, the view ``shape`` of the mesh ``spawned``.
    ``initialized`` completes once every rank ran ``__init__`` (None: it did already)."""
    return ActorMesh._create(  # noqa: SLF001  the factory of this module's class
        procs, shape, key, name, class_name, endpoints, initialized, spawned, methods
    )


def _restore(
    procs: ProcTable,
    shape: Shape,
    key: str,
    name: str,
    class_name: str,
    endpoints: frozenset[str],
    spawned: Shape | None = None,
    methods: frozenset[str] = frozenset(),
) -> ActorMesh[Any]:
    return new_actor_mesh(procs, shape, key, name, class_name, endpoints, None, spawned, methods)


def actor_key(mesh: ActorMesh[Any]) -> str:
    """The key the actors of ``mesh`` are known by in their processes (a function: an attribute
    on the mesh would hide an endpoint of the same name)."""
    return mesh._key  # noqa: SLF001  read for tools (the kernel binds a rank's actor by it)


class _Routes:
    """Held by every handle on one actor mesh in this process (slices and copies too): when
    the last goes, the sockets straight to its actors are closed, two descriptors per rank
    that a notebook re-running a spawning cell would otherwise pile up until none is left."""

    __slots__ = ("__weakref__",)


_routes: weakref.WeakValueDictionary[str, _Routes] = weakref.WeakValueDictionary()
_routes_lock = threading.Lock()


def _routes_of(procs: ProcTable, key: str) -> _Routes:
    with _routes_lock:
        routes = _routes.get(key)
        if routes is None:
            routes = _routes[key] = _Routes()
            weakref.finalize(routes, _release, procs, key)
        return routes


def _release(procs: ProcTable, key: str) -> None:
    # A finalizer: it runs inside whatever the garbage collector interrupted, so it must not
    # raise (and only hands the work to the I/O thread).
    try:
        node = node_if_started()
        if node is not None:
            node.transport.release_actor(list(procs.addresses), key)
    except Exception:
        logger.debug("releasing the routes of actor mesh %s failed", key, exc_info=True)


def refuse_hidden_endpoints(cls: type, endpoints: frozenset[str]) -> None:
    """An endpoint named like an attribute of ``ActorMesh`` (``size``, ``slice``, ...) would be
    unreachable: ``mesh.size`` finds the mesh's method first."""
    hidden = sorted(n for n in endpoints if hasattr(ActorMesh, n))
    if hidden:
        raise MeshUsageError(
            f"{cls.__qualname__} has endpoint {hidden[0]!r}, the name of an ActorMesh "
            f"attribute (a mesh method): mesh.{hidden[0]} would reach the mesh, never the "
            f"endpoint; rename it (taken: {', '.join(hidden)})"
        )

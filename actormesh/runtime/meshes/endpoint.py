"""The adverbs of an endpoint on a mesh: ``call``, ``call_one``, ``choose``, ``broadcast``,
``stream``; and the collectors that turn replies into futures.

A cast pickles the arguments once and sends one message per destination process (each with the
same payload and digest). Replies come back to a port of the caller's process, where a collector
gathers them on the I/O thread (those of a ``call`` to ranks on other hosts come one message per
host, gathered by its agent: relay.py). A process that dies fails the collector at once.
"""

from __future__ import annotations

import random
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from ... import config
from ...errors import (
    MeshClosedError,
    MeshTypeError,
    MeshUsageError,
    ProcDeath,
    RemoteFailure,
    SupervisionError,
)
from ..actors import Future
from ..faults import raise_pending
from ..messaging import (
    Port,
    current_node,
    payload_digest,
    spawn_hint,
    thread_reply_inbox,
)
from ..messaging.protocol import CALL, shape_state
from . import relay
from .tensor_seam import tensor_layer
from .value_mesh import ValueMesh, new_value_mesh

if TYPE_CHECKING:
    from ..messaging import Node
    from ..shape import Shape
    from .proc_table import ProcTable

from .arguments import pickle_arguments
from .collect import Collector, Gather, GatherOne, Stream

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


def _all_on(addresses: list[Any], ranks: tuple[int, ...], host: str) -> bool:
    """Whether the processes of ``ranks`` all live on ``host`` (a loop: a generator in
    ``all()`` costs more than the one comparison of a ``call_one``)."""
    for rank in ranks:  # noqa: SIM110  see above
        if addresses[rank].host != host:
            return False
    return True


def no_values(_: list[Any]) -> None:
    """The result of a gather whose replies only say "done" (spawns, re-spawns)."""
    return None


class Endpoint(Generic[P, R]):
    """An endpoint of an actor mesh (``mesh.step``). Not constructed by users.

    Every adverb sends without waiting. ``call``/``call_one``/``choose`` return a
    :class:`Future`; ``broadcast`` returns nothing (an exception it raises is reported to the
    mesh's owner); ``stream`` iterates over futures as replies arrive.
    """

    def __init__(
        self,
        procs: ProcTable,
        shape: Shape,
        key: str,
        mesh_name: str,
        name: str,
        full: Shape | None = None,
        routes: object = None,
    ) -> None:
        # The mesh's fields, not the mesh: an endpoint is made by its ActorMesh (which never
        # changes them) and reads them on every call.
        # ``routes``: held so the sockets to the actors stay open while the endpoint can send
        # (an endpoint outlives the handle it came from: ``procs.spawn(...).step.call()``).
        self._routes = routes
        self._procs = procs
        self._shape = shape
        self._size = len(shape)  # call_one checks it on every call
        # The mesh as spawned: errors name a rank by its coordinates there, not in a slice.
        self._full = shape if full is None else full
        self._key = key
        self._what = f"{mesh_name}.{name}"
        self._name = name
        self._state = shape_state(shape)  # the envelope's form of the mesh's shape

    def __repr__(self) -> str:
        return f"<endpoint {self._what} on {self._shape.extent}>"

    # -- adverbs ---------------------------------------------------------------------------------

    def call(self, *args: P.args, **kwargs: P.kwargs) -> Future[ValueMesh[R]]:
        """Call every actor of the mesh; the future gives a ``ValueMesh`` of their results.

        Fails with ``ActorError`` once all ranks answered if any raised (identical tracebacks
        grouped), and with ``SupervisionError`` as soon as any rank's process dies.
        """
        shape = self._shape
        gather = Gather(self._what, self._procs, shape, partial(new_value_mesh, shape), self._full)
        self.cast(shape, args, kwargs, gather)
        return gather.future

    def call_one(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call the only actor of a one-actor mesh (slice first); the future gives its result."""
        shape = self._shape
        if self._size != 1:
            dims = [d for d, n in zip(shape.labels, shape.sizes, strict=True) if n > 1]
            hint = f"mesh.slice({dims[0]}=0).{self._name}.call_one(...)" if dims else ""
            raise MeshUsageError(
                f"call_one needs exactly one actor, but {self._what} is called on "
                f"{len(shape)} actors (extent {shape.extent}); slice the mesh to one actor, "
                f"e.g. {hint}, or use call() to reach them all"
            )
        gather: GatherOne[R] = GatherOne(self._what, self._procs, shape, self._full)
        self.cast(shape, args, kwargs, gather)
        return gather.future

    def choose(self, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Call one actor of the mesh, chosen at random among live ones."""
        shape = self._chosen()
        gather: GatherOne[R] = GatherOne(self._what, self._procs, shape, self._full)
        self.cast(shape, args, kwargs, gather)
        return gather.future

    def _chosen(self) -> Shape:
        """The one-actor view of a live actor of the mesh, chosen at random."""
        node = current_node()
        view = self._shape
        ranks = view.ranks()
        live = [r for r in ranks if self._procs.addresses[r].mailbox not in node.dead] or ranks
        index = view.local_index(random.choice(live))
        assert index is not None
        return view.slice(**dict(view.point(index)))

    def send_to(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        port: Port | None = None,
        selection: str = "all",
    ) -> None:
        """Monarch's ``send(endpoint, args, kwargs, port=, selection=)`` (use that name): call
        every actor (``selection="all"``) or one live one (``"choose"``) without waiting; each
        answer goes to ``port`` as its rank's value (``Channel.open_ranked`` gives the ranks),
        a failure as a failed value. Without a port it is ``broadcast``."""
        if selection not in ("all", "choose"):
            raise MeshUsageError(f'selection must be "all" or "choose", got {selection!r}')
        shape = self._shape if selection == "all" else self._chosen()
        forward = None if port is None else Forward(self._what, self._procs, shape, port)
        self.cast(shape, args, kwargs, forward)

    def broadcast(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Send to every actor of the mesh without waiting for anything (fire and forget)."""
        self.cast(self._shape, args, kwargs, None)

    def stream(self, *args: P.args, **kwargs: P.kwargs) -> Stream[R]:
        """Call every actor; iterate over one completed future per rank, in arrival order.

        ``for fut in mesh.ep.stream(x): fut.get()`` or ``async for fut in ...``.
        """
        shape = self._shape
        stream: Stream[R] = Stream(self._what, self._procs, shape, self._full)
        self.cast(shape, args, kwargs, stream)
        return stream

    def rref(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        """Monarch's ``rref``: a step of the tensor engine's op stream that calls this endpoint
        on every actor (on its own thread, after the tensor ops issued before it, with each
        MeshTensor argument as that rank's local value) and keeps the results on the ranks:
        they come back at once as per-rank MeshTensors that later ops read without a round
        trip. The actors must live on the processes of the tensor mesh of a MeshTensor argument
        (or of ``procs.activate()``'s mesh)."""
        return tensor_layer("endpoint.rref").rref(self._key, self._name, args, kwargs)

    # -- sending ---------------------------------------------------------------------------------

    def cast(
        self,
        shape: Shape,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        collector: Collector[Any] | None,
    ) -> None:
        """Send ``endpoint(*args, **kwargs)`` to the ranks of ``shape`` (a view of this mesh),
        their replies to ``collector`` (a :class:`Collector`; ``None``: no reply). The adverbs
        are made of it; tools use it with a collector of their own (the kernel's cells)."""
        raise_pending()
        procs = self._procs
        if procs.closed or procs.stopped_actors:
            self._refuse_if_stopped(shape)
        ranks = shape.ranks()
        payload, buffers = pickle_arguments(args, kwargs, self._what, (procs, ranks))
        node = current_node()
        transport = node.transport
        reply = None if collector is None else _reply_to(collector, node, procs, ranks)
        # Plain tuples pickle several times faster than the Shape and Port objects they stand for.
        state = self._state if shape is self._shape else shape_state(shape)
        envelope = (CALL, self._key, self._name, state, reply)
        digest = payload_digest(payload)
        if procs.relays is not None:  # ranks on other hosts: one message per host (relay.py)
            # and, for call(), one message per host back: the agents gather the replies
            window = config.REPLY_WINDOW if isinstance(collector, Gather) and len(shape) > 1 else 0
            what = self._what
            relay.cast(
                node, procs, shape, envelope, payload, buffers, digest, collector, what, window
            )
            return
        dead = node.dead
        key = self._key
        dests = []
        for rank in ranks:
            address = procs.addresses[rank]
            death = dead.get(address.mailbox)
            if death is not None:
                if collector is not None:
                    collector.on_death(address.mailbox, death)
                    continue
                raise SupervisionError([death], f"cannot broadcast to {self._what}")
            dests.append(transport.route_to_actor(address, key))
        if collector is None and not buffers:
            for dest in dests:  # batched with the casts that follow (send_one_way)
                transport.send_one_way(dest, envelope, payload)
        elif len(dests) == 1:
            transport.send(dests[0], envelope, payload, buffers, digest)
        elif dests:
            transport.send_many(dests, envelope, payload, buffers, digest)

    def _refuse_if_stopped(self, shape: Shape) -> None:
        procs = self._procs
        if procs.closed:
            raise MeshClosedError(
                f"cannot call {self._what}: its proc mesh was stopped; {spawn_hint('a new one')}"
            )
        stopped = procs.stopped_actors.get(self._key)
        if stopped and not stopped.isdisjoint(shape.ranks()):
            raise MeshClosedError(f"cannot call {self._what}: its actor mesh was stopped")


def _reply_to(
    collector: Collector[Any], node: Node, procs: ProcTable, ranks: tuple[int, ...]
) -> tuple[Any, ...]:
    """Where the replies of a cast go: a port of this process for ``collector``, read by the
    waiting thread itself (its reply inbox) when it waits and every rank is on this host."""
    inbox = None
    if collector.read_by_waiter and _all_on(procs.addresses, ranks, node.transport.host_id):
        inbox = thread_reply_inbox(node)  # replies read by this thread as it waits
    if inbox is None:
        port = collector.port = node.open_port(collector)
        return (tuple(port.address), port.port_id)
    port = collector.port = node.open_port(collector, inbox.address)
    # The repliers also learn this process's mailbox (see Node.in_order).
    return (inbox.address_state, port.port_id, node.address.mailbox)


class NotAnEndpoint:
    """``mesh.method`` for a public method of the actor that is not marked ``@endpoint``:
    not callable as it is; ``as_endpoint(mesh.method)`` makes it an endpoint (Monarch's)."""

    def __init__(self, endpoint: Endpoint[Any, Any], class_name: str, name: str) -> None:
        self.endpoint = endpoint
        self._what = f"{class_name}.{name}"
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise MeshTypeError(
            f"{self._what} is not an endpoint: mark it with @endpoint, or call it through "
            f"as_endpoint(mesh.{self._name})"
        )

    def __repr__(self) -> str:
        return f"<not an endpoint: {self._what}>"


def as_endpoint(
    method: NotAnEndpoint | Endpoint[Any, Any],
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
) -> Endpoint[Any, Any]:
    """Monarch's ``as_endpoint``: a plain method of the actors of a mesh
    (``as_endpoint(mesh.method)``), called with the adverbs of an endpoint. ``propagate`` is
    accepted and has no effect (it serves Monarch's tensor engine)."""
    if explicit_response_port:
        raise MeshUsageError(
            "as_endpoint(explicit_response_port=True) is not supported: declare the method "
            "with @endpoint(explicit_response_port=True)"
        )
    if isinstance(method, Endpoint):
        return method
    if isinstance(method, NotAnEndpoint):
        return method.endpoint
    raise MeshUsageError(
        f"as_endpoint takes mesh.method (a method of an actor mesh), got {method!r}"
    )


def send(
    endpoint: Endpoint[Any, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    port: Port | None = None,
    selection: str = "all",
) -> None:
    """Monarch's ``send``: ``endpoint`` called with ``args`` and ``kwargs`` on every actor
    (``selection="all"``) or one (``"choose"``), each answer sent to ``port`` (none: fire and
    forget, as ``broadcast``). See ``Endpoint.send_to``."""
    endpoint.send_to(args, kwargs, port, selection)


class Forward(Collector[Any]):
    """Sends each rank's answer on to a user's port, with the rank's index in the call (what
    ``PortReceiver.ranked()`` gives); a failure, or a death, fails that value."""

    def __init__(self, what: str, procs: ProcTable, shape: Shape, port: Port) -> None:
        super().__init__(what, procs, shape)
        self.target = port

    def deliver(self, index: int, failed: bool, value: Any) -> None:
        if self.record(index, value) is None:
            return
        if isinstance(value, ProcDeath):
            text = value.describe()
            value = RemoteFailure(value.rank, self.what, "", "SupervisionError", text, text)
        self.target.forward(value, index, failed)

"""Ports for fan-in and streaming: ``Channel.open()`` gives a ``(Port, PortReceiver)`` pair;
``Accumulator`` folds the replies of a call."""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ...errors import MeshUsageError, ProcDeath, RemoteFailure, actor_error
from ..actors import Future, set_exception, set_result
from ..mesh_shape import NoPublicConstructor
from ..messaging import FAILED_VALUE, OK_VALUE, Message, Port, current_node
from ..messaging.envelopes import PortEnvelope
from .endpoint import Endpoint
from .value_mesh import ValueMesh

T = TypeVar("T")
U = TypeVar("U")

__all__ = ["Accumulator", "Channel", "Port", "PortReceiver"]


class PortReceiver(Generic[T], metaclass=NoPublicConstructor):
    """The receiving end of a channel, in the process that opened it.

    ``recv()`` returns a :class:`Future` of the next value sent to the port (values arrive per
    sender in order); a value sent with ``port.exception(exc)`` fails it with an ``ActorError``.
    ``ranked()`` gives a receiver of the same port whose values come as ``(rank, value)``.
    Not constructed by users: use ``Channel.open()``.
    """

    _values: queue.SimpleQueue[tuple[int | None, int, Any]]
    _waiters: queue.SimpleQueue[tuple[Future[Any], bool]]
    _port: Port | None
    _once: bool
    _ranked: bool

    _not_constructed = "PortReceiver is not constructed directly; use Channel.open()"

    @classmethod
    def _create(cls, once: bool = False) -> PortReceiver[T]:
        self = object.__new__(cls)
        self._values = queue.SimpleQueue()
        self._waiters = queue.SimpleQueue()
        self._port = None
        self._once = once
        self._ranked = False
        return self

    # PortHandler protocol (I/O thread)
    def on_message(self, msg: Message) -> None:
        sent = PortEnvelope.of(msg)
        status = OK_VALUE if sent.status is None else sent.status
        if self._once:
            self.close()  # a once port takes one value; later ones are dropped
        self._deliver((sent.rank, status, msg.value()))

    def on_death(self, mailbox: bytes, death: ProcDeath) -> bool:
        return False  # a port does not know its senders; a dead sender simply sends no more

    def ranked(self) -> PortReceiver[tuple[int | None, T]]:
        """A receiver of the same port whose ``recv()`` gives ``(rank, value)``: the rank of the
        sender in the slice that messaged it (``None`` when sent from outside an endpoint).
        Both receivers take from the same values."""
        other: PortReceiver[tuple[int | None, T]] = object.__new__(PortReceiver)
        other.__dict__.update(self.__dict__)
        other._ranked = True
        return other

    def recv(self) -> Future[T]:
        """A future of the next value to arrive on this port."""
        fut: Future[T] = Future(lambda: "a value on the port")
        try:
            _settle(fut, self._ranked, self._values.get_nowait())
        except queue.Empty:
            self._waiters.put((fut, self._ranked))
            # A value may have arrived between the two steps: hand it over.
            try:
                entry = self._values.get_nowait()
            except queue.Empty:
                return fut
            self._deliver(entry)
        return fut

    def _deliver(self, entry: tuple[int | None, int, Any]) -> None:
        while True:
            try:
                waiter, ranked = self._waiters.get_nowait()
            except queue.Empty:
                self._values.put(entry)
                return
            if _settle(waiter, ranked, entry):
                return

    def close(self) -> None:
        if self._port is not None:
            current_node().close_port(self._port)


def _settle(fut: Future[Any], ranked: bool, entry: tuple[int | None, int, Any]) -> bool:
    rank, status, value = entry
    if status == FAILED_VALUE:
        failure = value if isinstance(value, RemoteFailure) else None
        if failure is None:
            return set_exception(fut, MeshUsageError(f"a port received a bad failure {value!r}"))
        return set_exception(fut, actor_error([failure]))
    return set_result(fut, (rank, value) if ranked else value)


class Channel(Generic[T]):
    """Factory of ports: ``port, receiver = Channel.open()``."""

    @staticmethod
    def open(once: bool = False) -> tuple[Port, PortReceiver[Any]]:
        """Open a port in this process. The ``Port`` is picklable and can be sent to actors,
        which ``port.send(value)`` to it; the ``PortReceiver`` stays here. A ``once`` port
        takes one value and then closes (later values are dropped)."""
        receiver: PortReceiver[Any] = PortReceiver._create(once)  # noqa: SLF001  same module
        port = current_node().open_port(receiver)
        receiver._port = port  # noqa: SLF001  same module: the port exists only once routed to it
        return port, receiver

    @staticmethod
    def open_ranked(once: bool = False) -> tuple[Port, PortReceiver[tuple[int | None, Any]]]:
        """``Channel.open()`` with a receiver whose values come as ``(rank, value)``."""
        port, receiver = Channel.open(once)
        return port, receiver.ranked()


class Accumulator(Generic[T, U]):
    """Fold the replies of an endpoint: ``Accumulator(mesh.ep, 0, operator.add).accumulate(x)``
    calls every actor and gives a future of ``combine(...combine(identity, v0)..., vN)``."""

    def __init__(self, endpoint: Endpoint[Any, T], identity: U, combine: Callable[[U, T], U]):
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine

    def accumulate(self, *args: Any, **kwargs: Any) -> Future[U]:
        result: Future[U] = Future(lambda: "the replies to accumulate")
        call = self._endpoint.call(*args, **kwargs)

        def fold(done: Future[ValueMesh[T]]) -> None:
            exc = done.exception()
            if exc is not None:
                set_exception(result, exc)
                return
            acc = self._identity
            try:
                for value in done.get().values():
                    acc = self._combine(acc, value)
            except Exception as e:
                set_exception(result, e)
                return
            set_result(result, acc)

        call.add_done_callback(fold)
        return result

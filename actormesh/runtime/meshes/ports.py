"""Ports for fan-in and streaming: ``Channel.open()`` gives a ``(Port, PortReceiver)`` pair;
``Accumulator`` folds the replies of a call."""

from __future__ import annotations

import queue
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ...errors import ProcDeath
from ..actors.future import Future
from ..messaging.codec import Message
from ..messaging.node import Port, current_node
from ..shape import NoPublicConstructor
from .endpoint import Endpoint
from .value_mesh import ValueMesh

T = TypeVar("T")
U = TypeVar("U")

__all__ = ["Accumulator", "Channel", "Port", "PortReceiver"]


class PortReceiver(Generic[T], metaclass=NoPublicConstructor):
    """The receiving end of a channel, in the process that opened it.

    ``recv()`` returns a :class:`Future` of the next value sent to the port (values arrive per
    sender in order). Not constructed by users: use ``Channel.open()``.
    """

    _values: queue.SimpleQueue[Any]
    _waiters: queue.SimpleQueue[Future[T]]
    _port: Port | None

    _not_constructed = "PortReceiver is not constructed directly; use Channel.open()"

    @classmethod
    def _create(cls) -> PortReceiver[T]:
        self = object.__new__(cls)
        self._values = queue.SimpleQueue()
        self._waiters = queue.SimpleQueue()
        self._port = None
        return self

    # PortHandler protocol (I/O thread)
    def on_message(self, msg: Message) -> None:
        self._deliver(msg.value())

    def on_death(self, mailbox: bytes, death: ProcDeath) -> bool:
        return False  # a port does not know its senders; a dead sender simply sends no more

    def recv(self) -> Future[T]:
        """A future of the next value to arrive on this port."""
        fut: Future[T] = Future(lambda: "a value on the port")
        try:
            fut._set_result(self._values.get_nowait())
        except queue.Empty:
            self._waiters.put(fut)
            # A value may have arrived between the two steps: hand it over.
            try:
                value = self._values.get_nowait()
            except queue.Empty:
                return fut
            self._deliver(value)
        return fut

    def _deliver(self, value: Any) -> None:
        while True:
            try:
                waiter = self._waiters.get_nowait()
            except queue.Empty:
                self._values.put(value)
                return
            if waiter._set_result(value):
                return

    def close(self) -> None:
        if self._port is not None:
            current_node().close_port(self._port)


class Channel(Generic[T]):
    """Factory of ports: ``port, receiver = Channel.open()``."""

    @staticmethod
    def open() -> tuple[Port, PortReceiver[Any]]:
        """Open a port in this process. The ``Port`` is picklable and can be sent to actors,
        which ``port.send(value)`` to it; the ``PortReceiver`` stays here."""
        receiver: PortReceiver[Any] = PortReceiver._create()
        port = current_node().open_port(receiver)
        receiver._port = port  # noqa: SLF001  same module: the port exists only once routed to it
        return port, receiver


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
                result._set_exception(exc)
                return
            acc = self._identity
            try:
                for value in done.get().values():
                    acc = self._combine(acc, value)
            except Exception as e:
                result._set_exception(e)
                return
            result._set_result(acc)

        call.add_done_callback(fold)
        return result

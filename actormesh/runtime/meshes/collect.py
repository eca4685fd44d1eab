"""Reply collection on the caller's side: one reply per rank gathered into a ``ValueMesh``
(``Gather``), or handed over as they come (``Stream``)."""

from __future__ import annotations

import pickle
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ... import config
from ...errors import (
    MeshTimeoutError,
    ProcDeath,
    RemoteFailure,
    SupervisionError,
    actor_error,
)
from ..actors import Future, completed_future, failed_future, set_exception, set_result
from ..extent import point_label
from ..messaging import Message, Node, Port, current_node
from ..messaging.envelopes import ReplyEnvelope
from ..messaging.protocol import FAILED, OK

if TYPE_CHECKING:
    from ..shape import Shape
    from .proc_table import ProcTable

T = TypeVar("T")
# A rank that has not answered yet (None is a valid reply).
MISSING: Any = object()
_pickle_loads = pickle.loads


class Collector(Generic[T]):
    """Gathers one reply per rank of ``shape`` on the caller's I/O thread."""

    # Whether the caller reads the replies itself while it waits for them (from its thread's
    # reply inbox, when it has one: see reply_inbox.py) rather than the I/O thread.
    read_by_waiter = False

    def __init__(
        self, what: str, procs: ProcTable, shape: Shape, full: Shape | None = None
    ) -> None:
        self.node: Node = current_node()
        self.what = what
        self.procs = procs
        self.shape = shape
        # The shape the actors were spawned with: a rank is named by its coordinates there (as
        # the actor names itself), not by those in the slice that was called.
        self.full = full
        self.n = len(shape)
        self.values: list[Any] = [MISSING] * self.n
        self.remaining = self.n
        self.lock = threading.Lock()
        self.port: Port | None = None

    def rank_name(self, index: int) -> str:
        """``{hosts=0, gpus=2}``: the coordinates of the slice's rank ``index``."""
        point = None
        if self.full is not None:
            point = self.full.point_of_global(self.shape.global_rank(index))
        return point_label(self.shape.point(index) if point is None else point)

    def missing_ranks(self) -> str:
        missing = [self.rank_name(i) for i, v in enumerate(self.values) if v is MISSING]
        shown = ", ".join(missing[:8]) + (
            f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        )
        return f"replies to {self.what} from rank {shown}"

    def describe_timeout(self) -> str:
        """What a timed-out wait was for, and why nothing answers when the ranks are waiting
        for each other (waits.py)."""
        from .waits import describe_wait_chain

        return self.missing_ranks() + describe_wait_chain(self.pending_ranks())

    def pending_ranks(self) -> list[tuple[str, int]]:
        """``(mesh_id, rank)`` of the ranks that have not answered yet."""
        mesh_id = self.procs.mesh_id
        return [
            (mesh_id, self.shape.global_rank(i)) for i, v in enumerate(self.values) if v is MISSING
        ]

    def on_message(self, msg: Message) -> None:
        reply = ReplyEnvelope.of(msg)
        index, status = reply.index, reply.status
        try:
            value = msg.value()
        except Exception as exc:
            status, value = FAILED, self.unreadable(index, exc)
        if status == FAILED and not isinstance(value, RemoteFailure):
            status, value = (
                FAILED,
                RemoteFailure(self.rank_name(index), self.what, "", "Error", repr(value), ""),
            )
        self.deliver(index, status == FAILED, value)

    def unreadable(self, index: int, exc: Exception) -> RemoteFailure:
        """The failure of rank ``index`` whose reply could not be unpickled here."""
        return RemoteFailure(
            self.rank_name(index),
            self.what,
            "",
            type(exc).__name__,
            f"the reply could not be unpickled in the caller: {exc}",
            "",
        )

    def on_death(self, mailbox: bytes, death: ProcDeath) -> bool:
        observed = False
        for i, rank in enumerate(self.shape.ranks()):
            if self.procs.addresses[rank].mailbox == mailbox and self.values[i] is MISSING:
                self.deliver(i, True, death)
                observed = True
        return observed

    def deliver(self, index: int, failed: bool, value: Any) -> None:
        raise NotImplementedError

    def record(self, index: int, value: Any) -> bool | None:
        """Store rank ``index``'s answer: ``None`` if it had answered already, else whether it was
        the last one. After the last, the port is closed: until then it stays open, even when a
        death already failed the call, so the other deaths of that event are observed too."""
        with self.lock:
            if self.values[index] is not MISSING:
                return None
            self.values[index] = value
            self.remaining -= 1
            last = self.remaining == 0
        if last:
            port = self.port  # close(), inline: this runs for every reply
            if port is not None:
                self.node.close_port(port)
        return last

    def close(self) -> None:
        port = self.port
        if port is not None:
            self.node.close_port(port)


class Gather(Collector[T]):
    read_by_waiter = True  # Future.get reads them

    def __init__(
        self,
        what: str,
        procs: ProcTable,
        shape: Shape,
        finish: Callable[[list[Any]], T],
        full: Shape | None = None,
    ) -> None:
        super().__init__(what, procs, shape, full)
        self.finish = finish
        self.deaths_as_values = False  # stacks(): a dead rank is an answer, not a failure
        self.failures: list[RemoteFailure] = []
        # A call to a few ranks leaves a core to a thread that spins for their replies.
        spin = self.n <= config.SPIN_RANKS
        self.future: Future[T] = Future(self.describe_timeout, self.pending_ranks, spin)

    def on_message(self, msg: Message) -> None:
        # A rank that answered (the common case: every reply of a call_one, a choose or a call
        # that succeeds, read by the caller's thread as it waits) is recorded here, without the
        # general path's value -> deliver chain.
        reply = ReplyEnvelope.of(msg)
        index, status = reply.index, reply.status
        if status != OK:
            super().on_message(msg)
            return
        try:
            value = _pickle_loads(msg.payload, buffers=msg.buffers)
        except Exception as exc:
            self.deliver(index, True, self.unreadable(index, exc))
            return
        self.answered(index, value)

    def answered(self, index: int, value: Any) -> None:
        """Rank ``index`` answered ``value`` (it did not fail)."""
        if self.record(index, value) and not self.future.done():  # not failed by a death
            self._complete()

    def deliver(self, index: int, failed: bool, value: Any) -> None:
        done = self.record(index, value)
        if done is None or self.future.done():
            return
        if failed and isinstance(value, ProcDeath) and self.deaths_as_values:
            self.values[index] = f"(dead: {value.describe()})\n"
            failed = False
        elif failed and isinstance(value, ProcDeath):
            set_exception(self.future, SupervisionError([value], f"{self.what} cannot complete"))
            return
        if failed:
            self.failures.append(value)
        if done:
            self._complete()

    def _complete(self) -> None:
        """Every rank answered: the future gets the failures, or ``finish`` of the values."""
        if self.failures:
            set_exception(self.future, actor_error(self.failures))
        else:
            set_result(self.future, self.finish(self.values))


class GatherOne(Gather[T]):
    """The reply of one actor (``call_one``, ``choose``): its value is the result."""

    def __init__(self, what: str, procs: ProcTable, shape: Shape, full: Shape | None = None):
        super().__init__(what, procs, shape, _only, full)

    def answered(self, index: int, value: Any) -> None:
        # Gather's, with what one rank needs inline: every call_one's reply comes here.
        with self.lock:
            if self.remaining == 0:
                return  # answered already (or failed by a death)
            self.values[0] = value
            self.remaining = 0
        port = self.port  # close(), inline
        if port is not None:
            self.node.close_port(port)
        set_result(self.future, value)


def _only(values: list[Any]) -> Any:
    return values[0]


class Stream(Collector[T], Generic[T]):
    """Completed futures, one per rank, in the order the replies arrive. Not built by users."""

    def __init__(
        self, what: str, procs: ProcTable, shape: Shape, full: Shape | None = None
    ) -> None:
        super().__init__(what, procs, shape, full)
        self._arrived: queue.SimpleQueue[Future[T]] = queue.SimpleQueue()
        self._yielded = 0

    def deliver(self, index: int, failed: bool, value: Any) -> None:
        if self.record(index, value) is None:
            return
        if isinstance(value, ProcDeath):
            fut: Future[T] = failed_future(SupervisionError([value], f"{self.what} failed"))
        elif failed:
            fut = failed_future(actor_error([value]))
        else:
            fut = completed_future(value)
        self._arrived.put(fut)

    def __iter__(self) -> Iterator[Future[T]]:
        return self

    def __next__(self) -> Future[T]:
        return self.next(timeout=None)

    def next(self, timeout: float | None = None) -> Future[T]:
        """The next arrived reply as a completed future; ``StopIteration`` after the last."""
        if self._yielded >= self.n:
            raise StopIteration
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if wait <= 0:
                raise MeshTimeoutError(f"timed out waiting for {self.missing_ranks()}")
            try:
                fut = self._arrived.get(timeout=wait)
                break
            except queue.Empty:
                continue
        self._yielded += 1
        return fut

    def __aiter__(self) -> AsyncIterator[Future[T]]:
        return self._async_iter()

    async def _async_iter(self) -> AsyncIterator[Future[T]]:
        import asyncio

        loop = asyncio.get_running_loop()
        while self._yielded < self.n:
            yield await loop.run_in_executor(None, self.next)

"""One Future for sync and async callers: ``.get(timeout=)`` blocks, ``await`` suspends.

Results are set from the I/O thread, or by the main thread itself: replies to its calls come to
a socket of its own, which it reads while it waits in ``get`` (``reply_inbox.py``). Waiting
happens on any thread. ``get`` works in a plain script, inside a running event loop (a Jupyter
cell: it blocks that thread only, and the replies are read by that thread or the I/O thread, so
it cannot deadlock), and inside a sync endpoint that calls another actor (the I/O thread reads
the reply).
"""

from __future__ import annotations

import asyncio
import collections.abc
import threading
import time
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

from ... import config
from ...errors import MeshTimeoutError
from ..faults import add_main_waiter, raise_pending, remove_main_waiter
from ..messaging import ReplyInbox, hand_back_replies, waiting_inbox

T = TypeVar("T")
_PENDING, _DONE, _FAILED = 0, 1, 2

# Called with the future every slice of a blocking get() (a few times a second); a hook may
# raise to end the wait early. The debugger ends a notebook cell whose remaining ranks are all
# paused; the runtime never imports it, it registers here.
wait_hooks: list[Callable[[Future[Any]], None]] = []


class Future(Generic[T]):
    """The eventual result of an endpoint call, a port receive, a stop, ...

    Not constructed by users: endpoints, ports and meshes return them.

    - ``get(timeout=None)`` blocks the calling thread until the result is there and returns it
      (or raises the remote failure). ``timeout`` is in seconds; without one, the default from
      ``ACTORMESH_GET_TIMEOUT`` applies (none by default: a dead worker fails the wait anyway).
      Past the deadline it raises :class:`MeshTimeoutError` naming what has not answered.
    - ``await future`` does the same without blocking the event loop.
    - ``result()`` is ``get()``; ``exception()`` waits and returns the error or ``None``;
      ``add_done_callback(fn)`` calls ``fn(future)`` once done, on the thread that completes it
      (the I/O thread, or the main thread while it reads its replies in ``get``): keep it short.
    """

    __slots__ = (
        "_awaiting",
        "_callbacks",
        "_describe_pending",
        "_event",
        "_lock",
        "_pending_ranks",
        "_spin",
        "_state",
        "_value",
        "_waker",
    )

    def __init__(
        self,
        describe_pending: Callable[[], str] | None = None,
        pending_ranks: Callable[[], list[tuple[str, int]]] | None = None,
        spin: bool = False,
    ) -> None:
        self._state = _PENDING
        self._value: Any = None
        self._lock = threading.Lock()
        self._event: threading.Event | None = None
        self._waker: ReplyInbox | None = None  # a thread reading its reply inbox for this
        self._callbacks: list[Callable[[Future[T]], None]] = []
        self._describe_pending = describe_pending
        self._pending_ranks = pending_ranks
        # Whether a thread waiting for this checks for its replies awhile before it sleeps
        # (a call to few ranks: see config.WAIT_SPIN_US).
        self._spin = spin
        self._awaiting: Generator[Any, None, T] | None = None  # see send()

    def pending_ranks(self) -> list[tuple[str, int]]:
        """The ``(mesh_id, rank)`` pairs whose replies this future still waits for, when it is
        a call to a mesh (empty otherwise): what wait hooks (the debugger) look at."""
        return [] if self._pending_ranks is None else self._pending_ranks()

    # -- completing (runtime side: set_result, set_exception below) -------------------------------

    def _complete(self, state: int, value: Any) -> bool:
        with self._lock:
            if self._state != _PENDING:
                return False
            self._state = state
            self._value = value
            event, callbacks, waker = self._event, self._callbacks, self._waker
            self._callbacks = []
            if state == _DONE:
                # These are bound methods of the collector that holds this future, a cycle
                # that would keep the result (a tensor's receive buffer) alive until the
                # garbage collector's next pass. A failed call keeps them: its other ranks'
                # replies still come in, and pending_ranks() says which are still out.
                self._describe_pending = self._pending_ranks = None
        if event is not None:
            event.set()
        if waker is not None and waker.owner_ident != threading.get_ident():
            waker.set()
        for cb in callbacks:
            _run_callback(cb, self)
        return True

    # -- waiting (user side) ---------------------------------------------------------------------

    def done(self) -> bool:
        return self._state != _PENDING

    def get(self, timeout: float | None = None) -> T:
        """Block until done and return the result (or raise). See the class docstring."""
        if self._state == _PENDING:
            self._wait(timeout)
        if self._state == _FAILED:
            raise self._value
        # _value holds the result or the exception; done and not failed, it is the result.
        value: T = self._value
        return value

    def result(self, timeout: float | None = None) -> T:
        return self.get(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == _PENDING:
            self._wait(timeout)
        return self._value if self._state == _FAILED else None

    def _wait(self, timeout: float | None) -> None:
        if timeout is not None and not timeout >= 0:  # also NaN
            raise ValueError(
                f"timeout must be a number of seconds >= 0 (or None: no limit), got {timeout!r}"
            )
        # Until it returns or raises (its timeout's message included): a process asked what
        # its threads wait for answers from this (see blocked_on).
        ident = threading.get_ident()
        _blocked[ident] = self
        try:
            if timeout is None and config.DEFAULT_GET_TIMEOUT > 0:
                timeout = config.DEFAULT_GET_TIMEOUT
            raise_pending()
            inbox = waiting_inbox()
            if inbox is not None:
                # Wait by reading the thread's reply inbox (see reply_inbox.py); inline, as
                # every call_one(...).get() of a script or notebook waits here.
                with self._lock:
                    if self._state != _PENDING:
                        return
                    self._waker = inbox
                try:
                    deadline = None if timeout is None else time.monotonic() + timeout
                    step = 0.25 if wait_hooks else 1.0
                    inbox.wait(self, deadline, self._on_wake, step, self._spin)
                finally:
                    self._waker = None
                if self._state != _PENDING:
                    return
                if not inbox.closed:
                    self._timed_out(timeout)
                # The inbox closed under the wait (the node is closing): wait the ordinary way.
            self._wait_on_event(timeout)
        finally:
            _blocked.pop(ident, None)

    def _wait_on_event(self, timeout: float | None) -> None:
        with self._lock:
            if self._state != _PENDING:
                return
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        # In a script's main thread, an unhandled failure elsewhere wakes this wait (fail fast).
        watched = add_main_waiter(event)
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            while self._state == _PENDING:
                # Wait in slices so that Ctrl-C (KeyboardInterrupt) is delivered promptly.
                step = 0.25 if wait_hooks else 1.0
                left = step if deadline is None else min(step, deadline - time.monotonic())
                if left <= 0:
                    break
                event.wait(left)
                if self._state == _PENDING:
                    self._on_wake()
                    with self._lock:  # woken for nothing: re-arm
                        if self._state == _PENDING:
                            event.clear()
        finally:
            if watched:
                remove_main_waiter(event)
        if self._state == _PENDING:
            self._timed_out(timeout)

    def _on_wake(self) -> None:
        # Every slice of a wait, and when another thread wakes it: failures, wait hooks.
        raise_pending()
        for hook in list(wait_hooks):
            hook(self)

    def _timed_out(self, timeout: float | None) -> None:
        what = self._describe_pending() if self._describe_pending else "the result"
        raise MeshTimeoutError(f"timed out after {timeout:g} s waiting for {what}")

    def add_done_callback(self, fn: Callable[[Future[T]], None]) -> None:
        with self._lock:
            if self._state == _PENDING:
                self._callbacks.append(fn)
                hand_back_replies()  # its reply may be due on the main thread's reply inbox
                return
        _run_callback(fn, self)

    def __await__(self) -> Generator[Any, None, T]:
        if self._state == _PENDING:
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()

            def wake(_: Future[T]) -> None:
                loop.call_soon_threadsafe(_set_if_pending, waiter)

            self.add_done_callback(wake)
            yield from waiter.__await__()
        return self.get()

    # The coroutine protocol, over one ``__await__`` of this future: Monarch code hands a future
    # to what takes a coroutine (``asyncio.run(procs.logging_option(...))``,
    # ``asyncio.create_task(mesh.ep.call())``), since Monarch's are coroutines there. Running
    # it that way once does not stop ``get()`` or ``await`` from working after.

    def send(self, value: None) -> Any:
        if self._awaiting is None:
            self._awaiting = self.__await__()
        return self._awaiting.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if self._awaiting is None:
            self._awaiting = self.__await__()
        if val is None:
            return self._awaiting.throw(typ)
        return self._awaiting.throw(typ, val, tb)

    def close(self) -> None:
        if self._awaiting is not None:
            self._awaiting.close()

    def as_asyncio(self) -> asyncio.Future[T]:
        """An ``asyncio.Future`` of the running event loop that completes as this one does
        (Monarch's ``Future.as_asyncio``): for ``asyncio.wait``, ``gather`` with timeouts, etc.
        Each call gives a new one; this future stays usable with ``get()`` and ``await``.

        Raises:
            RuntimeError: no event loop is running in this thread.
        """
        loop = asyncio.get_running_loop()
        mirror: asyncio.Future[T] = loop.create_future()

        def copy(done: Future[T]) -> None:
            if not mirror.done():
                exc = done.exception()
                if exc is None:
                    mirror.set_result(done.get())
                else:  # asyncio refuses StopIteration as an exception (PEP 479)
                    bad = isinstance(exc, StopIteration)
                    mirror.set_exception(RuntimeError(str(exc)) if bad else exc)

        def on_done(done: Future[T]) -> None:
            if loop.is_closed():
                return  # nobody can await the mirror any more
            try:
                loop.call_soon_threadsafe(copy, done)
            except RuntimeError:
                pass  # the loop closed since the check

        self.add_done_callback(on_done)
        return mirror

    def __repr__(self) -> str:
        state = {_PENDING: "pending", _DONE: "done", _FAILED: "failed"}[self._state]
        return f"<actormesh.Future {state}>"


# asyncio.run, create_task and run_until_complete ask for a coroutine: a future is one.
collections.abc.Coroutine.register(Future)


# -- completing (runtime side) -------------------------------------------------------------------
# Functions of this module, not methods: a user who holds a future has no way to complete it.


def set_result(future: Future[T], value: T) -> bool:
    """Complete ``future`` with ``value``; ``False`` (and nothing changes) if it was done."""
    return future._complete(_DONE, value)  # noqa: SLF001  this module's class


def set_exception(future: Future[Any], exc: BaseException) -> bool:
    """Fail ``future`` with ``exc``; ``False`` (and nothing changes) if it was done."""
    return future._complete(_FAILED, exc)  # noqa: SLF001  this module's class


def waiting_for(future: Future[Any]) -> str | None:
    """What a pending ``future`` waits for, in the words a wait that times out uses (the ranks
    of a call still out), or ``None`` when it says nothing (or is done): for a future that
    stands in for another (``then``, ``when_all``, the tensor layer's translated replies)."""
    describe = future._describe_pending  # noqa: SLF001  this module's class
    return None if describe is None else describe()


def completed_future(value: T) -> Future[T]:
    """A future already done with ``value``."""
    future: Future[T] = Future()
    set_result(future, value)
    return future


def failed_future(exc: BaseException) -> Future[Any]:
    """A future already failed with ``exc``."""
    future: Future[Any] = Future()
    set_exception(future, exc)
    return future


_blocked: dict[int, Future[Any]] = {}


def blocked_on(thread_ident: int | None) -> list[tuple[str, int]]:
    """The ``(mesh_id, rank)`` pairs the thread is blocked waiting for in ``Future.get``."""
    future = _blocked.get(thread_ident) if thread_ident is not None else None
    return [] if future is None else future.pending_ranks()


def _set_if_pending(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _run_callback(cb: Callable[[Any], None], fut: Any) -> None:
    try:
        cb(fut)
    except Exception:
        import logging

        logging.getLogger(__name__).exception("done-callback of %r raised", fut)

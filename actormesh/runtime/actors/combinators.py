"""Futures made of other futures, without blocking: ``then`` (a step after a result),
``when_all`` (every result, in order) and ``settle`` (complete one future as another did). What
a combined future waits for is said in the words of the futures it waits on (``waiting_for``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .future import Future, set_exception, set_result, waiting_for

X = TypeVar("X")
Y = TypeVar("Y")


def then(first: Future[X], step: Callable[[X], Future[Y]]) -> Future[Y]:
    """A future for ``step(first's result)``: failures of either propagate, nothing blocks."""
    current: list[Future[Any]] = [first]

    def describe() -> str:
        return waiting_for(current[-1]) or "the next step"

    out: Future[Y] = Future(describe)

    def on_first(done: Future[X]) -> None:
        exc = done.exception()
        if exc is not None:
            set_exception(out, exc)
            return
        try:
            nxt = step(done.get())
        except BaseException as err:
            set_exception(out, err)
            return
        current.append(nxt)
        nxt.add_done_callback(lambda f: settle(f, out))

    first.add_done_callback(on_first)
    return out


def when_all(futures: list[Future[Any]]) -> Future[list[Any]]:
    """A future for every result, in order; fails with the first failure. Nothing blocks."""

    def describe() -> str:  # what the futures still pending wait for (the ranks they name)
        pending = [f for f in futures if not f.done()]
        said = [d for f in pending if (d := waiting_for(f)) is not None]
        return "; ".join(said) if said else f"{len(pending)} more results"

    out: Future[list[Any]] = Future(describe)
    remaining = [len(futures)]
    if not futures:
        set_result(out, [])
        return out
    lock = threading.Lock()

    def one(fut: Future[Any]) -> None:
        exc = fut.exception()
        if exc is not None:
            set_exception(out, exc)
            return
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            set_result(out, [f.get() for f in futures])

    for fut in futures:
        fut.add_done_callback(one)
    return out


_KEEP: Any = object()


def settle(src: Future[Any], dst: Future[Any], value: Any = _KEEP) -> None:
    """Complete ``dst`` as ``src`` completed (``src`` is done): its failure, else its result or,
    when given, ``value`` instead."""
    exc = src.exception()
    if exc is not None:
        set_exception(dst, exc)
    else:
        set_result(dst, src.get() if value is _KEEP else value)

"""``Future`` and its combinators, in one process: completion, waiting (with a timeout, from
another thread, from asyncio), callbacks, ``then``, ``when_all`` and ``settle``."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from actormesh.errors import MeshTimeoutError
from actormesh.runtime.actors import future as future_mod
from actormesh.runtime.actors.combinators import settle, then, when_all
from actormesh.runtime.actors.future import (
    Future,
    completed_future,
    failed_future,
    set_exception,
    set_result,
    waiting_for,
)


class Boom(Exception):
    pass


def test_a_result_is_set_once() -> None:
    fut: Future[int] = Future()
    assert not fut.done()
    assert set_result(fut, 5)
    assert fut.done()
    assert fut.get() == 5
    assert fut.result() == 5
    assert fut.exception() is None
    assert not set_result(fut, 6)  # the first completion wins
    assert not set_exception(fut, Boom())
    assert fut.get() == 5
    assert repr(fut) == "<actormesh.Future done>"


def test_an_exception_is_raised_by_get_and_returned_by_exception() -> None:
    fut: Future[int] = Future()
    err = Boom("remote")
    assert set_exception(fut, err)
    with pytest.raises(Boom) as raised:
        fut.get()
    assert raised.value is err
    assert fut.exception() is err
    assert not set_result(fut, 1)
    assert repr(fut) == "<actormesh.Future failed>"


def test_get_times_out_naming_what_it_waits_for() -> None:
    fut: Future[int] = Future(lambda: "rank 3 of trainers")
    with pytest.raises(MeshTimeoutError, match=r"timed out after 0.05 s waiting for rank 3 of"):
        fut.get(timeout=0.05)
    assert not fut.done()
    plain: Future[int] = Future()
    with pytest.raises(MeshTimeoutError, match="waiting for the result"):
        plain.exception(timeout=0.01)
    assert repr(plain) == "<actormesh.Future pending>"


def test_get_returns_a_result_set_by_another_thread() -> None:
    fut: Future[str] = Future()
    worker = threading.Thread(
        target=set_result,
        args=(
            fut,
            "from a thread",
        ),
    )
    worker.start()
    try:
        assert fut.get(timeout=10) == "from a thread"
    finally:
        worker.join(10)


def test_get_raises_an_exception_set_by_another_thread() -> None:
    fut: Future[str] = Future()
    worker = threading.Thread(
        target=set_exception,
        args=(
            fut,
            Boom("late"),
        ),
    )
    worker.start()
    try:
        with pytest.raises(Boom, match="late"):
            fut.get(timeout=10)
    finally:
        worker.join(10)


@pytest.fixture
def raising_hook() -> Iterator[list[Future[Any]]]:
    seen: list[Future[Any]] = []

    def hook(fut: Future[Any]) -> None:
        seen.append(fut)
        raise Boom("ended by a wait hook")

    future_mod.wait_hooks.append(hook)
    try:
        yield seen
    finally:
        future_mod.wait_hooks.remove(hook)


def test_a_wait_hook_that_raises_ends_the_wait(raising_hook: list[Future[Any]]) -> None:
    fut: Future[int] = Future()
    with pytest.raises(Boom, match="ended by a wait hook"):
        fut.get(timeout=30)
    assert raising_hook == [fut]


def test_await_gives_the_result_set_from_another_thread() -> None:
    async def main() -> str:
        fut: Future[str] = Future()
        loop = asyncio.get_running_loop()
        loop.call_soon(
            threading.Thread(
                target=set_result,
                args=(
                    fut,
                    "awaited",
                ),
            ).start
        )
        return await asyncio.wait_for(_awaiting(fut), 10)

    assert asyncio.run(main()) == "awaited"


def test_await_raises_the_failure_and_a_done_future_needs_no_loop_turn() -> None:
    async def main() -> None:
        failed: Future[int] = failed_future(Boom("awaited failure"))
        with pytest.raises(Boom, match="awaited failure"):
            await failed
        assert await completed_future(3) == 3

    asyncio.run(main())


async def _awaiting(fut: Future[str]) -> str:
    return await fut


def test_callbacks_run_once_in_order_and_late_ones_at_once() -> None:
    fut: Future[int] = Future()
    calls: list[tuple[str, Any]] = []
    fut.add_done_callback(lambda f: calls.append(("first", f.get())))
    fut.add_done_callback(lambda f: calls.append(("second", f)))
    assert calls == []
    set_result(fut, 7)
    assert calls == [("first", 7), ("second", fut)]
    set_result(fut, 8)
    assert len(calls) == 2
    fut.add_done_callback(lambda f: calls.append(("late", f.get())))
    assert calls[-1] == ("late", 7)


def test_a_raising_callback_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fut: Future[int] = Future()
    ran: list[int] = []

    def bad(_: Future[int]) -> None:
        raise Boom("in a callback")

    fut.add_done_callback(bad)
    fut.add_done_callback(lambda f: ran.append(f.get()))
    with caplog.at_level(logging.ERROR, logger=future_mod.__name__):
        set_result(fut, 1)
    assert ran == [1]
    assert "done-callback" in caplog.text and "in a callback" in caplog.text


def test_then_chains_without_blocking() -> None:
    first: Future[int] = Future()
    second: Future[str] = Future(lambda: "the second step")
    seen: list[int] = []

    def step(value: int) -> Future[str]:
        seen.append(value)
        return second

    out = then(first, step)
    assert not out.done()
    set_result(first, 2)
    assert seen == [2] and not out.done()
    with pytest.raises(MeshTimeoutError, match="waiting for the second step"):
        out.get(timeout=0.01)  # it describes the step it waits on
    set_result(second, "done")
    assert out.get() == "done"


def test_then_propagates_failures_of_either_step() -> None:
    failed: Future[int] = Future()
    steps: list[int] = []
    out = then(failed, lambda v: completed_future(steps.append(v)))
    set_exception(failed, Boom("first"))
    with pytest.raises(Boom, match="first"):
        out.get()
    assert steps == []  # the step never ran

    def raising_step(_: int) -> Future[int]:
        raise Boom("the step itself")

    with pytest.raises(Boom, match="the step itself"):
        then(completed_future(1), raising_step).get()
    with pytest.raises(Boom, match="second"):
        then(completed_future(1), lambda _: failed_future(Boom("second"))).get()


def test_waiting_for_says_what_a_pending_future_waits_for() -> None:
    """The runtime's hook for a future that stands in for another (the tensor layer's
    translated replies): the same words a timed-out wait would use, nothing once done."""
    described: Future[int] = Future(lambda: "rank {dp=1} of the call")
    assert waiting_for(described) == "rank {dp=1} of the call"
    assert waiting_for(Future()) is None  # it says nothing of itself
    assert waiting_for(then(described, completed_future)) == "rank {dp=1} of the call"
    set_result(described, 1)
    assert waiting_for(described) is None


def test_when_all_keeps_order_and_fails_with_the_first_failure() -> None:
    a: Future[int] = Future()
    b: Future[int] = Future()
    both = when_all([a, b])
    set_result(b, 2)
    assert not both.done()
    with pytest.raises(MeshTimeoutError, match="waiting for 1 more results"):
        both.get(timeout=0.01)
    described: Future[int] = Future(lambda: "rank {dp=1} of the call")
    named = when_all([described, completed_future(3)])
    with pytest.raises(MeshTimeoutError, match=r"waiting for rank \{dp=1\} of the call$"):
        named.get(timeout=0.01)  # it says what the futures still pending wait for
    set_result(a, 1)
    assert both.get() == [1, 2]  # the order given, not the order of completion
    assert when_all([]).get() == []
    c: Future[int] = Future()
    d: Future[int] = Future()
    failing = when_all([c, d])
    set_exception(d, Boom("d failed"))
    with pytest.raises(Boom, match="d failed"):
        failing.get()  # at once: c is still pending
    assert not c.done()


def test_settle_copies_the_outcome_or_replaces_the_value() -> None:
    dst: Future[int] = Future()
    settle(completed_future(4), dst)
    assert dst.get() == 4
    replaced: Future[str] = Future()
    settle(completed_future(4), replaced, "instead")
    assert replaced.get() == "instead"
    failed: Future[str] = Future()
    settle(failed_future(Boom("src")), failed, "ignored on failure")
    with pytest.raises(Boom, match="src"):
        failed.get()


def test_a_completed_future_does_not_keep_its_result_in_a_cycle() -> None:
    # A collector holds its future and the future holds the collector's bound methods: once
    # done, dropping both must free the result at once (a tensor's receive buffer), without
    # waiting for the garbage collector.
    import gc
    import weakref

    class Holder:
        def __init__(self) -> None:
            self.future: Future[Any] = Future(self.describe, self.pending)

        def describe(self) -> str:
            return "x"

        def pending(self) -> list[tuple[str, int]]:
            return []

    class Result:
        pass

    holder = Holder()
    result = Result()
    alive = weakref.ref(result)
    set_result(holder.future, result)
    del result
    gc.disable()
    try:
        del holder
        assert alive() is None
    finally:
        gc.enable()


@pytest.mark.parametrize("timeout", [-1, -0.5, float("nan")])
def test_a_negative_timeout_is_refused_with_what_to_pass(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout must be a number of seconds >= 0"):
        Future().get(timeout=timeout)
    assert completed_future(3).get(timeout=timeout) == 3  # done: nothing to wait for

"""What a rank's stack dump shows of its actors' threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from actormesh.kernel.executor import MeshExecutor
from actormesh.runtime.actors.future import Future, set_result
from actormesh.runtime.faults.stacks import format_stacks


@pytest.fixture
def runtime_thread() -> Iterator[threading.Thread]:
    """A thread busy in the runtime's own code only (waiting on a future)."""
    fut: Future[None] = Future()
    thread = threading.Thread(target=fut.get, kwargs={"timeout": 30}, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        set_result(fut, None)
        thread.join(10)


def _runner(thread: threading.Thread, name: str, instance: object = None) -> SimpleNamespace:
    busy = ("status", time.monotonic())
    return SimpleNamespace(thread=thread, name=name, busy=busy, instance=instance)


def test_a_user_actor_busy_in_runtime_code_shows_its_whole_stack(runtime_thread: Any) -> None:
    text = format_stacks([_runner(runtime_thread, "trainer")])
    assert "actor trainer: in status for" in text
    assert "future.py" in text


def test_a_kernel_helper_answering_a_question_is_left_out(runtime_thread: Any) -> None:
    # The sidebar's status poll lands on one rank as its stacks are taken: that rank's text must
    # not differ from the others' because of it.
    text = format_stacks([_runner(runtime_thread, "_mesh_status")])
    assert "actor _mesh_status" not in text
    assert "future.py" not in text


def _wait_outside_actormesh(ready: threading.Event, done: threading.Event) -> None:
    # Stands in for psutil answering the sidebar's status poll: frames that are not actormesh's.
    ready.set()
    done.wait(30)


def test_an_internal_actor_is_left_out_whatever_code_it_is_in() -> None:
    ready, done = threading.Event(), threading.Event()
    thread = threading.Thread(target=_wait_outside_actormesh, args=(ready, done), daemon=True)
    thread.start()
    try:
        assert ready.wait(10)
        for name in ("_mesh_status", "_mesh_debug"):
            text = format_stacks([_runner(thread, name)])
            assert f"actor {name}" not in text, text
            assert "_wait_outside_actormesh" not in text, text
        # The %%mesh executor is the kernel's too, but what it runs is the user's cell.
        text = format_stacks(
            [_runner(thread, "_mesh_executor", MeshExecutor.__new__(MeshExecutor))]
        )
        assert "actor _mesh_executor: in status for" in text
        assert "_wait_outside_actormesh" in text
    finally:
        done.set()
        thread.join(10)

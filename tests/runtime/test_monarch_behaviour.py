"""Behaviour aligned with Monarch's documented contract (issue 20): a failed ``__init__`` and a
``BaseException`` that is not an ``Exception`` are supervision events; real worker processes."""

from __future__ import annotations

import os
import pathlib
import sys

import pytest
from support import wait_until

import actormesh as am


class BrokenInit(am.Actor):
    def __init__(self) -> None:
        raise RuntimeError("bad config")

    @am.endpoint
    def ping(self) -> int:
        return 1


class Quits(am.Actor):
    def __init__(self, where: str) -> None:
        self.where = where

    @am.endpoint
    def pid(self) -> int:
        return os.getpid()

    @am.endpoint
    def quit(self, how: str) -> None:
        if how == "exit":
            sys.exit(3)
        raise BaseException("bare")

    @am.endpoint
    def spin_until_interrupted(self) -> str:
        try:
            while True:
                pass
        except KeyboardInterrupt:
            raise

    def __cleanup__(self, exc: BaseException | None) -> None:
        pathlib.Path(self.where, "cleanup").write_text(repr(exc))


class Other(am.Actor):
    @am.endpoint
    def pid(self) -> int:
        return os.getpid()


def test_a_failed_init_nobody_calls_is_a_supervision_event(spawn_procs, unhandled_failures) -> None:
    spawn_procs(per_host={"gpus": 2}).spawn("broken_init", BrokenInit)  # never called
    wait_until(lambda: len(unhandled_failures) == 2, 10, "the __init__ failures")
    for failure in unhandled_failures:
        assert isinstance(failure, am.ActorError) and isinstance(failure, am.MeshFailure)
        assert failure.mesh_name == "broken_init" and "bad config" in failure.report()
        assert failure.failures[0].endpoint == "__init__"
    unhandled_failures.clear()


@pytest.mark.parametrize(
    ("how", "exc_type", "shown"),
    [("exit", "SystemExit", "SystemExit(3)"), ("bare", "BaseException", "bare")],
)
def test_a_base_exception_stops_the_actor_not_the_process(
    spawn_procs, unhandled_failures, tmp_path, how: str, exc_type: str, shown: str
) -> None:
    procs = spawn_procs(per_host={"gpus": 1})
    quits = procs.spawn("quits", Quits, str(tmp_path))
    pid = quits.pid.call_one().get(timeout=30)
    with pytest.raises(am.ActorError) as info:
        quits.quit.call_one(how).get(timeout=30)
    assert info.value.exc_type == exc_type
    # The actor is stopped: it ran __cleanup__ with the exception and refuses calls.
    assert shown in (tmp_path / "cleanup").read_text()
    with pytest.raises(am.ActorError, match="was stopped"):
        quits.pid.call_one().get(timeout=10)
    # Its owner heard of it, although the caller got the failure too.
    wait_until(lambda: bool(unhandled_failures), 10, "the supervision event")
    event = unhandled_failures.pop()
    assert isinstance(event, am.ActorError) and "the actor stopped" in str(event)
    assert not unhandled_failures
    # The process lives on.
    assert procs.spawn("other", Other).pid.call_one().get(timeout=30) == pid
    assert procs.health().values() == ["alive"]


def test_an_interrupt_stays_survivable(spawn_procs, tmp_path) -> None:
    procs = spawn_procs(per_host={"gpus": 1})
    quits = procs.spawn("interrupted", Quits, str(tmp_path))
    pid = quits.pid.call_one().get(timeout=30)
    running = quits.spin_until_interrupted.call_one()
    wait_until(
        lambda: "spin_until_interrupted" in procs.stacks().get(timeout=10).item(),
        10,
        "the endpoint to run",
    )
    procs.interrupt()
    with pytest.raises(am.ActorError, match="KeyboardInterrupt"):
        running.get(timeout=10)
    assert quits.pid.call_one().get(timeout=10) == pid  # the actor still serves
    assert not (tmp_path / "cleanup").exists()

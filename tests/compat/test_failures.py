"""docs/monarch.md, "Failures"."""

from __future__ import annotations

import sys
import threading

import pytest
from support import wait_until

import actormesh
from actormesh import Actor, ActorError, MeshFailure, SupervisionError, endpoint


class Fails(Actor):
    @endpoint
    def boom(self) -> None:
        raise ValueError("boom")

    @endpoint
    def exit(self) -> None:
        sys.exit(1)

    @endpoint
    def ping(self, value: object = None) -> str:
        return "pong"


class FailsInInit(Actor):
    def __init__(self) -> None:
        raise RuntimeError("cannot start")

    @endpoint
    def ping(self) -> str:
        return "pong"


def test_actor_error(procs) -> None:
    with pytest.raises(ActorError, match="boom"):
        procs.spawn("fails_call", Fails).boom.call().get()


def test_supervision_error_is_a_runtime_error_and_covers_a_stopped_mesh() -> None:
    from actormesh import this_host

    procs = this_host().spawn_procs(per_host={"gpus": 1})
    fails = procs.spawn("fails_stopped", Fails)
    procs.stop().get()
    with pytest.raises(SupervisionError):
        fails.ping.call().get()
    assert issubclass(SupervisionError, RuntimeError)


def test_unhandled_fault_hook_gets_a_mesh_failure(procs, unhandled_failures) -> None:
    seen: list[MeshFailure] = []
    original = actormesh.unhandled_fault_hook
    actormesh.unhandled_fault_hook = seen.append
    try:
        procs.spawn("fails_hook", Fails).slice(gpus=0).boom.broadcast()
        wait_until(lambda: bool(seen), 10, "the fault hook")
    finally:
        actormesh.unhandled_fault_hook = original
    assert isinstance(seen[0], MeshFailure)
    assert seen[0].mesh_name == "fails_hook" and "boom" in seen[0].report()


def test_init_failure_is_a_supervision_event(procs, unhandled_failures) -> None:
    actor = procs.spawn("fails_init", FailsInInit)
    wait_until(lambda: len(unhandled_failures) == 2, 10, "the __init__ failures")
    assert all("cannot start" in f.report() for f in unhandled_failures)
    unhandled_failures.clear()
    with pytest.raises(ActorError, match="cannot start"):
        actor.ping.call().get()


def test_base_exception_ends_the_actor(procs, unhandled_failures) -> None:
    fails = procs.spawn("fails_exit", Fails).slice(gpus=1)
    with pytest.raises(ActorError):
        fails.exit.call_one().get()
    with pytest.raises(ActorError, match="stopped"):
        fails.ping.call_one().get()
    wait_until(lambda: bool(unhandled_failures), 10, "the supervision event")
    unhandled_failures.clear()


def test_unpicklable_argument_keeps_its_exception_type(procs) -> None:
    with pytest.raises(TypeError) as info:
        procs.spawn("fails_pickle", Fails).ping.call(threading.Lock())
    assert any("argument 0" in note for note in info.value.__notes__)

"""docs/monarch.md: ``context().actor_instance`` (``proc``, ``creator``, ``abort``) and the
ownership tree (who supervises an actor mesh, what stops with an actor)."""

from __future__ import annotations

import os
import pathlib
import signal

import pytest
from support import wait_until

from actormesh import (
    Actor,
    ActorError,
    MeshFailure,
    SupervisionError,
    context,
    endpoint,
    this_host,
)


class Beside(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def creator_name(self) -> str | None:
        creator = context().actor_instance.creator
        return None if creator is None else creator.name


class Parent(Actor):
    @endpoint
    def spawn_beside(self) -> tuple[int, int, str | None]:
        beside = context().actor_instance.proc.spawn("beside", Beside)
        return os.getpid(), beside.pid.call_one().get(), beside.creator_name.call_one().get()

    @endpoint
    def creator_name(self) -> str | None:
        creator = context().actor_instance.creator
        return None if creator is None else creator.name


def test_actor_instance_proc_and_creator(procs) -> None:
    parent = procs.slice(gpus=1).spawn("parent", Parent)
    assert parent.creator_name.call_one().get() is None  # the script spawned it
    mine, besides, creator = parent.spawn_beside.call_one().get(timeout=30)
    assert mine == besides and creator == "parent"


class Quitter(Actor):
    def __init__(self, where: str) -> None:
        self.where = where

    @endpoint
    def give_up(self) -> str:
        context().actor_instance.abort("nothing left to do")
        return "finishing this message"

    @endpoint
    def ping(self) -> str:
        return "pong"

    def __cleanup__(self, exc: Exception | None) -> None:
        pathlib.Path(self.where, "quitter").write_text(str(exc))


def test_actor_instance_abort(procs, tmp_path, unhandled_failures) -> None:
    quitter = procs.slice(gpus=0).spawn("quitter", Quitter, str(tmp_path))
    assert quitter.give_up.call_one().get() == "finishing this message"
    wait_until(lambda: bool(unhandled_failures), 10, "the abort's supervision event")
    assert "nothing left to do" in unhandled_failures[0].report()
    unhandled_failures.clear()
    with pytest.raises(ActorError, match="stopped"):
        quitter.ping.call_one().get()
    assert "nothing left to do" in (tmp_path / "quitter").read_text()


class Child(Actor):
    def __init__(self, where: str) -> None:
        self.where = where

    @endpoint
    def fail(self) -> None:
        raise ValueError("child failed")

    @endpoint
    def ping(self) -> str:
        return "pong"

    def __cleanup__(self, exc: Exception | None) -> None:
        pathlib.Path(self.where, "child").write_text("cleaned up")


class Owner(Actor):
    """Spawns its child on a proc mesh the script made and passed to it."""

    def __init__(self, child_procs, where: str, raise_in_supervise: bool) -> None:
        self.child = child_procs.spawn("owned_child", Child, where)
        self.raise_in_supervise = raise_in_supervise
        self.seen: list[str] = []

    @endpoint
    def fail_child(self) -> None:
        self.child.fail.broadcast()

    @endpoint
    def get_child(self) -> object:
        return self.child

    @endpoint
    def seen_failures(self) -> list[str]:
        return self.seen

    def __supervise__(self, failure: MeshFailure) -> bool:
        if self.raise_in_supervise:
            raise RuntimeError("the supervisor gives up")
        self.seen.append(failure.mesh_name)
        return True


def test_the_spawning_actor_supervises_on_procs_it_did_not_make(procs, tmp_path) -> None:
    owner = procs.slice(gpus=0).spawn("owner", Owner, procs.slice(gpus=1), str(tmp_path), False)
    owner.fail_child.call_one().get(timeout=30)
    wait_until(lambda: owner.seen_failures.call_one().get() != [], 10, "__supervise__")
    assert owner.seen_failures.call_one().get() == ["owned_child"]


def test_a_supervise_that_raises_fails_the_supervisor(procs, tmp_path, unhandled_failures) -> None:
    owner = procs.slice(gpus=0).spawn("raiser", Owner, procs.slice(gpus=1), str(tmp_path), True)
    owner.fail_child.call_one().get(timeout=30)
    wait_until(lambda: bool(unhandled_failures), 10, "the supervisor's own failure")
    assert "the supervisor gives up" in unhandled_failures[0].report()
    unhandled_failures.clear()
    with pytest.raises(ActorError, match="stopped"):
        owner.seen_failures.call_one().get()


def test_stopping_an_actor_stops_the_meshes_it_spawned(procs, tmp_path) -> None:
    owner = procs.slice(gpus=0).spawn("stopper", Owner, procs.slice(gpus=1), str(tmp_path), False)
    child = owner.get_child.call_one().get(timeout=30)
    assert child.ping.call_one().get() == "pong"
    owner.stop().get(timeout=30)
    assert (tmp_path / "child").read_text() == "cleaned up"
    with pytest.raises((ActorError, SupervisionError), match="stopped"):
        child.ping.call_one().get(timeout=30)


class Mortal(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()


class Guardian(Actor):
    def __init__(self, child_procs) -> None:
        self.child = child_procs.spawn("mortal", Mortal)
        self.seen: list[tuple[bool, str]] = []

    @endpoint
    def child_pid(self) -> int:
        return self.child.pid.call_one().get()

    @endpoint
    def seen_failures(self) -> list[tuple[bool, str]]:
        return self.seen

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.seen.append((isinstance(failure, SupervisionError), failure.report()))
        return True


def test_a_lost_process_goes_to_the_owner_of_the_actor_mesh_on_it(unhandled_failures) -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    try:
        guardian = procs.slice(gpus=0).spawn("guardian", Guardian, procs.slice(gpus=1))
        os.kill(guardian.child_pid.call_one().get(timeout=30), signal.SIGKILL)
        wait_until(lambda: guardian.seen_failures.call_one().get() != [], 10, "__supervise__")
        [(lost_process, report)] = guardian.seen_failures.call_one().get()
        assert lost_process and "SIGKILL" in report
        assert unhandled_failures == []  # not the fault hook: the owner handled it
    finally:
        procs.stop().get(timeout=30)

"""docs/monarch.md, ``concurrent_endpoint`` and ``__supervise__`` at an await."""

from __future__ import annotations

import asyncio
import pathlib

import pytest

from actormesh import (
    Actor,
    ActorError,
    MeshFailure,
    concurrent_endpoint,
    current_rank,
    endpoint,
    this_host,
)


class Player(Actor):
    def __init__(self, name: str) -> None:
        self.name = name
        self.other = None

    @endpoint
    def meet(self, other) -> None:
        self.other = other

    @concurrent_endpoint
    async def ping(self, n: int) -> list[str]:
        if n == 0:
            return [self.name]
        return [self.name, *await self.other.ping.call_one(n - 1)]


def test_reentrant_ping_pong_between_two_meshes(procs) -> None:
    ping = procs.slice(gpus=0).spawn("ping", Player, "ping")
    pong = procs.slice(gpus=1).spawn("pong", Player, "pong")
    ping.meet.call_one(pong).get()
    pong.meet.call_one(ping).get()
    # ping(5) on "ping" awaits pong(4), which calls ping(3) on "ping" while ping(5) awaits.
    assert ping.ping.call_one(5).get(timeout=30) == ["ping", "pong"] * 3


class Gate(Actor):
    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.started: list[int] = []

    @concurrent_endpoint
    async def wait(self, i: int) -> int:
        self.started.append(i)
        await self.opened.wait()
        return i

    @endpoint
    def open(self) -> list[int]:
        self.opened.set()
        return self.started


def test_calls_overlap_and_start_in_arrival_order(procs) -> None:
    gate = procs.slice(gpus=0).spawn("gate", Gate)
    waits = [gate.wait.call_one(i) for i in range(10)]
    # ``open`` runs while the ten calls await: with ordinary endpoints it would wait for them.
    assert gate.open.call_one().get(timeout=30) == list(range(10))
    assert [w.get(timeout=30) for w in waits] == list(range(10))


def test_concurrent_endpoint_must_be_async() -> None:
    with pytest.raises(TypeError):

        class Sync(Actor):
            @concurrent_endpoint
            def f(self) -> int:
                return 1


class Forever(Actor):
    def __init__(self, where: str) -> None:
        self.where = where
        self.cancelled = 0

    @concurrent_endpoint
    async def hang(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    @endpoint
    def ready(self) -> bool:
        return True

    def __cleanup__(self, exc: Exception | None) -> None:
        rank = current_rank()["gpus"]
        pathlib.Path(self.where, str(rank)).write_text(str(self.cancelled))


def test_outstanding_calls_are_cancelled_before_cleanup(procs, tmp_path) -> None:
    forever = procs.spawn("forever", Forever, str(tmp_path))
    hanging = [forever.hang.call() for _ in range(2)]
    forever.ready.call().get(timeout=30)  # both hang calls started before this one
    forever.stop().get(timeout=30)
    for call in hanging:
        with pytest.raises(ActorError, match="CancelledError"):
            call.get(timeout=30)
    assert sorted(p.read_text() for p in tmp_path.iterdir()) == ["2", "2"]


class Child(Actor):
    @endpoint
    def fail(self) -> None:
        raise ValueError("child failed")


class AwaitingSupervisor(Actor):
    def __init__(self) -> None:
        self.child = this_host().spawn_procs(per_host={"gpus": 1}).spawn("child", Child)
        self.failed = asyncio.Event()
        self.seen: list[str] = []

    @endpoint
    async def fail_child_and_wait(self) -> list[str]:
        self.child.fail.broadcast()
        # The failure is reported while this endpoint awaits, not queued behind it.
        await asyncio.wait_for(self.failed.wait(), timeout=30)
        return self.seen

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.seen.append(failure.mesh_name)
        self.failed.set()
        return True


def test_supervise_runs_while_an_async_endpoint_awaits() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        supervisor = procs.spawn("awaiting_supervisor", AwaitingSupervisor)
        assert supervisor.fail_child_and_wait.call_one().get(timeout=60) == ["child"]
    finally:
        procs.stop().get(timeout=30)

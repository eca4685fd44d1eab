"""Monarch's lifecycle API (issue 20): ActorMesh.stop and __cleanup__, ProcMesh.initialized and
host_mesh, bootstrap, async with, HostMesh.shutdown; with real worker processes."""

from __future__ import annotations

import asyncio
import os
import pathlib
import threading

import pytest
from support import wait_until

import actormesh as am


class Tidy(am.Actor):
    """Writes what its __cleanup__ got to a file (the actor is gone when the test looks)."""

    def __init__(self, where: str) -> None:
        self.where = where

    @am.endpoint
    def pid(self) -> int:
        return os.getpid()

    @am.endpoint
    def wait_then(self, seconds: float, value: int) -> int:
        threading.Event().wait(seconds)  # the call is still running when the stop is sent
        return value

    def __cleanup__(self, exc: BaseException | None) -> None:
        rank = am.current_rank()["gpus"]
        pathlib.Path(self.where, f"cleanup-{rank}").write_text(repr(exc))


class AsyncTidy(am.Actor):
    def __init__(self, where: str) -> None:
        self.where = where

    @am.endpoint
    async def ping(self) -> str:
        return "pong"

    async def __cleanup__(self, exc: BaseException | None) -> None:
        await asyncio.sleep(0)
        pathlib.Path(self.where, f"async-{am.current_rank()['gpus']}").write_text(repr(exc))


class BadCleanup(am.Actor):
    @am.endpoint
    def ping(self) -> str:
        return "pong"

    def __cleanup__(self, exc: BaseException | None) -> None:
        raise OSError("could not close the file")


class Env(am.Actor):
    @am.endpoint
    def env(self, name: str) -> str | None:
        return os.environ.get(name)


def set_boot_env() -> None:
    os.environ["BOOTED"] = f"yes-{am.current_rank()['gpus']}"


async def set_boot_env_async() -> None:
    await asyncio.sleep(0)
    os.environ["BOOTED"] = "async"


def failing_bootstrap() -> None:
    raise RuntimeError("no GPU driver here")


def test_actor_mesh_stop_runs_cleanup_and_leaves_the_processes(spawn_procs, tmp_path) -> None:
    procs = spawn_procs(per_host={"gpus": 2})
    tidy = procs.spawn("tidy", Tidy, str(tmp_path))
    pids = tidy.pid.call().get(timeout=30).values()
    running = tidy.wait_then.call(0.3, 7)  # sent before the stop: it completes
    tidy.stop().get(timeout=30)
    assert running.get(timeout=10).values() == [7, 7]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cleanup-0", "cleanup-1"]
    assert (tmp_path / "cleanup-0").read_text() == "None"
    with pytest.raises(am.SupervisionError, match="stopped") as info:  # as Monarch code catches it
        tidy.pid.call()
    assert isinstance(info.value, am.MeshClosedError)
    tidy.stop().get(timeout=10)  # twice is harmless
    # The processes live on: a new actor mesh runs on them.
    again = procs.spawn("again", Tidy, str(tmp_path / "x"))
    assert again.pid.call().get(timeout=30).values() == pids


def test_stopping_a_slice_stops_only_its_actors(spawn_procs, tmp_path) -> None:
    tidy = spawn_procs(per_host={"gpus": 2}).spawn("tidy_slice", Tidy, str(tmp_path))
    tidy.slice(gpus=1).stop().get(timeout=30)
    assert [p.name for p in tmp_path.iterdir()] == ["cleanup-1"]
    assert tidy.slice(gpus=0).pid.call_one().get(timeout=30) > 0
    with pytest.raises(am.MeshClosedError):
        tidy.pid.call()


def test_async_cleanup_is_awaited(spawn_procs, tmp_path) -> None:
    tidy = spawn_procs(per_host={"gpus": 1}).spawn("async_tidy", AsyncTidy, str(tmp_path))
    assert tidy.ping.call_one().get(timeout=30) == "pong"
    tidy.stop().get(timeout=30)
    assert (tmp_path / "async-0").read_text() == "None"


def test_a_cleanup_that_raises_fails_the_stop(spawn_procs) -> None:
    bad = spawn_procs(per_host={"gpus": 1}).spawn("bad_cleanup", BadCleanup)
    with pytest.raises(am.ActorError, match="could not close the file"):
        bad.stop().get(timeout=30)


def test_stopping_the_proc_mesh_runs_cleanup(tmp_path) -> None:
    procs = am.this_host().spawn_procs(per_host={"gpus": 2})
    tidy = procs.spawn("tidy_procs", Tidy, str(tmp_path))
    tidy.pid.call().get(timeout=30)
    procs.stop().get(timeout=30)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cleanup-0", "cleanup-1"]


def test_proc_mesh_initialized_host_mesh_and_async_with() -> None:
    hosts = am.this_host()

    async def main() -> am.ProcMesh:
        async with hosts.spawn_procs(per_host={"gpus": 1}) as procs:
            assert await procs.initialized is True
            assert procs.host_mesh is hosts and procs.slice(gpus=0).host_mesh is hosts
            assert await procs.spawn("env", Env).env.call_one("HOME") == os.environ["HOME"]
        return procs

    procs = asyncio.run(main())
    assert "stopped" in repr(procs)


def test_bootstrap_runs_on_every_proc_before_any_actor(spawn_procs) -> None:
    procs = spawn_procs(per_host={"gpus": 2}, bootstrap=set_boot_env)
    env = procs.spawn("env_boot", Env)  # spawned before the bootstrap is known to be done
    assert env.env.call("BOOTED").get(timeout=30).values() == ["yes-0", "yes-1"]
    assert procs.initialized.get(timeout=30) is True
    async_procs = spawn_procs(per_host={"gpus": 1}, bootstrap=set_boot_env_async)
    assert async_procs.spawn("env_async", Env).env.call_one("BOOTED").get(timeout=30) == "async"


def test_a_failed_bootstrap_surfaces_on_initialized(spawn_procs, unhandled_failures) -> None:
    procs = spawn_procs(per_host={"gpus": 2}, bootstrap=failing_bootstrap)
    with pytest.raises(am.ActorError, match="no GPU driver here"):
        procs.initialized.get(timeout=30)
    # Each rank's failure is a supervision event too (a failed __init__ is); the actors that
    # then fail because of it add none.
    wait_until(lambda: len(unhandled_failures) >= 2, 10, "the bootstrap failures")
    env = procs.spawn("env_failed", Env)
    with pytest.raises(am.ActorError, match="bootstrap of this proc mesh failed"):
        env.initialized.get(timeout=30)
    with pytest.raises(am.ActorError, match="bootstrap of this proc mesh failed"):
        env.env.call("HOME").get(timeout=30)
    assert len(unhandled_failures) == 2
    assert all("no GPU driver here" in str(f) for f in unhandled_failures)
    unhandled_failures.clear()


def test_host_mesh_shutdown_stops_what_it_spawned(shared_procs) -> None:
    hosts = am.this_host()
    first = hosts.spawn_procs(per_host={"gpus": 1})
    second = hosts.slice(hosts=0).spawn_procs(per_host={"gpus": 1})
    hosts.shutdown().get(timeout=30)
    assert "stopped" in repr(first) and "stopped" in repr(second)
    # Another host mesh over the same host keeps its procs (the session's shared mesh here).
    assert "stopped" not in repr(shared_procs)
    with am.this_host() as again:
        third = again.spawn_procs(per_host={"gpus": 1})
        assert third.spawn("env_host", Env).env.call_one("HOME").get(timeout=30)
    assert "stopped" in repr(third)

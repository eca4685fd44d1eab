"""docs/monarch.md, "Meshes"."""

from __future__ import annotations

import asyncio
import os

import pytest

from actormesh import (
    Actor,
    Extent,
    ProcMesh,
    SupervisionError,
    current_rank,
    endpoint,
    this_host,
    this_proc,
)


class Env(Actor):
    @endpoint
    def get(self, name: str) -> str | None:
        return os.environ.get(name)

    @endpoint
    def pid(self) -> int:
        return os.getpid()


def setup_env() -> None:
    os.environ["SETUP_DONE"] = "1"


def test_this_host_spawn_procs_with_bootstrap() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=setup_env)
    assert procs.initialized.get() is True
    assert procs.spawn("env", Env).get.call("SETUP_DONE").get().values() == ["1", "1"]
    procs.stop().get()


def test_this_proc() -> None:
    env = this_proc().spawn("env_here", Env)
    assert env.pid.call_one().get() == os.getpid()
    env.stop().get()  # an actor of this process: its thread ends with it


class SpawnsHere(Actor):
    @endpoint
    def pids(self) -> tuple[int, int]:
        beside = this_proc().spawn("beside_here", Env)
        return os.getpid(), beside.pid.call_one().get(timeout=20)


def test_this_proc_in_an_actor_is_its_own_process(procs) -> None:
    """Also on a process that is not rank 0 of its mesh (its spawns were ignored there)."""
    for gpus in (0, 1):
        mine, beside = (
            procs.slice(gpus=gpus)
            .spawn(f"spawns_here{gpus}", SpawnsHere)
            .pids.call_one()
            .get(timeout=30)
        )
        assert mine == beside


def test_host_mesh_shutdown() -> None:
    host = this_host()
    procs = host.spawn_procs(per_host={"gpus": 1})
    env = procs.spawn("env_shutdown", Env)
    env.pid.call().get()
    host.shutdown().get()
    with pytest.raises(SupervisionError):
        env.pid.call().get()


def test_proc_mesh_spawn_and_stop() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    assert isinstance(procs, ProcMesh)
    assert procs.spawn("env_stop", Env).pid.call_one().get() > 0
    procs.stop().get()


def test_proc_mesh_initialized_and_host_mesh(procs) -> None:
    assert procs.initialized.get() is True
    assert procs.host_mesh.sizes == {"hosts": 1}


def test_async_with() -> None:
    async def main() -> list[int]:
        async with this_host().spawn_procs(per_host={"gpus": 1}) as procs:
            await procs.initialized
            return (await procs.spawn("env_async", Env).pid.call()).values()

    assert asyncio.run(main())[0] > 0


def test_actor_mesh_stop_and_initialized(procs) -> None:
    env = procs.spawn("env_actor_stop", Env)
    env.initialized.get()
    pids = env.pid.call().get().values()
    env.stop().get()
    with pytest.raises(SupervisionError):
        env.pid.call().get()
    assert procs.spawn("env_after", Env).pid.call().get().values() == pids  # procs live on


def test_slice_flatten_rename_size_sizes_extent(procs) -> None:
    env = procs.spawn("env_shape", Env)
    assert env.size() == 2 and env.size("gpus") == 2
    assert env.sizes == {"hosts": 1, "gpus": 2}
    assert dict(env.extent) == {"hosts": 1, "gpus": 2}
    assert env.slice(gpus=slice(1, 2)).size() == 1
    assert env.flatten("rank").sizes == {"rank": 2}
    assert env.rename(gpus="workers").sizes == {"hosts": 1, "workers": 2}


def test_split(procs) -> None:
    env = procs.spawn("env_split", Env).flatten("rank")
    split = env.split(rank=("dp", "tp"), tp=2)
    assert split.sizes == {"dp": 1, "tp": 2}
    assert len(split.slice(tp=1).pid.call().get().values()) == 1


class RunIt(Actor):
    @endpoint
    async def return_current_rank_str(self) -> str:
        return str(current_rank())


def test_rank_string_and_a_hosts_entry_in_per_host() -> None:
    """Monarch's ``test_rank_string``: ``per_host`` may name the host dimension (with the host
    mesh's size), and a rank prints as Monarch prints it."""
    per_host = {"hosts": 1, "gpus": 2}
    proc = this_host().spawn_procs(per_host=per_host)
    try:
        assert proc.extent == Extent(["hosts", "gpus"], [1, 2])
        r = proc.spawn("runit", RunIt)
        vm = r.return_current_rank_str.call().get(timeout=30)
        r0 = vm.flatten("r").slice(r=0).item()
        r1 = vm.flatten("r").slice(r=1).item()
        assert r0 == "{'hosts': 0/1, 'gpus': 0/2}"
        assert r1 == "{'hosts': 0/1, 'gpus': 1/2}"
    finally:
        proc.stop().get(timeout=30)


def test_a_hosts_entry_of_another_size_is_refused() -> None:
    with pytest.raises(ValueError, match="'hosts' is a dimension of this host mesh, of size 1"):
        this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})

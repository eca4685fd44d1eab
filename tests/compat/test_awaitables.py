"""docs/monarch.md, "Values, shapes, futures, ports": every future a Monarch API returns goes
where Monarch code awaits it, ``asyncio.run`` and ``asyncio.create_task`` included (Monarch's
getting-started guide runs ``asyncio.run(procs.logging_option(...))``)."""

from __future__ import annotations

import asyncio

import pytest

from actormesh import (
    Actor,
    ActorError,
    Channel,
    Port,
    endpoint,
    get_or_spawn_controller,
    this_host,
)


class Counter(Actor):
    def __init__(self, v: int) -> None:
        self.v = v

    @endpoint
    def incr(self) -> None:
        self.v += 1

    @endpoint
    def value(self) -> int:
        return self.v

    @endpoint
    def fail(self) -> None:
        raise ValueError("no value")

    @endpoint
    def send(self, port: Port) -> None:
        port.send(self.v)


def test_asyncio_run_takes_every_future(procs) -> None:
    asyncio.run(procs.logging_option(stream_to_client=True, aggregate_window_sec=None))
    counter = procs.spawn("counter_run", Counter, 3)
    asyncio.run(counter.initialized)
    asyncio.run(counter.incr.call())
    assert asyncio.run(counter.value.call()).values() == [4, 4]
    assert asyncio.run(counter.slice(gpus=0).value.call_one()) == 4
    assert asyncio.run(counter.value.choose()) == 4
    port, receiver = Channel.open()
    counter.slice(gpus=1).send.call_one(port).get(timeout=30)
    assert asyncio.run(receiver.recv()) == 4
    with pytest.raises(ActorError, match="no value"):
        asyncio.run(counter.fail.call())
    asyncio.run(counter.stop())


def test_a_future_run_as_a_coroutine_stays_a_future(procs) -> None:
    counter = procs.spawn("counter_task", Counter, 5)

    async def main() -> list[int]:
        task = asyncio.create_task(counter.slice(gpus=0).value.call_one())
        both = asyncio.ensure_future(counter.value.call())
        return [await task, *(await both).values()]

    assert asyncio.run(main()) == [5, 5, 5]
    fut = counter.slice(gpus=1).value.call_one()
    assert asyncio.run(fut) == 5
    assert fut.get(timeout=10) == 5  # still a future after running as a coroutine

    async def twice() -> int:
        return await fut

    assert asyncio.run(twice()) == 5


class Registry(Actor):
    @endpoint
    def ping(self) -> str:
        return "pong"


def test_asyncio_run_of_a_proc_mesh_stop_and_a_controller() -> None:
    registry = asyncio.run(get_or_spawn_controller("awaitables_registry", Registry))
    assert asyncio.run(registry.ping.call_one()) == "pong"
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    asyncio.run(procs.initialized)
    asyncio.run(procs.stop())

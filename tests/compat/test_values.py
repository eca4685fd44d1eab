"""docs/monarch.md, "Values, shapes, futures, ports"."""

from __future__ import annotations

import asyncio

import pytest

from actormesh import (
    Actor,
    ActorError,
    Channel,
    Extent,
    Future,
    Point,
    Port,
    PortReceiver,
    ValueMesh,
    current_rank,
    endpoint,
)


class Sender(Actor):
    @endpoint
    def rank(self) -> int:
        return current_rank()["gpus"]

    @endpoint
    def send(self, port: Port, value: int) -> None:
        port.send(value + current_rank()["gpus"])

    @endpoint
    def fail(self, port: Port) -> None:
        port.exception(ValueError("bad value"))


def test_value_mesh(procs) -> None:
    values = procs.spawn("sender_values", Sender).rank.call().get()
    assert isinstance(values, ValueMesh)
    assert values.item(gpus=1) == 1 and values.values() == [0, 1]
    assert [(point["gpus"], v) for point, v in values.items()] == [(0, 0), (1, 1)]
    assert [v for _, v in values] == [0, 1]
    assert values.slice(gpus=1).item() == 1
    assert values.get(1) == 1


def test_extent_and_point() -> None:
    extent = Extent(["hosts", "gpus"], [2, 4])
    assert extent.nelements == 8 and extent.labels == ("hosts", "gpus") and extent["gpus"] == 4
    point = Point(5, extent)
    assert point.rank == 5 and dict(point) == {"hosts": 1, "gpus": 1}
    assert point.size("gpus") == 4 and point.extent == extent


def test_future(procs) -> None:
    sender = procs.spawn("sender_future", Sender)
    fut = sender.rank.call()
    assert isinstance(fut, Future)
    assert fut.get(timeout=30).values() == [0, 1] and fut.result().values() == [0, 1]
    assert fut.exception() is None

    async def main() -> int:
        return await sender.slice(gpus=1).rank.call_one()

    assert asyncio.run(main()) == 1


def test_future_as_asyncio(procs) -> None:
    sender = procs.spawn("sender_aio", Sender)

    async def main() -> list[int]:
        results = await asyncio.gather(sender.rank.call().as_asyncio())
        return results[0].values()

    assert asyncio.run(main()) == [0, 1]


def test_channel_open_and_port_send(procs) -> None:
    port, receiver = Channel.open()
    assert isinstance(receiver, PortReceiver)
    procs.spawn("sender_port", Sender).send.call(port, 10).get()
    assert sorted(receiver.recv().get() for _ in range(2)) == [10, 11]


def test_channel_open_once(procs) -> None:
    port, receiver = Channel.open(once=True)
    procs.spawn("sender_once", Sender).slice(gpus=1).send.call_one(port, 10).get()
    assert receiver.recv().get() == 11


def test_channel_open_ranked(procs) -> None:
    port, ranked = Channel.open_ranked()
    procs.spawn("sender_ranked", Sender).send.call(port, 0).get()
    assert sorted(ranked.recv().get() for _ in range(2)) == [(0, 0), (1, 1)]
    port2, receiver = Channel.open()
    port2.send(1)
    assert receiver.ranked().recv().get() == (None, 1)


def test_port_exception(procs) -> None:
    port, receiver = Channel.open()
    procs.spawn("sender_exc", Sender).slice(gpus=0).fail.call_one(port).get()
    with pytest.raises(ActorError, match="bad value"):
        receiver.recv().get()

"""docs/monarch.md, "Actors and endpoints" and "Context"."""

from __future__ import annotations

import asyncio
import os
import pathlib

import pytest
from support import wait_until

from actormesh import (
    Accumulator,
    Actor,
    Channel,
    Context,
    Endpoint,
    MeshFailure,
    Port,
    context,
    current_actor_name,
    current_rank,
    current_size,
    endpoint,
    send,
    this_host,
)


class Counter(Actor):
    def __init__(self, initial_value: int) -> None:
        self.value = initial_value

    @endpoint
    def incr(self) -> None:
        self.value += 1

    @endpoint
    def get_value(self) -> int:
        return self.value

    @endpoint
    async def aget_value(self) -> int:
        await asyncio.sleep(0)
        return self.value


class Reporter(Actor):
    @endpoint
    def logger_name(self) -> str:
        self.logger.info("reporting")
        return self.logger.name

    @endpoint
    def where(self) -> tuple[dict[str, int], dict[str, int], dict[str, int], str]:
        ctx = context()
        assert isinstance(ctx, Context)
        return (
            dict(current_rank()),
            current_size(),
            dict(ctx.message_rank),
            current_actor_name(),
        )


class Doubler(Actor):
    @endpoint(explicit_response_port=True)
    def double(self, port: Port, x: int) -> None:
        port.send(2 * x)


class Tidy(Actor):
    def __init__(self, where: str) -> None:
        self.where = where

    @endpoint
    def ping(self) -> str:
        return "pong"

    def __cleanup__(self, exc: Exception | None) -> None:
        pathlib.Path(self.where, f"{current_rank()['gpus']}").write_text(repr(exc))


class Child(Actor):
    @endpoint
    def fail(self) -> None:
        raise ValueError("child failed")


class Supervisor(Actor):
    def __init__(self) -> None:
        self.failures: list[str] = []
        self.child_procs = this_host().spawn_procs(per_host={"gpus": 1})
        self.child = self.child_procs.spawn("child", Child)

    @endpoint
    def make_child_fail(self) -> None:
        self.child.fail.broadcast()

    @endpoint
    def failures_seen(self) -> list[str]:
        return self.failures

    @endpoint
    def stop_children(self) -> None:
        self.child_procs.stop().get()

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.failures.append(failure.report())
        return True


def test_actor_endpoint_and_call(procs) -> None:
    counter = procs.spawn("counter", Counter, 0)
    counter.incr.call().get()
    assert counter.get_value.call().get().values() == [1, 1]


def test_actor_logger(procs) -> None:
    reporters = procs.spawn("reporter_log", Reporter)
    assert reporters.logger_name.call().get().values() == ["Reporter", "Reporter"]


def test_endpoint_options() -> None:
    class Options(Actor):
        @endpoint(propagate=None, instrument=True)
        def f(self) -> int:
            return 1

    with pytest.raises(TypeError):

        class Misspelled(Actor):
            @endpoint(explicit_respose_port=True)
            def f(self) -> int:
                return 1


def test_explicit_response_port(procs) -> None:
    assert procs.spawn("doubler", Doubler).double.call(4).get().values() == [8, 8]


def test_adverbs(procs) -> None:
    counter = procs.spawn("counter_adverbs", Counter, 5)
    counter.incr.broadcast()
    assert counter.slice(gpus=0).get_value.call_one().get() == 6
    assert counter.get_value.choose().get() == 6
    assert sorted(f.get() for f in counter.get_value.stream()) == [6, 6]

    async def main() -> list[int]:
        return (await counter.aget_value.call()).values()

    assert asyncio.run(main()) == [6, 6]


def test_endpoint_type(procs) -> None:
    assert isinstance(procs.spawn("counter_type", Counter, 0).incr, Endpoint)


def test_accumulator(procs) -> None:
    counter = procs.spawn("counter_acc", Counter, 3)
    assert Accumulator(counter.get_value, 0, lambda x, y: x + y).accumulate().get() == 6


def test_supervise() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    supervisor = procs.spawn("supervisor", Supervisor)
    supervisor.make_child_fail.call_one().get(timeout=60)
    wait_until(lambda: supervisor.failures_seen.call_one().get() != [], 10, "__supervise__")
    assert "child failed" in supervisor.failures_seen.call_one().get()[0]
    supervisor.stop_children.call_one().get()
    procs.stop().get()  # the supervisor's process, and the host agent it started, end


def test_cleanup(procs, tmp_path) -> None:
    tidy = procs.spawn("tidy", Tidy, str(tmp_path))
    assert tidy.ping.call().get().values() == ["pong", "pong"]
    tidy.stop().get()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0", "1"]


def test_context_and_current_rank_size_name(procs) -> None:
    got = procs.spawn("reporter", Reporter).where.call().get().values()
    ranks = [rank for rank, _, _, _ in got]
    assert [r["gpus"] for r in ranks] == [0, 1]
    assert got[0][1]["gpus"] == 2
    assert [m["gpus"] for _, _, m, _ in got] == [0, 1]
    names = {name for _, _, _, name in got}
    assert len(names) == 2 and all(name.startswith("reporter") for name in names)
    assert os.getpid() > 0 and current_actor_name() == "controller"


def test_send(procs) -> None:
    counter = procs.spawn("counter_send", Counter, 2)
    port, receiver = Channel.open_ranked()
    send(counter.get_value, (), {}, port=port)
    assert sorted(receiver.recv().get() for _ in range(2)) == [(0, 2), (1, 2)]

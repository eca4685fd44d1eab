"""Message order, as Monarch's ``test_choose`` (``python/tests/test_python_actors.py``) relies
on it: per-sender FIFO, and causal order: a broadcast sent before a call to another actor is
seen by whatever that actor then asks (here ``choose`` may pick the other rank).

Once each actor has answered the script. Right after a spawn, the script's connection to an
actor's socket may still be waiting to retry (the socket is bound when the spawn arrives), and
a later call from another process, on a connection of its own, can reach the actor first:
docs/monarch.md, "Message order", says so."""

from __future__ import annotations

import asyncio

from monarch_counter import Counter

from actormesh import Actor, endpoint


class SyncCounter(Actor):
    def __init__(self, c) -> None:
        self.c = c

    @endpoint
    def value_sync_endpoint(self) -> int:
        return self.c.value.choose().get()


class Indirect(Actor):
    @endpoint
    async def call_value(self, c: Counter) -> int:
        return await c.value.choose()


def test_choose(procs) -> None:
    v = procs.spawn("counter", Counter, 3)
    i = procs.spawn("indirect", Indirect)
    v2 = procs.spawn("sync_counter", SyncCounter, v)
    # Every actor is up, and the script's connections to each of them too.
    assert v.value.call().get(timeout=30).values() == [3, 3]
    assert i.call_value.call(v).get(timeout=30).values() == [3, 3]
    assert v2.value_sync_endpoint.call().get(timeout=30).values() == [3, 3]

    async def main() -> None:
        for n in range(4, 54):  # a race lost 1 time in 20 would show here
            v.incr.broadcast()
            result = await v.value.choose()
            result2 = await i.call_value.choose(v)
            result3 = await v2.value_sync_endpoint.choose()
            assert result == result2 == result3 == n

    asyncio.run(asyncio.wait_for(main(), timeout=60))

"""Message order, as Monarch's ``test_choose`` (``python/tests/test_python_actors.py``) relies
on it: per-sender FIFO, and causal order: a broadcast sent before a call to another actor is
seen by whatever that actor then asks (here ``choose`` may pick the other rank).

Once each actor has answered the script. Right after a spawn, the script's connection to an
actor's socket may still be waiting to retry (the socket is bound when the spawn arrives), and
a later call from another process, on a connection of its own, can reach the actor first:
docs/monarch.md, "Message order", says so."""

from __future__ import annotations

import asyncio
import time

from monarch_counter import Counter

from actormesh import Actor, Channel, Port, endpoint


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


class BusyCounter(Actor):
    def __init__(self) -> None:
        self.v = 0

    @endpoint
    def hold(self, seconds: float, started: Port) -> None:
        started.send(None)
        time.sleep(seconds)  # busy: what comes meanwhile waits in the socket

    @endpoint
    def incr(self) -> None:
        self.v += 1

    @endpoint
    def value(self) -> int:
        return self.v


class Asker(Actor):
    @endpoint
    def occupy(self, c: BusyCounter, seconds: float) -> None:
        """Returns once ``c`` is busy: a cast may still be on its way when the caller's next
        message (a stop) reaches ``c``, which would then take that first."""
        started, receiver = Channel.open(once=True)
        c.hold.broadcast(seconds, started)
        receiver.recv().get(timeout=30)

    @endpoint
    def ask(self, c: BusyCounter) -> int:
        return c.value.call_one().get(timeout=30)

    @endpoint
    def stop_it(self, c: BusyCounter) -> None:
        c.stop().get(timeout=30)


def test_causal_order_holds_while_the_receiver_is_busy(procs) -> None:
    """A broadcast, then a call to another actor that asks the broadcast's receiver: both wait
    in the receiver's socket while it is busy, and it takes them in the order they were sent.
    ZeroMQ alone takes turns between senders, and here it is the asker's turn: the asker sent
    what keeps the receiver busy."""
    c = procs.slice(gpus=0).spawn("busy", BusyCounter)
    a = procs.slice(gpus=1).spawn("asker", Asker)
    assert a.ask.call_one(c).get(timeout=30) == 0  # every connection is up
    for n in range(1, 9):
        a.occupy.call_one(c, 0.1).get(timeout=30)
        c.incr.broadcast()
        assert a.ask.call_one(c).get(timeout=30) == n


def test_two_stops_that_wait_together_are_both_answered(procs) -> None:
    """Two processes stop the same busy actor: the second stop waits in its socket beside the
    calls the first one runs first, and is answered too (it used to be taken for a call)."""
    c = procs.slice(gpus=0).spawn("busy", BusyCounter)
    a = procs.slice(gpus=1).spawn("asker", Asker)
    assert a.ask.call_one(c).get(timeout=30) == 0
    a.occupy.call_one(c, 0.2).get(timeout=30)
    c.incr.broadcast()
    by_asker = a.stop_it.call_one(c)
    c.stop().get(timeout=30)
    by_asker.get(timeout=30)

"""Meshes and ports as picklable references: actors calling actors, fan-in through ports."""

from __future__ import annotations

import pytest

import actormesh as am


class Ponger(am.Actor):
    @am.endpoint
    def pong(self, n: int) -> int:
        return n + 1


class Pinger(am.Actor):
    def __init__(self, partner: am.ActorMesh[Ponger]) -> None:
        self.partner = partner

    @am.endpoint
    def rally(self, rounds: int) -> int:
        """Sync endpoint that blocks on calls to another mesh: must not deadlock."""
        n = 0
        me = am.current_rank()["gpus"]
        for _ in range(rounds):
            n = self.partner.slice(gpus=me).pong.call_one(n).get(timeout=10)
        return n

    @am.endpoint
    async def rally_async(self, rounds: int) -> int:
        n = 0
        for _ in range(rounds):
            values = await self.partner.pong.call(n)
            n = max(values.values())
        return n


def test_two_meshes_play_ping_pong_through_references(shared_procs) -> None:
    pongers = shared_procs.spawn("ponger", Ponger)
    other = am.this_host().spawn_procs(per_host={"gpus": 4})
    try:
        pingers = other.spawn("pinger", Pinger, pongers)
        assert pingers.rally.call(50).get(timeout=30).values() == [50] * 4
        assert pingers.slice(gpus=0).rally_async.call_one(20).get(timeout=30) == 20
    finally:
        other.stop().get(timeout=20)


class Coordinator(am.Actor):
    """Rank 0 collects a token from every other rank of its own mesh."""

    def __init__(self) -> None:
        self.tokens: list[int] = []

    @am.endpoint
    def start(self, mesh: am.ActorMesh[Coordinator]) -> None:
        self.mesh = mesh

    @am.endpoint
    def report(self, token: int) -> int:
        self.tokens.append(token)
        return len(self.tokens)

    @am.endpoint
    def check_in(self) -> int:
        rank = am.current_rank()["gpus"]
        return self.mesh.slice(gpus=0).report.call_one(rank * 10).get(timeout=10)

    @am.endpoint
    def collected(self) -> list[int]:
        return sorted(self.tokens)


def test_rank0_coordinator_reached_by_the_other_ranks(shared_procs) -> None:
    coord = shared_procs.spawn("coord", Coordinator)
    coord.start.broadcast(coord)
    counts = coord.slice(gpus=slice(1, 4)).check_in.call().get(timeout=30)
    assert sorted(counts.values()) == [1, 2, 3]
    assert coord.slice(gpus=0).collected.call_one().get(timeout=10) == [10, 20, 30]


class Sender(am.Actor):
    @am.endpoint
    def send_to(self, port: am.Port, count: int) -> None:
        rank = am.current_rank()["gpus"]
        for i in range(count):
            port.send((rank, i))


def test_port_fan_in_keeps_per_sender_order(shared_procs) -> None:
    port, receiver = am.Channel.open()
    senders = shared_procs.spawn("sender", Sender)
    senders.send_to.broadcast(port, 25)
    got = [receiver.recv().get(timeout=10) for _ in range(100)]
    for rank in range(4):
        assert [i for r, i in got if r == rank] == list(range(25))
    receiver.close()


def test_a_mesh_received_by_an_actor_can_be_sliced_and_called(shared_procs) -> None:
    class Relay(am.Actor):
        @am.endpoint
        def via(self, target: am.ActorMesh[Ponger]) -> list[int]:
            return target.slice(gpus=slice(2, 4)).pong.call(1).get(timeout=10).values()

    pongers = shared_procs.spawn("ponger2", Ponger)
    relay = shared_procs.spawn("relay", Relay)
    assert relay.slice(gpus=0).via.call_one(pongers).get(timeout=10) == [2, 2]


def test_port_receiver_is_not_built_directly() -> None:
    with pytest.raises(TypeError, match=r"Channel.open"):
        am.PortReceiver()

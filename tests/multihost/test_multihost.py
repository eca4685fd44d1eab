"""The same API across hosts: three fake hosts (network namespaces), one agent each."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest
from fakehosts import FakeNet
from support import wait_until

import actormesh as am
from actormesh.runtime.dataplane.distributed import destroy_process_group, init_process_group

WAIT = 60


class Probe(am.Actor):
    def __init__(self) -> None:
        self.seen: list[int] = []

    @am.endpoint
    def where(self) -> tuple[str, str, int]:
        return str(am.current_rank()), os.environ["ACTORMESH_HOST_ADDR"], os.getpid()

    @am.endpoint
    def record(self, i: int) -> None:
        self.seen.append(i)

    @am.endpoint
    def tensor_record(self, i: int, _t: Any) -> None:
        self.seen.append(i)

    @am.endpoint
    def recorded(self) -> list[int]:
        return self.seen

    @am.endpoint
    def ask(self, others: am.ActorMesh[Any]) -> list[str]:
        # Actor to actor: the replies come straight here, from the other hosts.
        return [r for r, _, _ in others.where.call().get(timeout=WAIT).values()]

    @am.endpoint
    def send_to(self, port: am.Port) -> None:
        port.send((str(am.current_rank()), os.environ["ACTORMESH_HOST_ADDR"]))

    @am.endpoint
    def nap(self, seconds: float) -> None:
        import time

        time.sleep(seconds)

    @am.endpoint
    def say(self, text: str) -> None:
        print(text, flush=True)

    @am.endpoint
    def all_reduce(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item())


@pytest.fixture(scope="module")
def procs(three_hosts: am.HostMesh) -> Any:
    mesh = three_hosts.spawn_procs(per_host={"gpus": 2})
    yield mesh
    mesh.stop().get(timeout=30)


def test_spawn_procs_across_three_hosts(procs: Any, fake_net: FakeNet) -> None:
    assert procs.extent == am.Extent(["hosts", "gpus"], [3, 2])
    probes = procs.spawn("where", Probe)
    seen = probes.where.call().get(timeout=WAIT)
    for point, (rank, addr, _pid) in seen.items():
        assert rank == str(point)
        assert addr == fake_net.ip(1 + point["hosts"])  # host i of the mesh is the i-th agent
    assert len({pid for _, _, pid in seen.values()}) == 6
    # Slicing works across hosts as on one.
    one = probes.slice(hosts=2, gpus=1).where.call_one().get(timeout=WAIT)
    assert one[1] == fake_net.ip(3)
    column = probes.slice(gpus=0).where.call().get(timeout=WAIT)
    assert [a for _, a, _ in column.values()] == [fake_net.ip(i) for i in (1, 2, 3)]


def test_per_sender_fifo_across_hosts(procs: Any) -> None:
    probes = procs.spawn("fifo", Probe)
    for i in range(50):
        if i % 3 == 0:
            probes.slice(hosts=i % 3).record.broadcast(i)
        probes.record.broadcast(i)
    got = probes.recorded.call().get(timeout=WAIT)
    for point, seen in got.items():
        expected = [i for i in range(50) for _ in range(1 + (i % 3 == 0 and point["hosts"] == 0))]
        assert seen == expected


def test_a_cast_sends_one_message_per_host(procs: Any, monkeypatch: Any) -> None:
    """The controller sends a cast (and a spawn) once per host, to its agent, which fans it out
    locally."""
    from actormesh.runtime.messaging.node import current_node

    probes = procs.spawn("fanout", Probe)
    probes.where.call().get(timeout=WAIT)
    transport = current_node().transport
    sent: list[bytes] = []
    real_send, real_one_way = transport.send, transport.send_one_way

    # Heartbeats to the agents go on meanwhile: count what the casts send.
    def send(dest: Any, envelope: Any, *args: Any, **kwargs: Any) -> None:
        if envelope[0] != "hb":
            sent.append(dest.mailbox)
        real_send(dest, envelope, *args, **kwargs)

    def send_one_way(dest: Any, envelope: Any, *args: Any, **kwargs: Any) -> None:
        if envelope[0] != "hb":
            sent.append(dest.mailbox)
        real_one_way(dest, envelope, *args, **kwargs)

    monkeypatch.setattr(transport, "send", send)
    monkeypatch.setattr(transport, "send_one_way", send_one_way)
    agents = {a.address.mailbox for a in procs._record.agents}
    workers = {a.mailbox for a in procs._procs.addresses}
    assert len(probes.where.call().get(timeout=WAIT)) == 6
    probes.record.broadcast(1)
    probes.slice(gpus=1).record.broadcast(2)
    assert sorted(sent) == sorted(list(agents) * 3)
    assert not workers & set(sent)
    sent.clear()
    probes.slice(hosts=2, gpus=1).where.call_one().get(timeout=WAIT)
    assert sent == [procs._record.agents[2].address.mailbox]
    sent.clear()
    spawned = procs.spawn("fanout2", Probe)  # a spawn is a cast too
    assert sorted(sent) == sorted(agents)
    assert len(spawned.where.call().get(timeout=WAIT)) == 6


def test_fifo_across_routes_of_every_kind(procs: Any) -> None:
    """Calls, broadcasts, slices and calls with out-of-band tensors from one sender arrive in
    the order sent, whichever path each took through the agents (batched or not)."""
    import torch

    probes = procs.spawn("fifo-kinds", Probe)
    big = torch.zeros(1 << 15)  # 128 KB: travels as a separate zero-copy frame
    expected: dict[int, list[int]] = {r: [] for r in range(6)}
    pending = []
    for i in range(60):
        kind = i % 4
        if kind == 0:
            probes.record.broadcast(i)
            targets = range(6)
        elif kind == 1:
            pending.append(probes.slice(hosts=i % 3).record.call(i))
            targets = [2 * (i % 3), 2 * (i % 3) + 1]
        elif kind == 2:
            pending.append(probes.slice(hosts=1, gpus=i % 2).record.call_one(i))
            targets = [2 + i % 2]
        else:
            probes.tensor_record.broadcast(i, big)
            targets = range(6)
        for r in targets:
            expected[r].append(i)
    for fut in pending:
        fut.get(timeout=WAIT)
    got = probes.recorded.call().get(timeout=WAIT).values()
    assert got == [expected[r] for r in range(6)]


def test_actor_to_actor_and_ports_across_hosts(procs: Any, fake_net: FakeNet) -> None:
    probes = procs.spawn("a2a", Probe)
    others = procs.spawn("others", Probe)
    # An actor on host 0 calls a mesh on every host; replies go to it directly.
    answers = probes.slice(hosts=0, gpus=0).ask.call_one(others).get(timeout=WAIT)
    assert sorted(answers) == sorted(str(p) for p, _ in others.where.call().get(WAIT).items())
    # Every actor sends to a port of the controller.
    port, receiver = am.Channel.open()
    probes.send_to.broadcast(port)
    got = sorted(receiver.recv().get(timeout=WAIT) for _ in range(6))
    assert {addr for _, addr in got} == {fake_net.ip(i) for i in (1, 2, 3)}


def test_remote_and_local_actors_call_each_other(procs: Any, fake_net: FakeNet) -> None:
    """Once hosts are connected, workers on the controller's host listen on tcp:// too (Curve
    included), so actors on other hosts can call them and answer them."""
    local = am.this_host().spawn_procs(per_host={"gpus": 2})
    try:
        assert all(a.tcp is not None for a in local._procs.addresses)
        near = local.spawn("near", Probe)
        far = procs.spawn("far", Probe)
        expected_near = sorted(str(p) for p, _ in near.where.call().get(WAIT).items())
        # A remote actor calls the local mesh; the local workers answer it over tcp://.
        asked = far.slice(hosts=2, gpus=0).ask.call_one(near).get(timeout=WAIT)
        assert sorted(asked) == expected_near
        # A local actor calls the remote mesh (through the remote hosts' agents).
        asked = near.slice(gpus=1).ask.call_one(far).get(timeout=WAIT)
        assert sorted(asked) == sorted(str(p) for p, _ in far.where.call().get(WAIT).items())
    finally:
        local.stop().get(timeout=30)


def test_output_and_stacks_across_hosts(procs: Any, capsys: Any) -> None:
    probes = procs.spawn("talk", Probe)
    probes.slice(hosts=2).say.call("hello from far away").get(timeout=WAIT)
    out = capsys.readouterr().out
    assert "[hosts=2,gpus=0] hello from far away" in out
    assert "[hosts=2,gpus=1] hello from far away" in out
    napping = probes.slice(hosts=1, gpus=0).nap.call_one(5.0)

    def shows_nap() -> bool:
        stacks = procs.stacks().get(timeout=WAIT)
        assert len(stacks) == 6
        return "in nap" in stacks.values()[2]

    wait_until(shows_nap, WAIT, "the stack of the rank in nap() on host 1")
    napping.get(timeout=WAIT)


def test_gloo_all_reduce_across_hosts(procs: Any, fake_net: FakeNet) -> None:
    # Every fake host's name is this machine's, which may resolve to 127.0.0.1: the group must
    # still use the addresses other hosts reach (the agent sets them), or gloo hangs.
    members = procs.spawn("member", Probe)
    joined = init_process_group(members, timeout=30).get(timeout=WAIT)
    assert [m.rank for m in joined.values()] == list(range(6))
    assert {m.master_addr for m in joined.values()} == {fake_net.ip(1)}
    futures = [
        members.slice(hosts=h, gpus=g).all_reduce.call_one(float(2 * h + g + 1))
        for h in range(3)
        for g in range(2)
    ]
    assert [f.get(timeout=WAIT) for f in futures] == [21.0] * 6
    destroy_process_group(members).get(timeout=WAIT)


def test_tensor_buffer_across_hosts(procs: Any) -> None:
    import torch

    class Owner(am.Actor):
        def __init__(self) -> None:
            self.t = torch.arange(1 << 16, dtype=torch.float32)
            self.buf = am.TensorBuffer(self.t)

        @am.endpoint
        def handle(self) -> am.TensorBuffer:
            return self.buf

        @am.endpoint
        def total(self) -> float:
            return float(self.t.sum())

    class Reader(am.Actor):
        @am.endpoint
        def read(self, buf: am.TensorBuffer) -> float:
            dst = torch.empty(1 << 16, dtype=torch.float32)
            buf.read_into(dst).get(timeout=WAIT)
            buf.write_from(torch.ones(1 << 16)).get(timeout=WAIT)
            return float(dst.sum())

    owner = procs.slice(hosts=0, gpus=0).spawn("owner", Owner)
    reader = procs.slice(hosts=2, gpus=1).spawn("reader", Reader)
    buf = owner.handle.call_one().get(timeout=WAIT)
    expected = float(torch.arange(1 << 16, dtype=torch.float32).sum())
    assert reader.read.call_one(buf).get(timeout=WAIT) == expected
    assert owner.total.call_one().get(timeout=WAIT) == float(1 << 16)


def test_cross_host_inboxes_speak_curve(procs: Any) -> None:
    """Encryption is on by default across hosts: the controller's and every remote worker's
    tcp:// inbox greets with the CURVE mechanism (ZMTP 3 greeting, bytes 12..32)."""
    from actormesh.runtime.messaging.node import current_node

    endpoints = [current_node().address.tcp, procs._procs.addresses[0].tcp]
    for endpoint in endpoints:
        assert endpoint is not None
        host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0"))
            greeting = b""
            while len(greeting) < 32:
                chunk = s.recv(64)
                assert chunk, "the inbox closed the connection during the greeting"
                greeting += chunk
        assert greeting[12:32].rstrip(b"\0") == b"CURVE"


class Looper(am.Actor):
    def __init__(self) -> None:
        self.stop = False

    @am.endpoint
    def loop(self) -> str:
        n = 0
        while not self.stop:
            n += 1
        return os.environ["ACTORMESH_HOST_ADDR"]

    @am.endpoint
    def hit_breakpoint(self) -> int:
        answer = 41
        breakpoint()
        return answer + 1


def _debugger() -> Any:
    from actormesh.debugger.session import get_debugger

    return get_debugger()


def test_debugger_pauses_and_inspects_ranks_on_other_hosts(procs: Any) -> None:
    # Every rank here runs on another host than the controller: the debugger reaches each
    # rank's debugpy (on that host's loopback) through the host agent.
    debugger = _debugger()
    mesh_id = procs._procs.mesh_id
    loopers = procs.spawn("loopers", Looper)
    running = loopers.loop.call()
    ranks = list(range(6))
    try:
        debugger.pause(mesh_id, ranks)

        def all_in_loop() -> bool:
            paused = debugger.paused_in(mesh_id)
            return all(
                r in paused and paused[r].location and paused[r].location.function == "loop"
                for r in ranks
            )

        assert debugger.wait(all_in_loop, WAIT), [rd.describe() for rd in debugger.paused()]
        for r in ranks:
            rd = debugger.rank(mesh_id, r)
            assert rd.evaluate("n > 0")["result"] == "True"
            rd.evaluate("self.stop = True")
        debugger.resume(mesh_id, ranks)
        hosts = running.get(timeout=WAIT).values()
        assert len(set(hosts)) == 3
    finally:
        debugger.detach_all()


def test_breakpoint_on_a_rank_of_another_host_pauses_it(three_hosts: am.HostMesh) -> None:
    from actormesh.debugger.session import enable_breakpoints

    debugger = _debugger()
    previous = os.environ.get("PYTHONBREAKPOINT")
    enable_breakpoints()  # reaches the ranks of the next spawn, on every host
    try:
        mesh = three_hosts.spawn_procs(per_host={"gpus": 1})
    finally:
        if previous is None:
            os.environ.pop("PYTHONBREAKPOINT", None)
        else:
            os.environ["PYTHONBREAKPOINT"] = previous
    try:
        one = mesh.spawn("loopers", Looper).slice(hosts=2)
        result = one.hit_breakpoint.call_one()
        mesh_id = mesh._procs.mesh_id
        assert debugger.wait(lambda: 2 in debugger.paused_in(mesh_id), WAIT)
        rd = debugger.rank(mesh_id, 2)
        assert debugger.wait(lambda: rd.location is not None, WAIT)
        assert rd.location.function == "hit_breakpoint"
        assert rd.evaluate("answer")["result"] == "41"
        rd.resume()
        assert result.get(timeout=WAIT) == 42
    finally:
        debugger.detach_all()
        mesh.stop().get(timeout=30)


def test_no_process_left_after_stop(three_hosts: am.HostMesh, fake_net: FakeNet) -> None:
    mesh = three_hosts.spawn_procs(per_host={"gpus": 1})
    before = {h: len(fake_net.pids(h)) for h in (1, 2, 3)}
    mesh.stop().get(timeout=30)
    for h in (1, 2, 3):
        wait_until(lambda h=h: len(fake_net.pids(h)) == before[h] - 1, 10, f"host {h} reaped")


def test_actor_mesh_stop_and_ranked_ports_across_hosts(procs: Any) -> None:
    """ActorMesh.stop takes the casts' route through the agents; values sent to a ranked port
    from other hosts carry their sender's rank (issue 20)."""
    port, ranked = am.Channel.open_ranked()
    probes = procs.spawn("stopping", Probe)
    probes.send_to.call(port).get(timeout=WAIT)
    got = sorted((rank, where) for rank, (where, _) in (ranked.recv().get(WAIT) for _ in range(6)))
    assert [rank for rank, _ in got] == list(range(6))
    assert [where for _, where in got] == [str(p) for p, _ in probes.where.call().get(WAIT)]
    pending = probes.nap.call(0.2)  # sent before the stop: it completes
    probes.stop().get(timeout=WAIT)
    pending.get(timeout=WAIT)
    with pytest.raises(am.MeshClosedError):
        probes.where.call()
    assert len(procs.spawn("after_stop", Probe).where.call().get(timeout=WAIT).values()) == 6

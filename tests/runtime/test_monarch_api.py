"""Monarch's names and semantics that actormesh adds (issue 20), with real worker processes."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

import pytest
from support import wait_until

import actormesh as am


class Probe(am.Actor):
    @am.endpoint
    def rank(self) -> int:
        return am.current_rank().rank

    @am.endpoint
    def names(self) -> tuple[str, int, str]:
        return self.logger.name, self.logger.level, am.current_actor_name()

    @am.endpoint
    def send_to(self, port: am.Port, times: int = 1) -> None:
        for _ in range(times):
            port.send(am.current_rank()["gpus"] * 10)

    @am.endpoint
    def fail_port(self, port: am.Port) -> None:
        port.exception(KeyError("no such key"))

    @am.endpoint
    def fail(self) -> None:
        raise ValueError("broadcast went wrong")


class Answers(am.Actor):
    @am.endpoint(explicit_response_port=True)
    def double(self, port: am.Port, x: int) -> None:
        if x < 0:
            port.exception(ValueError(f"negative: {x}"))
        else:
            port.send(2 * x)

    @am.endpoint(explicit_response_port=True)
    def later(self, port: am.Port, x: int) -> None:
        threading.Thread(target=port.send, args=(x + 1,)).start()  # answered after it returns

    @am.endpoint(explicit_response_port=True)
    def raises(self, port: am.Port) -> None:
        raise RuntimeError("before answering")

    @am.endpoint(explicit_response_port=True)
    def twice(self, port: am.Port) -> None:
        port.send(1)
        port.send(2)  # a usage error: reported to the mesh's owner, nobody waits any more


def test_extent_nelements_and_point_size() -> None:
    extent = am.Extent(["hosts", "gpus"], [2, 4])
    assert extent.nelements == 8 == extent.nelem  # a property, as in Monarch
    point = am.Point(5, extent)
    assert point.size("gpus") == 4 and point.size("hosts") == 2
    with pytest.raises(KeyError):
        point.size("nodes")


def test_value_mesh_get_is_the_rank_in_row_major_order(shared_procs) -> None:
    values = shared_procs.spawn("probe_get", Probe).rank.call().get(timeout=30)
    assert [values.get(i) for i in range(4)] == values.values() == [0, 1, 2, 3]
    sliced = values.slice(gpus=slice(2, 4))
    assert sliced.get(0) == 2 and sliced.get(1) == 3
    with pytest.raises(IndexError):
        values.get(4)


def test_split_makes_new_dimensions_in_the_same_rank_order(shared_procs) -> None:
    probes = shared_procs.spawn("probe_split", Probe)
    split = probes.split(gpus=("dp", "tp"), tp=2)
    assert split.extent == {"hosts": 1, "dp": 2, "tp": 2}
    assert split.slice(dp=1).rank.call().get(timeout=30).values() == [2, 3]
    assert split.slice(tp=1).rank.call().get(timeout=30).values() == [1, 3]
    assert probes.split(gpus=("dp", "tp"), dp=4).extent == {"hosts": 1, "dp": 4, "tp": 1}
    with pytest.raises(am.MeshUsageError, match="at most one"):
        probes.split(gpus=("dp", "tp"))
    with pytest.raises(am.MeshUsageError, match="multiply to 4"):
        probes.split(gpus=("dp", "tp"), tp=3)
    with pytest.raises(am.MeshUsageError, match="no split dimension"):
        probes.split(pp=2)


def test_future_as_asyncio(shared_procs) -> None:
    probes = shared_procs.spawn("probe_aio", Probe)
    with pytest.raises(RuntimeError):
        probes.rank.call().as_asyncio()  # no running event loop

    async def main() -> list[int]:
        done, _ = await asyncio.wait([probes.rank.call().as_asyncio()], timeout=30)
        return done.pop().result().values()

    assert asyncio.run(main()) == [0, 1, 2, 3]


def test_actor_logger_and_current_actor_name(shared_procs) -> None:
    got = shared_procs.spawn("probe_names", Probe).names.call().get(timeout=30).values()
    assert {(name, level) for name, level, _ in got} == {("Probe", 10)}
    names = [actor for _, _, actor in got]
    assert len(set(names)) == 4 and all(n.startswith("probe_names-") for n in names)
    assert "gpus=3" in names[3]
    assert am.current_actor_name() == "controller"


def test_supervision_error_is_a_runtime_error_and_covers_a_stopped_mesh(spawn_procs) -> None:
    assert issubclass(am.SupervisionError, RuntimeError)
    procs = spawn_procs(per_host={"gpus": 1})
    probes = procs.spawn("probe_stop", Probe)
    probes.rank.call().get(timeout=30)
    procs.stop().get(timeout=30)
    with pytest.raises(am.SupervisionError, match="stopped") as info:
        probes.rank.call()
    assert isinstance(info.value, am.MeshClosedError)


def test_endpoint_refuses_an_unknown_option_where_it_is_defined() -> None:
    with pytest.raises(TypeError, match=r"unknown option 'explicit_respons_port'.*'instrument'"):

        class Typo(am.Actor):
            @am.endpoint(explicit_respons_port=True)
            def f(self, port: am.Port) -> None:
                port.send(1)

    class Accepted(am.Actor):  # Monarch's other options are accepted
        @am.endpoint(propagate=None, instrument=False)
        def f(self) -> int:
            return 1


def test_explicit_response_port(shared_procs, unhandled_failures) -> None:
    answers = shared_procs.spawn("answers", Answers)
    assert answers.double.call(21).get(timeout=30).values() == [42] * 4
    assert answers.slice(gpus=1).later.call_one(1).get(timeout=30) == 2
    with pytest.raises(am.ActorError, match="negative: -1") as info:
        answers.double.call(-1).get(timeout=30)
    assert info.value.exc_type == "ValueError"
    # Raising instead of answering ends the actor, as in Monarch; its owner (here the fault
    # hook) hears of it.
    with pytest.raises(am.SupervisionError, match="before answering"):
        answers.slice(gpus=0).raises.call_one().get(timeout=30)
    wait_until(lambda: bool(unhandled_failures), 10, "the ended actor's failure")
    assert "before answering" in str(unhandled_failures.pop())
    # A second answer is a usage error raised in the endpoint: the caller has its first one,
    # and the actor ends for it.
    assert answers.slice(gpus=1).twice.call_one().get(timeout=30) == 1
    wait_until(lambda: bool(unhandled_failures), 10, "the second answer's failure")
    failure = unhandled_failures.pop()
    assert isinstance(failure, am.ActorError) and "already answered" in str(failure)


def test_port_exception_fails_the_receiver(shared_procs) -> None:
    port, receiver = am.Channel.open()
    shared_procs.spawn("probe_exc", Probe).slice(gpus=2).fail_port.call_one(port).get(timeout=30)
    with pytest.raises(am.ActorError, match="no such key") as info:
        receiver.recv().get(timeout=10)
    assert info.value.exc_type == "KeyError"


def test_once_port_takes_one_value(shared_procs) -> None:
    port, receiver = am.Channel.open(once=True)
    probe = shared_procs.spawn("probe_once", Probe).slice(gpus=1)
    # The reply comes after what the endpoint sent: both values have arrived by then.
    probe.send_to.call_one(port, times=2).get(timeout=30)
    assert receiver.recv().get(timeout=10) == 10
    assert not receiver.recv().done()


def test_ranked_ports_give_the_sender_rank(shared_procs) -> None:
    port, ranked = am.Channel.open_ranked()
    probes = shared_procs.spawn("probe_ranked", Probe)
    probes.send_to.call(port).get(timeout=30)
    got = sorted(ranked.recv().get(timeout=10) for _ in range(4))
    assert got == [(0, 0), (1, 10), (2, 20), (3, 30)]
    # The rank is the sender's place in the slice it was messaged as.
    probes.slice(gpus=slice(2, 4)).send_to.call(port).get(timeout=30)
    assert sorted(ranked.recv().get(timeout=10) for _ in range(2)) == [(0, 20), (1, 30)]
    port.send("from the controller")
    assert ranked.recv().get(timeout=10) == (None, "from the controller")
    plain_port, plain = am.Channel.open()
    plain_port.send(5)
    assert plain.ranked().recv().get(timeout=10) == (None, 5)


def test_assigning_the_fault_hook_installs_it(shared_procs, unhandled_failures) -> None:
    seen: list[am.MeshFailure] = []
    previous = am.unhandled_fault_hook
    am.unhandled_fault_hook = seen.append  # Monarch's way
    try:
        assert am.unhandled_fault_hook == seen.append
        shared_procs.spawn("probe_hook", Probe).slice(gpus=2).fail.broadcast()
        wait_until(lambda: bool(seen), 10, "the assigned hook")
    finally:
        am.unhandled_fault_hook = previous
    assert not unhandled_failures  # the assigned hook got it instead of the previous one
    failure = seen[0]
    assert isinstance(failure, am.MeshFailure) and isinstance(failure, am.ActorError)
    assert failure.exc_type == "ValueError" and failure.mesh_name == "probe_hook"
    assert isinstance(failure.mesh, am.ProcMesh)
    assert "mesh 'probe_hook'" in failure.report() and "broadcast went wrong" in failure.report()


class Victim(am.Actor):
    @am.endpoint
    def pid(self) -> int:
        return os.getpid()


class Owner(am.Actor):
    def __init__(self) -> None:
        self.failures: list[tuple[bool, bool, str | None, str]] = []
        self.procs = am.this_host().spawn_procs(per_host={"gpus": 1}, name="owned")
        self.children = self.procs.spawn("child", Victim)

    @am.endpoint
    def child_pid(self) -> int:
        return self.children.pid.call_one().get(timeout=30)

    @am.endpoint
    def seen(self) -> list[tuple[bool, bool, str | None, str]]:
        return self.failures

    def __supervise__(self, failure: am.MeshFailure) -> bool:
        assert isinstance(failure, am.SupervisionError)
        mesh_is_procs = isinstance(failure.mesh, am.ProcMesh)
        self.failures.append((True, mesh_is_procs, failure.mesh_name, failure.report()))
        return True


def test_supervise_gets_a_mesh_failure(spawn_procs) -> None:
    owner = spawn_procs(per_host={"gpus": 1}).spawn("owner", Owner)
    os.kill(owner.child_pid.call_one().get(timeout=60), signal.SIGKILL)
    wait_until(lambda: owner.seen.call_one().get(timeout=10) != [], 10, "__supervise__")
    [(_, mesh_is_procs, mesh_name, report)] = owner.seen.call_one().get(timeout=10)
    assert mesh_is_procs and mesh_name is not None and mesh_name.startswith("owned-")
    assert "SIGKILL" in report


def test_send_answers_to_a_port_with_ranks(shared_procs) -> None:
    probes = shared_procs.spawn("probe_send", Probe)
    port, ranked = am.Channel.open_ranked()
    am.send(probes.rank, (), {}, port=port)
    assert sorted(ranked.recv().get(timeout=10) for _ in range(4)) == [(i, i) for i in range(4)]
    am.send(probes.slice(gpus=slice(2, 4)).rank, (), {}, port=port, selection="choose")
    index, value = ranked.recv().get(timeout=10)
    assert index == 0 and value in (2, 3)  # the chosen actor is the whole of its call
    am.send(probes.slice(gpus=1).fail, (), {}, port=port)
    with pytest.raises(am.ActorError, match="broadcast went wrong"):
        ranked.recv().get(timeout=10)
    with pytest.raises(am.MeshUsageError, match="selection"):
        am.send(probes.rank, (), {}, port=port, selection="some")

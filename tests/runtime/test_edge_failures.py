"""Edge paths of error reporting (issue 26): failures that fail to render, errors that name
ranks of sliced meshes, endpoints hidden by mesh methods, stopped ranks, forked children."""

from __future__ import annotations

import pytest
from support import wait_until

import actormesh as am


class Unprintable(Exception):
    def __str__(self) -> str:
        raise ValueError("no text for you")


class Unpicklable:
    def __reduce__(self) -> tuple[object, ...]:
        raise KeyboardInterrupt


class Reporter(am.Actor):
    @am.endpoint
    def bad_str(self) -> None:
        raise Unprintable("the real problem")

    @am.endpoint
    def bad_pickle(self) -> Unpicklable:
        return Unpicklable()

    @am.endpoint
    def ping(self) -> int:
        return 1

    @am.endpoint
    def hang(self, seconds: float) -> None:
        import threading

        threading.Event().wait(seconds)


class BadInit(am.Actor):
    def __init__(self) -> None:
        raise Unprintable("bad config")

    @am.endpoint
    def ping(self) -> int:
        return 1


def test_an_exception_whose_str_raises_is_still_an_actor_error(shared_procs) -> None:
    r = shared_procs.spawn("unprintable", Reporter)
    with pytest.raises(am.ActorError, match="Unprintable") as info:
        r.slice(gpus=1).bad_str.call_one().get(timeout=10)
    assert info.value.rank == "{hosts=0, gpus=1}"
    assert "in bad_str" in info.value.remote_traceback
    # The actor's thread survived: later calls are served.
    assert r.ping.call().get(timeout=10).values() == [1] * 4
    assert shared_procs.health().values() == ["alive"] * 4


def test_an_init_exception_whose_str_raises_fails_initialized(
    shared_procs, unhandled_failures
) -> None:
    b = shared_procs.spawn("badinit", BadInit)
    with pytest.raises(am.ActorError, match="Unprintable") as info:
        b.initialized.get(timeout=10)
    assert "__init__" in str(info.value)
    with pytest.raises(am.ActorError, match="failed in __init__"):
        b.ping.call().get(timeout=10)
    # A raising __init__ is also a supervision event for the mesh's owner (here the fault
    # hook), once per rank, whether or not anyone calls the actor (as in Monarch).
    wait_until(lambda: len(unhandled_failures) == 4, timeout=10, what="four __init__ failures")
    assert all("badinit.__init__ raised" in str(f) for f in unhandled_failures)
    unhandled_failures.clear()


def test_a_result_whose_pickling_raises_keyboardinterrupt_is_an_actor_error(shared_procs) -> None:
    r = shared_procs.spawn("kbdpickle", Reporter)
    with pytest.raises(am.ActorError, match="could not be pickled") as info:
        r.slice(gpus=2).bad_pickle.call_one().get(timeout=10)
    assert "KeyboardInterrupt" in str(info.value)
    assert r.slice(gpus=2).ping.call_one().get(timeout=10) == 1


def test_timeouts_of_sliced_meshes_name_the_ranks_full_coordinates(shared_procs) -> None:
    a = shared_procs.spawn("sliced-hang", Reporter)
    fut = a.slice(gpus=2).hang.call_one(1.0)
    with pytest.raises(am.MeshTimeoutError, match=r"rank \{hosts=0, gpus=2\}"):
        fut.get(timeout=0.3)
    fut.get(timeout=10)
    fut2 = a.slice(gpus=slice(2, 3)).hang.call(1.0)
    with pytest.raises(am.MeshTimeoutError, match=r"rank \{hosts=0, gpus=2\}"):
        fut2.get(timeout=0.3)
    fut2.get(timeout=10)
    # A slice of a slice, and a stream, say the same.
    stream = a.slice(gpus=slice(1, 4)).slice(gpus=2).hang.stream(1.0)
    with pytest.raises(am.MeshTimeoutError, match=r"rank \{hosts=0, gpus=3\}"):
        stream.next(timeout=0.3)
    stream.next(timeout=10)


class Shadowed(am.Actor):
    @am.endpoint
    def size(self) -> int:
        return 42


def test_an_endpoint_named_like_a_mesh_method_is_refused_at_spawn(shared_procs) -> None:
    from actormesh.errors import MeshUsageError

    with pytest.raises(MeshUsageError, match=r"endpoint 'size'.*mesh method"):
        shared_procs.spawn("shadowed", Shadowed)


class Forker(am.Actor):
    @am.endpoint
    def fork(self, child_exits: bool) -> int:
        import os

        pid = os.fork()
        if pid == 0:
            if child_exits:
                os._exit(0)
            return -1  # the child returns into the runtime
        return pid


@pytest.mark.parametrize("child_exits", [False, True])
def test_a_forked_child_never_runs_the_worker_loop(shared_procs, child_exits: bool) -> None:
    import psutil

    f = shared_procs.spawn(f"forker-{child_exits}", Forker)
    pid = f.slice(gpus=0).fork.call_one(child_exits).get(timeout=10)
    assert pid > 0  # the parent's reply, not the child's

    def gone() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    wait_until(gone, 10, f"the forked child {pid} to exit")
    assert f.slice(gpus=0).fork.call_one(True).get(timeout=10) > 0  # the parent still serves


def test_a_stopped_rank_says_it_is_stopped(spawn_procs) -> None:
    import os
    import signal

    procs = spawn_procs(per_host={"gpus": 2})
    r = procs.spawn("stoppable", Reporter)
    r.ping.call().get(timeout=30)
    pid = procs._procs.pids[1]
    os.kill(pid, signal.SIGSTOP)
    try:
        # The signal is delivered asynchronously.
        wait_until(lambda: procs.health().values()[1] != "alive", 10, "the rank to stop")
        assert procs.health().values()[0] == "alive"
        assert procs.health().values()[1].startswith("stopped")
        text = procs.slice(gpus=1).stacks(timeout=0.5).get(timeout=10).values()[0]
        assert "stopped" in text and "SIGCONT" in text
    finally:
        os.kill(pid, signal.SIGCONT)
    assert procs.health().values() == ["alive", "alive"]
    assert r.ping.call().get(timeout=10).values() == [1, 1]


class Cyclic(am.Actor):
    def __init__(self) -> None:
        self.peer: am.ActorMesh | None = None  # type: ignore[type-arg]

    @am.endpoint
    def set_peer(self, peer: am.ActorMesh) -> None:  # type: ignore[type-arg]
        self.peer = peer

    @am.endpoint
    def first(self) -> int:  # on gpus=0: calls gpus=1, which calls back here
        assert self.peer is not None
        return int(self.peer.slice(gpus=1).second.call_one().get())

    @am.endpoint
    def second(self) -> int:
        assert self.peer is not None
        return int(self.peer.slice(gpus=0).third.call_one().get())

    @am.endpoint
    def third(self) -> int:
        return 3


def test_a_timeout_in_a_cycle_of_blocking_calls_says_who_waits_on_whom(spawn_procs) -> None:
    procs = spawn_procs(per_host={"gpus": 2})
    c = procs.spawn("cyclic", Cyclic)
    c.set_peer.call(c).get(timeout=30)
    fut = c.slice(gpus=0).first.call_one()
    with pytest.raises(am.MeshTimeoutError) as info:
        fut.get(timeout=1)
    text = str(info.value)
    assert "replies to cyclic.first from rank {hosts=0, gpus=0}" in text, text
    assert (
        "rank {gpus=0} (cyclic.first) waits for rank {gpus=1}; "
        "rank {gpus=1} (cyclic.second) waits for rank {gpus=0}: a cycle of blocking calls"
    ) in text, text
    procs.interrupt()  # ends the deadlock: both calls fail
    with pytest.raises(am.ActorError):
        fut.get(timeout=10)

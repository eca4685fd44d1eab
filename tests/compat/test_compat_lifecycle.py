"""docs/monarch.md: a proc mesh's ``bootstrap`` that spawns actors, ``ActorMesh.stop()`` while
an actor's ``__init__`` runs, and finalizers at a graceful stop, as Monarch's
``python/tests/test_python_actors.py`` has them (``test_setup``, ``test_run_forever_on_init``,
``test_del_runs_on_proc_mesh_stop``). The first two hung until a timeout before they worked:
each wait here is bounded so that a hang fails the test."""

from __future__ import annotations

import os
import pathlib
import threading
from typing import Any

import psutil
import pytest
from monarch_counter import Counter
from support import wait_until

from actormesh import Actor, Channel, Port, endpoint, this_host, this_proc

_global_foo: Any = None


def setup_with_spawn() -> None:
    global _global_foo
    proc = this_proc()
    # Doesn't matter which actor is spawned, just make sure it persists.
    _global_foo = proc.spawn("foo", Counter, 0)
    _global_foo.incr.call().get(timeout=20)
    # Spawn one that is dropped, to make sure it doesn't cause any issues.
    bar = proc.spawn("bar", Counter, 0)
    bar.incr.call().get(timeout=20)


async def async_setup_with_spawn() -> None:
    global _global_foo
    proc = this_proc()
    _global_foo = proc.spawn("foo", Counter, 0)
    await _global_foo.incr.call()
    bar = proc.spawn("bar", Counter, 0)
    await bar.incr.call()


class ReadsFoo(Actor):
    @endpoint
    async def foo_value(self) -> int:
        return await _global_foo.value.call_one()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("bootstrap", [setup_with_spawn, async_setup_with_spawn])
def test_setup(bootstrap) -> None:
    # Two processes: this_proc() in the second names that process, not the first one's rank.
    procs = this_host().spawn_procs(per_host={"gpus": 2}, bootstrap=bootstrap)
    try:
        procs.initialized.get(timeout=40)
        counter = procs.spawn("counter", Counter, 0)
        counter.incr.call().get(timeout=20)
        assert counter.value.call().get(timeout=20).values() == [1, 1]
        # What the bootstrap spawned lives on, beside the actors spawned after it.
        reads = procs.spawn("reads_foo", ReadsFoo).foo_value.call().get(timeout=20)
        assert reads.values() == [1, 1]
    finally:
        procs.stop().get(timeout=30)


class RunForeverOnInitActor(Actor):
    """Actor whose __init__ never returns."""

    def __init__(self, pm: Any, send: Port) -> None:
        counter = pm.spawn("counter_from_init", Counter, 42)
        send.send(counter)
        threading.Event().wait()

    @endpoint
    async def unreachable(self) -> None:
        pass


class BusyOnInitActor(Actor):
    """Actor whose __init__ runs Python code for good."""

    def __init__(self, send: Port) -> None:
        send.send(os.getpid())
        while True:
            pass

    @endpoint
    async def unreachable(self) -> None:
        pass


@pytest.mark.timeout(90)
def test_run_forever_on_init() -> None:
    """An actor whose __init__ never returns still lets its side effects out, and stops."""
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        send, recv = Channel.open()
        forever = pm.spawn("forever", RunForeverOnInitActor, pm, send)
        counter = recv.recv().get(timeout=30)
        assert counter.value.call_one().get(timeout=20) == 42
        forever.stop().get(timeout=30)
        # The stop's failure is an ActorError as well (stopped before it was built).
        with pytest.raises(Exception, match="stopped"):
            forever.unreachable.call_one().get(timeout=20)
    finally:
        pm.stop().get(timeout=30)


@pytest.mark.timeout(90)
def test_stop_interrupts_a_busy_init() -> None:
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        send, recv = Channel.open()
        busy = pm.spawn("busy", BusyOnInitActor, send)
        pid = recv.recv().get(timeout=30)
        busy.stop().get(timeout=30)
        # The loop was interrupted: the process no longer spins a core.
        process = psutil.Process(pid)
        process.cpu_percent()
        wait_until(lambda: process.cpu_percent() < 50, 10, "the __init__ loop to end")
    finally:
        pm.stop().get(timeout=30)


class ObjectWithFinalizer:
    """Writes a marker file when finalized."""

    def __init__(self, path: str) -> None:
        # Opened now: "open" may be gone at interpreter finalization time.
        self._file = open(path, "w")  # noqa: SIM115  closed by __del__

    def __del__(self) -> None:
        self._file.write("finalized")
        self._file.close()


_finalizer_sentinel: ObjectWithFinalizer | None = None


class CleanupMarkerActor(Actor):
    """Stashes an ObjectWithFinalizer in a module global, collected only as the process ends."""

    def __init__(self, path: str) -> None:
        global _finalizer_sentinel
        _finalizer_sentinel = ObjectWithFinalizer(path)

    @endpoint
    def getpid(self) -> int:
        return os.getpid()


@pytest.mark.timeout(90)
def test_del_runs_on_proc_mesh_stop(tmp_path: pathlib.Path) -> None:
    marker = tmp_path / "marker.txt"
    marker.write_text("not finalized")
    pm = this_host().spawn_procs(per_host={"gpus": 1})
    am = pm.spawn("cleanup", CleanupMarkerActor, str(marker))
    pids = [pid for _, pid in am.getpid.call().get(timeout=30)]
    assert os.getpid() not in pids
    pm.stop().get(timeout=30)
    wait_until(lambda: not any(psutil.pid_exists(pid) for pid in pids), 10, "the process to end")
    assert marker.read_text() == "finalized"

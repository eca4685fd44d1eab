"""The runtime core with real worker processes: actors, adverbs, slicing, ordering, futures."""

from __future__ import annotations

import asyncio
import operator
import os
import re
import threading

import pytest
from support import wait_until

import actormesh as am


class Counter(am.Actor):
    def __init__(self, start: int) -> None:
        self.value = start

    @am.endpoint
    def incr(self, by: int = 1) -> None:
        self.value += by

    @am.endpoint
    async def get(self) -> int:
        return self.value


class Recorder(am.Actor):
    """Remembers the order in which it saw messages."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    @am.endpoint
    def note(self, i: int) -> None:
        self.seen.append(i)

    @am.endpoint
    def note_and_ack(self, i: int) -> int:
        self.seen.append(i)
        return i

    @am.endpoint
    def history(self) -> list[int]:
        return self.seen


class Where(am.Actor):
    @am.endpoint
    def rank(self) -> dict[str, object]:
        ctx = am.context()
        return {
            "rank": dict(am.current_rank()),
            "size": am.current_size(),
            "message_rank": dict(ctx.message_rank),
            "actor_rank": ctx.actor_instance.rank.rank,
            "pid": os.getpid(),
            "env": os.environ.get("AM_TEST_VAR"),
        }

    @am.endpoint
    def say(self, text: str) -> str:
        print(f"said {text}")
        return text


def test_issue_example(spawn_procs) -> None:
    procs = spawn_procs(per_host={"gpus": 4})
    assert dict(procs.extent) == {"hosts": 1, "gpus": 4}
    c = procs.spawn("counter", Counter, 10)
    c.incr.broadcast()
    c.slice(gpus=slice(0, 2)).incr.broadcast(5)
    values = c.get.call().get(timeout=30)
    assert isinstance(values, am.ValueMesh)
    assert values.values() == [16, 16, 11, 11]
    assert repr(values) == "ValueMesh({gpus=0: 16, gpus=1: 16, gpus=2: 11, gpus=3: 11})"
    assert c.slice(gpus=3).get.call_one().get(timeout=10) == 11
    assert procs.stop().get(timeout=20) is None
    with pytest.raises(am.MeshClosedError):
        c.get.call()


def test_each_rank_is_its_own_process_with_its_rank(spawn_procs) -> None:
    procs = spawn_procs(per_host={"a": 2, "b": 3}, env={"AM_TEST_VAR": "yes"})
    assert dict(procs.extent) == {"hosts": 1, "a": 2, "b": 3}
    w = procs.spawn("where", Where)
    result = w.rank.call().get(timeout=30)
    pids = {v["pid"] for v in result.values()}
    assert len(pids) == 6 and os.getpid() not in pids
    for point, v in result.items():
        assert v["rank"] == {"hosts": 0, "a": point["a"], "b": point["b"]}
        assert v["size"] == {"hosts": 1, "a": 2, "b": 3}
        assert v["actor_rank"] == point.rank
        assert v["env"] == "yes"
    # message_rank is the position within the slice that was messaged
    sliced = w.slice(b=slice(1, 3)).rank.call().get(timeout=30)
    for point, v in sliced.items():
        assert v["message_rank"] == {"hosts": 0, "a": point["a"], "b": point["b"]}
        assert v["rank"]["b"] == point["b"] + 1


def test_per_sender_fifo_across_broadcasts_calls_and_slices(shared_procs) -> None:
    rec = shared_procs.spawn("recorder", Recorder)
    expected: dict[int, list[int]] = {g: [] for g in range(4)}
    pending = []
    for i in range(400):
        kind = i % 4
        if kind == 0:
            rec.note.broadcast(i)
            targets = range(4)
        elif kind == 1:
            rec.slice(gpus=i % 4).note.broadcast(i)
            targets = [i % 4]
        elif kind == 2:
            pending.append(rec.slice(gpus=slice(1, 4)).note_and_ack.call(i))
            targets = range(1, 4)
        else:
            pending.append(rec.slice(gpus=slice(0, 4, 2)).note_and_ack.call(i))
            targets = [0, 2]
        for g in targets:
            expected[g].append(i)
    for fut in pending:
        fut.get(timeout=30)
    history = rec.history.call().get(timeout=30)
    for point, seen in history.items():
        assert seen == expected[point["gpus"]]


class Indirect(am.Actor):
    @am.endpoint
    async def read(self, counter: am.ActorMesh[Counter]) -> int:
        return await counter.get.call_one()

    @am.endpoint
    async def read_until(self, counter: am.ActorMesh[Counter], wanted: int) -> int:
        """Read ``counter`` until it holds ``wanted`` (each read a call of its own); how many
        reads it took. Bounded by the caller's timeout."""
        reads = 1
        while await counter.get.call_one() != wanted:
            reads += 1
        return reads


def test_causal_order_a_broadcast_waiting_for_the_io_thread_goes_out_with_the_next_call(
    shared_procs,
) -> None:
    """A broadcast waits in a batch for this process's I/O thread (held busy here, as a loaded
    machine would); a call to another actor sends the batch first, so that actor, reading what
    the broadcast changed, sees the change while the I/O thread is still held.

    It may take that actor more than one read: a read may reach the counter while the
    broadcast is still on its way, under load (docs/monarch.md, "Message order"). Without the
    flush the broadcast would not leave before the release, and every read would see the old
    value until the timeout."""
    from actormesh.runtime.messaging.node import current_node

    counter = shared_procs.slice(gpus=1).spawn("causal_counter", Counter, 3)
    indirect = shared_procs.slice(gpus=2).spawn("causal_indirect", Indirect)
    assert indirect.read.call_one(counter).get(timeout=30) == 3
    busy, release = threading.Event(), threading.Event()

    def hold_the_io_thread() -> None:
        busy.set()
        release.wait(20)

    current_node().transport.call_soon(hold_the_io_thread)
    try:
        assert busy.wait(10)
        counter.incr.broadcast()  # batched: the busy I/O thread has not sent it
        indirect.read_until.call_one(counter, 4).get(timeout=10)
    finally:
        release.set()
    assert counter.get.call_one().get(timeout=10) == 4


def test_call_one_needs_one_actor_and_says_how_to_slice(shared_procs) -> None:
    c = shared_procs.spawn("counter1", Counter, 0)
    with pytest.raises(am.MeshError, match=r"4 actors.*slice\(gpus=0\)"):
        c.get.call_one()
    with pytest.raises(am.MeshError, match=r"no endpoint 'nope'.*get, incr"):
        c.nope.call()
    with pytest.raises(ValueError, match=r"no dimension 'gpu'.*\{hosts: 1, gpus: 4\}"):
        c.slice(gpu=0)
    with pytest.raises(IndexError, match="out of range"):
        c.slice(gpus=4)


def test_choose_stream_and_accumulate(shared_procs) -> None:
    w = shared_procs.spawn("where2", Where)
    chosen = w.rank.choose().get(timeout=10)
    assert chosen["rank"]["gpus"] in range(4)
    seen = sorted(fut.get()["rank"]["gpus"] for fut in w.rank.stream())
    assert seen == [0, 1, 2, 3]
    c = shared_procs.spawn("counter2", Counter, 5)
    total = am.Accumulator(c.get, 0, operator.add).accumulate().get(timeout=10)
    assert total == 20

    async def consume() -> list[int]:
        return sorted([(await fut)["rank"]["gpus"] async for fut in w.rank.stream()])

    assert asyncio.run(consume()) == [0, 1, 2, 3]


def test_future_in_sync_async_and_running_loop(shared_procs) -> None:
    c = shared_procs.spawn("counter3", Counter, 7)
    one = c.slice(gpus=1)

    async def inside_loop() -> tuple[int, int]:
        blocking = one.get.call_one().get(timeout=10)  # .get() inside a running loop
        awaited = await one.get.call_one()
        return blocking, awaited

    assert asyncio.run(inside_loop()) == (7, 7)
    fut = one.get.call_one()
    assert fut.result(timeout=10) == 7
    assert fut.exception() is None and fut.done()
    called = []
    fut.add_done_callback(lambda f: called.append(f.get()))
    assert called == [7]


def test_replies_to_the_main_thread_arrive_while_it_does_not_wait(shared_procs) -> None:
    # The main thread reads its replies itself while it waits in get(); when it does not wait,
    # the I/O thread must read them, or futures would never complete on their own.
    one = shared_procs.spawn("counter4", Counter, 3).slice(gpus=2)
    untouched = one.get.call_one()
    wait_until(untouched.done, timeout=10, what="a reply nobody waits for")
    assert one.get.call_one().get(timeout=10) == 3  # the main thread reads this one itself
    after_wait = one.get.call_one()
    seen = threading.Event()
    after_wait.add_done_callback(lambda _: seen.set())
    assert seen.wait(10), "the callback of a reply that arrived after a wait never ran"
    # Other threads get their replies through the process inbox, beside the main thread's.
    results: list[int] = []
    workers = [
        threading.Thread(target=lambda: results.append(one.get.call_one().get(timeout=10)))
        for _ in range(4)
    ]
    for t in workers:
        t.start()
    assert [one.get.call_one().get(timeout=10) for _ in range(20)] == [3] * 20
    for t in workers:
        t.join(timeout=10)
    assert results == [3] * 4


def test_prints_arrive_before_the_reply_prefixed_with_rank(shared_procs, capsys) -> None:
    w = shared_procs.spawn("talker", Where)
    assert w.slice(gpus=2).say.call_one("hello").get(timeout=10) == "hello"
    assert "[gpus=2] said hello" in capsys.readouterr().out
    w.say.call("all").get(timeout=10)
    out = capsys.readouterr().out
    for g in range(4):
        assert f"[gpus={g}] said all" in out


def test_tensors_travel_out_of_band_and_arrive_intact(shared_procs) -> None:
    import torch

    class Torch(am.Actor):
        @am.endpoint
        def double(self, t: torch.Tensor) -> torch.Tensor:
            return t * 2

        @am.endpoint
        def make(self, n: int) -> dict[str, torch.Tensor]:
            return {"ones": torch.ones(n, dtype=torch.bfloat16), "empty": torch.empty(0, 3)}

    t = shared_procs.spawn("torch", Torch)
    big = torch.arange(1 << 20, dtype=torch.float32).reshape(1024, 1024)
    out = t.slice(gpus=0).double.call_one(big).get(timeout=30)
    assert torch.equal(out, big * 2)
    strided = big[:, ::2]
    assert torch.equal(t.slice(gpus=1).double.call_one(strided).get(timeout=30), strided * 2)
    made = t.slice(gpus=0).make.call_one(100_000).get(timeout=30)
    assert made["ones"].dtype == torch.bfloat16 and made["ones"].float().sum().item() == 100_000
    assert made["empty"].shape == (0, 3)
    made["ones"].add_(1)  # received tensors are writable


def test_this_proc_runs_actors_in_the_controller() -> None:
    w = am.this_proc().spawn("local", Where)
    result = w.rank.call_one().get(timeout=10)
    assert result["pid"] == os.getpid()
    w.stop().get(timeout=10)  # its thread in this process ends


class SpawnsThere(am.Actor):
    def __init__(self) -> None:
        # This worker's own one-proc mesh, alive when the controller's arrives: it must not
        # stand in for the one the endpoint gets.
        self.mine = am.this_proc()

    @am.endpoint
    def pid_of_an_actor_on(self, mesh: am.ProcMesh) -> int:
        here = mesh.spawn("spawned_there", Where)
        pid = int(here.rank.call_one().get(timeout=10)["pid"])
        here.stop().get(timeout=10)  # its thread in the controller ends
        return pid


def test_this_proc_passed_to_a_worker_still_names_the_controller(shared_procs) -> None:
    spawner = shared_procs.slice(gpus=0).spawn("spawns_there", SpawnsThere)
    assert spawner.pid_of_an_actor_on.call_one(am.this_proc()).get(timeout=30) == os.getpid()


def test_init_failure_surfaces_at_first_call_and_initialized(
    shared_procs, unhandled_failures
) -> None:
    class Broken(am.Actor):
        def __init__(self) -> None:
            raise RuntimeError("bad config")

        @am.endpoint
        def ping(self) -> int:
            return 1

    b = shared_procs.spawn("broken", Broken)
    with pytest.raises(am.ActorError, match="bad config") as info:
        b.initialized.get(timeout=10)
    assert "__init__" in str(info.value)
    with pytest.raises(am.ActorError, match=r"failed in __init__.*bad config"):
        b.ping.call().get(timeout=10)
    # Each rank's failed __init__ is also a supervision event (test_monarch_behaviour.py).
    wait_until(lambda: len(unhandled_failures) == 4, 10, "the four __init__ failures")
    unhandled_failures.clear()


def test_endpoint_exception_keeps_actor_alive(shared_procs) -> None:
    class Flaky(am.Actor):
        @am.endpoint
        def div(self, x: int) -> float:
            return 1 / x

    f = shared_procs.spawn("flaky", Flaky)
    with pytest.raises(am.ActorError) as info:
        f.div.call(0).get(timeout=10)
    err = info.value
    assert err.exc_type == "ZeroDivisionError"
    assert len(err.groups()) == 1 and len(err.failures) == 4
    assert "in div" in err.remote_traceback
    assert f.div.call(2).get(timeout=10).values() == [0.5] * 4


def test_timeout_names_the_ranks_that_did_not_reply(shared_procs) -> None:
    class Sleepy(am.Actor):
        @am.endpoint
        def nap(self, seconds: float) -> None:
            import time

            if am.current_rank()["gpus"] == 3:
                time.sleep(seconds)

    s = shared_procs.spawn("sleepy", Sleepy)
    fut = s.nap.call(1.5)
    with pytest.raises(am.MeshTimeoutError, match=r"rank \{hosts=0, gpus=3\}"):
        fut.get(timeout=0.5)
    fut.get(timeout=20)  # and it does complete afterwards


def test_unpicklable_argument_is_named_before_sending(shared_procs) -> None:
    import threading

    c = shared_procs.spawn("counter4", Counter, 0)
    with pytest.raises(TypeError, match="pickle") as info:  # pickle's own error, as in Monarch
        c.incr.call(threading.Lock())
    assert not isinstance(info.value, am.MeshError)
    assert any(
        re.search(r"argument 0 of counter4\.incr .*lock.* cannot be pickled", note)
        for note in info.value.__notes__
    )

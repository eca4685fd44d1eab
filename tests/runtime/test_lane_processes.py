"""Large tensors between the controller and workers of one host through shared memory
(runtime/messaging/shm_lane.py), with real processes: intact both ways, and no slot file left
behind by a stop, a killed worker or the controller's exit."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap

import torch
from support import wait_until

import actormesh as am


class Doubler(am.Actor):
    @am.endpoint
    def double(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(t * 2 for t in tensors)

    @am.endpoint
    def make(self, n: int) -> torch.Tensor:
        return torch.arange(n, dtype=torch.float32)

    @am.endpoint
    def pid(self) -> int:
        return os.getpid()

    @am.endpoint
    def slots_mapped(self) -> list[str]:
        return slots_mapped()


def slots_mapped() -> list[str]:
    """The lane slots (of any process) that this process maps, removed ones included."""
    with open("/proc/self/maps") as f:
        words = [w for line in f for w in line.split() if w.startswith("/dev/shm/actormesh-")]
    return sorted({w for w in words if "-lane" in w})


def slots_of(pid: int) -> list[str]:
    return glob.glob(f"/dev/shm/actormesh-*-{pid}-lane*")


def test_large_tensors_cross_through_shared_memory_both_ways(spawn_procs) -> None:
    procs = spawn_procs(per_host={"gpus": 2})
    doublers = procs.spawn("doubler", Doubler)
    one = doublers.slice(gpus=0)
    big = torch.randn(512, 1024)  # 2 MiB
    halves = torch.ones(200_000, dtype=torch.bfloat16)
    strided = big[:, ::2]
    out = one.double.call_one(big, halves, strided).get(timeout=30)
    assert torch.equal(out[0], big * 2) and torch.equal(out[2], strided * 2)
    assert out[1].dtype == torch.bfloat16 and torch.equal(out[1], halves * 2)
    out[0].add_(1)  # what arrives is the receiver's own, writable memory
    assert torch.equal(one.make.call_one(1 << 20).get(timeout=30), torch.arange(1 << 20) * 1.0)
    worker = one.pid.call_one().get(timeout=10)
    # Both ways went through slots: the worker maps the controller's, and the other way round.
    assert any(f"-{os.getpid()}-lane" in s for s in one.slots_mapped.call_one().get(timeout=10))
    assert any(f"-{worker}-lane" in s for s in slots_mapped())
    assert slots_of(worker)
    # A call to both ranks: the tensors are copied once, into a slot both read.
    for doubled in doublers.double.call(big, halves).get(timeout=30).values():
        assert torch.equal(doubled[0], big * 2) and torch.equal(doubled[1], halves * 2)
    other = doublers.slice(gpus=1)
    assert any(f"-{os.getpid()}-lane" in s for s in other.slots_mapped.call_one().get(timeout=10))
    pids = doublers.pid.call().get(timeout=10).values()
    procs.stop().get(timeout=20)
    assert [slots_of(pid) for pid in pids] == [[], []]  # removed by the workers as they ended


def test_a_killed_workers_slots_are_removed_and_no_longer_mapped(
    spawn_procs, unhandled_failures
) -> None:
    procs = spawn_procs(per_host={"gpus": 2})
    doublers = procs.spawn("doubler", Doubler)
    victim = doublers.slice(gpus=0)
    assert victim.make.call_one(1 << 18).get(timeout=30).shape == (1 << 18,)
    pid = victim.pid.call_one().get(timeout=10)
    assert slots_of(pid) and any(f"-{pid}-lane" in s for s in slots_mapped())
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: slots_of(pid) == [], 10, "the killed worker's slots to be removed")
    wait_until(lambda: not any(f"-{pid}-lane" in s for s in slots_mapped()), 10, "the unmapping")
    # The other rank still takes tensors both ways.
    survivor = doublers.slice(gpus=1)
    t = torch.randn(1 << 18)
    assert torch.equal(survivor.double.call_one(t).get(timeout=30)[0], t * 2)
    unhandled_failures.clear()  # the death, which nobody was calling


CONTROLLER = """
import glob, os, torch
import actormesh as am

class Doubler(am.Actor):
    @am.endpoint
    def double(self, t):
        return t * 2

procs = am.this_host().spawn_procs(per_host={"gpus": 1})
t = torch.randn(1 << 18)
assert torch.equal(procs.spawn("doubler", Doubler).double.call_one(t).get(timeout=30), t * 2)
assert glob.glob(f"/dev/shm/actormesh-*-{os.getpid()}-lane*")
print("PID", os.getpid())
"""


def test_the_controllers_slots_go_when_it_exits(tmp_path) -> None:
    script = tmp_path / "controller.py"
    script.write_text(textwrap.dedent(CONTROLLER))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    pid = int(proc.stdout.split("PID")[1])
    assert slots_of(pid) == []


class Sink(am.Actor):
    @am.endpoint
    def hold(self, seconds: float) -> None:
        import threading

        threading.Event().wait(seconds)  # busy: what comes meanwhile stays unread

    @am.endpoint
    def take(self, t: torch.Tensor) -> float:
        return float(t[0])

    @am.endpoint
    def pid(self) -> int:
        return os.getpid()


def test_a_dead_receivers_unread_messages_free_the_senders_lane(
    spawn_procs, unhandled_failures
) -> None:
    from actormesh.runtime.messaging.node import current_node

    lane = current_node().transport._lane
    assert lane is not None
    procs = spawn_procs(per_host={"gpus": 1})
    sink = procs.spawn("sink", Sink)
    pid = sink.pid.call_one().get(timeout=30)
    before = lane.unread()
    sink.hold.broadcast(600)
    for i in range(80):  # 1 MiB each: the lane's pool holds 63 of them
        sink.take.broadcast(torch.full((1 << 18,), float(i)))
    wait_until(lambda: lane.unread() - before >= 60, 30, "the messages to fill the lane")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: procs.health().values()[0] != "alive", 30, "the death to be seen")
    assert lane.unread() == before, "the dead rank's unread messages still hold the lane"
    unhandled_failures.clear()  # the death, which nobody was calling
    procs.heal().get(timeout=30)
    sink = procs.spawn("sink2", Sink)
    t = torch.full((1 << 18,), 7.0)
    assert [sink.take.call_one(t).get(timeout=30) for _ in range(5)] == [7.0] * 5
    assert lane.unread() == before

"""TensorBuffer: one-sided reads and writes between processes, shared memory and socket paths."""

from __future__ import annotations

import os
import signal

import pytest
import torch

import actormesh as am


class Holder(am.Actor):
    def __init__(self) -> None:
        self.t = torch.arange(1 << 18, dtype=torch.float32)
        self.buffers: dict[str, am.TensorBuffer] = {}

    @am.endpoint
    def buffer(self, transport: str = "auto") -> am.TensorBuffer:
        buf = am.TensorBuffer(self.t, transport=transport)
        self.buffers[transport] = buf
        return buf

    @am.endpoint
    def total(self) -> float:
        return float(self.t.sum())

    @am.endpoint
    def drop(self, transport: str) -> None:
        self.buffers.pop(transport).drop()

    @am.endpoint
    def read(self, buf: am.TensorBuffer) -> float:
        dst = torch.empty(1 << 18, dtype=torch.float32)
        buf.read_into(dst).get(timeout=10)
        return float(dst.sum())

    @am.endpoint
    def write(self, buf: am.TensorBuffer, value: float) -> None:
        buf.write_from(torch.full((1 << 18,), value)).get(timeout=10)

    @am.endpoint
    def pid(self) -> int:
        return os.getpid()


EXPECTED = float(torch.arange(1 << 18, dtype=torch.float32).sum())


@pytest.mark.parametrize("transport", ["auto", "socket"])
def test_actor_reads_and_writes_another_actors_tensor(shared_procs, transport: str) -> None:
    h = shared_procs.spawn(f"holder-{transport}", Holder)
    owner, reader = h.slice(gpus=0), h.slice(gpus=1)
    buf = owner.buffer.call_one(transport).get(timeout=10)
    assert (buf.nbytes, buf.dtype, buf.shape) == (1 << 20, "float32", (1 << 18,))
    assert reader.read.call_one(buf).get(timeout=10) == EXPECTED
    reader.write.call_one(buf, 2.0).get(timeout=10)
    assert owner.total.call_one().get(timeout=10) == 2.0 * (1 << 18)  # the owner's own tensor
    dst = torch.empty(1 << 18)
    buf.read_into(dst).get(timeout=10)  # the controller holds the handle too
    assert float(dst.sum()) == 2.0 * (1 << 18)
    owner.drop.call_one(transport).get(timeout=10)
    with pytest.raises(am.ActorError, match="dropped"):
        h.slice(gpus=2).read.call_one(buf).get(timeout=10)


def test_controller_owned_buffer_and_clear_errors(shared_procs) -> None:
    mine = torch.ones(1 << 18)
    buf = am.TensorBuffer(mine)
    h = shared_procs.spawn("holder-ctl", Holder)
    assert h.slice(gpus=3).read.call_one(buf).get(timeout=10) == float(1 << 18)
    h.slice(gpus=3).write.call_one(buf, 3.0).get(timeout=10)
    assert float(mine.sum()) == 3.0 * (1 << 18)  # the controller's tensor, written by the actor
    with pytest.raises(am.MeshError, match="holds float32"):
        buf.read_into(torch.empty(10))
    with pytest.raises(am.MeshError, match="holds float32"):
        buf.read_into(torch.empty(1 << 18, dtype=torch.float64))
    with pytest.raises(am.MeshError, match="contiguous"):
        am.TensorBuffer(torch.ones(4, 4).t())
    buf.drop()


def test_a_dead_owner_is_a_supervision_error(spawn_procs, unhandled_failures) -> None:
    procs = spawn_procs(per_host={"gpus": 1})
    h = procs.spawn("holder", Holder)
    buf = h.buffer.call_one("socket").get(timeout=30)
    pid = h.pid.call_one().get(timeout=10)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(am.SupervisionError):
        h.total.call_one().get(timeout=10)
    with pytest.raises(am.SupervisionError, match="owner"):
        buf.read_into(torch.empty(1 << 18)).get(timeout=10)
    assert not [f for f in os.listdir("/dev/shm") if f"-{pid}-" in f]  # its memory is freed
    unhandled_failures.clear()  # the kill may land before the call: then nobody observed it


def test_a_view_is_served_over_the_socket_and_keeps_aliasing(shared_procs) -> None:
    base = torch.zeros(10)
    buf = am.TensorBuffer(base[2:5])
    assert buf.transport == "socket"

    class Writer(am.Actor):
        @am.endpoint
        def write(self, b: am.TensorBuffer) -> None:
            b.write_from(torch.tensor([1.0, 2.0, 3.0])).get(timeout=10)

    shared_procs.spawn("writer", Writer).slice(gpus=0).write.call_one(buf).get(timeout=10)
    assert base.tolist() == [0, 0, 1, 2, 3, 0, 0, 0, 0, 0]
    with pytest.raises(am.MeshError, match="view of a larger tensor"):
        am.TensorBuffer(base[2:5], transport="shm")
    buf.drop()

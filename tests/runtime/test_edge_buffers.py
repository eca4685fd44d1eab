"""TensorBuffer edge paths (issue 26): a full /dev/shm, and readers' mappings of dropped buffers
and of dead owners."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
from support import wait_until

import actormesh as am

N = 1 << 18  # float32: 1 MiB


class Owner(am.Actor):
    def __init__(self) -> None:
        self.buffers: list[am.TensorBuffer] = []

    @am.endpoint
    def make(self, value: float) -> am.TensorBuffer:
        buf = am.TensorBuffer(torch.full((N,), value))
        self.buffers.append(buf)
        return buf

    @am.endpoint
    def drop(self) -> None:
        self.buffers.pop().drop()

    @am.endpoint
    def pid(self) -> int:
        return os.getpid()


class Reader(am.Actor):
    def __init__(self) -> None:
        self.held: am.TensorBuffer | None = None
        self.seen: list[object] = []

    @am.endpoint
    def read(self, buf: am.TensorBuffer, keep: bool = True) -> float:
        if keep:
            self.held = buf
        dst = torch.empty(N)
        buf.read_into(dst).get(timeout=10)
        return float(dst[0])

    @am.endpoint
    def read_held(self) -> float:
        assert self.held is not None
        dst = torch.empty(N)
        self.held.read_into(dst).get(timeout=10)
        return float(dst[0])

    @am.endpoint
    def forget(self) -> None:
        self.held = None

    @am.endpoint
    def read_mapping(self, buf: am.TensorBuffer) -> int:
        """Read through a handle that is garbage afterwards; which mapping it read through
        (kept here, so that no later one takes its id)."""
        dst = torch.empty(N)
        buf.read_into(dst).get(timeout=10)
        self.seen.append(buf._map)
        return id(buf._map)

    @am.endpoint
    def mapped(self, path: str | None = None) -> list[str]:
        """The TensorBuffer files this process maps (deleted ones included; not the message
        lane's slots, which calls with large tensors map), or only ``path`` if it does. Other
        tests' buffers read by this worker may still be mapped for a moment (shm.LINGER_S)."""
        with open("/proc/self/maps") as f:
            found = [w for line in f for w in line.split() if w.startswith("/dev/shm/actormesh-")]
        return [p for p in found if "-lane" not in p and path in (None, p)]


def test_a_dropped_buffer_read_again_by_a_reader_that_mapped_it_raises(shared_procs) -> None:
    owner = shared_procs.spawn("drop-owner", Owner).slice(gpus=0)
    reader = shared_procs.spawn("drop-reader", Reader).slice(gpus=1)
    buf = owner.make.call_one(5.0).get(timeout=10)
    assert reader.read.call_one(buf).get(timeout=10) == 5.0
    assert reader.mapped.call_one(buf.path).get(timeout=10) == [buf.path]
    owner.drop.call_one().get(timeout=10)
    with pytest.raises(am.ActorError, match="dropped"):
        reader.read_held.call_one().get(timeout=10)
    assert reader.mapped.call_one(buf.path).get(timeout=10) == []  # the mapping went with it


def test_readers_release_their_mappings(shared_procs) -> None:
    owner = shared_procs.spawn("cycle-owner", Owner).slice(gpus=0)
    reader = shared_procs.spawn("cycle-reader", Reader).slice(gpus=2)
    for i in range(5):
        buf = owner.make.call_one(float(i)).get(timeout=10)
        assert reader.read.call_one(buf, keep=False).get(timeout=10) == float(i)
        owner.drop.call_one().get(timeout=10)
        # The reader's handle was garbage: nothing of any cycle stays mapped (past the linger).
        wait_until(lambda p=buf.path: reader.mapped.call_one(p).get(timeout=10) == [], 10, "unmap")
    buf = owner.make.call_one(7.0).get(timeout=10)
    assert reader.read.call_one(buf).get(timeout=10) == 7.0
    assert reader.read_held.call_one().get(timeout=10) == 7.0  # a kept handle stays mapped
    assert reader.mapped.call_one(buf.path).get(timeout=10) == [buf.path]
    reader.forget.call_one().get(timeout=10)
    wait_until(lambda: reader.mapped.call_one(buf.path).get(timeout=10) == [], 10, "unmapping")
    owner.drop.call_one().get(timeout=10)


def test_a_buffer_passed_into_every_call_is_mapped_once(shared_procs) -> None:
    """Each call brings a new handle of the same buffer: they read through one mapping, kept
    for a moment after each handle goes (mapping it again for every read cost as much as the
    copy), and released once no handle has used it for that moment."""
    owner = shared_procs.spawn("linger-owner", Owner).slice(gpus=0)
    reader = shared_procs.spawn("linger-reader", Reader).slice(gpus=3)
    buf = owner.make.call_one(4.0).get(timeout=10)
    first = reader.read_mapping.call_one(buf).get(timeout=10)
    assert [reader.read_mapping.call_one(buf).get(timeout=10) for _ in range(3)] == [first] * 3
    wait_until(lambda: reader.mapped.call_one(buf.path).get(timeout=10) == [], 10, "unmapping")
    assert reader.read_mapping.call_one(buf).get(timeout=10) != first  # mapped anew
    owner.drop.call_one().get(timeout=10)


def test_a_dead_owners_segment_is_not_pinned_by_its_readers(spawn_procs, unhandled_failures):
    procs = spawn_procs(per_host={"gpus": 2})
    owner = procs.spawn("dead-owner", Owner).slice(gpus=0)
    reader = procs.spawn("dead-reader", Reader).slice(gpus=1)
    buf = owner.make.call_one(3.0).get(timeout=30)
    assert reader.read.call_one(buf).get(timeout=10) == 3.0
    pid = owner.pid.call_one().get(timeout=10)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: procs.health().values()[0] != "alive", 10, "the owner's death")
    # The reader still holds the handle, and has not tried to read since.
    wait_until(lambda: reader.mapped.call_one().get(timeout=10) == [], 10, "the unmapping")
    with pytest.raises(am.ActorError, match="owner"):
        reader.read_held.call_one().get(timeout=10)
    unhandled_failures.clear()  # the owner's death, which nobody was calling


SMALL_SHM = """
import warnings
import torch
import actormesh as am


class Reader(am.Actor):
    @am.endpoint
    def total(self, buf):
        dst = torch.empty(buf.shape)
        buf.read_into(dst).get(timeout=10)
        return float(dst.sum())

    @am.endpoint
    def double(self, t):
        return t * 2


t = torch.ones(4 << 20)  # 16 MiB, in a /dev/shm of 8 MiB
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    buf = am.TensorBuffer(t)
assert buf.transport == "socket", buf.transport
assert any("/dev/shm" in str(w.message) for w in caught), [str(w.message) for w in caught]
assert float(t.sum()) == 4 << 20
try:
    am.TensorBuffer(torch.ones(4 << 20), transport="shm")
except am.MeshError as exc:
    assert "/dev/shm" in str(exc) and "8.0 MiB" in str(exc), exc
    print("shm refused:", exc)
else:
    raise AssertionError("transport='shm' should have been refused")
small = am.TensorBuffer(torch.ones(1000))
assert small.transport == "auto" and small.path is not None  # what fits still goes to shm
with am.this_host().spawn_procs(per_host={"gpus": 1}) as procs:
    r = procs.spawn("reader", Reader)
    assert r.total.call_one(buf).get(timeout=30) == 4 << 20
    assert r.total.call_one(small).get(timeout=30) == 1000
    # Tensors in calls: no slot of the message lane fits (12 MiB), so they take the socket.
    big = torch.ones(3 << 20)
    assert torch.equal(r.double.call_one(big).get(timeout=30), big * 2)
print("OK")
"""


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare(1) to mount a small /dev/shm in a private mount namespace",
)
def test_a_buffer_larger_than_free_dev_shm_falls_back_to_the_socket(tmp_path) -> None:
    script = tmp_path / "small_shm.py"
    script.write_text(textwrap.dedent(SMALL_SHM))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = f"mount -t tmpfs -o size=8m tmpfs /dev/shm && exec {sys.executable} {script}"
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", cmd],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.strip().endswith("OK")

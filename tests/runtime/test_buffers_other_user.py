"""A TensorBuffer's shared-memory names against another local user (issue 40, items 5 and 6):
the names are public (``ls /dev/shm``), so a file or a link someone made under a dropped
buffer's name is never read or written, and names someone made first never refuse a buffer.

The other user is real: made with ``useradd`` for the test and removed after, so these tests
need root (they skip otherwise)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import actormesh as am
from actormesh.runtime.dataplane import buffer_owner
from actormesh.runtime.messaging.node import current_node

N = 1 << 18  # float32: 1 MiB
NBYTES = 4 * N


class OtherUser:
    """A local user of its own for one test, and what it does in ``/dev/shm``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def run(self, script: str) -> None:
        subprocess.run(
            ["runuser", "-u", self.name, "--", "sh", "-c", script], check=True, timeout=30
        )

    def make_file(self, path: str, nbytes: int, byte: str = "A") -> None:
        # Readable and writable by all: the most a careless (or hostile) user leaves open.
        self.run(f"head -c {nbytes} /dev/zero | tr '\\000' '{byte}' > {path}; chmod 666 {path}")

    def make_link(self, path: str, target: str) -> None:
        self.run(f"ln -s {target} {path}")


@pytest.fixture
def other_user() -> Iterator[OtherUser]:
    if os.geteuid() != 0:
        pytest.skip("needs root: it makes a second local user (useradd) and acts as it")
    if shutil.which("useradd") is None or shutil.which("runuser") is None:
        pytest.skip("needs useradd and runuser to act as a second local user")
    name = f"am-test-{os.getpid()}"
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
        check=True,
        timeout=30,
    )
    try:
        yield OtherUser(name)
    finally:
        uid = int(subprocess.run(["id", "-u", name], capture_output=True, text=True).stdout)
        for path in glob.glob("/dev/shm/actormesh-*"):
            try:
                if os.lstat(path).st_uid == uid:
                    os.unlink(path)
            except FileNotFoundError:
                pass
        subprocess.run(["userdel", name], check=True, timeout=30)


class Lender(am.Actor):
    def __init__(self) -> None:
        self.buffers: list[am.TensorBuffer] = []

    @am.endpoint
    def lend(self, value: float) -> am.TensorBuffer:
        buf = am.TensorBuffer(torch.full((N,), value))
        self.buffers.append(buf)
        return buf

    @am.endpoint
    def drop(self) -> None:
        self.buffers.pop().drop()

    @am.endpoint
    def read(self, buf: am.TensorBuffer) -> float:
        dst = torch.empty(N)
        buf.read_into(dst).get(timeout=10)
        return float(dst.sum())


def test_a_file_made_under_a_dropped_buffers_name_is_neither_read_nor_written(
    spawn_procs: Any, other_user: OtherUser
) -> None:
    lender = spawn_procs(per_host={"gpus": 1}).spawn("lender", Lender)
    buf = lender.lend.call_one(1.0).get(timeout=30)
    assert buf.path is not None
    dst = torch.zeros(N)
    buf.read_into(dst).get(timeout=10)
    assert torch.equal(dst, torch.ones(N))
    lender.drop.call_one().get(timeout=30)
    other_user.make_file(buf.path, NBYTES)
    fresh = torch.zeros(N)
    with pytest.raises(am.MeshError, match=r"dropped by its owner.*uid"):
        buf.read_into(fresh).get(timeout=10)
    assert torch.equal(fresh, torch.zeros(N)), "the reader got the other user's bytes"
    with pytest.raises(am.MeshError, match="dropped by its owner"):
        buf.write_from(torch.full((N,), 9.0)).get(timeout=10)
    with open(buf.path, "rb") as f:
        assert f.read() == b"A" * NBYTES, "the job's data went into the other user's file"


def test_a_link_made_under_a_dropped_buffers_name_is_not_followed(
    spawn_procs: Any, other_user: OtherUser, tmp_path: Any
) -> None:
    lender = spawn_procs(per_host={"gpus": 1}).spawn("lender", Lender)
    buf = lender.lend.call_one(1.0).get(timeout=30)
    assert buf.path is not None
    buf.read_into(torch.zeros(N)).get(timeout=10)
    lender.drop.call_one().get(timeout=30)
    victim = tmp_path / "a-file-of-root"  # the job's user's file, of the buffer's size
    victim.write_bytes(b"R" * NBYTES)
    other_user.make_link(buf.path, str(victim))
    with pytest.raises(am.MeshError, match="dropped by its owner"):
        buf.write_from(torch.full((N,), 9.0)).get(timeout=10)
    assert victim.read_bytes() == b"R" * NBYTES, "the job wrote through the other user's link"


def test_names_another_user_made_first_do_not_refuse_a_buffer(
    spawn_procs: Any, other_user: OtherUser
) -> None:
    lender = spawn_procs(per_host={"gpus": 1}).spawn("lender", Lender)
    probe = am.TensorBuffer(torch.ones(N))  # its id says which ids come next
    mailbox, pid = current_node().address.mailbox.hex(), os.getpid()
    taken = [f"/dev/shm/actormesh-{mailbox}-{pid}-{probe.buffer_id + i}" for i in range(1, 9)]
    other_user.run("; ".join(f"touch {path}" for path in taken))
    try:
        buf = am.TensorBuffer(torch.full((N,), 3.0))
        assert buf.path is not None and buf.path.startswith("/dev/shm/"), "not in shared memory"
        assert lender.read.call_one(buf).get(timeout=30) == 3.0 * N
        buf.drop()
    finally:
        probe.drop()


def test_when_no_new_name_can_be_made_the_socket_serves_the_buffer(
    spawn_procs: Any, other_user: OtherUser, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Names are random; were the random part guessed too, the buffer goes over the socket."""
    lender = spawn_procs(per_host={"gpus": 1}).spawn("lender", Lender)
    monkeypatch.setattr(buffer_owner.secrets, "token_hex", lambda n: "guessed")
    mailbox, pid = current_node().address.mailbox.hex(), os.getpid()
    next_id = am.TensorBuffer(torch.ones(1), transport="socket").buffer_id + 1
    other_user.run(f"touch /dev/shm/actormesh-{mailbox}-{pid}-{next_id}.guessed")
    with pytest.warns(ResourceWarning, match=r"taken.*over the socket"):
        buf = am.TensorBuffer(torch.full((N,), 5.0))
    assert buf.path is None and buf.transport == "socket"
    assert lender.read.call_one(buf).get(timeout=30) == 5.0 * N

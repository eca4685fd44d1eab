"""Fixtures shared by every tier: timeouts, process-leak detection, mesh factories."""

from __future__ import annotations

import contextlib
import glob
import os
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import psutil
import pytest

# Every envelope any process of the test run sends is checked against the protocol table
# (runtime/messaging/protocol.py), and every tensor op recorded against the table of op kinds
# (tensor/wire/kinds.py); workers and agents inherit the variable.
os.environ["ACTORMESH_CHECK_PROTOCOL"] = "1"


def _descendants() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def _infrastructure(procs: list[psutil.Process]) -> set[int]:
    """The controller's host agents and their fork servers: they live for the whole session."""
    me = os.getpid()
    keep: set[int] = set()
    for p in procs:
        try:
            cmd = " ".join(p.cmdline())
            if "actormesh.runtime.procs.host_agent" in cmd and p.ppid() == me:
                keep.add(p.pid)
        except psutil.Error:
            continue
    for p in procs:
        try:
            if p.ppid() in keep and "actormesh.runtime.procs.zygote" in " ".join(p.cmdline()):
                keep.add(p.pid)
        except psutil.Error:
            continue
    return keep


T = TypeVar("T")


def _left_after_grace(find: Callable[[], list[T]], grace: float = 10.0) -> list[T]:
    """What ``find`` still finds once it finds nothing or ``grace`` seconds have passed: what
    a test started gets that long to go away by itself."""
    deadline = time.monotonic() + grace
    left = find()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = find()
    return left


@pytest.fixture(autouse=True)
def no_leaked_processes() -> Iterator[None]:
    """Fail the test that leaves a process behind (after giving stops a few seconds)."""
    before = {p.pid for p in _descendants()}
    yield

    def leaked() -> list[psutil.Process]:
        procs = _descendants()
        infra = _infrastructure(procs)
        out = []
        for p in procs:
            if p.pid in before or p.pid in infra:
                continue
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                continue
        return out

    left = _left_after_grace(leaked)
    if left:
        desc = [f"{p.pid}: {' '.join(p.cmdline())[:120]}" for p in left if p.is_running()]
        for p in left:
            try:
                p.kill()
            except psutil.Error:
                pass
        pytest.fail(f"test left {len(left)} process(es) running: {desc}")


def _orphaned_shared_memory() -> list[str]:
    """actormesh's files in /dev/shm whose process is gone (named ``actormesh-<mailbox>-<pid>-*``:
    TensorBuffers and the message lane's slots). A live process's are its own business."""
    out = []
    for path in glob.glob("/dev/shm/actormesh-*"):
        parts = os.path.basename(path).split("-")
        if len(parts) >= 4 and parts[2].isdigit() and not psutil.pid_exists(int(parts[2])):
            out.append(path)
    return out


@pytest.fixture(autouse=True)
def no_leaked_shared_memory() -> Iterator[None]:
    """Fail the test that leaves a dead process's shared memory behind (removing it is the
    process's own job as it exits, or its host agent's when it is killed)."""
    before = set(_orphaned_shared_memory())
    yield
    left = _left_after_grace(lambda: sorted(set(_orphaned_shared_memory()) - before))
    for path in left:
        with contextlib.suppress(OSError):
            os.unlink(path)
    if left:
        pytest.fail(f"test left shared memory of dead processes: {left}")


@pytest.fixture(autouse=True)
def unhandled_failures() -> Iterator[list[object]]:
    """Collects failures that reached the fault hook; a test that expects some empties the list.

    Anything left at the end fails the test: an unhandled failure nobody meant to cause.
    """
    from actormesh.runtime.faults import supervision

    seen: list[object] = []
    previous = supervision.set_fault_hook(seen.append)
    yield seen
    supervision.set_fault_hook(previous)
    if seen:
        pytest.fail(f"unexpected unhandled failures: {seen}")


@pytest.fixture
def spawn_procs() -> Iterator[Callable[..., object]]:
    """Factory: ``spawn_procs(per_host={...})``; every mesh is stopped at teardown."""
    import actormesh as am

    meshes: list[am.ProcMesh] = []

    def make(**kwargs: object) -> am.ProcMesh:
        mesh = am.this_host().spawn_procs(**kwargs)  # type: ignore[arg-type]
        meshes.append(mesh)
        return mesh

    yield make
    for mesh in meshes:
        mesh.stop().get(timeout=20)

"""Fixtures shared by every tier: timeouts, process-leak detection, mesh factories."""

from __future__ import annotations

import contextlib
import faulthandler
import glob
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import psutil
import pytest

# Every envelope any process of the test run sends is checked against the protocol table
# (runtime/messaging/protocol.py), and every tensor op recorded against the table of op kinds
# (tensor/wire/kinds.py); workers and agents inherit the variable.
os.environ["ACTORMESH_CHECK_PROTOCOL"] = "1"


# On pytest-xdist's workers (scripts/test.sh runs two), what runs together: a test file stays on
# one worker, so its module and package fixtures (a mesh, a kernel) are made once there, and the
# multi-host tests all run on one, as they build network namespaces and a bridge under fixed
# names (scripts/fakehosts/). Each worker is a process of its own, so the leak fixtures below
# see only its own children and threads.
_ONE_WORKER_DIRS = {"tests/multihost": "multihost"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        group = _ONE_WORKER_DIRS.get(os.path.dirname(path), path)
        item.add_marker(pytest.mark.xdist_group(group))


# What pytest-timeout allows a test when it has no marker (pyproject's `timeout`).
DEFAULT_TIMEOUT = 120.0


def _timeout_of(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
        if value:
            return float(value)
    return float(item.config.getini("timeout") or DEFAULT_TIMEOUT)


# The part of a test's limit after which its threads' stacks are dumped (the suite's own test of
# this, tests/runtime/test_suite_hygiene.py, sets less, to leave a loaded machine time to spare).
DUMP_AT = float(os.environ.get("ACTORMESH_TEST_DUMP_AT", "0.9"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """A hang leaves every thread's stack (faulthandler, which also reaches a GIL held in C)
    shortly before pytest-timeout ends the test: at nine tenths of *that test's* limit, not a
    suite-wide one, which printed stacks in the middle of slow tests that then passed. Written
    to fd 2, which pytest captures: shown with the test's failure, never in a passing run."""
    faulthandler.dump_traceback_later(DUMP_AT * _timeout_of(item), file=2)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


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


# Threads actormesh starts in this process (actor runners, I/O loops, timers, listeners), and
# the one that lives as long as the process: the controller node's I/O loop.
_ACTORMESH_THREADS = ("actor-", "actormesh-", "tensor-")
_PROCESS_THREADS = ("actormesh-io-",)


def _actormesh_threads() -> list[threading.Thread]:
    """The threads above, less those that live as long as the process by design: an actor
    stopped by ``ActorMesh.stop`` keeps its thread, idle, to answer later calls with "actor ...
    was stopped" (runner.py), and a ``get_or_spawn_controller`` singleton is the process's."""
    from actormesh.runtime.actors import local_actor_host
    from actormesh.runtime.meshes.actor_mesh import actor_key
    from actormesh.runtime.procs import singletons

    host = local_actor_host()
    process_wide = {actor_key(mesh) for mesh in list(singletons._singletons.values())}
    stopped = {
        runner.thread.ident
        for runner in (list(host.actors.values()) if host is not None else [])
        if runner.stopped or runner.key in process_wide
    }
    return [
        t
        for t in threading.enumerate()
        if t.name.startswith(_ACTORMESH_THREADS)
        and not t.name.startswith(_PROCESS_THREADS)
        and t.ident not in stopped
    ]


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Fail the test that leaves an actormesh thread running in the test process: an actor on
    ``this_proc()`` not stopped, a host listener not closed (after a few seconds' grace)."""
    before = {t.ident for t in threading.enumerate()}
    yield
    left = _left_after_grace(
        lambda: [t for t in _actormesh_threads() if t.ident not in before and t.is_alive()],
        grace=5.0,
    )
    if left:
        pytest.fail(
            f"test left {len(left)} actormesh thread(s) running in the test process: "
            f"{sorted(t.name for t in left)}; stop what it started in this process (the "
            "actors it spawned on this_proc(), the host listener it opened)"
        )


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


class UnhandledFailures(list[object]):
    """The failures that reached the fault hook. ``clear()`` also forgives the deaths known
    by then whose report is still on its way: the controller marks a process dead (``health()``
    shows it, sync points fail on it) before it reports the death, so a test that waits for
    the death and clears may clear before the report lands."""

    def __init__(self) -> None:
        super().__init__()
        self._forgiven: set[tuple[str, int]] = set()

    def clear(self) -> None:
        from actormesh.runtime.messaging import node

        super().clear()
        known = node._node.dead.values() if node._node is not None else ()
        self._forgiven |= {(death.host, death.pid) for death in known}

    def unexpected(self) -> list[object]:
        from actormesh.errors import SupervisionError

        def forgiven(failure: object) -> bool:
            deaths = failure.deaths if isinstance(failure, SupervisionError) else ()
            return bool(deaths) and all((d.host, d.pid) in self._forgiven for d in deaths)

        return [failure for failure in self if not forgiven(failure)]


@pytest.fixture(autouse=True)
def unhandled_failures() -> Iterator[UnhandledFailures]:
    """Collects failures that reached the fault hook; a test that expects some clears them.

    Anything else left at the end fails the test: an unhandled failure nobody meant to cause.
    """
    from actormesh.runtime.faults import supervision

    seen = UnhandledFailures()
    previous = supervision.set_fault_hook(seen.append)
    yield seen
    supervision.set_fault_hook(previous)
    if seen.unexpected():
        pytest.fail(f"unexpected unhandled failures: {seen.unexpected()}")


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

"""Ownership with real processes: what ``heal()`` brings back of actors that were stopped."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from support import wait_until

import actormesh as am


class Counted(am.Actor):
    """Counts its constructions in a file named after it (one mark per ``__init__``)."""

    def __init__(self, where: str, name: str) -> None:
        with open(Path(where, name), "a") as f:
            f.write("x")

    @am.endpoint
    def pid(self) -> int:
        return os.getpid()


def kill_and_heal(procs: Any, kept: Any, pid: int, unhandled_failures: list[object]) -> None:
    """SIGKILL the one process, heal the mesh; ``kept`` answers from its new process."""
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: procs.health().values()[0] != "alive", 10, "the death")
    procs.heal().get(timeout=60)
    unhandled_failures.clear()  # the kill, which no call observed
    assert kept.pid.call_one().get(timeout=30) != pid


def assert_only_kept_was_recreated(tmp_path: Path) -> None:
    # Counted writes an "x" per __init__: the stopped mesh's actor was built once, not twice.
    assert (tmp_path / "kept").read_text() == "xx"
    assert (tmp_path / "gone").read_text() == "x"


def test_heal_does_not_recreate_an_actor_mesh_that_was_stopped(
    spawn_procs, tmp_path, unhandled_failures
) -> None:
    procs = spawn_procs(per_host={"gpus": 1})
    kept = procs.spawn("kept", Counted, str(tmp_path), "kept")
    gone = procs.spawn("gone", Counted, str(tmp_path), "gone")
    pid = kept.pid.call_one().get(timeout=30)
    gone.initialized.get(timeout=30)
    gone.stop().get(timeout=30)
    kill_and_heal(procs, kept, pid, unhandled_failures)
    assert_only_kept_was_recreated(tmp_path)


class Stopper(am.Actor):
    @am.endpoint
    def stop_mesh(self, mesh: am.ActorMesh[Counted]) -> None:
        mesh.stop().get(timeout=30)


def test_heal_does_not_recreate_actors_stopped_from_another_process(
    spawn_procs, tmp_path, unhandled_failures
) -> None:
    # The script spawns the actors (so heal would re-create them), an actor elsewhere stops
    # them: their worker tells the controller that heals them.
    children = spawn_procs(per_host={"gpus": 1})
    gone = children.spawn("gone", Counted, str(tmp_path), "gone")
    kept = children.spawn("kept", Counted, str(tmp_path), "kept")
    pid = kept.pid.call_one().get(timeout=30)
    gone.initialized.get(timeout=30)
    stopper = spawn_procs(per_host={"gpus": 1}).spawn("stopper", Stopper)
    stopper.stop_mesh.call_one(gone).get(timeout=60)
    kill_and_heal(children, kept, pid, unhandled_failures)
    assert_only_kept_was_recreated(tmp_path)

"""The protocol table's roles match the handlers real processes register: a worker handles
exactly the runtime's kinds that name the worker role, and so does the controller."""

from __future__ import annotations

from collections.abc import Callable

import torch

import actormesh as am
from actormesh.runtime.messaging.node import current_node
from actormesh.runtime.messaging.protocol import CONTROLLER, KINDS, WORKER


def _expected(role: str) -> list[str]:
    return sorted(k.name for k in KINDS.values() if role in k.roles and _in_runtime(k.name))


def _in_runtime(kind: str) -> bool:
    # Kinds handled outside the runtime (the debugger, the host listener, remote agents) are
    # registered only while those are in use (earlier tests of this process may have).
    return KINDS[kind].handler.startswith("runtime.")


def _handled() -> list[str]:
    return sorted(k for k in current_node().handlers if _in_runtime(k))


class Kinds(am.Actor):
    @am.endpoint
    def handled(self) -> list[str]:
        buffer = am.TensorBuffer(torch.zeros(4))  # buffers register their kinds with the first
        buffer.drop()
        return _handled()


def test_each_role_handles_the_kinds_the_table_gives_it(
    spawn_procs: Callable[..., am.ProcMesh],
) -> None:
    # Fresh workers: one that spawned meshes of its own also handles the controller's kinds.
    procs = spawn_procs(per_host={"gpus": 2})
    kinds = procs.spawn("kinds", Kinds)
    for handled in kinds.handled.call().get(timeout=30).values():
        assert handled == _expected(WORKER)
    buffer = am.TensorBuffer(torch.zeros(4))
    buffer.drop()
    assert _handled() == _expected(CONTROLLER)

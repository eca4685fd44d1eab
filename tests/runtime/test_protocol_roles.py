"""The protocol table's roles match the handlers real processes register: a worker handles
exactly the runtime's kinds that name the worker role, and so does the controller."""

from __future__ import annotations

import torch

import actormesh as am
from actormesh.runtime.messaging.node import current_node
from actormesh.runtime.messaging.protocol import CONTROLLER, KINDS, WORKER


def _expected(role: str) -> list[str]:
    # Kinds handled outside the runtime (the debugger, the host listener, remote agents) are
    # registered only when those are in use.
    return sorted(
        k.name for k in KINDS.values() if role in k.roles and k.handler.startswith("runtime.")
    )


class Kinds(am.Actor):
    @am.endpoint
    def handled(self) -> list[str]:
        buffer = am.TensorBuffer(torch.zeros(4))  # buffers register their kinds with the first
        buffer.drop()
        return sorted(current_node().handlers)


def test_each_role_handles_the_kinds_the_table_gives_it(shared_procs: am.ProcMesh) -> None:
    kinds = shared_procs.spawn("kinds", Kinds)
    for handled in kinds.handled.call().get(timeout=30).values():
        assert handled == _expected(WORKER)
    buffer = am.TensorBuffer(torch.zeros(4))
    buffer.drop()
    assert sorted(current_node().handlers) == _expected(CONTROLLER)

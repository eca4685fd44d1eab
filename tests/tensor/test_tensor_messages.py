"""What a user reads when a MeshTensor's mesh is gone or is the wrong one (issue 45): each message
names what happened (stopped, lost a rank, healed since; two meshes) and an action that works
then, and never the engine actor's or its endpoints' names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import actormesh as am

WAIT = 60
# The tensor engine's actor and endpoints: the user never spawned or called them.
INTERNAL = ("_tensor_engine", "_TensorEngine", "run_and_fetch", "engine.run", "engine.fetch")


def said(call: Callable[[], Any], error: type[BaseException] = am.MeshClosedError) -> str:
    with pytest.raises(error) as info:
        call()
    text = str(info.value)
    for name in INTERNAL:
        assert name not in text, f"{name!r} is internal, in: {text}"
    return text


def test_a_stopped_mesh_says_it_was_stopped_and_to_spawn_new_procs(
    spawn_procs: Callable[..., Any],
) -> None:
    procs = spawn_procs(per_host={"gpus": 2})
    t = am.distribute(torch.ones(4, 4), procs, sharding_spec=["gpus", None])
    assert am.inspect(t).sum().item() == 16
    procs.stop().get(timeout=WAIT)
    uses: dict[str, Callable[[], Any]] = {
        "an op": lambda: t + 1,  # refused at the user's line, not a MeshTensor that never runs
        "inspect": lambda: am.inspect(t),
        "a reduction": lambda: t.sum().item(),
        "fetch": lambda: am.fetch(t, gpus=0).get(timeout=WAIT),
    }
    for what, use in uses.items():
        text = said(use)
        assert "was stopped" in text and "spawn_procs" in text and "distribute" in text, what
        assert "lost a rank" not in text and "heal" not in text, what  # heal cannot help
    text = said(lambda: am.distribute(torch.ones(2), procs))
    assert text.startswith("distribute:") and "was stopped" in text and "spawn_procs" in text
    assert "cannot spawn" not in text  # the user did not spawn anything
    text = said(lambda: procs.heal().get(timeout=WAIT))
    assert "was stopped" in text and "spawn_procs" in text


def test_two_meshes_of_one_shape_read_apart_and_the_move_is_named(
    spawn_procs: Callable[..., Any],
) -> None:
    first = spawn_procs(per_host={"gpus": 2})
    second = spawn_procs(per_host={"gpus": 2})
    assert repr(first) != repr(second)
    a = am.distribute(torch.ones(4), first)
    b = am.distribute(torch.ones(4), second)
    text = said(lambda: a + b, am.MeshUsageError)
    names = [repr(first).split()[1], repr(second).split()[1]]  # <ProcMesh 'procs-2' {...}>
    assert names[0] != names[1] and all(name in text for name in names), text
    assert "t.to_mesh(procs)" in text  # the call that moves a tensor, rank to rank
    moved = b.to_mesh(first)
    assert torch.equal(am.inspect(a + moved), torch.full((4,), 2.0))

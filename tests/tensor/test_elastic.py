"""``FaultTolerant.shrink`` and ``grow`` (issue 42): with no spare process a lost rank's
data-parallel slice is left out, training goes on on the survivors (the same processes), the
user's ``on_resize`` sets the learning rate, and ``grow`` brings the respawned rank back. The
losses are those of one process given the same learning rates (float64), step by step."""

from __future__ import annotations

import copy
import itertools
import math
import os
import signal
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from training import MLP, MODES, mlp_batches

import actormesh as am
from actormesh.tensor import module_to_mesh

WAIT = 120
STEPS, KILL_AT, GROW_AT = 8, 3, 6
LR = 1e-2


def pid(t: torch.Tensor) -> int:
    return os.getpid()


def engine_pids(model: Any, sizes: dict[str, int]) -> list[int]:
    """The process of each rank (row-major) the engine runs on now."""
    weight = model.fc1.weight
    return [
        am.call_on_shard_and_fetch(pid, weight, **dict(zip(sizes, point, strict=True))).get(
            timeout=WAIT
        )
        for point in itertools.product(*(range(n) for n in sizes.values()))
    ]


CASES = [
    # mode, mesh, victim (coords), sizes after the shrink, where the shrink's state comes from
    ("default", {"dp": 4}, {"dp": 1}, {"dp": 3}, "replicas"),
    ("fsdp", {"dp": 4}, {"dp": 1}, {"dp": 3}, "checkpoint"),  # a 4-way split: DCP reshards
    ("tp_plan", {"dp": 2, "tp": 2}, {"dp": 1, "tp": 1}, {"dp": 1, "tp": 2}, "replicas"),
]


@pytest.mark.parametrize(("mode", "shape", "victim", "shrunk", "source"), CASES)
def test_shrink_on_the_survivors_then_grow_back(
    spawn_procs: Callable[..., Any], unhandled_failures: list[Any], tmp_path: Any,
    mode: str, shape: dict[str, int], victim: dict[str, int], shrunk: dict[str, int], source: str,
) -> None:  # fmt: skip
    procs = spawn_procs(per_host=shape)
    torch.manual_seed(0)
    base = MLP().double()
    model = module_to_mesh(copy.deepcopy(base), procs, **MODES[mode])
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    resizes: list[tuple[int, int]] = []

    def on_resize(size: int, previous: int) -> None:  # the user's rule: lr by replicas
        resizes.append((size, previous))
        for group in opt.param_groups:
            group["lr"] = LR * size / shape["dp"]

    ft = am.FaultTolerant(
        {"model": model, "optim": opt}, checkpoint_id=str(tmp_path / "ckpt"),
        checkpoint_every=KILL_AT, on_resize=on_resize,
    )  # fmt: skip
    data = mlp_batches(STEPS, seed=2)
    done: dict[int, tuple[float, float]] = {}  # step -> (loss, learning rate)
    before = engine_pids(model, shape)
    killed = False
    victim_coords = tuple(victim.get(d, 0) for d in shape)
    while ft.step < STEPS:
        step = ft.step
        try:
            if step == KILL_AT and not killed:
                assert ft.saving is not None
                ft.saving[1].get(timeout=WAIT)  # the checkpoint of this step is written
                victim_pid = am.call_on_shard_and_fetch(pid, model.fc1.weight, **victim)
                os.kill(victim_pid.get(timeout=WAIT), signal.SIGKILL)
                killed = True
            if step == GROW_AT and ft.mesh.resized:
                ft.grow()
                after = engine_pids(model, shape)
                assert [a != b for a, b in zip(before, after, strict=True)] == [
                    c == victim_coords for c in itertools.product(*map(range, shape.values()))
                ]  # only the victim's process is new
            lr = opt.param_groups[0]["lr"]
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(data[step][0]), data[step][1])
            loss.backward()
            opt.step()
            done[step] = (loss.item(), lr)
            ft.commit()
        except am.SupervisionError:
            ft.shrink()
            assert ft.sizes == shrunk
            # The survivors go on in their own processes: none was restarted.
            left = set(before) - set(engine_pids(model, shrunk))
            assert len(left) == len(before) - math.prod(shrunk.values())
    unhandled_failures.clear()  # the death, and the abandoned engine's failures
    shrink, grow = ft.recoveries
    label = "{" + ", ".join(f"{k}={v}" for k, v in victim.items()) + "}"
    assert (shrink.kind, shrink.sizes, shrink.source) == ("shrink", shrunk, source)
    assert shrink.ranks == [label] and shrink.step == KILL_AT
    assert (grow.kind, grow.sizes, grow.source, grow.step) == ("grow", shape, "replicas", GROW_AT)
    assert label in grow.ranks  # (and, on two dimensions, the survivor left out with it)
    assert resizes == [(shrunk["dp"], shape["dp"]), (shape["dp"], shrunk["dp"])]
    assert [lr for _, lr in done.values()] == [
        LR * (shrunk["dp"] if KILL_AT <= s < GROW_AT else shape["dp"]) / shape["dp"]
        for s in range(STEPS)
    ]
    # One process with the same learning rates, step by step.
    local = copy.deepcopy(base)
    local_opt = torch.optim.AdamW(local.parameters(), lr=LR)
    for step, (x, y) in enumerate(data):
        for group in local_opt.param_groups:
            group["lr"] = done[step][1]
        local_opt.zero_grad()
        loss = nn.functional.mse_loss(local(x), y)
        loss.backward()
        local_opt.step()
        assert done[step][0] == pytest.approx(loss.item(), abs=1e-9, rel=0), step
    weights = am.inspect(dict(model.state_dict()))
    for name, value in local.state_dict().items():
        assert torch.allclose(weights[name], value, atol=1e-9, rtol=0), name


def test_shrink_and_grow_refuse_what_they_cannot_do(mesh: Any) -> None:
    model = module_to_mesh(MLP(), mesh)
    ft = am.FaultTolerant({"model": model})
    with pytest.raises(am.MeshUsageError, match="no rank of the mesh is dead"):
        ft.shrink()
    with pytest.raises(am.MeshUsageError, match="the mesh did not shrink"):
        ft.grow()
    with pytest.raises(am.MeshUsageError, match="on_resize takes a function"):
        am.FaultTolerant({"model": model}, on_resize=3)  # type: ignore[arg-type]
    tensor_only = am.FaultTolerant({"t": am.distribute(torch.ones(4), mesh)})
    with pytest.raises(am.MeshUsageError, match="shrink needs a data-parallel dimension"):
        tensor_only.shrink()

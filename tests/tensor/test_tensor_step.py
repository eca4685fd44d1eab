"""A controller-driven training step that costs what SPMD costs (issue 43), and stays the step of
one process: the optimizer's update as torch's foreach ops on the local shards."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from differential import compare_training
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from actormesh.tensor import module_to_mesh
from actormesh.tensor.controller.mesh import tensor_mesh


def mlp(width: int = 16, layers: int = 2) -> nn.Module:
    torch.manual_seed(0)
    sizes = [8] + [width] * (layers - 1) + [4]
    modules: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        modules += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*modules[:-1]).double()


def batches(steps: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` batches, then the first again (its loss must have gone down)."""
    g = torch.Generator().manual_seed(1)
    out = [(torch.randn(8, 8, generator=g).double(), torch.randn(8, 4, generator=g).double())
           for _ in range(steps)]  # fmt: skip
    return [*out, out[0]]


def mse(model: nn.Module, batch: Any) -> torch.Tensor:
    return F.mse_loss(model(batch[0]), batch[1])


def _ops_of_a_step(mesh: Any, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """How many ops the controller recorded for one ``optimizer.step()`` (after the first,
    which also creates the optimizer's state)."""
    stream = tensor_mesh(mesh).stream
    x, y = batches(1)[0]
    counts = []
    for _ in range(2):
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        before = stream.recorded
        optimizer.step()
        counts.append(stream.recorded - before)
    return counts[1]


def test_an_optimizer_over_mesh_parameters_records_one_op_per_foreach_call(mesh: Any) -> None:
    # Before: torch's per-parameter loop (foreach=None on the CPU), 8 AdamW ops per parameter,
    # each decoded and run by every rank: 32 ops for 4 parameters, 64 for 8.
    small = module_to_mesh(mlp(layers=2), mesh)
    large = module_to_mesh(mlp(layers=4), mesh)
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (small, large)]
    counts = [_ops_of_a_step(mesh, m, o) for m, o in zip((small, large), optimizers, strict=True)]
    assert counts[0] == counts[1] <= 12, counts
    # The choice is the step's only: the optimizer's own settings stay the user's.
    assert all(group["foreach"] is None for o in optimizers for group in o.param_groups)


def test_an_optimizer_that_chose_its_implementation_keeps_it(mesh: Any) -> None:
    model = module_to_mesh(mlp(layers=2), mesh)
    loop = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    assert _ops_of_a_step(mesh, model, loop) == 8 * 4


OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    "adam_amsgrad": lambda p: torch.optim.Adam(p, lr=1e-2, amsgrad=True),
    "sgd_nesterov": lambda p: torch.optim.SGD(
        p, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=0.01
    ),
}
MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "fsdp": {"fsdp": True},
    "tp_plan": {"tp_plan": {"0": ColwiseParallel(), "2": RowwiseParallel()}},
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_foreach_step_on_the_shards_is_the_step_of_one_process(
    mesh: Any, name: str, mode: str
) -> None:
    # Each parameter's placements (replicated, split over dp by fsdp, split over tp by the
    # plan) reach the foreach ops of the update; float64, compared step by step.
    losses = compare_training(mlp, mesh, MODES[mode], batches(), mse, optimizer=OPTIMIZERS[name])
    assert losses[-1] < losses[0]  # the first batch again

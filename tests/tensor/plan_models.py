"""Models and tensor-parallel plans written as PyTorch's own examples write them, shared by the
mesh tests and the SPMD program that ``torchrun`` runs (``spmd_plans.py``): the same seed gives
the same weights and batch in both.

Each plan comes with how an SPMD program hands each rank its input (``tp_input_dim``): the dim
the root input is split along over the tp dimension (the plan's first ``Shard`` input layout),
or ``None`` for a batch every tp rank holds whole. On the mesh nothing of the kind is needed: the
controller's batch is the global input.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class ToyModel(nn.Module):
    """PyTorch's tensor/sequence parallel example model (in_proj, relu, out_proj)."""

    def __init__(self) -> None:
        super().__init__()
        self.in_proj = nn.Linear(10, 32)
        self.relu = nn.ReLU()
        self.out_proj = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.relu(self.in_proj(x)))


class NormedToy(nn.Module):
    """A block with a norm before the projections, over (batch, sequence, features)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(10)
        self.in_proj = nn.Linear(10, 32)
        self.out_proj = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.out_proj(torch.relu(self.in_proj(self.norm(x))))


def plans() -> dict[str, tuple[type[nn.Module], dict[str, Any], int | None, tuple[int, ...]]]:
    """name -> (model class, plan, tp_input_dim, global batch shape)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    return {
        # PyTorch's tensor_parallel_example.py
        "tp": (ToyModel, {"in_proj": ColwiseParallel(), "out_proj": RowwiseParallel()}, None,
               (8, 10)),
        # PyTorch's sequence_parallel_example.py: the input arrives split along dim 0
        "sp": (ToyModel, {"in_proj": ColwiseParallel(input_layouts=Shard(0)),
                          "out_proj": RowwiseParallel(output_layouts=Shard(0))}, 0, (8, 10)),
        # Sequence parallelism over a (batch, sequence, features) block, as in Llama plans
        "sequence": (NormedToy, {"norm": SequenceParallel(),
                                 "in_proj": ColwiseParallel(input_layouts=Shard(1)),
                                 "out_proj": RowwiseParallel(output_layouts=Shard(1))}, 1,
                     (4, 6, 10)),
        # The input's layout given on the root module
        "prepare": (ToyModel, {"": PrepareModuleInput(input_layouts=(Shard(0),),
                                                      desired_input_layouts=(Replicate(),)),
                               "in_proj": ColwiseParallel(),
                               "out_proj": RowwiseParallel(output_layouts=Shard(0))}, 0, (8, 10)),
    }  # fmt: skip


def weights_and_batch(name: str) -> tuple[nn.Module, torch.Tensor]:
    """The plan's model (float64) and global batch, from one seed."""
    cls, _, _, shape = plans()[name]
    torch.manual_seed(0)
    model = cls().double()
    return model, torch.randn(*shape, dtype=torch.float64)


def loss_of(out: torch.Tensor) -> torch.Tensor:
    """The examples' loss: the sum of the output (of a rank's part of it, SPMD)."""
    return (out * out).sum()

"""A small model and training loop that the tensor tests run both locally and on a mesh."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

# module_to_mesh's modes for MLP, by name.
TP = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "fsdp": {"fsdp": True},
    "tp_plan": {"tp_plan": TP},
    "fsdp+tp_plan": {"fsdp": True, "tp_plan": TP},
}


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def train(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    """AdamW steps over ``batches``; the losses (``loss.item()``: one sync point a step)."""
    return steps(model, torch.optim.AdamW(model.parameters(), lr=1e-2), batches)


def steps(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
) -> list[float]:
    """One step of ``optimizer`` per batch; the losses."""
    losses = []
    for x, y in batches:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses

"""A small conv net (Conv2d with a bias, BatchNorm2d, a Linear head) trained on a mesh, equal to
one process in float64 step by step (tests/tensor/differential.py), in every mode: the batch is
split over dp, and the convolution's backward runs on each rank's rows (worker/shard_ops.py).
torchvision's resnet18 (tests/tensor/test_resnet18.py) needs a venv of its own; this runs in
every test environment."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from differential import compare_training
from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel


def conv_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3, stride=2, groups=2),
        nn.Flatten(),
        nn.Linear(4 * 3 * 3, 5),
    ).double()


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(8, 3, 8, 8, dtype=torch.float64, generator=generator),
            torch.randint(0, 5, (8,), generator=generator),
        )
        for _ in range(2)
    ]


def loss_of(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    images, labels = batch
    return nn.functional.cross_entropy(model(images), labels)


HEAD_PLAN = {"5": ColwiseParallel(output_layouts=Replicate())}  # the gradients reach the convs
# as Partial sums over tp


@pytest.mark.parametrize(
    "options",
    [{}, {"fsdp": True}, {"tp_plan": HEAD_PLAN}, {"fsdp": True, "tp_plan": HEAD_PLAN}],
    ids=["default", "fsdp", "tp_plan", "fsdp+tp_plan"],
)
def test_a_conv_net_trains_as_in_one_process(mesh: Any, options: dict[str, Any]) -> None:
    compare_training(conv_net, mesh, options, batches(), loss_of)

"""torchvision's resnet18 trained from the controller in every mode, equal to one process step by
step (differential.py), then its BatchNorm running statistics in eval mode. Run by
test_resnet18.py in .venv-torchvision (scripts/setup-torchvision-venv.sh: torchvision does not
import beside the project's CPU torch); exits non-zero at the first difference."""

from __future__ import annotations

import copy
import sys
from typing import Any

import torch
import torchvision
from differential import compare_training
from torch import nn
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel

import actormesh as am
from actormesh.tensor import inspect, module_to_mesh

MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "fsdp": {"fsdp": True},
    # torch's styles take Linear and Embedding layers: resnet18's classifier
    "tp_plan": {"tp_plan": {"fc": ColwiseParallel(output_layouts=Replicate())}},
    "fsdp+tp_plan": {"fsdp": True, "tp_plan": {"fc": ColwiseParallel(output_layouts=Replicate())}},
}


def resnet18() -> nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10).double()


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randn(6, 3, 32, 32, generator=generator, dtype=torch.float64),
         torch.randint(0, 10, (6,), generator=generator))
        for _ in range(steps)
    ]  # fmt: skip


def loss_of(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def main() -> None:
    procs = am.this_host().spawn_procs(per_host={"dp": 2, "tp": 2})
    try:
        for mode in sys.argv[1:] or list(MODES):
            compare_training(resnet18, procs, MODES[mode], batches(2), loss_of, atol=1e-8)
            print(f"resnet18 {mode}: equal to one process", flush=True)
        # eval(): BatchNorm uses the running statistics the training steps left
        local = resnet18()
        model = module_to_mesh(copy.deepcopy(local), procs)
        for m in (local, model):
            m.train()
            loss_of(m, batches(1)[0]).backward()
            m.eval()
        x = batches(2)[1][0]
        with torch.no_grad():
            worst = (inspect(model(x)) - local(x)).abs().max().item()
        assert worst < 1e-8, f"resnet18 eval: differs by {worst:.3g}"
        print("resnet18 eval: equal to one process", flush=True)
    finally:
        procs.stop().get(timeout=60)


if __name__ == "__main__":
    main()

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


class Config:
    """A model's settings, as real models keep them (``model.config``)."""

    def __init__(self, vocab: int = 16, width: int = 8, lr: float = 1e-2) -> None:
        self.vocab, self.width, self.lr = vocab, width, lr


class TiedLM(nn.Module):
    """A tiny language model written the way GPT implementations are: the output head's weight
    *is* the embedding's (tied), a config, its own optimizer setup and a greedy generate."""

    def __init__(self, config: Config | None = None) -> None:
        super().__init__()
        self.config = config or Config()
        c = self.config
        self.wte = nn.Embedding(c.vocab, c.width)
        self.mix = nn.Linear(c.width, c.width)
        self.norm = nn.LayerNorm(c.width)
        self.head = nn.Linear(c.width, c.vocab, bias=False)
        self.head.weight = self.wte.weight  # tied

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        h = self.wte(idx)
        h = h + torch.tanh(self.mix(h)).cumsum(1) / (1 + torch.arange(idx.shape[1]))[:, None]
        logits = self.head(self.norm(h))
        loss = None
        if targets is not None:
            loss = nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1
            )
        return logits, loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.config.lr)

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, new_tokens: int) -> torch.Tensor:
        for _ in range(new_tokens):
            logits, _ = self(idx)
            idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return idx

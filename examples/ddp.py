"""DistributedDataParallel inside actors: 4 ranks on CPU (gloo) match a single-process run.

One call forms a torch.distributed process group over the trainers' processes; each trainer
wraps the same small model in ``DistributedDataParallel`` and trains on its own quarter of the
data. DDP averages the gradients of equal shards, which is the gradient of the mean loss over
the whole data set, so every step's loss (the mean of the ranks' losses) and the final weights
must equal those of one process training on all the data. Everything is float64; the only
difference is the order of the sums, so they agree to about 1e-12.

Run: python examples/ddp.py   (prints the losses; exits 1 on a mismatch)
"""

from __future__ import annotations

import sys

import torch
from torch.nn.parallel import DistributedDataParallel

import actormesh as am

WORLD = 4
STEPS = 20
LR = 0.05
TOLERANCE = 1e-9


def make_data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(64 * WORLD, 8, generator=gen, dtype=torch.float64)
    y = torch.sin(x @ torch.linspace(-1, 1, 8, dtype=torch.float64)).unsqueeze(1)
    return x, y


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
    ).double()


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


class Trainer(am.Actor):
    """One data-parallel rank: the model wrapped in DDP, and this rank's shard of the data."""

    def __init__(self) -> None:
        rank = am.current_rank().rank
        x, y = make_data()
        shard = len(x) // WORLD
        self.x, self.y = x[rank * shard : (rank + 1) * shard], y[rank * shard : (rank + 1) * shard]
        self.model: torch.nn.Module | None = None

    @am.endpoint
    def wrap(self) -> None:
        # After init_process_group: DDP broadcasts rank 0's weights through the default group.
        self.model = DistributedDataParallel(make_model())
        self.opt = make_optimizer(self.model)

    @am.endpoint
    def step(self) -> float:
        assert self.model is not None, "call wrap() first"
        self.opt.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(self.x), self.y)
        loss.backward()  # DDP all-reduces (averages) the gradients here
        self.opt.step()
        return loss.item()

    @am.endpoint
    def weights(self) -> list[torch.Tensor]:
        assert self.model is not None
        return [p.detach().clone() for p in self.model.parameters()]


def single_process() -> tuple[list[float], list[torch.Tensor]]:
    """The reference: one model, all the data, the same optimizer."""
    x, y = make_data()
    model = make_model()
    opt = make_optimizer(model)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]


def data_parallel() -> tuple[list[float], list[list[torch.Tensor]]]:
    """The same training on WORLD actors with DDP; per step the mean of the ranks' losses."""
    with am.this_host().spawn_procs(per_host={"gpus": WORLD}) as procs:
        trainers = procs.spawn("trainer", Trainer)
        am.init_process_group(trainers).get(timeout=60)
        trainers.wrap.call().get(timeout=60)
        losses = []
        for _ in range(STEPS):
            per_rank = trainers.step.call().get(timeout=60).values()
            losses.append(sum(per_rank) / len(per_rank))
        weights = trainers.weights.call().get(timeout=60).values()
    return losses, weights


def main() -> int:
    ref_losses, ref_weights = single_process()
    losses, weights = data_parallel()
    worst = 0.0
    print("step  DDP (4 actors)      one process         difference")
    for step, (a, b) in enumerate(zip(losses, ref_losses, strict=True)):
        worst = max(worst, abs(a - b))
        print(f"{step:4d}  {a:.15f}  {b:.15f}  {abs(a - b):.1e}")
    for rank, rank_weights in enumerate(weights):
        pairs = zip(rank_weights, ref_weights, strict=True)
        diff = max((p - q).abs().max().item() for p, q in pairs)
        worst = max(worst, diff)
        print(f"rank {rank}: final weights differ from one process's by at most {diff:.1e}")
    if worst > TOLERANCE:
        print(f"MISMATCH: largest difference {worst:.1e} > {TOLERANCE:.0e}")
        return 1
    print(f"DDP over {WORLD} actors matches one process (largest difference {worst:.1e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

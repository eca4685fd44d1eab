"""A plain torchrun-style training script: it knows nothing of actormesh.

Either launcher runs it unchanged:

    torchrun --nproc-per-node 4 examples/train_script.py --steps 5
    python -m actormesh run --nproc-per-host 4 examples/train_script.py --steps 5

Each rank fits a linear model on its own shard of a fixed data set with DistributedDataParallel
(gloo), prints its place in the world and, on rank 0, the loss of every step. ``--report PREFIX``
also writes what the rank saw (its environment, ``sys.argv``, ``__name__``, the final loss) to
``PREFIX.<rank>.json``; the tests read those files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

TORCHRUN_VARS = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
    "OMP_NUM_THREADS",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--report", default=None, help="write PREFIX.<rank>.json")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    print(f"rank {rank} of {world} (local rank {local_rank}) starts")

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16 * world, 4, generator=gen, dtype=torch.float64)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]], dtype=torch.float64)
    xs, ys = x[rank::world], y[rank::world]  # this rank's shard
    torch.manual_seed(0)  # the same initial weights under any launcher (DDP broadcasts rank 0's)
    model = DistributedDataParallel(torch.nn.Linear(4, 1, dtype=torch.float64))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss = torch.zeros((), dtype=torch.float64)
    for step in range(args.steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xs), ys)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= world
        if rank == 0:
            print(f"step {step} loss {mean.item():.6f}")

    if args.report:
        report = {
            "env": {k: os.environ.get(k) for k in TORCHRUN_VARS},
            "argv": sys.argv,
            "name": __name__,
            "rank": rank,
            "world": world,
            "weight": model.module.weight.detach().flatten().tolist(),
        }
        with open(f"{args.report}.{rank}.json", "w") as f:
            json.dump(report, f)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

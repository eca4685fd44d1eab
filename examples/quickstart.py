"""actormesh quickstart: actors on a local CPU mesh of 4 worker processes.

Run: python examples/quickstart.py
"""

from __future__ import annotations

import operator

import torch

import actormesh as am


class Counter(am.Actor):
    def __init__(self, start: int) -> None:
        self.value = start

    @am.endpoint
    def incr(self, by: int = 1) -> None:
        self.value += by

    @am.endpoint
    async def get(self) -> int:
        return self.value


class Trainer(am.Actor):
    """A toy data-parallel step: each rank computes a gradient on its own shard."""

    def __init__(self, dim: int) -> None:
        torch.manual_seed(0)
        self.weight = torch.zeros(dim)
        rank = am.current_rank()["gpus"]
        gen = torch.Generator().manual_seed(rank)
        self.x = torch.randn(64, dim, generator=gen)
        self.y = self.x @ torch.arange(dim, dtype=torch.float32)

    @am.endpoint
    def grad(self, weight: torch.Tensor) -> torch.Tensor:
        err = self.x @ weight - self.y
        return self.x.T @ err / len(err)

    @am.endpoint
    def whoami(self) -> str:
        print(f"rank {am.current_rank()} of {am.current_size()} ready")
        return str(am.current_rank())


def main() -> None:
    procs = am.this_host().spawn_procs(per_host={"gpus": 4})
    print("proc mesh:", procs)

    counters = procs.spawn("counter", Counter, 10)
    counters.incr.broadcast()
    counters.slice(gpus=slice(0, 2)).incr.broadcast(5)
    print("counts:", counters.get.call().get())
    print("rank 3 alone:", counters.slice(gpus=3).get.call_one().get())

    trainers = procs.spawn("trainer", Trainer, 8)
    trainers.whoami.call().get()
    weight = torch.zeros(8)
    summed = am.Accumulator(trainers.grad, torch.zeros(8), operator.add)
    for _ in range(200):
        weight -= 0.1 * summed.accumulate(weight).get() / 4
    print("learned weights:", [round(w, 2) for w in weight.tolist()])

    procs.stop().get()
    print("stopped")


if __name__ == "__main__":
    main()

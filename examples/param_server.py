"""A parameter server over TensorBuffers: weights and gradients never pass through the controller.

The server actor exposes its weights and one gradient slot per worker as buffers. Each worker
pulls the weights straight from the server's memory, computes a gradient on its shard and pushes
it into its slot; the controller only says "step" and "apply".

Run: python examples/param_server.py
"""

from __future__ import annotations

import torch

import actormesh as am

DIM, WORKERS, STEPS = 32, 3, 60


class Server(am.Actor):
    def __init__(self) -> None:
        self.weights = torch.zeros(DIM)
        self.grads = [torch.zeros(DIM) for _ in range(WORKERS)]  # one slot per worker

    @am.endpoint
    def buffers(self) -> tuple[am.TensorBuffer, list[am.TensorBuffer]]:
        return am.TensorBuffer(self.weights), [am.TensorBuffer(g) for g in self.grads]

    @am.endpoint
    def apply(self, lr: float) -> float:
        self.weights -= lr * torch.stack(self.grads).mean(0)
        return float(self.weights.norm())


class Worker(am.Actor):
    def __init__(self, weights: am.TensorBuffer, grads: list[am.TensorBuffer]) -> None:
        self.rank = am.current_rank()["workers"]
        gen = torch.Generator().manual_seed(self.rank)
        self.x = torch.randn(128, DIM, generator=gen)
        self.y = self.x @ torch.linspace(-2, 2, DIM)
        self.weights_buf, self.grad_buf = weights, grads[self.rank]
        self.w = torch.empty(DIM)

    @am.endpoint
    def step(self) -> float:
        self.weights_buf.read_into(self.w).get()  # pull: one-sided, straight from the server
        err = self.x @ self.w - self.y
        self.grad_buf.write_from(self.x.T @ err / len(err)).get()  # push into our slot
        return float((err**2).mean())


def main() -> None:
    procs = am.this_host().spawn_procs(per_host={"workers": WORKERS + 1})
    server = procs.slice(workers=WORKERS).spawn("server", Server)
    weights, grads = server.buffers.call_one().get()
    workers = procs.slice(workers=slice(0, WORKERS)).spawn("worker", Worker, weights, grads)
    for step in range(STEPS):
        losses = workers.step.call().get().values()
        norm = server.apply.call_one(0.1).get()
        if step % 20 == 0 or step == STEPS - 1:
            print(f"step {step:3d}: loss {sum(losses) / WORKERS:.4f}  |w| {norm:.3f}")
    final = sum(losses) / WORKERS
    procs.stop().get()
    assert final < 0.05, final
    print("converged")


if __name__ == "__main__":
    main()

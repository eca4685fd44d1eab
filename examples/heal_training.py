"""Recover a training run from the loss of a rank: catch, heal, reload the checkpoint, go on.

Four ranks train a linear model data-parallel (the controller averages their gradients). Every
few steps each rank saves a checkpoint. In the second run a rank is SIGKILLed mid-run: the step
fails with SupervisionError, the mesh is healed in place (the dead rank is respawned and its
actor re-created), every rank reloads the last checkpoint, and training resumes. The final loss
is the same as the undisturbed run's.

Run: python examples/heal_training.py
"""

from __future__ import annotations

import os
import signal
import tempfile
import time

import torch

import actormesh as am

STEPS = 40
CHECKPOINT_EVERY = 5
KILL_AT_STEP = 23


class Trainer(am.Actor):
    def __init__(self, checkpoint_dir: str) -> None:
        self.rank = am.current_rank()["gpus"]
        self.path = os.path.join(checkpoint_dir, f"rank{self.rank}.pt")
        gen = torch.Generator().manual_seed(100 + self.rank)
        self.x = torch.randn(256, 16, generator=gen)
        true_w = torch.linspace(-1, 1, 16)
        self.y = self.x @ true_w + 0.01 * torch.randn(256, generator=gen)
        torch.manual_seed(0)  # the same initial weights on every rank
        self.model = torch.nn.Linear(16, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)

    @am.endpoint
    def grads(self) -> tuple[float, list[torch.Tensor]]:
        self.opt.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(self.x).squeeze(1), self.y)
        loss.backward()
        return loss.item(), [p.grad for p in self.model.parameters()]

    @am.endpoint
    def apply(self, grads: list[torch.Tensor]) -> None:
        for p, g in zip(self.model.parameters(), grads, strict=True):
            p.grad = g
        self.opt.step()

    @am.endpoint
    def save(self, step: int) -> None:
        state = {"step": step, "model": self.model.state_dict(), "opt": self.opt.state_dict()}
        torch.save(state, self.path)

    @am.endpoint
    def load(self) -> int:
        state = torch.load(self.path)
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        return int(state["step"])

    @am.endpoint
    def pid(self) -> int:
        return os.getpid()


def train(kill: bool) -> float:
    with (
        tempfile.TemporaryDirectory() as ckpt,
        am.this_host().spawn_procs(per_host={"gpus": 4}) as procs,
    ):
        trainers = procs.spawn("trainer", Trainer, ckpt)
        step, loss, killed = 0, float("nan"), False
        while step < STEPS:
            try:
                if step % CHECKPOINT_EVERY == 0:
                    trainers.save.call(step).get(timeout=60)
                if kill and not killed and step == KILL_AT_STEP:
                    victim = trainers.pid.call().get(timeout=60).values()[2]
                    os.kill(victim, signal.SIGKILL)  # the OOM killer, a bad node, ...
                    killed = True
                results = trainers.grads.call().get(timeout=60).values()
                loss = sum(r[0] for r in results) / len(results)
                grads = [torch.stack(g).mean(0) for g in zip(*(r[1] for r in results), strict=True)]
                trainers.apply.call(grads).get(timeout=60)
                step += 1
            except am.SupervisionError as err:
                print(f"step {step}: {str(err).splitlines()[0]}")
                start = time.monotonic()
                procs.heal().get(timeout=120)
                step = min(trainers.load.call().get(timeout=60).values())
                print(f"healed in {time.monotonic() - start:.2f} s; resuming from step {step}")
        return loss


def main() -> None:
    clean = train(kill=False)
    print(f"undisturbed run: final loss {clean:.6f}")
    recovered = train(kill=True)
    print(f"run that lost a rank: final loss {recovered:.6f}")
    assert abs(clean - recovered) < 1e-9, (clean, recovered)
    print("same final loss")


if __name__ == "__main__":
    main()

"""A generator and a trainer, each on its own mesh, driven by one loop (Monarch's RL style).

The generator mesh samples actions from its copy of the policy and scores them (a contextual
bandit: the reward is 1 when the action is the best one for the state); the trainer mesh
learns from those rollouts (REINFORCE with a mean baseline) with ``module_to_mesh`` and
AdamW. Every step the trainer's fresh weights move to the generator with ``to_mesh``, rank to
rank, and the rollouts move the other way; the controller only records ops. The generator
samples step k + 1 while the trainer learns from step k (one step off-policy, as asynchronous
RL does), so both meshes are busy at once; the loop reports how long each was busy, and how
much of that overlapped.

Run: python examples/rl_generator_trainer.py
"""

from __future__ import annotations

import time

import torch
from torch import nn

import actormesh as am
from actormesh.tensor import busy_spans, overlap

STATE, ACTIONS, BATCH, STEPS = 8, 4, 64, 40


def rollout(weight: am.MeshTensor, bias: am.MeshTensor, best: torch.Tensor, gen: am.ProcMesh):
    """Sample a batch on the generator mesh: states, the chosen actions (one-hot), rewards."""
    states = am.tensor.randn(BATCH, STATE, mesh=gen, sharding_spec=["gen", None])
    states = states.double()
    logits = states @ weight.T + bias
    # Gumbel-max: the argmax of logits + Gumbel noise is a sample of softmax(logits)
    noise = -torch.log(-torch.log(am.tensor.rand(BATCH, ACTIONS, mesh=gen).double()))
    noisy = logits + noise
    chosen = (noisy == noisy.max(1, keepdim=True).values).double()
    scores = states @ best.T
    wanted = (scores == scores.max(1, keepdim=True).values).double()
    return states, chosen, (chosen * wanted).sum(1)


def busy(procs: am.ProcMesh, since: float) -> list[tuple[float, float]]:
    """When any rank of ``procs`` ran ops since ``since`` (waits for the other mesh excluded)."""
    return [(max(a, since), b) for rank in busy_spans(procs) for a, b in rank if b > since]


def main() -> None:
    torch.manual_seed(0)
    trainer_procs = am.this_host().spawn_procs(per_host={"dp": 2})
    generator_procs = am.this_host().spawn_procs(per_host={"gen": 2})
    try:
        best = torch.randn(ACTIONS, STATE, dtype=torch.float64)  # the environment's rule
        policy = am.module_to_mesh(nn.Linear(STATE, ACTIONS).double(), trainer_procs)
        opt = torch.optim.AdamW(policy.parameters(), lr=0.05)

        def weights_to_generator() -> tuple[am.MeshTensor, am.MeshTensor]:
            return policy.weight.detach().to_mesh(generator_procs), policy.bias.detach().to_mesh(
                generator_procs
            )

        weights = weights_to_generator()
        batch = rollout(*weights, best, generator_procs)
        rewards = []
        busy_spans(trainer_procs), busy_spans(generator_procs)  # the start: both idle
        start = time.time()
        for step in range(STEPS):
            states, chosen, reward = am.to_mesh(batch, trainer_procs)  # the rollout, over
            batch = rollout(*weights, best, generator_procs)  # the generator samples the next
            logp = torch.log_softmax(policy(states), dim=1)
            advantage = reward - reward.mean()
            loss = -((logp * chosen).sum(1) * advantage).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            weights = weights_to_generator()  # fresh weights, trainer -> generator, every step
            rewards.append(reward.mean())
            if step % 10 == 9:
                recent = sum(r.item() for r in rewards[-10:]) / 10
                print(f"step {step + 1:3d}: mean reward {recent:.3f}")
        t_spans, g_spans = (busy(m, start) for m in (trainer_procs, generator_procs))
        wall = time.time() - start
        trainer, generator = overlap(t_spans, t_spans), overlap(g_spans, g_spans)
        both = overlap(t_spans, g_spans)
        print(
            f"wall {wall:.2f} s; trainer busy {trainer:.2f} s, generator busy {generator:.2f} s, "
            f"both at once {both:.2f} s"
        )
        first = sum(r.item() for r in rewards[:10]) / 10
        last = sum(r.item() for r in rewards[-10:]) / 10
        print(f"mean reward: first 10 steps {first:.3f}, last 10 steps {last:.3f}")
    finally:
        trainer_procs.stop().get(timeout=30)
        generator_procs.stop().get(timeout=30)


if __name__ == "__main__":
    main()

"""``grad_generator``: PyTorch Monarch's gradients one at a time, on 4 real ranks (gloo), and the
DDP step of Monarch's guide built on it (``grad.reduce_("dp", "sum")``), each compared with the
same computation in one process (float64)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn as nn

import actormesh as am
from actormesh.tensor import fetch

WAIT = 60
COORDS = [(d, p) for d in range(2) for p in range(2)]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4, dtype=torch.float64)
        self.unused = nn.Linear(4, 4, dtype=torch.float64)
        self.last = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        out = self.last(torch.relu(self.first(x)))
        return nn.functional.cross_entropy(out, target)


def local_copy(model: Net, d: int, p: int) -> Net:
    """Rank (d, p)'s model, in this process."""
    local = Net()
    with torch.no_grad():
        for mine, remote in zip(local.parameters(), model.parameters(), strict=True):
            mine.copy_(fetch(remote, dp=d, tp=p).get(timeout=WAIT))
    return local


def test_grads_one_at_a_time_as_autograd_gives_them(mesh: Any) -> None:
    with mesh.activate():
        model = Net()  # per rank: each draws its own weights
        x = torch.rand(5, 4, dtype=torch.float64)
        target = torch.randint(0, 3, (5,))
        loss = model(x, target)
    params = list(reversed(list(model.parameters())))
    grads = am.grad_generator(loss, params)
    got = list(grads)
    assert len(got) == len(params)
    assert all(p.grad is None for p in params)  # .grad is left alone
    for d, p in COORDS:
        local = local_copy(model, d, p)
        lx, lt = fetch(x, dp=d, tp=p).get(timeout=WAIT), fetch(target, dp=d, tp=p).get(timeout=WAIT)
        want = torch.autograd.grad(
            local(lx, lt), list(reversed(list(local.parameters()))), allow_unused=True
        )
        for g, w in zip(got, want, strict=True):
            if w is None:
                assert g is None  # the unused layer
            else:
                assert torch.allclose(fetch(g, dp=d, tp=p).get(timeout=WAIT), w, rtol=1e-12)


def test_the_guides_ddp_step(mesh: Any) -> None:
    """Monarch's guide: backward one gradient at a time, each summed over dp, then a step."""
    torch.manual_seed(0)
    start = Net()
    with mesh.activate():
        model = Net()
        with torch.no_grad():  # the same start on every rank, as DDP has
            for p, w in zip(model.parameters(), start.parameters(), strict=True):
                p.copy_(torch.tensor(w.tolist(), dtype=torch.float64))
        x = torch.rand(3, 4, dtype=torch.float64)  # each rank's own batch
        target = torch.full((3,), 1, dtype=torch.int64)

        loss = model(x, target)
        rparameters = list(reversed(list(model.parameters())))
        grads = am.grad_generator(loss, rparameters)
        with torch.no_grad():
            it = iter(zip(rparameters, grads))  # noqa: B905  (the guide's line)
            todo = next(it, None)
            while todo is not None:
                param, grad = todo
                if grad is not None:
                    grad.reduce_("dp", "sum")
                todo = next(it, None)
                if grad is not None:
                    param += 0.01 * grad
    for p in range(2):  # each tp column is its own DDP over dp
        batches = [fetch(x, dp=d, tp=p).get(timeout=WAIT) for d in range(2)]
        ref = Net()
        ref.load_state_dict(start.state_dict())
        total = [torch.zeros_like(w) for w in ref.parameters()]
        for b in batches:
            loss_here = ref(b, torch.full((3,), 1))
            here = torch.autograd.grad(loss_here, list(ref.parameters()), allow_unused=True)
            for acc, g in zip(total, here, strict=True):
                if g is not None:
                    acc += g
        with torch.no_grad():
            for w, g in zip(ref.parameters(), total, strict=True):
                w += 0.01 * g
        for d in range(2):
            for mine, want in zip(model.parameters(), ref.parameters(), strict=True):
                assert torch.allclose(fetch(mine, dp=d, tp=p).get(timeout=WAIT), want, rtol=1e-12)


def test_plain_tensors_and_bad_arguments() -> None:
    a = torch.rand(3, dtype=torch.float64, requires_grad=True)
    b = torch.rand(3, dtype=torch.float64, requires_grad=True)
    out = (a * b).sum()
    assert [g.tolist() for g in am.grad_generator(out, [b, a])] == [a.tolist(), b.tolist()]
    seed = torch.full((3,), 2.0, dtype=torch.float64)
    twice = list(am.grad_generator([a * b], [a], grad_roots=[seed]))
    assert torch.equal(twice[0], 2 * b.detach())
    with pytest.raises(am.MeshUsageError, match="one gradient"):
        am.grad_generator([out], [a], grad_roots=[None, None])
    with pytest.raises(am.MeshUsageError, match="holds a str"):
        am.grad_generator(out, ["a"])

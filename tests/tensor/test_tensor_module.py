"""module_to_mesh with torch's own AdamW (TENSORS.md §8 test 2): losses and final weights equal a
single-process float64 run for the default (replicated, bucketed grad sums), fsdp, tp_plan and
both; failures on one rank in every mode. (The model as the user's own: test_mesh_model.py.)"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn
from training import MLP, MODES, train

from actormesh.tensor import MeshModule, MeshTensor, inspect, module_to_mesh, remote


@pytest.mark.parametrize("mode", list(MODES))
def test_module_to_mesh_training(mesh: Any, mode: str) -> None:
    torch.manual_seed(0)
    base = MLP().double()
    # 7 rows: the data dimension (2 ranks) splits the batch unevenly.
    batches = [
        (torch.randn(7, 8, dtype=torch.float64), torch.randn(7, 4, dtype=torch.float64))
        for _ in range(5)
    ]
    expected_losses = train(reference := copy.deepcopy(base), batches)
    model = module_to_mesh(copy.deepcopy(base), mesh, **MODES[mode])
    assert isinstance(model, MeshModule)
    assert all(isinstance(p, MeshTensor) and p.requires_grad for p in model.parameters())
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in base.named_parameters()]
    losses = train(model, batches)
    assert losses == pytest.approx(expected_losses, abs=1e-9, rel=0)
    weights = inspect(dict(model.state_dict()))
    for name, value in reference.state_dict().items():
        assert torch.allclose(weights[name], value, atol=1e-9, rtol=0), name
    assert losses[-1] < losses[0]  # it learnt something


def test_factory_builds_on_the_workers_and_eval_mode(mesh: Any) -> None:
    torch.manual_seed(3)
    model = module_to_mesh(lambda: nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)), mesh)
    x = torch.randn(6, 4)
    model.eval()
    with torch.no_grad():
        a, b = inspect((model(x), model(x)))
    assert torch.equal(a, b)  # dropout is off in eval mode on the workers
    local = model.fetch_module()
    assert torch.allclose(local.eval()(x), a, atol=1e-6)
    model.train()
    with torch.no_grad():
        c = inspect(model(x))
    assert (c == 0).any() and not torch.equal(c, a)  # and on again in train mode


def test_training_leaves_no_values_behind(mesh: Any) -> None:
    import gc

    from actormesh.tensor import live

    gc.collect()
    baseline = live(mesh).values()
    model = module_to_mesh(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)), mesh)
    optimizer = torch.optim.AdamW(model.parameters())
    counts = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(torch.randn(6, 4)), torch.randn(6, 2))
        loss.backward()
        optimizer.step()
        loss.item()
        del loss
        gc.collect()
        counts.append(live(mesh).values())
    # Per rank: 4 parameters, AdamW's 2 x 4 moments and the 4 gradients; steady.
    assert counts[0] == counts[2] == [b + 16 for b in baseline], (baseline, counts)
    del model, optimizer
    gc.collect()
    assert live(mesh).values() == baseline


@remote(propagate=lambda x: x)
def _bad_batch_on_rank_3(x: Any) -> Any:
    import torch.distributed as dist

    if dist.get_rank() == 3:
        raise FloatingPointError("bad batch on rank 3")
    return x


class FailsOnRank3(nn.Module):
    """A forward that fails on one rank only: it calls a remote function that raises there (the
    forward itself runs on the controller)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(_bad_batch_on_rank_3(x))))


@pytest.mark.parametrize("mode", list(MODES))
def test_a_forward_failing_on_one_rank_is_reported_without_a_hang(mesh: Any, mode: str) -> None:
    from actormesh.tensor import RemoteTensorError, distribute, fetch

    model = module_to_mesh(FailsOnRank3(), mesh, **MODES[mode])
    optimizer = torch.optim.AdamW(model.parameters())
    loss = nn.functional.mse_loss(model(torch.randn(6, 4)), torch.randn(6, 2))
    loss.backward()  # collectives (gradient sums, tensor parallelism) with rank 3's stand-ins
    optimizer.step()
    with pytest.raises(RemoteTensorError, match="bad batch on rank 3") as info:
        fetch(loss).get(timeout=60)  # a hang fails here, well before the group's timeout
    assert info.value.ranks == ["{dp=1, tp=1}"]
    # Later values that depend on it say so too (the parameters after the step), and the mesh
    # still runs collectives for everything else.
    with pytest.raises(RemoteTensorError, match="bad batch on rank 3"):
        fetch(next(iter(model.parameters()))).get(timeout=60)
    x = torch.arange(8.0).reshape(4, 2)
    d = distribute(x, mesh, sharding_spec=["dp", None])
    assert torch.equal(fetch(d @ d.T).get(timeout=60), x @ x.T)


def test_fsdp_in_float32_over_four_data_parallel_ranks(spawn_procs: Any) -> None:
    """Found on the first module design (issue 42): ``fsdp=True`` on float32 Linear layers over
    {dp: 4} failed at the first backward with "Cannot use ReduceOp.PREMUL_SUM with Gloo"
    (fully_shard's gradient division). grad_sync sums with plain all_reduces."""
    procs = spawn_procs(per_host={"dp": 4})
    torch.manual_seed(0)
    base = MLP()
    batches = [(torch.randn(8, 8), torch.randn(8, 4)) for _ in range(3)]
    expected = train(copy.deepcopy(base), batches)
    losses = train(module_to_mesh(copy.deepcopy(base), procs, fsdp=True), batches)
    assert losses == pytest.approx(expected, abs=1e-5, rel=0)

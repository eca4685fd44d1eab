"""BatchNorm under ``module_to_mesh`` (issue 45): per-shard batch statistics, as under DDP, compared
in float64 with one process that normalises each data-parallel part of the batch on its own; and
``nn.SyncBatchNorm``, which torch runs on GPUs only, refused on a CPU mesh at the user's line."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import actormesh as am

WAIT = 60


def model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)).double()


def test_batchnorm_normalises_each_data_parallel_part_with_its_own_statistics(mesh: Any) -> None:
    x = torch.randn(16, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    y = torch.randn(16, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    on_mesh = am.module_to_mesh(model(), mesh)  # {dp: 2, tp: 2}: the batch splits over dp
    opt = torch.optim.SGD(on_mesh.parameters(), lr=0.1)
    per_part, whole = model(), model()
    opt_part = torch.optim.SGD(per_part.parameters(), lr=0.1)
    opt_whole = torch.optim.SGD(whole.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        loss = nn.functional.mse_loss(on_mesh(x), y)
        loss.backward()
        opt.step()
        opt_part.zero_grad()
        ref = nn.functional.mse_loss(torch.cat([per_part(x[:8]), per_part(x[8:])]), y)
        ref.backward()
        opt_part.step()
        opt_whole.zero_grad()
        one = nn.functional.mse_loss(whole(x), y)
        one.backward()
        opt_whole.step()
        assert abs(loss.item() - ref.item()) < 1e-12, (loss.item(), ref.item())
        assert abs(loss.item() - one.item()) > 1e-6  # not the whole batch's statistics
    running = dict(on_mesh.named_buffers())["1.running_mean"]
    first = am.fetch(running, dp=0).get(timeout=WAIT)
    second = am.fetch(running, dp=1).get(timeout=WAIT)
    assert not torch.allclose(first, second)  # each data-parallel rank keeps its own
    assert torch.equal(am.inspect(running), first)  # inspect reads rank 0's, as documented


def test_sync_batchnorm_on_a_cpu_mesh_is_refused_at_the_users_line(mesh: Any) -> None:
    with pytest.raises(am.MeshUsageError, match=r"SyncBatchNorm.*GPUs only.*nn\.BatchNorm"):
        am.module_to_mesh(nn.SyncBatchNorm.convert_sync_batchnorm(model()), mesh)

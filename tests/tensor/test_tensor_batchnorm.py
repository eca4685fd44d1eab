"""BatchNorm under ``module_to_mesh``: the statistics of the whole batch, as in one process (the
model's forward runs on the controller, so a data-parallel split changes no number), for
``nn.BatchNorm1d`` and for ``nn.SyncBatchNorm`` alike, compared in float64 step by step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import actormesh as am

WAIT = 60


def model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)).double()


def synced() -> nn.Module:
    return nn.SyncBatchNorm.convert_sync_batchnorm(model())


@pytest.mark.parametrize("build", [model, synced], ids=["BatchNorm1d", "SyncBatchNorm"])
def test_batchnorm_normalises_the_whole_batch_as_one_process(
    mesh: Any, build: Callable[[], nn.Module]
) -> None:
    x = torch.randn(16, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    y = torch.randn(16, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    on_mesh = am.module_to_mesh(build(), mesh)  # {dp: 2, tp: 2}: the batch splits over dp
    local = build()
    opt = torch.optim.SGD(on_mesh.parameters(), lr=0.1)
    opt_local = torch.optim.SGD(local.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        loss = nn.functional.mse_loss(on_mesh(x), y)
        loss.backward()
        opt.step()
        opt_local.zero_grad()
        expected = nn.functional.mse_loss(local(x), y)
        expected.backward()
        opt_local.step()
        assert abs(loss.item() - expected.item()) < 1e-12, (loss.item(), expected.item())
    buffers = dict(local.named_buffers())
    for name, value in on_mesh.named_buffers():
        for dp in (0, 1):
            got = am.fetch(value, dp=dp).get(timeout=WAIT)
            torch.testing.assert_close(got, buffers[name], rtol=0, atol=1e-12, msg=name)
    on_mesh.eval()
    local.eval()
    torch.testing.assert_close(am.inspect(on_mesh(x)), local(x), rtol=0, atol=1e-12)

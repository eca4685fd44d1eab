"""The distributed-tensor layer on GPUs: NCCL and CUDA tensors where each rank has a GPU of its
own (a ``gpus`` dimension no larger than the GPU count); a mesh whose ranks share a GPU computes
on the CPU, and says so."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from support import gpus_here
from training import MLP, train

import actormesh as am
from actormesh.tensor import activate, fetch, inspect, module_to_mesh, randn

GPUS = gpus_here()  # conftest skips without

WAIT = 120


@pytest.fixture(scope="module")
def gpu_mesh() -> Iterator[Any]:
    procs = am.this_host().spawn_procs(per_host={"gpus": len(GPUS)})
    try:
        yield procs
    finally:
        procs.stop().get(timeout=60)


def test_founding_matmul_on_gpus(gpu_mesh: Any) -> None:
    x = torch.randn(64, 32, dtype=torch.float64)
    dt = am.distribute(x, gpu_mesh, sharding_spec=["gpus", None])
    assert dt.device.type == "cuda"
    got = fetch(dt @ dt.T).get(timeout=WAIT)
    assert torch.allclose(got.cpu(), x @ x.T, atol=1e-10, rtol=0)


def test_ranks_sharing_a_gpu_compute_on_the_cpu(caplog: pytest.LogCaptureFixture) -> None:
    procs = am.this_host().spawn_procs(per_host={"gpus": len(GPUS) + 1})
    try:
        x = torch.randn(6, 4, dtype=torch.float64)
        dt = am.distribute(x, procs, sharding_spec=["gpus", None])
        assert dt.device.type == "cpu"
        assert "share a GPU (NCCL needs one per rank)" in caplog.text
        assert torch.allclose(inspect(dt @ dt.T), x @ x.T, atol=1e-12, rtol=0)
    finally:
        procs.stop().get(timeout=60)


def test_random_factories_use_dtensors_rng(gpu_mesh: Any) -> None:
    torch.manual_seed(7)
    sharded = randn(64, 16, mesh=gpu_mesh, sharding_spec=["gpus", None])
    torch.manual_seed(7)
    whole = randn(64, 16, mesh=gpu_mesh)  # replicated, same controller seed
    a, b = inspect(sharded).cpu(), inspect(whole).cpu()
    assert sharded.device.type == "cuda"
    assert torch.equal(a, b)  # one stream at per-shard offsets: the placement does not matter
    assert not torch.equal(a[:32], a[32:])  # the shards are not copies of each other
    assert abs(float(a.mean())) < 0.2 and 0.8 < float(a.std()) < 1.2
    like = torch.randn_like(sharded)  # an aten random op on a DTensor, on the GPU
    c = inspect(like).cpu()
    assert not torch.equal(c, a) and not torch.equal(c[:32], c[32:])


@pytest.mark.skipif(len(GPUS) < 2, reason="needs two GPUs (ranks of one GPU compute on the CPU)")
def test_per_rank_factories_differ_per_rank(gpu_mesh: Any) -> None:
    with activate(gpu_mesh):
        t = torch.randn(4, device="cuda")
    first, second = fetch(t, gpus=0).get(timeout=WAIT), fetch(t, gpus=1).get(timeout=WAIT)
    assert not torch.equal(first.cpu(), second.cpu())


@pytest.mark.parametrize("fsdp", [False, True], ids=["replicated", "fsdp"])
def test_module_to_mesh_training_step_on_gpus(gpu_mesh: Any, fsdp: bool) -> None:
    torch.manual_seed(0)
    base = MLP().double()
    batches = [
        (torch.randn(6, 8, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64))
        for _ in range(4)
    ]
    expected = train(reference := copy.deepcopy(base), batches)
    model = module_to_mesh(copy.deepcopy(base), gpu_mesh, fsdp=fsdp)
    assert all(p.device.type == "cuda" for p in model.parameters())
    assert train(model, batches) == pytest.approx(expected, abs=1e-9, rel=0)
    weights = inspect(dict(model.state_dict()))
    for name, value in reference.state_dict().items():
        assert torch.allclose(weights[name].cpu(), value, atol=1e-9, rtol=0), name

"""Device pinning, CUDA TensorBuffers and process groups on real GPUs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from support import gpus_here, wait_until

import actormesh as am
from actormesh import MeshUsageError, TensorBuffer

GPUS = gpus_here()  # conftest skips without


class Gpu(am.Actor):
    @am.endpoint
    def where(self) -> tuple[str | None, int, str]:
        x = torch.ones(1 << 20, device="cuda")  # really allocate on it
        uuid = str(torch.cuda.get_device_properties(x.device).uuid)
        return os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.device_count(), uuid


class Owner(am.Actor):
    def __init__(self) -> None:
        self.tensor: torch.Tensor | None = None
        self.buffer: TensorBuffer | None = None

    @am.endpoint
    def share(self, n: int, transport: str = "auto", cuda: bool = True) -> TensorBuffer:
        device = "cuda" if cuda else "cpu"
        self.tensor = torch.arange(n, dtype=torch.float32, device=device)
        self.buffer = TensorBuffer(self.tensor, transport=transport)
        return self.buffer

    @am.endpoint
    def scale(self, by: float) -> None:
        assert self.tensor is not None
        self.tensor.mul_(by)  # a kernel still running when this returns, on a GPU

    @am.endpoint
    def value(self) -> torch.Tensor:
        assert self.tensor is not None
        return self.tensor.cpu()

    @am.endpoint
    def drop(self) -> None:
        assert self.buffer is not None
        self.buffer.drop()


class Reader(am.Actor):
    @am.endpoint
    def read(self, buf: TensorBuffer, cuda: bool = True) -> tuple[torch.Tensor, bool]:
        dst = torch.full(buf.shape, -1.0, device="cuda" if cuda else "cpu")
        buf.read_into(dst).get(timeout=60)
        return dst.cpu(), buf.opened is not None

    @am.endpoint
    def write(self, buf: TensorBuffer, value: float, cuda: bool = True) -> None:
        src = torch.full(buf.shape, value, device="cuda" if cuda else "cpu")
        buf.write_from(src).get(timeout=60)


@pytest.fixture
def two_ranks() -> Iterator[am.ProcMesh]:
    # No 'gpus' dimension: both processes see every GPU, and use device 0.
    procs = am.this_host().spawn_procs(per_host={"ranks": 2})
    yield procs
    procs.stop().get(timeout=60)


def pair(procs: am.ProcMesh) -> tuple[Any, Any]:
    return (
        procs.slice(ranks=0).spawn("owner", Owner),
        procs.slice(ranks=1).spawn("reader", Reader),
    )


def test_the_gpus_dimension_gives_each_rank_its_own_gpu() -> None:
    procs = am.this_host().spawn_procs(per_host={"gpus": len(GPUS)})
    try:
        seen = procs.spawn("gpu", Gpu).where.call().get(timeout=120).values()
    finally:
        procs.stop().get(timeout=60)
    assert [cvd for cvd, _, _ in seen] == GPUS
    assert all(count == 1 for _, count, _ in seen)  # each sees only its own, as device 0
    assert len({uuid for _, _, uuid in seen}) == len(GPUS)


def test_more_ranks_than_gpus_share_them_round_robin() -> None:
    n = 2 * len(GPUS) + 1
    procs = am.this_host().spawn_procs(per_host={"gpus": n})
    try:
        seen = procs.spawn("gpu", Gpu).where.call().get(timeout=120).values()
    finally:
        procs.stop().get(timeout=60)
    assert [cvd for cvd, _, _ in seen] == [GPUS[i % len(GPUS)] for i in range(n)]
    assert all(count == 1 for _, count, _ in seen)
    assert len({uuid for _, _, uuid in seen}) == len(GPUS)


@pytest.mark.parametrize("transport", ["auto", "socket"])
def test_a_cuda_buffer_is_read_and_written_by_another_rank(
    two_ranks: am.ProcMesh, transport: str
) -> None:
    owner, reader = pair(two_ranks)
    n = 1 << 20
    buf = owner.share.call_one(n, transport).get(timeout=60)
    assert buf.gpu == GPUS[0] and repr(buf).endswith(f"on GPU {GPUS[0]}>")
    got, through_ipc = reader.read.call_one(buf).get(timeout=60)
    assert through_ipc == (transport == "auto")
    assert torch.equal(got, torch.arange(n, dtype=torch.float32))
    # The owner's kernel may still run when scale() returns: the read must see its result.
    owner.scale.call_one(3.0).get(timeout=60)
    got, _ = reader.read.call_one(buf).get(timeout=60)
    assert torch.equal(got, 3 * torch.arange(n, dtype=torch.float32))
    got, _ = reader.read.call_one(buf, cuda=False).get(timeout=60)  # into host memory
    assert torch.equal(got, 3 * torch.arange(n, dtype=torch.float32))
    reader.write.call_one(buf, 7.0).get(timeout=60)
    assert torch.equal(owner.value.call_one().get(timeout=60), torch.full((n,), 7.0))
    reader.write.call_one(buf, 2.0, cuda=False).get(timeout=60)
    assert torch.equal(owner.value.call_one().get(timeout=60), torch.full((n,), 2.0))
    owner.drop.call_one().get(timeout=60)
    with pytest.raises(am.ActorError, match="dropped by its owner"):
        reader.read.call_one(buf).get(timeout=60)


def test_a_cpu_buffer_is_read_into_and_written_from_gpu_memory(two_ranks: am.ProcMesh) -> None:
    owner, reader = pair(two_ranks)
    buf = owner.share.call_one(1000, cuda=False).get(timeout=60)
    got, through_ipc = reader.read.call_one(buf).get(timeout=60)
    assert not through_ipc and torch.equal(got, torch.arange(1000, dtype=torch.float32))
    reader.write.call_one(buf, 5.0).get(timeout=60)
    assert torch.equal(owner.value.call_one().get(timeout=60), torch.full((1000,), 5.0))


def test_a_cuda_buffer_refuses_shared_memory_transport(two_ranks: am.ProcMesh) -> None:
    owner, _ = pair(two_ranks)
    with pytest.raises(am.ActorError, match="transport='shm' is for CPU tensors"):
        owner.share.call_one(10, "shm").get(timeout=60)


class Member(am.Actor):
    @am.endpoint
    def all_reduce(self) -> float:
        import torch.distributed as dist

        x = torch.full((1 << 20,), float(dist.get_rank() + 1), device="cuda")
        dist.all_reduce(x)
        return float(x[-1].item())


def group_over(procs: am.ProcMesh, backend: str | None = None) -> list[Any]:
    members = am.init_process_group(procs, backend).get(timeout=180).values()
    return members


def test_one_rank_per_gpu_forms_an_nccl_group() -> None:
    procs = am.this_host().spawn_procs(per_host={"gpus": len(GPUS)})
    try:
        members = group_over(procs)
        assert all("nccl" in m.backend for m in members)
        sums = procs.spawn("member", Member).all_reduce.call().get(timeout=120).values()
        n = len(GPUS)
        assert sums == [n * (n + 1) / 2] * n
    finally:
        procs.stop().get(timeout=60)


def test_ranks_sharing_a_gpu_run_cuda_collectives_through_gloo() -> None:
    n = len(GPUS) + 1
    procs = am.this_host().spawn_procs(per_host={"gpus": n})
    try:
        with pytest.raises(MeshUsageError, match="NCCL needs a GPU per rank"):
            group_over(procs, "cpu:gloo,cuda:nccl")
        members = group_over(procs)
        assert all(m.backend == "cpu:gloo,cuda:gloo" for m in members)
        sums = procs.spawn("member", Member).all_reduce.call().get(timeout=120).values()
        assert sums == [n * (n + 1) / 2] * n
    finally:
        procs.stop().get(timeout=60)


class DdpTrainer(am.Actor):
    @am.endpoint
    def train(self, state: dict[str, torch.Tensor], batches: list[Any]) -> dict[str, Any]:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        rank, world = dist.get_rank(), dist.get_world_size()
        model = torch.nn.Linear(8, 4).double().cuda()
        model.load_state_dict(state)
        ddp = DistributedDataParallel(model)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for x, y in batches:
            part = slice(rank * len(x) // world, (rank + 1) * len(x) // world)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x[part].cuda()), y[part].cuda())
            loss.backward()
            optimizer.step()
        return {k: v.cpu() for k, v in model.state_dict().items()}


def test_ddp_on_gpus_matches_one_gpu() -> None:
    torch.manual_seed(0)
    base = torch.nn.Linear(8, 4).double()
    batches = [(torch.randn(16, 8).double(), torch.randn(16, 4).double()) for _ in range(4)]
    reference = torch.nn.Linear(8, 4).double()
    reference.load_state_dict(base.state_dict())
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x, y in batches:
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        optimizer.step()
    procs = am.this_host().spawn_procs(per_host={"gpus": 2})
    try:
        group_over(procs)
        trained = procs.spawn("ddp", DdpTrainer).train.call(base.state_dict(), batches)
        for state in trained.get(timeout=180).values():
            for name, value in reference.state_dict().items():
                assert torch.allclose(state[name], value, atol=1e-12, rtol=0), name
    finally:
        procs.stop().get(timeout=60)


def test_gpu_memory_and_utilisation_are_sampled_per_rank(two_ranks: am.ProcMesh) -> None:
    pytest.importorskip("pynvml", reason="GPU sampling needs nvidia-ml-py (the gpu extra)")
    owner, _ = pair(two_ranks)
    owner.share.call_one(64 << 20).get(timeout=60)  # 256 MB on rank 0's GPU
    history = two_ranks._record.resources

    def holds_it() -> bool:
        sample = history.latest().get(0)
        return sample is not None and (sample.gpu_mem or 0) >= 256 << 20

    wait_until(
        holds_it,
        timeout=15,
        what="rank 0's GPU memory in its samples",
    )
    rank0, rank1 = history.latest()[0], history.latest().get(1)
    assert rank0.gpu_mem is not None and rank0.gpu_mem >= 256 << 20
    assert rank0.gpu_util is not None and 0 <= rank0.gpu_util <= 100
    assert rank1 is not None and rank1.gpu_mem == 0  # it never touched CUDA

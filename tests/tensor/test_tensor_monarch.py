"""PyTorch Monarch's tensor-engine semantics (TENSORS.md §8 test 9) and remote functions."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from support import gpus_here

import actormesh as am
from actormesh.tensor import (
    MeshTensor,
    activate,
    call_on_shard_and_fetch,
    distribute,
    fetch,
    inspect,
    no_mesh,
    rank,
)

WAIT = 60


def per_rank(t: Any) -> dict[tuple[int, int], torch.Tensor]:
    return {(d, p): fetch(t, dp=d, tp=p).get(timeout=WAIT) for d in range(2) for p in range(2)}


def test_monarch_semantics(mesh: Any) -> None:
    with mesh.activate():  # ProcMesh methods, as in Monarch
        t = torch.rand(3, 4)
        assert isinstance(t, MeshTensor) and t.shape == (3, 4)
        s = t.reduce("tp", "sum")
        both = t.reduce(("dp", "tp"), "avg")
        stacked = t.reduce(("dp", "tp"), "stack")
        biggest = t.reduce("dp", "max")
        square = t @ t.T
        coords = mesh.rank("dp")
        flat = rank(mesh, ("dp", "tp"))
        with no_mesh.activate():
            plain = torch.zeros(2)
        assert type(plain) is torch.Tensor
    values = per_rank(t)
    assert len({v.sum().item() for v in values.values()}) == 4  # a different draw on every rank
    assert torch.equal(fetch(t).get(timeout=WAIT), values[(0, 0)])  # omitted coords mean 0
    order = [values[(d, p)] for d in range(2) for p in range(2)]
    for (d, _), got in per_rank(s).items():
        assert torch.allclose(got, values[(d, 0)] + values[(d, 1)])
    for got in per_rank(both).values():
        assert torch.allclose(got, sum(order) / 4)
    assert stacked.shape == (4, 3, 4)
    assert torch.allclose(inspect(stacked), torch.stack(order))
    for (_, p), got in per_rank(biggest).items():
        assert torch.equal(got, torch.maximum(values[(0, p)], values[(1, p)]))
    for key, got in per_rank(square).items():
        assert torch.allclose(got, values[key] @ values[key].T)
    assert {k: v.item() for k, v in per_rank(coords).items()} == {
        (0, 0): 0,
        (0, 1): 0,
        (1, 0): 1,
        (1, 1): 1,
    }
    assert [fetch(flat, dp=d, tp=p).get(timeout=WAIT).item() for d in (0, 1) for p in (0, 1)] == [
        0, 1, 2, 3
    ]  # fmt: skip


def test_per_rank_and_global_do_not_mix(mesh: Any) -> None:
    g = distribute(torch.ones(3, 4), mesh)
    with activate(mesh):
        t = torch.ones(3, 4)
    with pytest.raises(ValueError, match="mixes a per-rank MeshTensor"):
        t + g
    with pytest.raises(ValueError, match="unknown mesh dimension 'gpus'"):
        t.reduce("gpus")
    with pytest.raises(ValueError, match="unknown reduction"):
        t.reduce("dp", "median")
    with pytest.raises(ValueError, match="per-rank MeshTensor"):
        g.reduce("dp")


@am.remote(propagate=lambda t: t)
def clip(t: Any) -> Any:
    return t.clamp(-1, 1)


@am.remote
def twice_and_total(t: Any) -> Any:
    return t * 2, t.sum()


@am.remote
def positives(t: Any) -> Any:
    return t[t > 0]  # a data-dependent shape: meta tensors cannot say it


@am.remote(propagate="inspect")
def local_norm(t: Any) -> float:
    local = t.to_local() if hasattr(t, "to_local") else t
    return float(local.norm())


def test_remote_functions(mesh: Any) -> None:
    x = torch.arange(-8.0, 8.0).reshape(4, 4) / 4
    dt = distribute(x, mesh, sharding_spec=["dp", None])
    assert torch.equal(inspect(clip(dt)), x.clamp(-1, 1))
    doubled, total = twice_and_total(dt)
    assert doubled.shape == (4, 4) and total.shape == ()
    assert torch.equal(inspect(doubled), x * 2) and inspect(total).item() == x.sum().item()
    shards = clip.call(dt).get(timeout=WAIT)
    for point, shard in shards.items():
        rows = slice(2 * point["dp"], 2 * point["dp"] + 2)
        assert torch.equal(shard, x[rows].clamp(-1, 1))
    got = call_on_shard_and_fetch(clip, dt, dp=1).get(timeout=WAIT)
    assert torch.equal(got, x[2:4].clamp(-1, 1))
    norm = local_norm(dt)
    assert fetch(norm, dp=1).get(timeout=WAIT) == pytest.approx(float(x[2:4].norm()))
    with activate(mesh):
        ramp = torch.arange(-2.0, 3.0)
    pos = positives(ramp)  # learnt from rank 0 (one round trip), then cached
    assert pos.shape == (2,)
    assert torch.equal(inspect(pos * 10), torch.tensor([10.0, 20.0]))


@am.remote(propagate=lambda t: t[:1])
def says_one_row(t: torch.Tensor) -> torch.Tensor:
    return t * 1  # every row: not what its propagate says


def test_a_result_unlike_its_propagate_fails_at_the_sync_point(mesh: Any) -> None:
    """The controller shapes later ops from ``propagate``'s answer: a result of another shape
    was kept without a word (the controller said (1, 4), each rank held (3, 4))."""
    with activate(mesh):
        t = torch.ones(3, 4)
    wrong = says_one_row(t)
    assert wrong.shape == (1, 4)
    with pytest.raises(am.ActorError, match=r"returned a \(3, 4\).*told \(1, 4\)"):
        fetch(wrong, dp=1).get(timeout=WAIT)
    assert torch.equal(fetch(t + 1, dp=1).get(timeout=WAIT), torch.full((3, 4), 2.0))
    whole = distribute(torch.ones(4, 4), mesh, sharding_spec=["dp", None])
    wrong_whole = says_one_row(whole)  # a DTensor result: checked by its global shape
    assert wrong_whole.shape == (1, 4)
    with pytest.raises(am.ActorError, match=r"returned a \(4, 4\).*told \(1, 4\)"):
        inspect(wrong_whole)
    assert torch.equal(inspect(whole * 2), torch.full((4, 4), 2.0))


def test_a_gpu_program_runs_on_the_cpu_mesh(mesh: Any) -> None:
    # Monarch's guide writes factories with device="cuda": under activate() the device names the
    # mesh's devices, so the same code runs where the ranks have only CPUs.
    with activate(mesh):
        t = torch.ones(2, 3, device="cuda")
        total = (t @ t.T).reduce(("dp", "tp"), "sum")
    # On GPUs only with one per rank (four here); ranks that share one compute on the CPU.
    gpus = gpus_here()
    assert t.device.type == ("cuda" if len(gpus) >= 4 else "cpu")
    assert torch.equal(fetch(total, dp=1, tp=1).get(timeout=WAIT), torch.full((2, 2), 12.0))


class Scaler(am.Actor):
    def __init__(self) -> None:
        self.calls = 0

    @am.endpoint
    def scale(self, t: torch.Tensor, k: int) -> torch.Tensor:
        import threading

        import torch.distributed as dist

        self.calls += 1
        assert threading.current_thread().name == "actor-scaler"  # the actor's own thread
        return t * k + dist.get_rank()

    @am.endpoint
    def count(self) -> int:
        return self.calls


def test_endpoint_rref_is_a_mesh_tensor_in_the_stream(mesh: Any) -> None:
    from actormesh.tensor import MeshTensor
    from actormesh.tensor.controller.mesh import tensor_mesh

    actors = mesh.spawn("scaler", Scaler)
    x = torch.arange(8.0).reshape(4, 2)
    dt = distribute(x, mesh, sharding_spec=["dp", None])
    pending = dt + 1  # not sent yet: the endpoint must see it
    r = actors.scale.rref(pending, 10)
    assert isinstance(r, MeshTensor) and r.per_rank and r.shape == (2, 2)
    doubled = r * 2  # a later op reads the result where it is
    total = r.reduce("dp", "sum")
    for dp in range(2):
        for tp in range(2):
            want = (x[dp * 2 : dp * 2 + 2] + 1) * 10 + (dp * 2 + tp)
            assert torch.equal(fetch(r, dp=dp, tp=tp).get(timeout=60), want)
            assert torch.equal(fetch(doubled, dp=dp, tp=tp).get(timeout=60), want * 2)
    expected = sum((x[d * 2 : d * 2 + 2] + 1) * 10 + d * 2 for d in range(2))
    assert torch.equal(fetch(total, dp=0, tp=0).get(timeout=60), expected)
    # The same signature again: its shape is known, so nothing is sent until a sync point.
    stream = tensor_mesh(mesh).stream
    sent = stream.batches
    again = actors.scale.rref(pending, 10)
    assert stream.batches == sent and again.shape == (2, 2)
    assert torch.equal(fetch(again, dp=1, tp=1).get(timeout=60), (x[2:4] + 1) * 10 + 3)
    assert actors.count.call().get(timeout=60).values() == [2, 2, 2, 2]

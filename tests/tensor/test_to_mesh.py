"""``MeshTensor.to_mesh`` (issue 41): a tensor moves rank to rank between tensor meshes, between
the slices of one proc mesh and between separate proc meshes, on real ranks (gloo). Every pair
of source and destination placements lands the same global tensor, each rank holding the block
its placement says; gradients flow back through it; a failure on the source reaches the
destination's error with the source's rank and op, and nothing waits for it. Values compared
with one process (float64)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.distributed.tensor import Partial, Replicate, Shard

import actormesh as am
from actormesh.tensor import RemoteTensorError, activate, device_mesh, distribute, fetch, inspect

WAIT = 60


@pytest.fixture(scope="module")
def meshes() -> Iterator[tuple[Any, Any]]:
    """A {pp: 2, dp: 2} whose slices pp=0 and pp=1 are the stages, and a separate {dp: 2}."""
    stages = am.this_host().spawn_procs(per_host={"pp": 2, "dp": 2})
    other = am.this_host().spawn_procs(per_host={"dp": 2})
    try:
        yield stages, other
    finally:
        stages.stop().get(timeout=30)
        other.stop().get(timeout=30)


X = torch.arange(42.0, dtype=torch.float64).reshape(7, 6)  # 7 rows over 2 ranks: uneven

# Source placements over {dp: 2}, made the way a program makes them.
SOURCES = ["rows", "cols", "replicated", "partial"]
TARGETS: list[Any] = [[Shard(0)], [Shard(1)], [Replicate()], None]  # None: as on the source


def _source(kind: str, mesh: Any) -> Any:
    if kind == "rows":
        return distribute(X, mesh, sharding_spec=["dp", None])
    if kind == "cols":
        return distribute(X, mesh, sharding_spec=[None, "dp"])
    if kind == "replicated":
        return distribute(X, mesh)
    # (7, 6) cols-sharded @ (6, 6) rows-sharded identity: each rank holds a partial sum
    eye = distribute(torch.eye(6, dtype=torch.float64), mesh, sharding_spec=["dp", None])
    return distribute(X, mesh, sharding_spec=[None, "dp"]) @ eye


def _block(placement: Any, rank: int) -> torch.Tensor:
    if isinstance(placement, Shard):
        return X.chunk(2, dim=placement.dim)[rank]
    return X


def _expected_placement(kind: str, target: Any) -> Any:
    if target is not None:
        return target[0]
    return {"rows": Shard(0), "cols": Shard(1)}.get(kind, Replicate())


@pytest.mark.parametrize("between", ["slices", "proc meshes"])
def test_every_placement_pair(meshes: tuple[Any, Any], between: str) -> None:
    stages, other = meshes
    src, dst = (stages.slice(pp=0), stages.slice(pp=1))
    if between == "proc meshes":
        src, dst = stages.slice(pp=1), other
    sources = {kind: _source(kind, src) for kind in SOURCES}
    moved = {
        (kind, i): sources[kind].to_mesh(dst, placements=target)
        for kind in SOURCES
        for i, target in enumerate(TARGETS)
    }  # all recorded before anything is fetched
    got = inspect(list(moved.values()))
    for (kind, i), value in zip(moved, got, strict=True):
        assert torch.equal(value, X), (kind, TARGETS[i])
    for (kind, i), t in moved.items():
        placement = _expected_placement(kind, TARGETS[i])
        assert t.placements().get(timeout=WAIT) == (placement,), (kind, TARGETS[i])
        assert torch.equal(fetch(t, dp=1).get(timeout=WAIT), _block(placement, 1)), (kind, i)
    assert isinstance(_source("partial", src).placements().get(timeout=WAIT)[0], Partial)


@pytest.mark.parametrize("between", ["slices", "proc meshes", "one process"])
def test_a_moved_tensor_is_the_destinations_own(
    meshes: tuple[Any, Any], mesh: Any, between: str
) -> None:
    """Rows to rows: each destination rank's block arrives as one piece, which it keeps as its
    value without a copy; changing either side in place leaves the other alone (also where a
    rank of the destination is the source's process: the package's {dp: 2, tp: 2} to its
    slice tp=1, whose rank dp=1 gets its block from its own process)."""
    stages, other = meshes
    src, dst = {
        "slices": (stages.slice(pp=0), stages.slice(pp=1)),
        "proc meshes": (stages.slice(pp=0), other),
        "one process": (mesh, mesh.slice(tp=1)),
    }[between]
    t = distribute(X, src, sharding_spec=["dp", None])
    moved = t.to_mesh(dst)
    moved.add_(1)
    t.mul_(2)
    assert torch.equal(inspect(moved), X + 1) and torch.equal(inspect(t), X * 2)
    assert torch.equal(fetch(moved, dp=1).get(timeout=WAIT), X.chunk(2)[1] + 1)


def test_a_two_dimensional_mesh_and_its_slice(mesh: Any) -> None:
    """The package's {dp: 2, tp: 2} and its slice tp=1 share processes: what stays in a process
    is copied there, the rest sent."""
    whole = distribute(X, mesh, sharding_spec=["dp", "tp"])
    half = mesh.slice(tp=1)
    on_half = whole.to_mesh(half)  # dp keeps Shard(0); tp is not on the slice
    back = on_half.to_mesh(mesh, sharding_spec=[("dp", "tp"), None])
    assert torch.equal(inspect(on_half), X) and torch.equal(inspect(back), X)
    assert torch.equal(fetch(on_half, dp=1).get(timeout=WAIT), X[4:])
    assert torch.equal(fetch(back, dp=1, tp=0).get(timeout=WAIT), X.chunk(4)[2])


def test_gradients_flow_back(meshes: tuple[Any, Any]) -> None:
    stages, other = meshes
    s0, s1 = stages.slice(pp=0), stages.slice(pp=1)
    torch.manual_seed(0)
    w = torch.randn(7, 6, dtype=torch.float64, requires_grad=True)
    target = torch.randn(7, 6, dtype=torch.float64)
    loss = ((w.tanh() * 3).sum(1, keepdim=True) * target).pow(2).mean()
    loss.backward()
    wm = distribute(w.detach(), s0, sharding_spec=["dp", None]).requires_grad_()
    h = (wm.tanh() * 3).sum(1, keepdim=True).to_mesh(s1, [None, "dp"])
    h = h.to_mesh(other)  # and on to a separate proc mesh
    lm = (h * distribute(target, other, sharding_spec=["dp", None])).pow(2).mean()
    lm.backward()
    assert lm.item() == pytest.approx(loss.item(), rel=1e-12)
    assert w.grad is not None
    assert torch.allclose(inspect(wm.grad), w.grad, rtol=1e-12, atol=1e-12)


def test_a_per_rank_tensor_moves_rank_to_rank_and_broadcasts(mesh: Any) -> None:
    """Monarch's semantics: rank dp=i goes to rank dp=i; the destination's other dimension
    (tp) gets copies, and their gradients add up on the way back."""
    device_mesh(mesh)  # the whole first: its slice then runs in its process group
    part = mesh.slice(tp=0)
    with activate(part):
        r = torch.rand(3, dtype=torch.float64).requires_grad_()
    everywhere = r.to_mesh(mesh)
    (everywhere * everywhere).sum().backward()
    mine = [fetch(r, dp=i).get(timeout=WAIT) for i in (0, 1)]
    for d in (0, 1):
        for p in (0, 1):
            assert torch.equal(fetch(everywhere, dp=d, tp=p).get(timeout=WAIT), mine[d])
        assert r.grad is not None
        assert torch.allclose(fetch(r.grad, dp=d).get(timeout=WAIT), 4 * mine[d])  # 2 copies
    with pytest.raises(am.MeshUsageError, match="has no dimension 'tp'"):
        everywhere.to_mesh(part)  # tp would have nowhere to go
    with pytest.raises(am.MeshUsageError, match="per-rank"):
        r.to_mesh(mesh, placements=[Replicate(), Replicate()])


def test_bad_targets_are_refused_at_the_line(meshes: tuple[Any, Any]) -> None:
    stages, other = meshes
    t = distribute(X, stages.slice(pp=0))
    with pytest.raises(am.MeshUsageError, match="Shard and Replicate"):
        t.to_mesh(other, placements=[Partial()])
    with pytest.raises(am.MeshUsageError, match="unknown mesh dimension 'pp'"):
        t.to_mesh(other, ["pp", None])
    with pytest.raises(am.MeshUsageError, match="moves MeshTensors"):
        am.tensor.controller.transfer.to_mesh(X, other)  # type: ignore[arg-type]
    moved = am.to_mesh({"x": t, "n": 3}, other)  # Monarch's function: every MeshTensor of a tree
    assert moved["n"] == 3 and torch.equal(inspect(moved["x"]), X)


@am.remote(propagate=lambda t: t)
def fails_on_dp1(t: Any) -> Any:
    if t.device_mesh.get_local_rank() == 1:
        raise ValueError("no good on dp=1")
    return t * 1


def test_a_failure_on_the_source_reaches_the_destination(meshes: tuple[Any, Any]) -> None:
    stages, other = meshes
    s0, s1 = stages.slice(pp=0), stages.slice(pp=1)
    a = distribute(X, s0, sharding_spec=["dp", None])
    bad = fails_on_dp1(a).to_mesh(s1).to_mesh(other)  # two hops on
    dep = bad @ bad.T  # a collective on the destination: its ranks hold stand-ins
    healthy = a.to_mesh(other) + 1
    start = time.monotonic()
    assert torch.equal(fetch(healthy).get(timeout=WAIT), X + 1)
    with pytest.raises(RemoteTensorError) as info:
        fetch(dep).get(timeout=WAIT)
    assert time.monotonic() - start < WAIT / 2  # nothing waited for a message that never came
    err = info.value
    assert err.rank == "{pp=0, dp=1}" and "fails_on_dp1" in err.op
    assert 'raise ValueError("no good on dp=1")' in err.remote_traceback
    assert torch.equal(inspect(a.to_mesh(other)), X)  # both meshes go on

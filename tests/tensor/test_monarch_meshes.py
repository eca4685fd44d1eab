"""Tensor meshes that are another shape of the processes running a tensor engine: a
``flatten``, ``rename`` or ``split`` of its mesh (Monarch's "Device Mesh Dimensions"), on 4
real ranks (gloo). Each shares the engine and its op stream; its dimensions group the ranks as
its names say, values compared with one process (float64)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import actormesh as am
from actormesh import config
from actormesh.tensor import device_mesh, distribute, fetch, inspect

WAIT = 60


def test_a_flattened_mesh_is_a_view_of_the_engine(mesh: Any) -> None:
    base = device_mesh(mesh)  # the engine runs over {dp: 2, tp: 2} (however the tests ran)
    flat = mesh.flatten("all")
    assert device_mesh(flat) is device_mesh(flat)  # one view per shape
    assert device_mesh(flat).stream is base.stream  # the same engine and op stream
    with flat.activate():
        r = flat.rank("all")
        x = torch.rand(3, dtype=torch.float64) + r  # per rank: its own draw
        total = x.reduce("all", "sum")
        stacked = x.reduce("all", "stack")
    values = [fetch(x, all=i).get(timeout=WAIT) for i in range(4)]
    assert [fetch(r, all=i).get(timeout=WAIT).item() for i in range(4)] == [0, 1, 2, 3]
    for i in range(4):
        assert torch.allclose(fetch(total, all=i).get(timeout=WAIT), sum(values), rtol=1e-12)
    assert torch.equal(inspect(stacked), torch.stack(values))  # in rank order
    # The same processes in the engine's own shape: rank "all"=2*dp+tp.
    with mesh.activate():
        coords = mesh.rank(("dp", "tp"))
    assert [fetch(coords, dp=d, tp=p).get(timeout=WAIT).item() for d in (0, 1) for p in (0, 1)] == [
        0, 1, 2, 3
    ]  # fmt: skip


def test_rename_and_split_group_ranks_by_their_new_names(mesh: Any) -> None:
    renamed = mesh.rename(dp="x", tp="y")
    split = mesh.flatten("all").split(all=("a", "b"), b=2)  # {a: 2, b: 2}: a is dp, b is tp
    with mesh.activate():
        x = torch.rand(2, 3, dtype=torch.float64)
        want = x.reduce("tp", "sum")
    with renamed.activate():
        y = renamed.rank("y")
    xs = {(d, p): fetch(x, dp=d, tp=p).get(timeout=WAIT) for d in (0, 1) for p in (0, 1)}
    for d in (0, 1):
        for p in (0, 1):
            assert fetch(y, x=d, y=p).get(timeout=WAIT).item() == p
    # A tensor of one mesh moves to a view of it (same processes): reduce(mesh=...) leaves each
    # rank's value where it is.
    with torch.no_grad():
        on_split = x.reduce((), "max", mesh=split)  # all four ranks, placed on the split view
        total = (x * 1).reduce("tp", "sum", mesh=split).reduce("b", "sum")  # b groups like tp
    for d in (0, 1):
        for p in (0, 1):
            got = fetch(on_split, a=d, b=p).get(timeout=WAIT)
            assert torch.equal(got, torch.stack(list(xs.values())).amax(0))
            assert torch.allclose(
                fetch(total, a=d, b=p).get(timeout=WAIT), 2 * (xs[d, 0] + xs[d, 1])
            )
            assert torch.allclose(fetch(want, dp=d, tp=p).get(timeout=WAIT), xs[d, 0] + xs[d, 1])


def test_global_tensors_on_a_view(mesh: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    flat = mesh.flatten("all")
    x = torch.arange(32.0, dtype=torch.float64).reshape(8, 4)
    dt = distribute(x, flat, sharding_spec=["all", None])  # 2 rows per rank, over 4 ranks
    assert torch.equal(fetch(dt, all=3).get(timeout=WAIT), x[6:8])
    monkeypatch.setattr(config, "TENSOR_SHARD_BYTES", 8)  # each rank is sent its block alone
    staged = distribute(x, flat, sharding_spec=["all", None])
    monkeypatch.undo()
    assert torch.equal(fetch(staged, all=2).get(timeout=WAIT), x[4:6])
    assert torch.equal(inspect(staged + dt), 2 * x)
    drawn = am.tensor.randn(8, 2, mesh=flat, sharding_spec=["all", None])
    assert torch.equal(fetch(drawn, all=1).get(timeout=WAIT), inspect(drawn)[2:4])
    assert torch.allclose(inspect(dt @ dt.T), x @ x.T)
    assert torch.allclose(inspect((dt * 2).sum(0)), (x * 2).sum(0))
    again = dt.redistribute(sharding_spec=[None, "all"])  # one column per rank
    assert torch.equal(fetch(again, all=1).get(timeout=WAIT), x[:, 1:2])
    assert torch.equal(inspect(again), x)
    with flat.activate():  # a fetch inside activate() gives a controller tensor, as outside
        inside = inspect(again)
    assert type(inside) is torch.Tensor and torch.equal(inside, x)


def test_views_do_not_mix_and_the_engine_shape_ones_say_so(mesh: Any) -> None:
    flat = mesh.flatten("all")
    with mesh.activate():
        a = torch.ones(2)
    with flat.activate():
        b = torch.ones(2)
    with pytest.raises(am.MeshUsageError, match="two different meshes"):
        a + b
    with pytest.raises(am.MeshUsageError, match="rename, flatten or split of it"):
        am.module_to_mesh(torch.nn.Linear(2, 2), flat)

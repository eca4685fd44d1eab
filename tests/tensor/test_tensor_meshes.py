"""Several tensor meshes at once (issue 41): the slices ``pp=0`` and ``pp=1`` of one proc mesh
each run their own engine and op stream, concurrently, on 4 real ranks (gloo); a slice of a mesh
whose whole already runs an engine runs in that engine's process group with groups of its own;
what cannot be one group is refused at the user's line. Values are compared with one process
(float64)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import actormesh as am
from actormesh.tensor import RemoteTensorError, device_mesh, distribute, fetch, inspect

WAIT = 60


@pytest.fixture(scope="module")
def stages() -> Iterator[Any]:
    """A fresh {pp: 2, dp: 2}: its slices are used before (and without) the whole."""
    procs = am.this_host().spawn_procs(per_host={"pp": 2, "dp": 2})
    try:
        yield procs
    finally:
        procs.stop().get(timeout=30)


@am.remote(propagate=lambda t, mine, theirs: t)
def meet(t: Any, mine: str, theirs: str) -> Any:
    """Say this slice's ranks run, then wait for the other slice's: only slices that run at the
    same time get through (a poll with a deadline; it raises after 30 s)."""
    Path(mine).touch()
    deadline = time.monotonic() + 30
    while not Path(theirs).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{theirs} never appeared: the other slice did not run meanwhile")
        time.sleep(0.01)
    return t * 1


def test_slices_run_their_own_ops_at_the_same_time(stages: Any, tmp_path: Path) -> None:
    s0, s1 = stages.slice(pp=0), stages.slice(pp=1)
    x = torch.arange(14.0, dtype=torch.float64).reshape(7, 2)
    a = distribute(x, s0, sharding_spec=["dp", None])  # 7 rows over 2: uneven
    b = distribute(2 * x, s1, sharding_spec=[None, "dp"])
    assert device_mesh(s0).stream is not device_mesh(s1).stream  # an engine each
    assert device_mesh(s0).labels == ("dp",) and device_mesh(s1).sizes == (2,)
    zero, one = str(tmp_path / "zero"), str(tmp_path / "one")
    a2 = meet(a, zero, one)  # each slice's ranks wait for the other's: both streams at once
    b2 = meet(b, one, zero)
    assert torch.equal(inspect(a2 @ a2.T), x @ x.T)
    assert torch.equal(inspect(b2.sum(0)), 2 * x.sum(0))
    assert torch.equal(fetch(a, dp=1).get(timeout=WAIT), x[4:])
    with s1.activate():
        r = torch.rand(3, dtype=torch.float64)
        total = r.reduce("dp", "sum")
    rs = [fetch(r, dp=i).get(timeout=WAIT) for i in (0, 1)]
    assert not torch.equal(rs[0], rs[1])
    assert torch.allclose(fetch(total, dp=1).get(timeout=WAIT), rs[0] + rs[1], rtol=1e-12)


def test_one_fetch_of_values_on_several_meshes(stages: Any) -> None:
    """Ids are per stream: two meshes' values may share one, and a fetch of both must not mix
    them up (it gave the first mesh's value for both)."""
    s0, s1 = stages.slice(pp=0), stages.slice(pp=1)
    n0, n1 = device_mesh(s0).stream.new_id(), device_mesh(s1).stream.new_id()
    behind = device_mesh(s0 if n0 < n1 else s1).stream
    for _ in range(abs(n0 - n1)):  # the two streams' next ids meet
        behind.new_id()
    a = distribute(torch.zeros(3, dtype=torch.float64), s0)
    b = distribute(torch.ones(3, dtype=torch.float64), s1)
    assert a.value_id == b.value_id
    got = inspect({"a": a, "b": [b, 5]})
    assert torch.equal(got["a"], torch.zeros(3)) and torch.equal(got["b"][0], torch.ones(3))
    assert got["b"][1] == 5


def test_a_module_on_each_slice(stages: Any) -> None:
    torch.manual_seed(0)
    nets = [nn.Linear(4, 3).double() for _ in range(2)]
    meshed = [am.module_to_mesh(net, stages.slice(pp=i)) for i, net in enumerate(nets)]
    x = torch.randn(8, 4, dtype=torch.float64)
    outs = [m(x) for m in meshed]  # both recorded before either is fetched
    for net, out in zip(nets, outs, strict=True):
        assert torch.allclose(inspect(out), net(x), rtol=1e-12, atol=1e-12)


def test_a_mesh_over_two_groups_is_refused_at_the_line(stages: Any) -> None:
    device_mesh(stages.slice(pp=0))
    device_mesh(stages.slice(pp=1))  # each slice formed a group of its own
    with pytest.raises(am.MeshUsageError, match=r"device_mesh\(procs\)"):
        distribute(torch.ones(2, 2), stages)
    assert torch.equal(
        inspect(distribute(torch.ones(2), stages.slice(pp=1)) + 1), 2 * torch.ones(2)
    )


@am.remote(propagate=lambda t: t)
def fails_on_the_second_rank(t: Any) -> Any:
    if t.device_mesh.get_local_rank() == 1:
        raise ValueError("no good on this rank")
    return t * 1


def test_a_slice_of_a_mesh_that_runs_an_engine(mesh: Any) -> None:
    """The package's {dp: 2, tp: 2} runs an engine; its slices run engines of their own in its
    process group, beside it, with groups of their own (also slices that cross: tp=0 after
    dp=0, whose members belong to different numbers of groups)."""
    whole = device_mesh(mesh)
    x = torch.arange(16.0, dtype=torch.float64).reshape(4, 4)
    on_whole = distribute(x, mesh, sharding_spec=["dp", "tp"])
    rows = mesh.slice(dp=1)
    cols = mesh.slice(tp=0)
    on_rows = distribute(x, rows, sharding_spec=[None, "tp"])
    on_cols = distribute(x, cols, sharding_spec=["dp", None])
    assert device_mesh(rows).group is whole.group and device_mesh(rows).stream is not whole.stream
    assert torch.equal(inspect(on_rows @ on_rows.T), x @ x.T)  # all_gather over tp, its group
    assert torch.equal(inspect(on_cols.T @ on_cols), x.T @ x)
    assert torch.equal(inspect(on_whole @ on_whole), x @ x)
    # A failure on a slice names the rank by its place in the whole mesh.
    with pytest.raises(RemoteTensorError) as info:
        inspect(fails_on_the_second_rank(on_rows))
    assert info.value.rank == "{dp=1, tp=1}"
    assert torch.equal(inspect(on_rows + 1), x + 1)  # the slice's engine goes on

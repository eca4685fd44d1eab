"""distribute, MeshTensor and fetch on 4 real ranks (gloo, CPU): TENSORS.md §8 tests 1, 3, 6,
10 and 12."""

from __future__ import annotations

import gc
import time
from typing import Any

import pytest
import torch
from support import wait_until

import actormesh as am
from actormesh.tensor import MeshTensor, distribute, fetch, inspect, live

WAIT = 60  # seconds: every wait here is bounded

SPECS: list[list[Any]] = [
    [None, None], ["dp", None], [None, "dp"], ["tp", None], [None, "tp"], ["dp", "tp"],
    ["tp", "dp"], [("dp", "tp"), None], [None, ("dp", "tp")],
]  # fmt: skip


def engine_stats(procs: Any) -> list[dict[str, int]]:
    from actormesh.tensor.controller.mesh import tensor_mesh

    return tensor_mesh(procs).engine.stats.call().get(timeout=WAIT).values()


def test_founding_matmul(mesh: Any) -> None:
    torch.manual_seed(0)
    x = torch.randn(8, 8)
    dt = distribute(x, mesh, sharding_spec=["dp", None])
    assert isinstance(dt, MeshTensor) and isinstance(dt, torch.Tensor)
    r = dt @ dt.T
    # Metadata before anything is fetched.
    assert r.shape == (8, 8) and r.dtype == torch.float32 and r.dim() == 2
    assert "MeshTensor(shape=(8, 8)" in repr(r)
    assert torch.allclose(inspect(r), x @ x.T, atol=1e-5)
    assert torch.equal(fetch(dt, dp=1).get(timeout=WAIT), x[4:8])
    placements = r.placements().get(timeout=WAIT)
    assert [type(p).__name__ for p in placements] == ["Shard", "Partial"]


@pytest.mark.parametrize("rows", [8, 7])
def test_every_sharding_gives_the_local_result(mesh: Any, rows: int) -> None:
    x = torch.arange(rows * 6, dtype=torch.float64).reshape(rows, 6)
    for spec in SPECS:
        dt = distribute(x, mesh, sharding_spec=spec)
        assert torch.equal(inspect(dt), x), spec
        assert torch.allclose(inspect(dt @ dt.T), x @ x.T), spec
        assert torch.allclose(inspect((dt * 2 + 1).sum(0)), (x * 2 + 1).sum(0)), spec
    # A rank's own shard: rows split over dp (uneven: 4 and 3), columns over tp.
    dt = distribute(x, mesh, sharding_spec=["dp", "tp"])
    first = (rows + 1) // 2
    assert torch.equal(fetch(dt, dp=1, tp=0).get(timeout=WAIT), x[first:, :3])
    assert torch.equal(fetch(dt, dp=0, tp=1).get(timeout=WAIT), x[:first, 3:])


def test_partial_values_fetch_whole(mesh: Any) -> None:
    """A value that is a partial sum or average over mesh dimensions: small ones are added up on
    the controller from every rank's term, large ones reduced on the workers first."""
    x = torch.arange(48, dtype=torch.float64).reshape(8, 6) / 7
    for spec in (["dp", "tp"], ["dp", None], [None, ("dp", "tp")]):
        dt = distribute(x, mesh, sharding_spec=spec)
        assert torch.allclose(inspect(dt.sum()), x.sum()), spec
        assert torch.allclose(inspect(dt.mean()), x.mean()), spec
        assert torch.allclose(inspect(dt.T @ dt), x.T @ x), spec
        assert dt.sum().item() == pytest.approx(x.sum().item()), spec
    # 300 x 300 = 90,000 elements, Partial over dp: above the size added up on the controller.
    big = torch.randn(300, 8, dtype=torch.float64)
    dt = distribute(big, mesh, sharding_spec=[None, "dp"])
    r = dt @ dt.T
    assert "Partial" in [type(p).__name__ for p in r.placements().get(timeout=WAIT)]
    assert torch.allclose(inspect(r), big @ big.T)


def test_sync_points_and_pytrees(mesh: Any) -> None:
    x = torch.tensor([[1.0, -2.0], [3.0, 4.0]])
    dt = distribute(x, mesh, sharding_spec=["dp", None])
    total = dt.sum()
    assert total.item() == 6.0 and float(total) == 6.0 and int(total) == 6
    assert bool(total > 5) and not bool(total > 7)
    assert dt.tolist() == x.tolist()
    assert f"{total:.1f}" == "6.0"
    got = inspect({"a": dt, "b": [dt.abs(), 3]})
    assert torch.equal(got["a"], x) and torch.equal(got["b"][0], x.abs()) and got["b"][1] == 3


def test_repr_and_metadata_never_fetch(mesh: Any) -> None:
    dt = distribute(torch.ones(4, 3), mesh, sharding_spec=["dp", None])
    inspect(dt)
    before = engine_stats(mesh)
    r = (dt * 3).T
    text = repr(r) + str(r)
    assert "shape=(3, 4)" in text and r.shape == (3, 4) and r.stride() == (1, 3)
    assert not r.requires_grad and r.dtype == torch.float32
    assert [s["fetch"] for s in engine_stats(mesh)] == [b["fetch"] for b in before]


def test_controller_side_errors_raise_at_the_line_and_send_nothing(mesh: Any) -> None:
    from actormesh.tensor.controller.mesh import tensor_mesh

    dt = distribute(torch.ones(4, 4), mesh, sharding_spec=["dp", None])
    stream = tensor_mesh(mesh).stream
    stream.flush()
    sent = stream.batches
    with pytest.raises(RuntimeError) as info:
        dt @ torch.ones(3, 3)  # shapes do not match
    assert "[4, 4] X [3, 3]" in str(info.value)
    assert not stream.ops and stream.batches == sent  # nothing recorded, nothing sent
    with pytest.raises(ValueError, match="unknown mesh dimension 'gpus'"):
        distribute(torch.ones(4, 4), mesh, sharding_spec=["gpus", None])
    with pytest.raises(ValueError, match="one entry per tensor dimension"):
        distribute(torch.ones(4, 4), mesh, sharding_spec=["dp"])
    with pytest.raises(ValueError, match="appears twice"):
        distribute(torch.ones(4, 4), mesh, sharding_spec=["dp", "dp"])
    with pytest.raises(ValueError, match="in mesh order"):
        distribute(torch.ones(4, 4), mesh, sharding_spec=[("tp", "dp"), None])
    with pytest.raises(ValueError, match=r"entry 0 \(tensor dim 0\) is not a mesh dimension"):
        distribute(torch.ones(4, 4), mesh, sharding_spec=[0, None])  # a DTensor Shard(0) habit
    with pytest.raises(ValueError, match=r"entry \('dp', 1\) \(tensor dim 1\) is not"):
        distribute(torch.ones(4, 4), mesh, sharding_spec=[None, ("dp", 1)])
    with pytest.raises(TypeError, match="not constructed directly"):
        MeshTensor()
    assert not stream.ops and stream.batches == sent


def test_no_round_trip_per_op(mesh: Any) -> None:
    from actormesh.tensor.controller.mesh import tensor_mesh

    tm = tensor_mesh(mesh)
    one = tm.engine.slice(dp=0, tp=0)
    rtts = []
    for _ in range(5):
        start = time.perf_counter()
        one.stats.call_one().get(timeout=WAIT)
        rtts.append(time.perf_counter() - start)
    rtt = sorted(rtts)[2]
    t = distribute(torch.zeros(4, 4), mesh, sharding_spec=["dp", None])
    t = t + 0  # warm: the first op of a signature runs on meta tensors (and may import kernels)
    inspect(t)
    gc.collect()  # garbage of earlier tests is not this loop's cost
    before = engine_stats(mesh)
    start = time.perf_counter()
    for _ in range(500):
        t = t + 1
    recorded = time.perf_counter() - start
    assert torch.equal(inspect(t), torch.full((4, 4), 500.0))
    after = engine_stats(mesh)
    for b, a in zip(before, after, strict=True):
        assert a["run"] - b["run"] <= 3, (before, after)
        assert a["fetch"] - b["fetch"] == 1
    assert recorded < 500 * rtt, (recorded, rtt)


def test_lifetime(mesh: Any) -> None:
    x = torch.arange(8.0).reshape(4, 2)
    base = distribute(x, mesh, sharding_spec=["dp", None])
    inspect(base)
    gc.collect()
    baseline = live(mesh).values()
    acc = base
    for i in range(1000):
        tmp = base * i  # a temporary, dropped at the next iteration
        acc = acc + tmp
    expected = x * (1 + sum(range(1000)))
    assert torch.allclose(inspect(acc), expected)
    del tmp, acc
    gc.collect()
    assert live(mesh).values() == baseline
    # A value dropped while a queued op still reads it: the op runs first, then the drop.
    a = distribute(x, mesh, sharding_spec=["dp", None])
    b = a * 2
    del a
    gc.collect()
    assert torch.equal(inspect(b), x * 2)
    del b
    gc.collect()
    assert live(mesh).values() == baseline


class Reader(am.Actor):
    @am.endpoint
    def read(self, t: torch.Tensor) -> tuple[tuple[int, ...], list[float]]:
        return tuple(t.shape), t.flatten().tolist()


def test_actor_interop_gets_local_value_after_pending_ops(mesh: Any) -> None:
    x = torch.arange(12.0).reshape(4, 3)
    readers = mesh.spawn("reader", Reader)
    dt = distribute(x, mesh, sharding_spec=["dp", None])
    for _ in range(20):
        dt = dt + 1  # still buffered when the call is made
    got = readers.read.call(dt).get(timeout=WAIT)
    for point, (shape, values) in got.items():
        rows = slice(2 * point["dp"], 2 * point["dp"] + 2)
        assert shape == (2, 3)
        assert values == (x[rows] + 20).flatten().tolist()


def test_cpu_random_one_seed_every_spec(mesh: Any) -> None:
    from actormesh.tensor import randn

    values = []
    for spec in SPECS:
        torch.manual_seed(1234)
        values.append(inspect(randn(8, 6, mesh=mesh, sharding_spec=spec)))
    for v in values[1:]:
        assert torch.equal(v, values[0])
    assert values[0].std() > 0.5  # really random, not zeros
    torch.manual_seed(1)
    other = inspect(randn(8, 6, mesh=mesh, sharding_spec=["dp", None]))
    assert not torch.equal(other, values[0])
    # Random ops on an existing global MeshTensor draw the global tensor from one seed too.
    dt = distribute(torch.zeros(8, 6), mesh, sharding_spec=["dp", "tp"])
    torch.manual_seed(7)
    a = inspect(torch.rand_like(dt))
    torch.manual_seed(7)
    b = inspect(torch.rand_like(distribute(torch.zeros(8, 6), mesh)))
    assert torch.equal(a, b) and len(a.unique()) == 48


def test_redistribute(mesh: Any) -> None:
    x = torch.arange(48.0).reshape(8, 6)
    dt = distribute(x, mesh, sharding_spec=["dp", None])
    moved = dt.redistribute(["tp", "dp"])
    assert moved.shape == (8, 6)
    assert [type(p).__name__ for p in moved.placements().get(timeout=WAIT)] == ["Shard", "Shard"]
    assert torch.equal(inspect(moved), x)
    assert torch.equal(fetch(moved, dp=1, tp=0).get(timeout=WAIT), x[:4, 3:])
    replicated = moved.redistribute()
    assert torch.equal(fetch(replicated, dp=1, tp=1).get(timeout=WAIT), x)
    with pytest.raises(ValueError, match="unknown mesh dimension"):
        dt.redistribute(["gpus", None])


def torch_env(t: Any) -> dict[str, str]:
    import os

    return {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}


def test_ranks_see_torch_distributed_environment(mesh: Any) -> None:
    from actormesh.tensor import call_on_shard_and_fetch

    dt = distribute(torch.ones(4), mesh)
    env = call_on_shard_and_fetch(torch_env, dt, dp=1, tp=0).get(timeout=WAIT)
    assert env == {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "2"}


def test_notebook_cell_end_flushes(mesh: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    from actormesh.tensor.controller import stream
    from actormesh.tensor.controller.mesh import tensor_mesh

    s = tensor_mesh(mesh).stream
    # Only the end of the cell sends: no idle timer (an earlier one ends after a quiet second).
    wait_until(lambda: s._timer is None, 10, "the stream's idle timer to end")
    monkeypatch.setattr(stream.Stream, "_start_timer", lambda self: None)
    shell = InteractiveShell.instance()
    try:
        shell.user_ns.update(distribute=distribute, mesh=mesh, torch=torch)
        shell.run_cell("dt = distribute(torch.ones(4, 4), mesh)")  # the hook goes in on first use
        s.flush()
        sent = s.batches
        result = shell.run_cell("r = dt * 3")
        assert result.success
        assert not s.ops and s.batches == sent + 1
        assert torch.equal(inspect(shell.user_ns["r"]), torch.full((4, 4), 3.0))
    finally:
        InteractiveShell.clear_instance()
        s.armed = False  # armed with no timer: the next op of a later test starts one


@am.remote(propagate=lambda x, t: x)
def _plus_total(x: Any, t: torch.Tensor) -> Any:
    return x + t.sum().item()  # t: a controller tensor, a plain one on each rank


def test_a_controller_tensor_changed_after_its_op_is_sent_as_it_was(mesh: Any) -> None:
    # The ops wait in a batch until a sync point; a tensor changed in place meanwhile (as an
    # optimizer changes the parameters a copy on the mesh was made from) must not reach the
    # ranks changed. Before: distribute() and remote calls sent the tensor as it was at the
    # flush, so the optimizer's step showed twice on the mesh.
    inspect(distribute(torch.zeros(2), mesh))  # the engine is up: nothing flushes below
    t = torch.arange(6.0).reshape(2, 3)
    placed = distribute(t, mesh)
    with_t = _plus_total(distribute(torch.zeros(2, 3), mesh), t)
    t.add_(100)
    assert torch.equal(inspect(placed), torch.arange(6.0).reshape(2, 3))
    assert torch.equal(inspect(with_t), torch.full((2, 3), 15.0))
    # A factory under activate() and an actor's rref take theirs the same way.
    actors = mesh.spawn("snapshot_adders", _Adder)
    with mesh.activate():
        zeros = torch.zeros(3)
    fetch(actors.add.rref(zeros, torch.ones(3)), dp=0, tp=0).get(timeout=30)  # its shape, asked
    u = torch.arange(3.0)
    with mesh.activate(), pytest.warns(UserWarning, match="copy construct"):
        made = torch.tensor(u)  # (torch's advice is for a local copy)
    added = actors.add.rref(zeros, u)
    u.add_(100)
    for value in (made, added):
        assert fetch(value, dp=1, tp=1).get(timeout=30).tolist() == [0.0, 1.0, 2.0]


class _Adder(am.Actor):
    @am.endpoint
    def add(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return x + t

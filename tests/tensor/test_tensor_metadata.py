"""In-place ops that change a tensor's shape or strides (``unsqueeze_``, ``t_``, ``resize_``...)
change the controller's MeshTensor too, as they would a local tensor (``resize_`` only on a
per-rank one: DTensor cannot resize a global one); and the table of shape signatures the recording
path keys its plans on stays bounded."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import actormesh as am
from actormesh.tensor import distribute, fetch, inspect
from actormesh.tensor.wire import shapes

WAIT = 60


@pytest.mark.parametrize("spec", [[None, None], ["dp", None], ["dp", "tp"]])
def test_in_place_metadata_ops_change_the_controller_shape(mesh: Any, spec: list[Any]) -> None:
    x = torch.arange(12.0).reshape(4, 3)
    a = distribute(x, mesh, sharding_spec=spec)
    local = x.clone()
    for step in (
        lambda t: t.unsqueeze_(0),
        lambda t: t.squeeze_(0),
        lambda t: t.t_(),
        lambda t: t.transpose_(0, 1),
        lambda t: t.unsqueeze_(-1),
        lambda t: t.squeeze_(),
        lambda t: t.swapdims_(0, 1),
    ):
        assert step(a) is a
        step(local)
        assert a.shape == local.shape and a.stride() == local.stride(), (a.shape, local.shape)
    assert torch.equal(inspect(a), local)
    # Later ops see the new shape: on the controller (shapes, errors) and on the workers.
    assert torch.equal(inspect(a @ a.T), local @ local.T)
    with pytest.raises(RuntimeError):
        a @ torch.ones(3, 3)  # fine for the shape it had before the ops, (4, 3); not for (3, 4)
    assert (a + 1).shape == local.shape


def test_resize_of_a_per_rank_tensor(mesh: Any) -> None:
    with mesh.activate():
        t = torch.ones(3, 4) * am.tensor.rank(mesh, ("dp", "tp"))
    t.resize_(2, 3)
    assert t.shape == (2, 3) and t.stride() == (3, 1)
    assert torch.equal(fetch(t, dp=1, tp=1).get(timeout=WAIT), torch.full((2, 3), 3.0))
    assert t.reduce(("dp", "tp"), "sum").shape == (2, 3)
    with pytest.raises(am.MeshUsageError, match=r"cannot grow in place \(from \(2, 3\) to"):
        t.resize_(5, 5)
    assert t.shape == (2, 3)  # refused at the controller: nothing changed, nothing sent
    assert torch.equal(fetch(t, dp=0, tp=1).get(timeout=WAIT), torch.ones(2, 3))


@pytest.mark.parametrize("spec", [[None, None], ["dp", "tp"]])
def test_resize_of_a_global_tensor_is_refused_at_the_users_line(mesh: Any, spec: Any) -> None:
    x = torch.arange(12.0).reshape(4, 3)
    a = distribute(x, mesh, sharding_spec=spec)
    # DTensor has no sharding rule for resize_: sent, it would fail on every worker and surface
    # only at the next sync point. Refused here, even to its own size, nothing is sent.
    for resize in (
        lambda: a.resize_(2, 3),
        lambda: a.resize_(4, 3),
        lambda: a.resize_as_(torch.empty(2, 3)),
        lambda: a.resize_as_(distribute(torch.zeros(2, 2), mesh, sharding_spec=spec)),
    ):
        with pytest.raises(am.MeshUsageError, match=r"resize_.*global MeshTensor.*per-rank"):
            resize()
        assert a.shape == (4, 3) and a.stride() == (3, 1)
    # The tensor and its stream are still usable: the next sync point raises nothing.
    assert torch.equal(inspect(a + 1), x + 1)


def test_signature_table_is_bounded_and_never_reuses_a_number() -> None:
    first = shapes.signature((1, 1), (1, 1), torch.float32, False)
    seen = {first}
    for n in range(2, shapes.CACHE_SIZE + 50):
        seen.add(shapes.signature((n,), (1,), torch.float32, False))
        assert len(shapes._sigs) <= shapes.CACHE_SIZE
    again = shapes.signature((1, 1), (1, 1), torch.float32, False)
    assert again not in seen  # a new number: plans keyed on old ones stay theirs
    assert shapes.signature((1, 1), (1, 1), torch.float32, False) == again


@pytest.mark.parametrize("rows", [6, 5])
@pytest.mark.parametrize("op", ["view", "reshape"])
def test_a_view_of_rows_split_unevenly_over_two_mesh_dims_is_the_local_view(
    mesh: Any, rows: int, op: str
) -> None:
    # 6 (or 5) rows over the 4 ranks: 2, 1, 2, 1. DTensor's view rule splits the merged dim's
    # 30 rows as if evenly (8, 7, 8, 7) while the ranks hold 10 and 5: it failed ("shape
    # '[8, 16]' is invalid"), as in MultiheadAttention's backward under a tp_plan.
    x = torch.arange(rows * 5 * 4, dtype=torch.float64).reshape(rows, 5, 4)
    t = distribute(x, mesh, [("dp", "tp"), None, None])
    merged = getattr(t, op)(rows * 5, 4)
    assert torch.equal(inspect(merged), x.reshape(rows * 5, 4))
    again = getattr(merged * 2, op)(rows, 20)
    assert torch.equal(inspect(again), (x * 2).reshape(rows, 20))

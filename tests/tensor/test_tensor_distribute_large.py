"""``distribute`` of a tensor above ``ACTORMESH_TENSOR_SHARD_BYTES`` (TENSORS.md §2): each rank is
sent only its own block, not the whole tensor. The threshold is lowered here so that small test
tensors take that path; each rank's engine counts the bytes it was sent."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from actormesh import config
from actormesh.tensor import distribute, fetch, inspect

WAIT = 60
COORDS = [(d, p) for d in range(2) for p in range(2)]


def staged_bytes(dt: Any) -> list[int]:
    """Bytes of large-tensor blocks each rank received so far (after the ops before now ran)."""
    dt.mesh.stream.flush()
    return [s["staged_bytes"] for s in dt.mesh.engine.stats.call().get(timeout=WAIT).values()]


SPECS = [
    ["dp", None],
    [None, "tp"],
    ["dp", "tp"],
    ["tp", "dp"],
    [("dp", "tp"), None],
    [None, None],
]


@pytest.mark.parametrize("rows, cols", [(8, 6), (7, 5), (3, 9)])  # even, uneven, empty blocks
def test_each_rank_is_sent_only_its_block(
    mesh: Any, monkeypatch: pytest.MonkeyPatch, rows: int, cols: int
) -> None:
    monkeypatch.setattr(config, "TENSOR_SHARD_BYTES", 64)
    x = torch.arange(rows * cols, dtype=torch.float64).reshape(rows, cols)
    for spec in SPECS:
        before = staged_bytes(distribute(torch.zeros(1), mesh))
        dt = distribute(x, mesh, sharding_spec=spec)
        received = [a - b for a, b in zip(staged_bytes(dt), before, strict=True)]
        assert torch.equal(inspect(dt), x), spec
        for rank, (d, p) in enumerate(COORDS):
            local = fetch(dt, dp=d, tp=p).get(timeout=WAIT)
            assert received[rank] == local.numel() * local.element_size(), (spec, rank, received)
        if spec == [None, None]:
            assert received == [x.nbytes] * 4, received  # replicated: everyone needs it all
        elif spec in (["dp", "tp"], ["tp", "dp"], [("dp", "tp"), None]):
            assert sum(received) == x.nbytes, (spec, received)  # every byte sent once
        # Ops on it run as on any distributed tensor (a collective included).
        assert torch.allclose(inspect(dt @ dt.T), x @ x.T), spec


def test_blocks_match_the_local_shards_of_a_small_distribute(
    mesh: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = torch.randn(7, 5)
    small = {tuple(map(str, s)): distribute(x, mesh, sharding_spec=s) for s in SPECS}
    monkeypatch.setattr(config, "TENSOR_SHARD_BYTES", 0)
    for spec in SPECS:
        big = distribute(x, mesh, sharding_spec=spec)
        for d, p in COORDS:
            want = fetch(small[tuple(map(str, spec))], dp=d, tp=p).get(timeout=WAIT)
            assert torch.equal(fetch(big, dp=d, tp=p).get(timeout=WAIT), want), (spec, d, p)
        assert big.placements().get(timeout=WAIT) == small[tuple(map(str, spec))].placements().get(
            timeout=WAIT
        )


def test_below_the_threshold_the_tensor_goes_with_the_op(
    mesh: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config, "TENSOR_SHARD_BYTES", 10_000)
    x = torch.ones(4, 4)
    before = staged_bytes(distribute(torch.zeros(1), mesh))
    dt = distribute(x, mesh, sharding_spec=["dp", "tp"])
    assert staged_bytes(dt) == before
    assert torch.equal(inspect(dt), x)


def test_a_bad_threshold_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACTORMESH_TENSOR_SHARD_BYTES", "64MB")
    with pytest.raises(ValueError, match="ACTORMESH_TENSOR_SHARD_BYTES='64MB' is not a number"):
        config._bytes("ACTORMESH_TENSOR_SHARD_BYTES", 1)

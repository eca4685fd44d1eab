"""Which rank gives which value to which after a rank is lost (recovery_plan.py), without
processes: the reports are what the ranks' snapshots would say."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard

from actormesh import MeshUsageError
from actormesh.tensor.controller.recovery_plan import restore_plan, shrunk
from actormesh.tensor.worker.recovery import ValueMeta

R, S0 = Replicate(), Shard(0)


def meta(dims: tuple[str, ...], *placements: Any) -> ValueMeta:
    return ValueMeta(dims, tuple(placements), tuple(placements), (8, 4), (4, 1), torch.float64)


def report(gen: int, coords: dict[str, int], sizes: dict[str, int], **values: ValueMeta) -> Any:
    return (gen, coords, sizes, {int(k[1:]): m for k, m in values.items()})


DP_TP = {"dp": 2, "tp": 2}
REPLICATED = meta(("dp", "tp"), R, R)
TP_SPLIT = meta(("dp", "tp"), R, S0)
FSDP = meta(("dp", "tp"), S0, R)


def test_a_respawned_rank_gets_each_value_from_a_rank_with_its_shard() -> None:
    old = [report(3, {"dp": d, "tp": t}, DP_TP, v1=REPLICATED, v2=TP_SPLIT, v3=FSDP)
           for d in (0, 1) for t in (0, 1)]  # fmt: skip
    old[3] = report(-1, {}, {})  # {dp=1, tp=1} was respawned
    plan = restore_plan(old, [2, 3], ("dp", "tp"), (2, 2))
    assert plan is not None and plan.gen == 3
    # Replicated: from the first holder; split over tp: a rank with tp=1; split over dp: dp=1.
    assert sorted(plan.transfers) == [(1, 3, 0), (2, 3, 1), (3, 3, 2)]


def test_no_rank_holding_a_lost_shard_means_the_checkpoint() -> None:
    both = meta(("dp", "tp"), S0, Shard(1))  # fsdp + tp: every shard unique
    old = [report(3, {"dp": d, "tp": t}, DP_TP, v1=both) for d in (0, 1) for t in (0, 1)]
    old[3] = report(-1, {}, {})
    assert restore_plan(old, [3], ("dp", "tp"), (2, 2)) is None


def test_the_newest_generation_held_and_known_is_restored() -> None:
    sizes = {"dp": 4}
    old = [report(5, {"dp": 0}, sizes, v1=meta(("dp",), R)),
           report(4, {"dp": 1}, sizes, v1=meta(("dp",), R)),  # skipped generation 5
           report(5, {"dp": 2}, sizes, v1=meta(("dp",), R)),
           report(-1, {}, {})]  # fmt: skip
    plan = restore_plan(old, [4, 5], ("dp",), (4,))
    assert plan is not None and plan.gen == 5
    assert sorted(plan.transfers) == [(1, 1, 0), (1, 3, 0)]
    assert restore_plan(old, [1, 2], ("dp",), (4,)) is None  # the controller forgot them


def test_a_shrunk_mesh_keeps_replicated_values_in_place_and_not_split_ones() -> None:
    # {dp: 4} lost dp=1: the engine goes on with old dp=0, 2, 3 as dp=0, 1, 2.
    assert shrunk(("dp",), (4,), {1}, "dp") == ([0, 2, 3], [3])
    old = {"dp": 4}
    reports = [report(7, {"dp": d}, old, v1=meta(("dp",), R)) for d in (0, 2, 3)]
    plan = restore_plan(reports, [7], ("dp",), (3,))
    assert plan is not None and plan.transfers == ()  # each its own copy
    split = [report(7, {"dp": d}, old, v1=meta(("dp",), S0)) for d in (0, 2, 3)]
    assert restore_plan(split, [7], ("dp",), (3,)) is None  # a 4-way shard fits no 3-way mesh


def test_shrinking_two_dimensions_leaves_out_the_data_slice_of_the_dead_rank() -> None:
    # {dp: 2, tp: 2} lost {dp=1, tp=1}: {dp=0, tp=0} and {dp=0, tp=1} go on.
    assert shrunk(("dp", "tp"), (2, 2), {3}, "dp") == ([0, 1], [1, 2])
    assert shrunk(("tp", "dp"), (2, 3), {1}, "dp") == ([0, 2, 3, 5], [2, 2])
    reports = [report(2, {"dp": 0, "tp": t}, DP_TP, v1=TP_SPLIT) for t in (0, 1)]
    plan = restore_plan(reports, [2], ("dp", "tp"), (1, 2))
    assert plan is not None and plan.transfers == ()
    with pytest.raises(MeshUsageError, match="every slice of the mesh along 'dp' lost a rank"):
        shrunk(("dp", "tp"), (2, 2), {0, 3}, "dp")


def test_growing_back_sends_gathered_copies_to_the_ranks_that_rejoin() -> None:
    # After {dp: 3} (old dp=0, 2, 3 of 4) copied each value whole along dp, the mesh of 4
    # takes the rejoined rank's copies from the first holder.
    gathered = ValueMeta(("dp",), (R,), (S0,), (8, 4), (4, 1), torch.float64)
    small = {"dp": 3}
    reports = [report(9, {"dp": 0}, small, v1=gathered), report(-1, {}, {}),
               report(9, {"dp": 1}, small, v1=gathered),
               report(9, {"dp": 2}, small, v1=gathered)]  # fmt: skip
    plan = restore_plan(reports, [9], ("dp",), (4,))
    assert plan is not None and plan.transfers == ((1, 1, 0),)

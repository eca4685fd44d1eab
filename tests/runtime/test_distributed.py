"""Process groups over actor meshes, with real processes: ranks, collectives, several groups at
once, clear errors, and DDP equivalence (examples/ddp.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from support import gpus_here

import actormesh as am
from actormesh.runtime.dataplane.distributed import (
    GroupMember,
    destroy_process_group,
    init_process_group,
)
from actormesh.runtime.dataplane.rank_layout import SHARED_GPU_BACKEND, RankLayout, layout
from actormesh.runtime.shape import Shape

EXAMPLES = Path(__file__).parents[2] / "examples"
WAIT = 60  # seconds: every wait in this file is bounded

ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class Member(am.Actor):
    """A user actor that knows nothing of how its group was formed."""

    @am.endpoint
    def all_reduce(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item())

    @am.endpoint
    def seen(self) -> dict[str, Any]:
        import torch.distributed as dist

        return {
            "env": {k: os.environ.get(k) for k in ENV_KEYS},
            "rank": dist.get_rank(),
            "world": dist.get_world_size(),
            "backend": dist.get_backend(),
        }

    @am.endpoint
    def exit_now(self) -> None:
        os._exit(5)


# -- the layout is pure --------------------------------------------------------------------------


def test_layout_uses_the_hosts_dimension() -> None:
    shape = Shape.from_extent({"hosts": 2, "gpus": 3})
    members = layout(shape, ["h"] * 6)  # the hosts dimension wins over the process hosts
    assert [m.rank for m in members] == list(range(6))
    assert [m.local_rank for m in members] == [0, 1, 2, 0, 1, 2]
    assert [m.group_rank for m in members] == [0, 0, 0, 1, 1, 1]
    assert {(m.world_size, m.local_world_size, m.group_world_size) for m in members} == {(6, 3, 2)}


def test_layout_without_hosts_dimension_groups_by_process_host() -> None:
    shape = Shape.from_extent({"ranks": 4})
    members = layout(shape, ["a", "b", "a", "b"])
    assert [(m.local_rank, m.group_rank, m.local_world_size) for m in members] == [
        (0, 0, 2),
        (0, 1, 2),
        (1, 0, 2),
        (1, 1, 2),
    ]
    env = RankLayout(3, 4, 1, 2, 1, 2).env("10.0.0.1", 1234)
    assert env == {
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "1234",
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
    }


def test_layout_of_a_slice_counts_from_zero() -> None:
    shape = Shape.from_extent({"hosts": 1, "gpus": 4}).slice(gpus=slice(2, 4))
    members = layout(shape, ["h", "h"])
    assert [(m.rank, m.local_rank, m.world_size) for m in members] == [(0, 0, 2), (1, 1, 2)]


# -- real processes --------------------------------------------------------------------------------


def default_backend_for(ranks: int) -> str:
    """What a default group of ``ranks`` pinned ranks ('gpus' dimension) uses on this machine."""

    gpus = gpus_here()
    if not gpus:
        return "gloo"
    return "cpu:gloo,cuda:nccl" if len(gpus) >= ranks else SHARED_GPU_BACKEND


def test_group_over_four_actors_all_reduces_with_the_right_ranks(spawn_procs: Any) -> None:
    procs = spawn_procs(per_host={"gpus": 4})
    members = procs.spawn("member", Member)
    joined = init_process_group(members).get(timeout=WAIT)
    assert [m.rank for m in joined.values()] == [0, 1, 2, 3]
    expected = default_backend_for(4)
    assert all(isinstance(m, GroupMember) and m.backend == expected for m in joined.values())
    assert len({m.pid for m in joined.values()}) == 4
    assert len({m.master_port for m in joined.values()}) == 1

    # rank r contributes r + 1: 1 + 2 + 3 + 4
    sums = members.all_reduce.call(0.0).get(timeout=WAIT)  # warm: same value everywhere
    assert sums.values() == [0.0] * 4
    per_rank = [
        members.slice(gpus=r).all_reduce.call_one(float(r + 1)) for r in range(4)
    ]  # one call per rank, all pending at once: the collective needs every rank
    assert [f.get(timeout=WAIT) for f in per_rank] == [10.0] * 4

    seen = members.seen.call().get(timeout=WAIT)
    for point, info in seen.items():
        r = point["gpus"]
        assert (info["rank"], info["world"], info["backend"]) == (r, 4, expected)
        assert info["env"]["RANK"] == str(r)
        assert info["env"]["WORLD_SIZE"] == "4"
        assert info["env"]["LOCAL_RANK"] == str(r)
        assert info["env"]["LOCAL_WORLD_SIZE"] == "4"
        assert info["env"]["MASTER_ADDR"] == "127.0.0.1"
        assert info["env"]["MASTER_PORT"] == str(joined.values()[0].master_port)


def test_two_meshes_have_their_own_groups_at_once(spawn_procs: Any) -> None:
    a = spawn_procs(per_host={"gpus": 2}).spawn("a", Member)
    four = spawn_procs(per_host={"gpus": 4}).spawn("b", Member)
    b, c = four.slice(gpus=slice(0, 2)), four.slice(gpus=slice(2, 4))  # disjoint halves
    # Three groups form concurrently: nothing waits before all three were asked.
    forming = [init_process_group(m) for m in (a, b, c)]
    groups = [f.get(timeout=WAIT) for f in forming]
    ports = {g.values()[0].master_port for g in groups}
    assert len(ports) == 3, "each group has its own store"
    for g in groups:
        assert [(m.rank, m.world_size) for m in g.values()] == [(0, 2), (1, 2)]

    # All six ranks in collectives at the same time; each group sums only its own members.
    pending = [m.slice(gpus=r).all_reduce.call_one(10.0 * i + r) for i, m in enumerate((a, b, c))
               for r in range(2)]  # fmt: skip
    results = [f.get(timeout=WAIT) for f in pending]
    assert results == [1.0, 1.0, 21.0, 21.0, 41.0, 41.0]


def test_a_second_group_over_the_same_processes_is_refused_until_destroyed(
    spawn_procs: Any,
) -> None:
    members = spawn_procs(per_host={"gpus": 2}).spawn("member", Member)
    init_process_group(members).get(timeout=WAIT)
    with pytest.raises(am.ActorError) as info:
        init_process_group(members.slice(gpus=slice(0, 1))).get(timeout=WAIT)
    assert "already belongs to a process group (rank 0 of 2)" in str(info.value)
    assert "destroy_process_group" in str(info.value)

    assert destroy_process_group(members).get(timeout=WAIT).values() == [True, True]
    assert destroy_process_group(members).get(timeout=WAIT).values() == [False, False]
    alone = init_process_group(members.slice(gpus=1)).get(timeout=WAIT)
    assert [(m.rank, m.world_size) for m in alone.values()] == [(0, 1)]
    assert members.slice(gpus=1).all_reduce.call_one(2.5).get(timeout=WAIT) == 2.5


def test_a_dead_member_fails_the_group_at_once(spawn_procs: Any) -> None:
    members = spawn_procs(per_host={"gpus": 2}).spawn("member", Member)
    with pytest.raises(am.SupervisionError):
        members.slice(gpus=1).exit_now.call_one().get(timeout=WAIT)
    with pytest.raises(am.SupervisionError) as info:
        init_process_group(members).get(timeout=WAIT)
    assert info.value.exitcode == 5


def test_unknown_backend_is_an_actor_error_before_any_rendezvous(spawn_procs: Any) -> None:
    members = spawn_procs(per_host={"gpus": 2}).spawn("member", Member)
    with pytest.raises(am.ActorError) as info:
        init_process_group(members, backend="no-such-backend").get(timeout=WAIT)
    assert "no-such-backend" in str(info.value)


def test_init_process_group_wants_a_mesh() -> None:
    with pytest.raises(am.MeshError, match="expected an actor mesh or a proc mesh"):
        init_process_group("procs")  # type: ignore[arg-type]


def test_ddp_example_matches_one_process(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    # In this process (the workers import the example by name from the path they inherit),
    # which saves a second interpreter importing torch; `python examples/ddp.py` runs main().
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.delitem(sys.modules, "ddp", raising=False)
    import ddp  # type: ignore[import-not-found]  # examples/ is a folder, not a package

    try:
        assert ddp.main() == 0, capsys.readouterr().out
    finally:
        sys.modules.pop("ddp", None)
    out = capsys.readouterr().out
    assert "DDP over 4 actors matches one process" in out
    assert out.count("final weights differ from one process's by at most") == 4

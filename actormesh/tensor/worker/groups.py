"""Process groups of a tensor engine that runs on *some* of its process group's processes (a
slice of a mesh whose whole already runs an engine): the ranks' side.

Each process has one default group (``torch.distributed``'s world), formed over the processes of
the first tensor mesh that used them. An engine over a subset of that world (or over the same
processes in another order) gets process groups of its own, one per line of each of its mesh
dimensions, so that its collectives never pair with another engine's: two engines on one
process run their batches on two threads, and a group shared by both would see their
collectives interleaved differently on different ranks.

Why not ``torch.distributed.new_group``: called by the members only
(``use_local_synchronization=True``) it names the group after its ranks *and the number of
groups this process already has*, so two members that belong to different engines disagree on
the name, rendezvous under different store keys and wait forever (seen with a slice ``pp=0``,
then a slice ``dp=0`` of a {pp: 2, dp: 2} mesh); called by every process of the world it would
need the processes outside the engine, which run other engines' batches. So the group is made
by the helper ``new_group`` itself uses, under a name that every member derives from the
engine's key and the line's ranks (torch 2.13's private ``_new_process_group_helper``; the
test ``test_overlapping_slices_of_one_engine`` covers it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _named_group(ranks: list[int], name: str) -> Any:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    default = c10d._get_default_group()  # noqa: SLF001
    backend_name, store = c10d._world.pg_map[default]  # noqa: SLF001
    backend = c10d.Backend(backend_name)
    timeout = c10d._get_default_timeout(backend)  # noqa: SLF001
    me = dist.get_rank()
    pg, _ = c10d._new_process_group_helper(  # noqa: SLF001
        len(ranks), ranks.index(me), list(ranks), backend, store, c10d.GroupName(name),
        timeout=timeout,
    )  # fmt: skip
    c10d._world.pg_group_ranks[pg] = {g: i for i, g in enumerate(ranks)}  # noqa: SLF001
    return pg


def sub_device_mesh(
    device: str, name: str, ranks: Sequence[int], sizes: Sequence[int], labels: Sequence[str]
) -> Any:
    """A ``DeviceMesh`` over the default group's ``ranks`` (row-major in the shape ``sizes``),
    with a group of its own per line of each dimension. Every member calls it; the others never
    do. ``name`` must be unique to this mesh (the engine's key, and a view's number)."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    grid = torch.tensor(list(ranks), dtype=torch.int64).reshape(tuple(sizes))
    import torch.distributed as dist

    me = dist.get_rank()
    groups = []
    for dim, size in enumerate(sizes):
        for line in grid.movedim(dim, -1).reshape(-1, size).tolist():
            if me in line:
                if line != sorted(line):  # torch orders a group's ranks by their global rank
                    raise RuntimeError(
                        f"mesh dimension {labels[dim]!r} lists the processes out of their "
                        f"process group's order ({line}); a tensor mesh over these processes "
                        "needs them in the order of the mesh whose processes formed the group"
                    )
                groups.append(
                    _named_group(line, f"actormesh-{name}-{dim}-{'_'.join(map(str, line))}")
                )
    return DeviceMesh.from_group(
        groups if len(groups) > 1 else groups[0], device, mesh=grid, mesh_dim_names=tuple(labels)
    )

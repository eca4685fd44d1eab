"""What a recovery does, decided from the ranks' reports (pure: no processes, no I/O).

Each rank of a mesh that recovers reports its snapshot (worker/recovery.py): the generation it
holds (-1: none), where it was when it copied it (its coordinates, the mesh's sizes) and each
value's ``ValueMeta``. From these and the new mesh's shape, :func:`restore_plan` says which
rank sends which value to which, or that the snapshots cannot give every rank its shard (then
the state comes from the last checkpoint). :func:`shrunk` says which processes a mesh keeps
when it goes on without its dead ranks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import compat

# (generation, coordinates, sizes, {id: ValueMeta}) as one rank reports it
Report = tuple[int, dict[str, int], dict[str, int], dict[int, Any]]


@dataclass
class Plan:
    gen: int
    metas: dict[int, Any]  # id -> ValueMeta
    transfers: tuple[tuple[int, int, int], ...]  # (id, dst, src) engine indices


def restore_plan(
    reports: Sequence[Report], gens: Sequence[int], labels: Sequence[str], sizes: Sequence[int]
) -> Plan | None:
    """How the new engine (``reports[i]``: what its rank ``i`` holds; mesh ``labels`` x
    ``sizes``) gets the values of the newest generation in ``gens`` (those the controller
    still knows) that some rank holds; ``None`` if some rank's shard of some value is held by
    no rank (or was copied on a mesh of another size along a dimension that splits it)."""
    known = set(gens)
    held = [gen for gen, *_ in reports if gen in known]
    if not held:
        return None
    gen = max(held)
    holders = [i for i, r in enumerate(reports) if r[0] == gen]
    metas: dict[int, Any] = {}
    for i in holders:
        for id, meta in reports[i][3].items():
            metas.setdefault(id, meta)
    new_sizes = dict(zip(labels, sizes, strict=True))
    transfers = []
    for id, meta in metas.items():
        split = [d for d, p in zip(meta.dims, meta.placements, strict=True) if not p.is_replicate()]
        sources = [i for i in holders if all(reports[i][2].get(d) == new_sizes[d] for d in split)]
        for dst in range(len(reports)):
            want = coordinates(dst, labels, sizes)
            if dst in sources and _same(reports[dst][1], want, split):
                continue  # its own copy is its shard here
            src = next((s for s in sources if _same(reports[s][1], want, split)), None)
            if src is None:
                return None
            transfers.append((id, dst, src))
    return Plan(gen, metas, tuple(transfers))


def every_meta(reports: Sequence[Report]) -> dict[int, Any]:
    """Each value's metadata as any rank's snapshot gives it (a value's placements are the
    same on every rank)."""
    metas: dict[int, Any] = {}
    for *_, entries in reports:
        for id, meta in entries.items():
            metas.setdefault(id, meta)
    return metas


def coordinates(index: int, labels: Sequence[str], sizes: Sequence[int]) -> dict[str, int]:
    return dict(compat.Point(index, compat.Extent(list(labels), list(sizes))))


def _same(a: dict[str, int], b: dict[str, int], dims: Sequence[str]) -> bool:
    return all(a.get(d) == b.get(d) for d in dims)


def shrunk(
    labels: Sequence[str], sizes: Sequence[int], dead: set[int], data_dim: str
) -> tuple[list[int], list[int]]:
    """The processes (row-major indices) a mesh keeps when it goes on without the ``dead``
    ones, and its new sizes: every slice along ``data_dim`` that lost a rank is left out
    whole (a data-parallel replica; the others stay as they are, so every shard of a value
    replicated along ``data_dim`` is still held). Raises ``MeshUsageError`` if none is left."""
    axis = list(labels).index(data_dim)
    lost = {coordinates(i, labels, sizes)[data_dim] for i in dead}
    kept_slices = [k for k in range(sizes[axis]) if k not in lost]
    if not kept_slices:
        raise compat.MeshUsageError(
            f"every slice of the mesh along {data_dim!r} lost a rank, so no data-parallel "
            "replica is left to go on with; recover() respawns the lost ranks instead"
        )
    new_sizes = list(sizes)
    new_sizes[axis] = len(kept_slices)
    kept = []
    for j in range(math.prod(new_sizes)):
        coords = coordinates(j, labels, new_sizes)
        coords[data_dim] = kept_slices[coords[data_dim]]
        kept.append(_index(coords, labels, sizes))
    return kept, new_sizes


def _index(coords: dict[str, int], labels: Sequence[str], sizes: Sequence[int]) -> int:
    index = 0
    for label, size in zip(labels, sizes, strict=True):
        index = index * size + coords[label]
    return index

"""Where each member of a process group sits, and which backend the group can use (pure: no
process, no I/O; ``distributed`` and ``spmd`` apply them to meshes).

``layout`` numbers ranks as torchrun does, grouping them by host; ``monarch_layout`` by Monarch's
rules (the last mesh dimension is the local one). ``choose_backend`` keeps NCCL away from ranks
that would share a GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from ...errors import MeshUsageError
from ..shape import Shape

logger = logging.getLogger(__name__)

# What a default group uses when some of its ranks share a GPU (see choose_backend).
SHARED_GPU_BACKEND = "cpu:gloo,cuda:gloo"


@dataclass(frozen=True)
class RankLayout:
    """Where one member sits in a group: global, local (same host) and host (group) ranks."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    group_rank: int
    group_world_size: int

    def env(self, master_addr: str, master_port: int) -> dict[str, str]:
        """The variables every member of a group gets (a subset of torchrun's)."""
        return {
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.group_rank),
            "GROUP_WORLD_SIZE": str(self.group_world_size),
        }


def layout(shape: Shape, hosts: Sequence[str]) -> list[RankLayout]:
    """The rank layout of the members of ``shape``, in row-major order (pure).

    ``hosts[i]`` names the host of member ``i``; it is used only when the shape has no
    ``hosts`` dimension. Hosts are numbered in order of first appearance.
    """
    n = len(shape)
    if len(hosts) != n:
        raise ValueError(f"need one host per member: {len(hosts)} hosts for {n} members")
    if "hosts" in shape.labels:
        keys: list[object] = [shape.point(i)["hosts"] for i in range(n)]
    else:
        keys = list(hosts)
    host_index: dict[object, int] = {}
    local: list[int] = []
    counts: dict[object, int] = {}
    for key in keys:
        host_index.setdefault(key, len(host_index))
        local.append(counts.get(key, 0))
        counts[key] = counts.get(key, 0) + 1
    return [
        RankLayout(i, n, local[i], counts[key], host_index[key], len(host_index))
        for i, key in enumerate(keys)
    ]


def monarch_layout(shape: Shape) -> list[RankLayout]:
    """The rank layout by Monarch's rules (its ``SPMDActor``), in row-major order (pure): the
    last dimension is the local one (``LOCAL_RANK`` is the coordinate along it), and every run
    of it is one group (``GROUP_RANK = RANK // LOCAL_WORLD_SIZE``), whatever hosts the ranks
    are on. ``layout`` instead groups by host."""
    n = len(shape)
    if not shape.labels:
        return [RankLayout(0, 1, 0, 1, 0, 1)]
    last, per_group = shape.labels[-1], shape.sizes[-1]
    groups = -(-n // per_group)
    return [
        RankLayout(i, n, shape.point(i)[last], per_group, i // per_group, groups) for i in range(n)
    ]


def gpu_of(visible: list[str], local_rank: int, host: str) -> tuple[str, str] | None:
    """The GPU a member will use, as ``(host, name)``: its device ``local_rank % count``, as
    ``join_group`` picks it (on a mesh with a ``gpus`` dimension, its one visible GPU)."""
    if not visible:
        return None
    return host, visible[local_rank % len(visible)]


def choose_backend(
    requested: str | None, resolved: str, gpus: Sequence[tuple[str, str] | None]
) -> str:
    """The backend the members join with (pure).

    NCCL refuses two ranks on one GPU ("Duplicate GPU detected", at the first collective, on
    every rank). Where members share a GPU, the default backend moves CUDA tensors to gloo
    (which takes CUDA tensors, through host memory: slower, but every collective works); a
    backend that names NCCL explicitly is refused here, before anyone joins.
    """
    if "nccl" not in resolved:
        return resolved
    first: dict[tuple[str, str], int] = {}
    for rank, gpu in enumerate(gpus):
        if gpu is None:
            continue
        if gpu in first:
            other = first[gpu]
            if requested is not None:
                raise MeshUsageError(
                    f"backend {requested!r}: ranks {other} and {rank} would share GPU "
                    f"{gpu[1]} of host {gpu[0]}, and NCCL needs a GPU per rank. Give the mesh "
                    "a 'gpus' dimension no larger than the host's GPU count, or pass "
                    "backend='cpu:gloo,cuda:gloo' (or leave it None) to run CUDA tensors "
                    "through gloo"
                )
            logger.warning(
                "ranks %d and %d share GPU %s of host %s: NCCL needs a GPU per rank, so this "
                "group runs CUDA tensors through gloo (slower; a 'gpus' dimension no larger "
                "than the GPU count gives each rank its own GPU and NCCL)",
                other,
                rank,
                gpu[1],
                gpu[0],
            )
            return SHARED_GPU_BACKEND
        first[gpu] = rank
    return resolved

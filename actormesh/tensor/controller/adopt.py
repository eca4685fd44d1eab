"""``adopt``: a tensor that ``%%mesh`` cells made on the ranks becomes a MeshTensor (controller
side; the ranks' side is ``local.adopt_value``)."""

from __future__ import annotations

from typing import Any

from .. import compat
from .mesh import engine_mesh
from .tensor import MeshTensor, new_mesh_tensor

ADOPT_TIMEOUT = 60.0


def adopt(mesh: Any, name: str, *, timeout: float = ADOPT_TIMEOUT) -> MeshTensor:
    """The value every rank of ``mesh`` holds as ``name`` in its ``%%mesh`` namespace, as a
    MeshTensor that later ops, fetches and ``%mesh dbg inspect`` use like any other.

    A DTensor (over the mesh's tensor engine's DeviceMesh, e.g. made from a pushed MeshTensor's
    ``.device_mesh``) becomes a global MeshTensor; a plain tensor a per-rank one, as under
    ``activate()``. No data moves: the engine takes the cell's own tensor.

    Blocks for one round trip to every rank (up to ``timeout`` s), after the ops issued before
    it. A name missing on some rank, or not a tensor, raises ``ActorError`` naming the ranks;
    ranks that disagree (global shapes, dtypes, DTensor on some and not on others) raise
    ``MeshUsageError``, and nothing is kept.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise compat.MeshUsageError(
            f"adopt(mesh, name): name must be the Python name the %%mesh cell bound, got {name!r}"
        )
    tm = engine_mesh(mesh, "adopt")
    tm.stream.flush()  # the engine takes it after the ops issued before
    vid = tm.stream.new_id()
    try:
        replies = tm.engine.adopt.call(vid, name).get(timeout=timeout).values()
    except BaseException:
        tm.stream.died(vid)  # ranks that took it drop it again
        raise
    if len(set(replies)) != 1:
        tm.stream.died(vid)
        seen = ", ".join(
            f"{tm.coords_of(i)}: {'tensor' if r[0] else 'DTensor'} {list(r[1])} {r[2]}"
            for i, r in enumerate(replies)
        )
        raise compat.MeshUsageError(
            f"adopt({name!r}): the ranks' values do not make one MeshTensor ({seen}); a global "
            "one is a DTensor of the same global shape and dtype on every rank, a per-rank one a "
            "tensor of the same shape and dtype on every rank"
        )
    per_rank, shape, dtype, stride = replies[0]
    return new_mesh_tensor(tm, shape, dtype, per_rank=per_rank, stride=stride, value_id=vid)

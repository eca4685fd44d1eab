"""Stand-ins: what a failed op's outputs become on this rank (state.py's poisoned values).

A stand-in is a zero value of the shape the controller computed for the output (and the
placements of an input of that shape), so that later ops on this rank still run, for real, on
it: that keeps the healthy ranks from hanging in a collective that a failed rank would skip. A
handler that must take part in the op's collectives even when it fails (a module's forward
under FSDP) makes its own and raises :class:`StoodIn` with them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..wire.shapes import contiguous_strides

if TYPE_CHECKING:
    from .state import EngineState

logger = logging.getLogger(__name__)


class StoodIn(Exception):
    """Raised by a handler whose op failed on this rank but that still computed ``values`` to
    stand in for its results (so that the rank took part in the op's collectives): the engine
    keeps them, and reports ``cause`` as the op's failure."""

    def __init__(self, values: Sequence[Any], cause: Exception) -> None:
        super().__init__(str(cause))
        self.values = values
        self.cause = cause


def stand_in(engine: EngineState, meta: Any, ins: tuple[int, ...]) -> Any:
    """A zero value of the shape the op would have had; ``None`` when that is unknown."""
    if meta is None:
        return None
    import torch
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, dtype, per_rank = meta[:3]
    split = meta[3] if len(meta) > 3 else None  # a dim the value is known to be split over
    try:
        if per_rank:
            return torch.zeros(shape, dtype=dtype, device=engine.device)
        mesh = engine.mesh
        placements: list[Any] = [Replicate()] * engine.mesh.ndim
        if split is not None:
            placements = [Shard(0) if d == split else Replicate() for d in engine.labels]
        found = False
        for i in ins if split is None else ():  # an input of the same shape's placements
            v = engine.env.get(i)
            if isinstance(v, DTensor) and tuple(v.shape) == tuple(shape):
                mesh, placements = v.device_mesh, list(v.placements)
                found = True
                break
        for i in ins if split is None and not found else ():  # else an input's mesh (a view)
            v = engine.env.get(i)
            if isinstance(v, DTensor):
                mesh, placements = v.device_mesh, [Replicate()] * v.device_mesh.ndim
                break
        local, _ = compute_local_shape_and_global_offset(shape, mesh, placements)
        zeros = torch.zeros(local, dtype=dtype, device=engine.device)
        return DTensor.from_local(
            zeros, mesh, placements, run_check=False, shape=torch.Size(shape),
            stride=contiguous_strides(shape),
        )  # fmt: skip
    except Exception:
        logger.debug("no stand-in for %s", meta, exc_info=True)
        return None

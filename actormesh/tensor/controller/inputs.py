"""A controller tensor given to a meshed model (``module.py``'s ``MeshModule.__call__``): its
rows split over the data dimension as the batch, the same MeshTensor again while neither it nor
the batch changed, and its value known here when it is an integer tensor (``known.py``).

``state`` is the model's ``module._Placement``.
"""

from __future__ import annotations

import weakref
from functools import partial
from typing import Any

import torch

from .. import compat
from ..wire.ops import Ref, issue_site
from .constants import upload
from .known import exact, keep
from .tensor import MeshTensor, new_mesh_tensor

INPUTS_KEPT = 8  # controller tensors a model remembers having put on the mesh


def to_mesh(state: Any, x: Any) -> Any:
    """A controller tensor given to a meshed model: split along dim 0 over the data dimension
    (its rows are the batch), or replicated when it has no dims. MeshTensors stay as they are."""
    if not isinstance(x, torch.Tensor) or type(x) is MeshTensor:
        return x
    if x.requires_grad:
        raise compat.MeshUsageError(
            "a controller tensor that requires grad was passed to a model on a mesh: its "
            "gradient would stay on the ranks; pass actormesh.distribute(x, procs, ...) (a "
            "MeshTensor, which gets .grad) or x.detach()"
        )
    # The same batch again (a training loop's fixed batch, the same input_ids): the MeshTensor
    # made for it, while neither it nor the batch changed (their version counters say so).
    key = id(x)
    found = state.inputs.get(key)
    if found is not None:
        ref, version, made, made_version, sent, foreign = found
        if (
            ref() is x
            and version == x._version  # noqa: SLF001
            and made._version == made_version  # noqa: SLF001
            and foreign == made.mesh.stream.foreign  # no user code on the ranks since
        ):
            if sent is not None:  # what the ranks hold (x may have changed behind its counter)
                keep(made.mesh.stream.known, made, sent)
            return made
    tm = state.tm
    placements = tm.placements(x.dim(), _batch_spec(state, x), None)
    before = tm.stream.consts.get(id(x))
    cid = upload(tm.stream, x)  # uploaded once while x is unchanged (a reused batch)
    # Known only when sent now: an earlier copy is what x was then (its version counter does
    # not see a write through numpy or .data)
    fresh = before is None or before[2] != cid
    out = new_mesh_tensor(tm, x.shape, x.dtype, per_rank=False)
    meta = ((tuple(x.shape), x.dtype, False),)
    tm.stream.record(
        ("distribute", (out.value_id,), (cid,), meta, (Ref(cid), placements, 0), issue_site())
    )
    sent = x.clone() if fresh and exact(x) else None
    if sent is not None:
        keep(tm.stream.known, out, sent)
    if not x.is_inference():  # (inference tensors have no version counter)
        if len(state.inputs) >= INPUTS_KEPT:
            state.inputs.pop(next(iter(state.inputs)))
        gone = partial(_input_gone, weakref.ref(state), key)
        version, made_version = x._version, out._version  # noqa: SLF001
        state.inputs[key] = (
            weakref.ref(x, gone),
            version,
            out,
            made_version,
            sent,
            tm.stream.foreign,
        )
    return out


def _input_gone(state: weakref.ref[Any], key: int, ref: Any) -> None:
    """A controller tensor a model remembered was collected: forget its MeshTensor."""
    placement = state()
    if placement is not None and key in placement.inputs and placement.inputs[key][0] is ref:
        del placement.inputs[key]


def _batch_spec(state: Any, x: torch.Tensor) -> list[Any] | None:
    if state.data_dim is None or x.dim() == 0:
        return None
    return [state.data_dim] + [None] * (x.dim() - 1)

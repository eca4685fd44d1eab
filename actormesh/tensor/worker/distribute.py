"""The ranks' side of ``distribute.py`` and of MeshTensor's placement methods: global tensors
made from the controller's (``distribute``, ``distribute_staged``), drawn from one seed
(``random``), re-placed (``redistribute``) and described (``placements``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..wire.shapes import contiguous_strides
from .dtensors import as_dtensor

if TYPE_CHECKING:
    from .state import EngineState


def run_distribute(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    from torch.distributed.tensor import distribute_tensor

    tensor, placements, view_id = payload
    tensor = engine.resolve(tensor)  # the tensor itself, or a Ref to a controller constant
    mesh = engine.view(view_id).mesh  # the engine's DeviceMesh, or a view's (views.py)
    block = _own_block(tensor.to(engine.device), mesh, placements)
    if block is not None:
        return [block]
    # src_data_rank=None: every rank already has the whole tensor; each keeps its slice.
    return [distribute_tensor(tensor.to(engine.device), mesh, placements, src_data_rank=None)]


def _own_block(tensor: Any, mesh: Any, placements: Any) -> Any:
    """What ``distribute_tensor(..., src_data_rank=None)`` gives for Shard and Replicate
    placements, without its Python (a meshed model's batch, every step): this rank's block."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not all(type(p) is Shard or type(p) is Replicate for p in placements):
        return None
    shape, offset = compute_local_shape_and_global_offset(tensor.shape, mesh, placements)
    local = tensor
    for dim, (start, size) in enumerate(zip(offset, shape, strict=True)):
        if size != local.shape[dim]:
            local = local.narrow(dim, start, size)
    whole = tensor.shape
    return as_dtensor(local.contiguous(), mesh, placements, whole, contiguous_strides(whole))


def run_distribute_staged(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    import torch
    from torch.distributed.tensor import DTensor

    staged_id, placements, shape, view_id = payload
    # The block came on its own, sent to this rank alone (engine.stage): no communication.
    block = engine.staged.pop(staged_id).to(engine.device)
    stride = torch.empty(shape, device="meta").stride()
    return [
        DTensor.from_local(
            block, engine.view(view_id).mesh, placements, run_check=False, shape=torch.Size(shape),
            stride=stride,
        )
    ]  # fmt: skip


def run_random(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    import torch
    from torch.distributed.tensor import distribute_tensor

    fn, shape, dtype, seed, placements, view_id = payload
    mesh = engine.view(view_id).mesh
    if engine.device == "cuda":
        return [_dtensor_random(mesh, fn, shape, dtype, seed, placements)]
    # DTensor's RNG needs a GPU: on CPU every rank draws the whole tensor and keeps its part.
    gen = torch.Generator().manual_seed(seed)
    full = getattr(torch, fn)(*shape, generator=gen, dtype=dtype)
    return [distribute_tensor(full.to(engine.device), mesh, placements, src_data_rank=None)]


def _dtensor_random(mesh: Any, fn: str, shape: Any, dtype: Any, seed: int, placements: Any) -> Any:
    """DTensor's own factory: each rank draws only its shard, at its offset in one stream, so
    the global tensor is the same for every placement. The rank's generators are restored
    afterwards (per-rank factories under activate() keep drawing differently per rank)."""
    import torch
    from torch.distributed import tensor as dtensor

    with torch.random.fork_rng(devices=[torch.cuda.current_device()]):
        torch.manual_seed(seed)
        return getattr(dtensor, fn)(*shape, device_mesh=mesh, placements=placements, dtype=dtype)


def run_redistribute(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    ref, placements = payload
    v = engine.resolve(ref)
    return [v.redistribute(v.device_mesh, placements)]  # its own mesh: the engine's, or a view


def run_placements(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    (ref,) = payload
    return [tuple(engine.resolve(ref).placements)]

"""``distribute`` and the CPU random factories: making global MeshTensors from the controller."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from ... import config
from .. import compat
from ..wire.ops import issue_site
from .interrupts import held
from .mesh import TensorMesh, tensor_mesh
from .tensor import MeshTensor, new_mesh_tensor


def distribute(
    tensor: torch.Tensor,
    mesh: Any,
    sharding_spec: Sequence[Any] | None = None,
    *,
    placements: Sequence[Any] | None = None,
) -> MeshTensor:
    """Place ``tensor`` on ``mesh``: a MeshTensor that is a DTensor over the mesh's processes.

    ``sharding_spec`` has one entry per tensor dimension: a mesh dimension name (shard this
    tensor dimension over it), a tuple of names (over several, in mesh order) or ``None``
    (replicated). Or give DTensor ``placements`` (one per mesh dimension). Neither: replicated.
    The size-1 ``hosts`` dimension of a proc mesh is ignored.

    Does not block once the mesh's engine is up (the first use of a mesh starts it, which takes
    a few seconds). A tensor up to ``ACTORMESH_TENSOR_SHARD_BYTES`` (64 MiB) travels whole with
    the op and each rank keeps its slice; a larger one is cut here, and each rank is sent only
    its own block (ranks holding the same block share one message). Either way the ranks do not
    communicate. Bad specs raise ``ValueError`` here and send nothing.
    """
    if isinstance(tensor, MeshTensor):
        raise compat.MeshUsageError(
            "distribute() takes a controller tensor; this is already a MeshTensor (use "
            "t.redistribute(sharding_spec=...) to change its placements)"
        )
    if not isinstance(tensor, torch.Tensor):
        raise compat.MeshUsageError(
            f"distribute() takes a torch.Tensor, got {type(tensor).__name__}; "
            "wrap data with torch.as_tensor(...) first"
        )
    tm = tensor_mesh(mesh, "distribute")
    places = tm.placements(tensor.dim(), sharding_spec, placements)
    data = tensor.detach().contiguous()
    out = new_mesh_tensor(
        tm, tensor.shape, tensor.dtype, per_rank=False, requires_grad=tensor.requires_grad
    )
    meta = ((tuple(tensor.shape), tensor.dtype, False),)
    staged = None
    if data.nbytes > config.TENSOR_SHARD_BYTES:
        with held():  # every rank its block, or Ctrl-C before any: none left staged on some
            staged = _send_blocks(tm, data, places)
    if staged is None:
        if data.data_ptr() == tensor.data_ptr():
            # A snapshot: the op is pickled when its batch goes, and the caller may change the
            # tensor in place before that (an optimizer step on the tensor it was copied from).
            data = data.clone()
        tm.stream.record(("distribute", (out.value_id,), (), meta, (data, places, tm.view_id),
                                 issue_site()))  # fmt: skip
    else:
        payload = (staged, places, tuple(tensor.shape), tm.view_id)
        tm.stream.record(("distribute_staged", (out.value_id,), (), meta, payload, issue_site()))
    return out


def _send_blocks(tm: TensorMesh, data: torch.Tensor, places: tuple[Any, ...]) -> int | None:
    """Send each rank its block of ``data`` (``engine.stage``), ahead of the op that places it;
    the id the blocks are staged under, or ``None`` for placements other than Shard/Replicate
    (then the whole tensor goes with the op, as for a small one)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    if not all(type(p) is Shard or type(p) is Replicate for p in places):
        return None
    tm.stream.check()
    staged = tm.stream.new_id()
    sharded = [i for i, p in enumerate(places) if type(p) is Shard]
    # Ranks that differ only along replicated mesh dims hold the same block: one cast each.
    for coords in itertools.product(*(range(tm.sizes[i]) for i in sharded)):
        point = [0] * tm.ndim
        for i, c in zip(sharded, coords, strict=True):
            point[i] = c
        shape, offset = _compute_local_shape_and_global_offset(data.shape, tm.sizes, point, places)
        block = data[tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))]
        ranks = tm.engine.slice(**{tm.labels[i]: c for i, c in zip(sharded, coords, strict=True)})
        ranks.stage.broadcast(staged, block)  # the codec sends the block's elements only
    return staged


def _random(fn: str, size: tuple[Any, ...], mesh: Any, sharding_spec: Any, placements: Any,
            dtype: torch.dtype | None) -> MeshTensor:  # fmt: skip
    if mesh is None:
        raise compat.MeshUsageError(f"actormesh.tensor.{fn} needs mesh=procs")
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
    if not all(isinstance(n, int) and n >= 0 for n in shape):
        raise compat.MeshUsageError(f"{fn}: sizes must be non-negative ints, got {shape!r}")
    tm = tensor_mesh(mesh, fn)
    dtype = dtype or torch.get_default_dtype()
    places = tm.placements(len(shape), sharding_spec, placements)
    # One seed from the controller's generator: torch.manual_seed on the controller makes it
    # reproducible, and every placement gives the same global tensor.
    seed = int(torch.randint(0, 2**62, ()).item())
    out = new_mesh_tensor(tm, shape, dtype, per_rank=False)
    meta = ((shape, dtype, False),)
    tm.stream.record(
        (
            "random",
            (out.value_id,),
            (),
            meta,
            (fn, shape, dtype, seed, places, tm.view_id),
            issue_site(),
        )
    )
    return out


def randn(*size: Any, mesh: Any = None, sharding_spec: Any = None, placements: Any = None,
          dtype: torch.dtype | None = None) -> MeshTensor:  # fmt: skip
    """A global normal-random MeshTensor drawn from one seed (works on CPU, unlike DTensor's)."""
    return _random("randn", size, mesh, sharding_spec, placements, dtype)


def rand(*size: Any, mesh: Any = None, sharding_spec: Any = None, placements: Any = None,
         dtype: torch.dtype | None = None) -> MeshTensor:  # fmt: skip
    """A global uniform-random MeshTensor in [0, 1) drawn from one seed."""
    return _random("rand", size, mesh, sharding_spec, placements, dtype)

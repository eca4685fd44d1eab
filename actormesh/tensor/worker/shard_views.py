"""``view`` of a tensor whose rows are split over the mesh (a data-parallel batch), on each rank's
rows (the shard path of ``shard_ops.py``).

A transformer's step views its activations dozens of times (Hugging Face's ``Conv1D`` flattens
(batch, sequence, features) to rows and back; attention splits and merges heads), and DTensor's
rule for a view of a split tensor rewrites the op's sizes for the local shard in Python: in
GPT-2's step it was 40 % of a rank's time. Where the only split is of dim 0 into equal blocks and
the tensor is contiguous, each rank's block is one contiguous run of the flattened tensor, and
so is its block of the view when the view's dim 0 splits into as many equal blocks: the local
view with that dim divided is the view, split the same way.
"""

from __future__ import annotations

import math
from typing import Any

from ..wire.shapes import contiguous_strides


def view_rows(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``view(x, size)`` of a DTensor split only along dim 0 (Shard(0) over some mesh
    dimensions, evenly; Replicate or a Partial sum over the others) into a size whose dim 0
    splits as evenly; ``None`` otherwise (then DTensor runs it)."""
    import torch
    from torch.distributed.tensor import DTensor, Shard

    from .dtensors import as_dtensor

    x = args[0]
    if type(x) is not DTensor or len(args) != 2 or kwargs:
        return None
    spec = x._spec  # noqa: SLF001
    blocks = 1
    for axis, p in enumerate(spec.placements):
        if type(p) is Shard:
            if p.dim != 0:
                return None
            blocks *= spec.mesh.size(axis)
        elif not (p.is_replicate() or (p.is_partial() and getattr(p, "reduce_op", None) == "sum")):
            return None
    old = tuple(spec.shape)
    local = x._local_tensor  # noqa: SLF001
    if blocks == 1 or not old or old[0] % blocks or local.shape[0] * blocks != old[0]:
        return None
    if tuple(spec.stride) != contiguous_strides(old) or not local.is_contiguous():
        return None
    new = _sizes(args[1], math.prod(old))
    if new is None or not new or new[0] % blocks:
        return None
    out = func(local, [new[0] // blocks, *new[1:]])
    return as_dtensor(out, spec.mesh, spec.placements, torch.Size(new), contiguous_strides(new))


def _sizes(size: Any, numel: int) -> list[int] | None:
    """``size`` with its -1 worked out, if it holds ``numel`` elements."""
    sizes = list(size)
    if sizes.count(-1) > 1:
        return None
    if -1 in sizes:
        known = math.prod(n for n in sizes if n != -1)
        if known == 0 or numel % known:
            return None
        sizes[sizes.index(-1)] = numel // known
    return sizes if math.prod(sizes) == numel else None

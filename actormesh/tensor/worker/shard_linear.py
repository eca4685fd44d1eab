"""A linear layer's ops on each rank's local shards (a route of ``shard_ops.py``).

On plain placements (Shard, Replicate; Partial where the op keeps a sum a sum): ``t``, ``mm``,
``addmm`` (the batch split over rows, the weights replicated, or a weight gradient's contraction
over the split batch giving a ``Partial`` sum) and ``sum.dim_IntList``, and ``view`` of a tensor
split over no dimension or by rows (``shard_views.py``); each placement the result gets is the
one DTensor's rule gives. And ``cat`` with 1-D empty tensors among others, which torch skips and
DTensor does not: left out.
"""

from __future__ import annotations

from typing import Any

from .dtensors import as_dtensor, partial_sum
from .shard_views import view_rows


def _transpose(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``t`` of a 2-D DTensor: Shard(0) and Shard(1) swap, the rest stays."""
    from torch.distributed.tensor import DTensor, Shard

    x = args[0]
    if type(x) is not DTensor or x.dim() != 2 or kwargs or len(args) != 1:
        return None
    spec = x._spec  # noqa: SLF001
    placements: list[Any] = []
    for p in spec.placements:
        if type(p) is Shard:
            placements.append(Shard(1 - p.dim))
        elif p.is_replicate() or p.is_partial():
            placements.append(p)
        else:
            return None
    local = func(x._local_tensor)  # noqa: SLF001
    shape, stride = spec.shape, spec.stride
    return as_dtensor(local, spec.mesh, placements, (shape[1], shape[0]), (stride[1], stride[0]))


def _mm_placements(a: Any, b: Any) -> list[Any] | None:
    """Per mesh dimension, ``a @ b``'s placement when each rank's ``a_local @ b_local`` is its
    block of it: rows split and ``b`` whole (Shard(0)), columns split and ``a`` whole
    (Shard(1)), the contraction split alike on both (a Partial sum); else None."""
    from torch.distributed.tensor import Shard

    out = []
    for pa, pb in zip(a.placements, b.placements, strict=True):
        ta, tb = type(pa), type(pb)
        if pa.is_replicate() and pb.is_replicate():
            out.append(pa)
        elif ta is Shard and pa.dim == 0 and pb.is_replicate():
            out.append(Shard(0))
        elif pa.is_replicate() and tb is Shard and pb.dim == 1:
            out.append(Shard(1))
        elif ta is Shard and tb is Shard and pa.dim == 1 and pb.dim == 0:
            out.append(partial_sum())
        else:
            return None
    return out


def _mm(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    from torch.distributed.tensor import DTensor

    if len(args) != 2 or kwargs:
        return None
    a, b = args
    if type(a) is not DTensor or type(b) is not DTensor or a.device_mesh is not b.device_mesh:
        return None
    placements = _mm_placements(a, b)
    if placements is None:
        return None
    local = func(a._local_tensor, b._local_tensor)  # noqa: SLF001
    shape = (a.shape[0], b.shape[1])
    return as_dtensor(local, a.device_mesh, placements, shape, (shape[1], 1))


def _addmm(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``bias + a @ b`` with a replicated bias over the columns, where ``a @ b`` needs no sum
    and its columns are whole (each rank adds the whole bias to its rows)."""
    from torch.distributed.tensor import DTensor

    if len(args) != 3 or kwargs:
        return None
    bias, a, b = args
    if any(type(t) is not DTensor for t in args) or bias.dim() != 1:
        return None
    if a.device_mesh is not b.device_mesh or bias.device_mesh is not a.device_mesh:
        return None
    placements = _mm_placements(a, b)
    if placements is None or not all(p.is_replicate() for p in bias.placements):
        return None
    if any(not (p.is_replicate() or p.is_shard(0)) for p in placements):
        return None
    local = func(bias._local_tensor, a._local_tensor, b._local_tensor)  # noqa: SLF001
    shape = (a.shape[0], b.shape[1])
    return as_dtensor(local, a.device_mesh, placements, shape, (shape[1], 1))


def _sum_dims(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``sum`` over dims: a split dim summed over gives a Partial sum, other split dims move
    down past the removed ones (unless keepdim); Partial sums stay Partial sums."""
    import torch
    from torch.distributed.tensor import DTensor, Shard

    if kwargs or len(args) < 2 or len(args) > 3:
        return None
    x, dims = args[0], args[1]
    keepdim = args[2] if len(args) > 2 else False
    if type(x) is not DTensor or dims is None or not dims:
        return None
    nd = x.dim()
    reduced = sorted({d % nd for d in dims}) if nd else []
    placements = []
    for p in x.placements:
        if type(p) is Shard:
            if p.dim in reduced:
                placements.append(partial_sum())
            else:
                shift = 0 if keepdim else sum(1 for d in reduced if d < p.dim)
                placements.append(Shard(p.dim - shift))
        elif p.is_replicate() or (p.is_partial() and getattr(p, "reduce_op", None) == "sum"):
            placements.append(p)
        else:
            return None
    local = func(x._local_tensor, dims, keepdim)  # noqa: SLF001
    shape = [n if i not in reduced else 1 for i, n in enumerate(x.shape)]
    if not keepdim:
        shape = [n for i, n in enumerate(x.shape) if i not in reduced]
    from ..wire.shapes import contiguous_strides

    return as_dtensor(local, x.device_mesh, placements, torch.Size(shape),
                      contiguous_strides(shape))  # fmt: skip


def _view_unsplit(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``view`` of a DTensor split over no dimension (replicated or partial sums): each rank
    holds the whole shape, so the local view is the view."""
    from torch.distributed.tensor import DTensor

    x = args[0]
    if type(x) is not DTensor or len(args) != 2 or kwargs:
        return None
    spec = x._spec  # noqa: SLF001
    for p in spec.placements:
        if not (p.is_replicate() or (p.is_partial() and getattr(p, "reduce_op", None) == "sum")):
            return None
    local = func(x._local_tensor, args[1])  # noqa: SLF001
    return as_dtensor(local, spec.mesh, spec.placements)


def _view(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``view`` (and ``_unsafe_view``) of an unsplit tensor, or of one split by rows."""
    out = _view_unsplit(func, args, kwargs)
    return out if out is not None else view_rows(func, args, kwargs)


def _cat_skipping_empty(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``cat`` with 1-D empty tensors among others: torch skips them (a legacy rule Hugging Face's
    KV cache relies on: it starts from ``torch.tensor([])``); DTensor's rule does not, so they
    are left out here before DTensor runs it."""
    tensors = args[0] if args else kwargs.get("tensors")
    if not isinstance(tensors, (list, tuple)) or len(tensors) < 2:
        return None
    kept = [t for t in tensors if not (t.dim() == 1 and t.shape[0] == 0)]
    if len(kept) == len(tensors) or not kept or all(t.dim() == 1 for t in kept):
        return None
    return func(kept, *args[1:], **kwargs) if args else func(kept, **kwargs)


ROUTES = {
    "aten.t.default": _transpose,
    "aten.mm.default": _mm,
    "aten.addmm.default": _addmm,
    "aten.sum.dim_IntList": _sum_dims,
    "aten.view.default": _view,
    "aten._unsafe_view.default": _view,
    "aten.cat.default": _cat_skipping_empty,
}

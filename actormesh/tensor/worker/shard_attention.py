"""Attention on the CPU, on each rank's local shards (a route of ``shard_ops.py``).

``scaled_dot_product_attention``'s CPU kernel and its backward, which DTensor has no rule for
(torch 2.13): each (batch, head) attends within itself, so with query, key and value split alike
over batch or heads only (dims 0 and 1; others are redistributed so, the sequence made whole)
each rank's blocks are the op.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .dtensors import as_dtensor

_attention_meta: dict[Any, Any] = {}


def _aligned(tensors: Sequence[Any]) -> list[Any] | None:
    """The attention tensors (DTensors of the same mesh, batch and heads) all placed as the
    first one is, kept to splits of dims 0 and 1 (batch, heads) over at most one mesh dim each,
    replicated otherwise: a redistribute (exact) for any placed otherwise; None if they are
    not such DTensors."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    first = tensors[0]
    if any(type(t) is not DTensor for t in tensors):
        return None
    mesh = first.device_mesh
    if any(t.device_mesh is not mesh or t.shape[:2] != first.shape[:2] for t in tensors):
        return None
    target: list[Any] = []
    for p in first.placements:
        if type(p) is Shard and p.dim in (0, 1) and p not in target:
            target.append(p)
        else:
            target.append(Replicate())
    placements = tuple(target)
    return [t if t.placements == placements else t.redistribute(mesh, placements) for t in tensors]


def _mask_block(mask: Any, spec: Any) -> Any:
    """This rank's part of an attention mask for queries laid out as ``spec`` (None for no
    mask); ``_NOT_LOCAL`` when it cannot be cut here. Over each mesh dimension the mask is split
    as the queries are, or replicated (then cut here where the queries are split and the mask
    is not broadcast along that dim)."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if mask is None:
        return None
    lead = 4 - mask.dim()
    if type(mask) is DTensor:
        if mask._spec.mesh is not spec.mesh:  # noqa: SLF001
            return _NOT_LOCAL
        whole = [mp if mp.is_replicate() or (mp == qp and lead == 0) else Replicate()
                 for qp, mp in zip(spec.placements, mask.placements, strict=True)]  # fmt: skip
        if tuple(whole) != tuple(mask.placements):
            # Split where the queries are not (a padding mask split by batch, the queries
            # gathered by a view before): gathered there (exact), then cut below as they are.
            mask = mask.redistribute(spec.mesh, whole)
        placements, local = mask.placements, mask._local_tensor  # noqa: SLF001
    elif type(mask) is torch.Tensor:
        placements, local = (Replicate(),) * spec.mesh.ndim, mask
    else:
        return _NOT_LOCAL
    for i, (qp, mp) in enumerate(zip(spec.placements, placements, strict=True)):
        if mp == qp and (not qp.is_shard() or lead == 0):
            continue  # split alike (or both replicated)
        if not mp.is_replicate():
            return _NOT_LOCAL
        md = qp.dim - lead if qp.is_shard() else -1
        if md < 0 or mask.shape[md] == 1:
            continue  # broadcast along the split dim: every rank uses all of it
        if mask.shape[md] != spec.shape[qp.dim]:
            return _NOT_LOCAL
        alone: list[Any] = [Replicate()] * spec.mesh.ndim
        alone[i] = Shard(md)
        shape, offset = compute_local_shape_and_global_offset(mask.shape, spec.mesh, alone)
        local = local.narrow(md, offset[md], shape[md])
    return local


_NOT_LOCAL: Any = object()


def _global_meta(func: Any, tensors: Sequence[Any], rest: tuple[Any, ...], kwargs: Any) -> Any:
    """The op's outputs on meta tensors of the global shapes (cached): their shapes and
    strides are the results' global ones."""
    import torch

    key = (func, tuple((tuple(t.shape), t.stride(), t.dtype) if t is not None else None
                       for t in tensors), rest, tuple(sorted(kwargs.items())))  # fmt: skip
    found = _attention_meta.get(key)
    if found is None:
        metas = [None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                 device="meta") for t in tensors]  # fmt: skip
        *positional, mask = metas
        out = func(*positional, *rest, attn_mask=mask, **kwargs)
        if len(_attention_meta) > 4096:
            _attention_meta.clear()
        found = _attention_meta[key] = [(o.shape, o.stride()) for o in out]
    return found


def _attention_args(args: Sequence[Any], kwargs: dict[str, Any], n: int) -> Any:
    """(tensors, dropout_p, is_causal, mask, scale) of the CPU attention op or its backward
    (``n`` leading tensors)."""
    tensors = list(args[:n])
    rest = list(args[n:])
    dropout = rest[0] if rest else kwargs.get("dropout_p", 0.0)
    causal = rest[1] if len(rest) > 1 else kwargs.get("is_causal", False)
    return tensors, dropout, causal, kwargs.get("attn_mask"), kwargs.get("scale")


def _laid_out(local: Any, stride: Sequence[int]) -> Any:
    """``local`` with its dims in memory in the order the global ``stride`` has them (a copy if
    they are not): the controller (and DTensor's later views) take the layout from the global
    strides, and the kernel's output on redistributed, contiguous inputs may have another."""
    import torch

    nd = local.dim()
    order = sorted(range(nd), key=lambda d: -stride[d])
    if [local.stride(d) for d in order] == sorted(local.stride(), reverse=True):
        return local
    inverse = [order.index(d) for d in range(nd)]
    out = torch.empty([local.shape[d] for d in order], dtype=local.dtype, device=local.device)
    out = out.permute(inverse)
    out.copy_(local)
    return out


def _attention(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    tensors, dropout, causal, mask, scale = _attention_args(args, kwargs, 3)
    aligned = _aligned(tensors) if dropout == 0.0 else None
    if aligned is None:
        return None
    spec = aligned[0]._spec  # noqa: SLF001
    local_mask = _mask_block(mask, spec)
    if local_mask is _NOT_LOCAL:
        return None
    locals_ = [t._local_tensor for t in aligned]  # noqa: SLF001
    out, lse = func(*locals_, 0.0, causal, attn_mask=local_mask, scale=scale)
    (oshape, ostride), (lshape, lstride) = _global_meta(
        func, [*tensors, mask], (0.0, causal), {"scale": scale}
    )
    return (
        as_dtensor(_laid_out(out, ostride), spec.mesh, spec.placements, oshape, ostride),
        as_dtensor(_laid_out(lse, lstride), spec.mesh, spec.placements, lshape, lstride),
    )


def _attention_backward(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    tensors, dropout, causal, mask, scale = _attention_args(args, kwargs, 6)
    # (query first: the others are placed as it is)
    aligned = _aligned([tensors[1], tensors[0], *tensors[2:]]) if dropout == 0.0 else None
    if aligned is None:
        return None
    aligned = [aligned[1], aligned[0], *aligned[2:]]
    spec = aligned[1]._spec  # noqa: SLF001
    local_mask = _mask_block(mask, spec)
    if local_mask is _NOT_LOCAL:
        return None
    locals_ = [t._local_tensor for t in aligned]  # noqa: SLF001
    grads = func(*locals_, 0.0, causal, attn_mask=local_mask, scale=scale)
    metas = _global_meta(func, [*tensors, mask], (0.0, causal), {"scale": scale})
    return tuple(
        as_dtensor(_laid_out(g, stride), spec.mesh, spec.placements, shape, stride)
        for g, (shape, stride) in zip(grads, metas, strict=True)
    )


ROUTES = {
    "aten._scaled_dot_product_flash_attention_for_cpu.default": _attention,
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": _attention_backward,
}

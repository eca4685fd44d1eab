"""The ranks' side of ``activate.py``: per-rank tensors. Each rank runs a torch factory
itself (``factory``), knows its own coordinate (``rank``) and joins the collectives that combine
a per-rank tensor over mesh dimensions (``reduce``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .aten import tensor_leaves

if TYPE_CHECKING:
    from .engine import _TensorEngine


def run_factory(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    import torch

    name, args, kwargs = payload
    kwargs = dict(kwargs, device=engine.device)
    return tensor_leaves(getattr(torch, name)(*engine.resolve(args), **engine.resolve(kwargs)))


def run_rank(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    import torch

    (dims,) = payload
    value = 0
    for d in dims:  # row-major position within the named dimensions
        value = value * engine.sizes[engine.labels.index(d)] + engine.coords[d]
    return [torch.tensor(value, dtype=torch.int64, device=engine.device)]


def run_reduce(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    import torch
    import torch.distributed as dist

    ref, dims, reduction, scatter = payload
    local = engine.resolve(ref)
    groups = [engine.mesh.get_group(d) for d in dims]
    if reduction == "stack":
        result = local.unsqueeze(0)
        for d, group in reversed(list(zip(dims, groups, strict=True))):
            n = engine.sizes[engine.labels.index(d)]
            parts = [torch.empty_like(result) for _ in range(n)]
            dist.all_gather(parts, result.contiguous(), group=group)
            result = torch.cat(parts, 0) if result is not local else torch.stack(parts)
        total = 1
        for d in dims:
            total *= engine.sizes[engine.labels.index(d)]
        result = result.reshape(total, *local.shape)
    else:
        op = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
              "min": dist.ReduceOp.MIN, "product": dist.ReduceOp.PRODUCT}[reduction]  # fmt: skip
        result = local.clone()
        for group in groups:
            dist.all_reduce(result, op=op, group=group)
        if reduction == "avg":
            n = 1
            for d in dims:
                n *= engine.sizes[engine.labels.index(d)]
            result = result / n
    if scatter:
        # Rank i (row-major within ``dims``) keeps chunk i of dim 0.
        index = 0
        for d in dims:
            index = index * engine.sizes[engine.labels.index(d)] + engine.coords[d]
        n = 1
        for d in dims:
            n *= engine.sizes[engine.labels.index(d)]
        result = result.chunk(n, 0)[index].clone()
    return [result]

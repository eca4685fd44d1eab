"""The worker's side of ``t.reduce(...)``: the collective each rank runs (controller/reduce.py
says what each kind means and checks the arguments).

Over one mesh dimension each kind is one collective of that dimension's process group; over
several, the elementwise kinds all-reduce one dimension after the other and ``"stack"``
all-gathers from the last given dimension to the first, so the stacked ranks come row-major in
the order the dimensions were given. ``"avg"`` is a sum divided here (gloo has no average).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .state import EngineState


def _op(reduction: str) -> Any:
    import torch.distributed as dist

    return {
        "sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT,
        "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND,
        "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR,
    }[reduction]  # fmt: skip


def run_reduce(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    ref, dims, reduction, scatter, view_id, inplace, into = payload
    local = engine.resolve(ref)
    view = engine.view(view_id)
    groups = [view.mesh.get_group(d) for d in dims]
    n = view.size(dims)
    if scatter:  # one dimension (the controller refuses several)
        result = _scatter(local, reduction, groups[0], n)
    elif reduction == "stack":
        result = _stack(local, dims, groups, view)
    else:
        result = _all_reduce(local, reduction, groups, n, inplace)
    if inplace:
        if result is not local:
            local.copy_(result)
        return [local]
    if into is not None:
        target = engine.resolve(into)
        target.copy_(result)
        return [target]
    return [result]


def _all_reduce(local: Any, reduction: str, groups: list[Any], n: int, inplace: bool) -> Any:
    import torch
    import torch.distributed as dist

    # In place when it can be (collectives need contiguous tensors), else on a copy.
    if inplace and local.is_contiguous():
        result = local
    else:
        result = local.clone(memory_format=torch.contiguous_format)
    op = _op(reduction)
    for group in groups:
        dist.all_reduce(result, op=op, group=group)
    if reduction == "avg":
        result.div_(n)
    return result


def _stack(local: Any, dims: Sequence[str], groups: list[Any], view: Any) -> Any:
    import torch
    import torch.distributed as dist

    shape = tuple(local.shape)
    result = local.reshape(1, *shape).contiguous()  # gloo gathers blocks along dim 0
    for d, group in reversed(list(zip(dims, groups, strict=True))):
        parts = torch.empty(
            (view.size((d,)) * result.shape[0], *shape), dtype=local.dtype, device=local.device
        )
        dist.all_gather_single(parts, result, group=group)
        result = parts
    return result


def _scatter(local: Any, reduction: str, group: Any, n: int) -> Any:
    import torch
    import torch.distributed as dist

    source = local.contiguous()
    if reduction == "stack":
        # All-to-all: row j of the result is row i (this rank's index) of rank j's tensor.
        result = torch.empty_like(source)
        dist.all_to_all_single(result, source, group=group)
        return result
    # Reduce-scatter: this rank keeps row i of the reduction (gloo wants it as a 1-row block).
    result = torch.empty((1, *source.shape[1:]), dtype=local.dtype, device=local.device)
    dist.reduce_scatter_single(result, source, op=_op(reduction), group=group)
    if reduction == "avg":
        result.div_(n)
    return result.reshape(source.shape[1:])

"""Losses on each rank's local shards (a route of ``shard_ops.py``).

- ``mse_loss`` and its backward on a sharded input and a target that is sharded alike or
  replicated (each rank takes its block): the local sum is a ``Partial`` sum over the sharded
  mesh dimensions. (DTensor's own rule for it gave wrong values, see aten.py.)
- ``nll_loss`` (``cross_entropy``) with mean reduction on a split batch: DTensor's rule (torch
  2.13) averages the ranks' means, which is wrong whenever their counts of counted targets
  differ (``ignore_index``, padding, class weights); it is computed here as the sum over the
  counted targets divided by their count, each summed over the ranks.
"""

from __future__ import annotations

from typing import Any

from .dtensors import (
    UNKNOWN,
    OutSpecs,
    dtensor_class,
    local_layout,
    partial_sum,
    plain_spec,
    size_of,
    spec_of,
    wrap,
)
from .lowered import NOT_TAKEN, computes_locally_as


def _block(target: Any, spec: Any) -> tuple[Any, tuple[tuple[int, int, int], ...]] | None:
    """``target``'s local block laid out as a value of ``spec`` (same global shape), as a
    tensor and the ``narrow``s that cut the block from it (``_local_block``): its own local
    tensor when its spec matches, a slice of it when it is replicated, or of a plain tensor (a
    controller constant: every rank holds all of it); else ``None``."""
    import torch
    from torch.distributed.tensor import DTensor

    if type(target) is DTensor:
        if target.shape != spec.shape:
            return None
        tspec = target._spec  # noqa: SLF001
        if tspec.mesh is not spec.mesh:
            return None
        if tspec.placements == spec.placements:
            return target._local_tensor, ()  # noqa: SLF001
        if not all(p.is_replicate() for p in tspec.placements):
            return None
        block = target._local_tensor  # noqa: SLF001
    elif type(target) is torch.Tensor and target.shape == spec.shape:
        block = target
    else:
        return None
    shape, offset = local_layout(spec)
    narrows = tuple(
        (dim, start, size)
        for dim, (start, size) in enumerate(zip(offset, shape, strict=True))
        if size != block.shape[dim]  # (a dim not split over the mesh needs no narrow)
    )
    return block, narrows


def _local_block(target: Any, narrows: tuple[tuple[int, int, int], ...]) -> Any:
    """The block ``_block`` found: ``target`` (a DTensor's local tensor, or a plain tensor) cut."""
    for dim, start, size in narrows:
        target = target.narrow(dim, start, size)
    return target


def _reduction(args: tuple[Any, ...], kwargs: dict[str, Any], position: int) -> Any:
    return args[position] if len(args) > position else kwargs.get("reduction", 1)


_LOSS_SPECS = OutSpecs()


def _mse_takes(args: tuple[Any, ...], kwargs: dict[str, Any], at: int) -> Any:
    """(x's spec, the target's tensor and narrows, the reduction) where ``_mse_loss`` (``at``
    0) or ``_mse_loss_backward`` (``at`` 1: the gradient first) takes the op; else None."""
    dtensor = dtensor_class()
    x = args[at]
    reduction = _reduction(args, kwargs, 2 + at)
    if type(x) is not dtensor or reduction not in (1, 2):
        return None
    spec = x._spec  # noqa: SLF001
    if not plain_spec(spec):
        return None
    if at == 1:
        grad = args[0]
        if type(grad) is not dtensor or grad.dim() != 0:
            return None
        if not all(p.is_replicate() for p in grad._spec.placements):  # noqa: SLF001
            return None
    found = _block(args[1 + at], spec)
    if found is None:
        return None
    return spec, found[0], found[1], reduction


def _mse_term(x: Any, block: Any, reduction: int, count: int) -> Any:
    """This rank's term of ``mse_loss``: the local sum of squares (one op), divided by the
    global count for a mean. What the route and its later, lowered runs both compute."""
    import torch

    total = torch.ops.aten.mse_loss.default._op(x, block, 2)  # noqa: SLF001  (reduction=sum)
    if reduction == 1:  # mean over the global tensor
        total.div_(count)
    return total


def _mse_loss_locally(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> Any:
    """``_mse_loss`` on the local tensors, for arguments laid out as these (a program's step)."""
    import math

    taken = _mse_takes(args, kwargs, 0)
    if taken is None:
        return NOT_TAKEN
    narrows, count = taken[2], math.prod(taken[0].shape)

    def local(x: Any, target: Any, reduction: int = 1) -> Any:
        return _mse_term(x, _local_block(target, narrows), reduction, count)

    return local


@computes_locally_as(_mse_loss_locally)
def _mse_loss(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The local sum of squares divided by the global count for a mean (``_mse_term``): a
    Partial sum over the split mesh dimensions."""
    import math

    taken = _mse_takes(args, kwargs, 0)
    if taken is None:
        return None
    spec, target, narrows, reduction = taken
    x = args[0]._local_tensor  # noqa: SLF001
    total = _mse_term(x, _local_block(target, narrows), reduction, math.prod(spec.shape))
    # (the sum's own dtype: a float64 target promotes a float32 input's)
    out = _LOSS_SPECS.get((spec,), total.dtype)
    if out is UNKNOWN:
        out = _LOSS_SPECS.put((spec,), total.dtype, _loss_spec(spec, total.dtype))
    return wrap(total, out)


def _loss_spec(spec: Any, dtype: Any) -> Any:
    """A 0-dim ``dtype`` loss of a value of plain ``spec``: summed over the split mesh dims."""
    from torch.distributed.tensor import Replicate

    placements = [partial_sum() if p.is_shard() else Replicate() for p in spec.placements]
    return spec_of(spec.mesh, placements, size_of(()), (), dtype)


def _mse_grad(backward: Any, grad: Any, x: Any, block: Any, reduction: int, count: int) -> Any:
    """``2 (x - target) grad`` on the local blocks, with ``grad / count`` for a mean. What the
    route and its later, lowered runs both compute."""
    scale = grad / count if reduction == 1 else grad
    return backward(scale, x, block, 2)  # reduction=sum: 2 (x - target) scale


def _mse_loss_backward_locally(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
) -> Any:
    """``_mse_loss_backward`` on the local tensors, for arguments laid out as these, where it
    gave ``result`` (it declines a result laid out or typed unlike the input)."""
    import math

    taken = _mse_takes(args, kwargs, 1)
    if taken is None or type(result) is not dtensor_class() or result._spec is not taken[0]:  # noqa: SLF001
        return NOT_TAKEN  # (the route declines a result typed or laid out unlike the input)
    narrows, count = taken[2], math.prod(taken[0].shape)
    backward = func._op  # noqa: SLF001

    def local(grad: Any, x: Any, target: Any, reduction: int = 1) -> Any:
        return _mse_grad(backward, grad, x, _local_block(target, narrows), reduction, count)

    return local


@computes_locally_as(_mse_loss_backward_locally)
def _mse_loss_backward(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``_mse_grad`` on the local blocks, where the loss's gradient is replicated."""
    import math

    taken = _mse_takes(args, kwargs, 1)
    if taken is None:
        return None
    spec, target, narrows, reduction = taken
    local = args[1]._local_tensor  # noqa: SLF001
    grad = args[0]._local_tensor  # noqa: SLF001
    block = _local_block(target, narrows)
    out = _mse_grad(func._op, grad, local, block, reduction, math.prod(spec.shape))  # noqa: SLF001
    if out.dtype != local.dtype or out.stride() != local.stride():
        return None
    return wrap(out, spec)


def _nll_loss_mean(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Mean ``nll_loss`` of a DTensor whose batch is split: the summed loss and the summed
    weight of the counted targets, both made whole (all-reduced), then divided."""
    from torch.distributed.tensor import DTensor, Replicate

    x = args[0]
    reduction = args[3] if len(args) > 3 else kwargs.get("reduction", 1)
    if type(x) is not DTensor or reduction != 1 or kwargs:
        return None
    split = [a for a in args[:3] if type(a) is DTensor and any(p.is_shard() for p in a.placements)]
    if not split:
        return None  # nothing split: DTensor's mean is the mean
    local = _nll_loss_on_rows(func, args)
    if local is not None:
        return local
    total, weight = func(*args[:3], 2, *args[4:])  # reduction=sum: partial sums, exact
    whole = [Replicate()] * x.device_mesh.ndim
    total = total.redistribute(x.device_mesh, whole)
    weight = weight.redistribute(x.device_mesh, whole)
    return total / weight, weight


_MEAN_SPECS = OutSpecs()


def _nll_loss_on_rows(func: Any, args: tuple[Any, ...]) -> Any:
    """``_nll_loss_mean`` for an input and targets split alike by rows over one mesh dim (no
    class weights): the local sums, both summed over that dim in one all-reduce, divided.
    The sums DTensor's way gives, with one collective rather than two and no DTensor
    dispatch; None for any other layout."""
    import torch
    import torch.distributed as dist

    x, target, weight = args[0], args[1], args[2]
    if type(target) is not type(x) or weight is not None:
        return None
    spec, target_spec = x._spec, target._spec  # noqa: SLF001
    out = _MEAN_SPECS.get((spec, target_spec))
    if out is UNKNOWN:
        out = _MEAN_SPECS.put((spec, target_spec), None, _mean_specs(spec, target_spec))
    if out is None:
        return None
    group, loss_spec = out
    total, counted = func(x._local_tensor, target._local_tensor, None, 2, *args[4:])  # noqa: SLF001
    both = torch.stack([total, counted])
    dist.all_reduce(both, group=group)
    return wrap(both[0] / both[1], loss_spec), wrap(both[1], loss_spec)


def _mean_specs(spec: Any, target_spec: Any) -> tuple[Any, Any] | None:
    """(the process group of the mesh dim the rows are split over, the spec of the whole loss
    and count), or None unless ``spec`` (an input's) and ``target_spec`` split their rows over
    that dim alone."""
    from torch.distributed.tensor import Replicate, Shard

    if target_spec.mesh is not spec.mesh or target_spec.placements != spec.placements:
        return None
    split = [d for d, p in enumerate(spec.placements) if p != Replicate()]
    if len(split) != 1 or spec.placements[split[0]] != Shard(0) or spec.ndim != 2:
        return None
    whole = [Replicate()] * spec.mesh.ndim
    return spec.mesh.get_group(split[0]), spec_of(
        spec.mesh, whole, size_of(()), (), spec.tensor_meta.dtype
    )


ROUTES = {
    "aten.mse_loss.default": _mse_loss,
    "aten.mse_loss_backward.default": _mse_loss_backward,
    "aten.nll_loss_forward.default": _nll_loss_mean,
    "aten.nll_loss2d_forward.default": _nll_loss_mean,
}

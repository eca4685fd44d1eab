"""Ops on a batch split over dim 0, on each rank's rows (a route of ``shard_ops.py``).

- ``native_batch_norm`` and its backward: the statistics are summed over the ranks (one
  all-reduce each), so they are the whole batch's, and the running statistics are updated in
  place. DTensor's rule (torch 2.13) wants the channels split, so it redistributes the running
  statistics and the op updates its copies: the forward was right and the running statistics
  never moved.
- ``convolution_backward`` with the weight replicated: per sample and linear in the output's
  gradient, so each rank's blocks give the input's gradient and a ``Partial`` sum of the
  weight's and bias's (DTensor's handler, torch 2.14 on a 2-D mesh, fails on the bias's
  placements).
- ``_transformer_encoder_layer_fwd`` (``nn.TransformerEncoderLayer``'s inference path): per
  sample, so each rank's rows with the weights whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .dtensors import as_dtensor, local_layout, partial_sum

# -- batch norm -------------------------------------------------------------------------------


def _batch_split(spec: Any) -> list[int] | None:
    """Mesh dims that split dim 0 of a batch laid out as ``spec`` (the rest replicated), or None
    for any other layout."""
    dims = []
    for i, p in enumerate(spec.placements):
        if p.is_shard(0) and type(p).__name__ == "Shard":
            dims.append(i)
        elif not p.is_replicate():
            return None
    return dims


def _whole_locals(tensors: Sequence[Any], mesh: Any) -> list[Any] | None:
    """The local tensors of replicated DTensors (None stays None); None if any is not one."""
    from torch.distributed.tensor import DTensor

    out: list[Any] = []
    for t in tensors:
        if t is None:
            out.append(None)
        elif (
            type(t) is DTensor
            and t.device_mesh is mesh
            and all(p.is_replicate() for p in t.placements)
        ):
            out.append(t._local_tensor)  # noqa: SLF001
        else:
            return None
    return out


def _sum_over(t: Any, mesh: Any, dims: list[int]) -> Any:
    import torch.distributed as dist

    for d in dims:
        dist.all_reduce(t, group=mesh.get_group(d))
    return t


def _channels(t: Any, ndim: int) -> Any:
    return t.reshape([1, -1] + [1] * (ndim - 2))


def _batch_norm(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    import torch
    from torch.distributed.tensor import DTensor, Replicate

    if kwargs or len(args) != 8 or type(args[0]) is not DTensor:
        return None
    x, weight, bias, rmean, rvar, training, momentum, eps = args
    spec = x._spec  # noqa: SLF001
    split = _batch_split(spec)
    others = _whole_locals((weight, bias, rmean, rvar), spec.mesh)
    if split is None or others is None or x.dim() < 2:
        return None
    w, b, rm, rv = others
    local = x._local_tensor  # noqa: SLF001
    whole = [Replicate()] * spec.mesh.ndim
    if not training or not split:  # per sample, or the whole batch here: the op is exact
        out, mean, invstd = func(local, w, b, rm, rv, training, momentum, eps)
    else:
        dims = [0, *range(2, local.dim())]
        count = local.numel() // local.shape[1]
        sums = _sum_over(torch.cat([local.sum(dims), local.new_tensor([count])]), spec.mesh, split)
        n = sums[-1]
        mean = sums[:-1] / n
        centered = local - _channels(mean, local.dim())
        var = _sum_over((centered * centered).sum(dims), spec.mesh, split) / n
        invstd = torch.rsqrt(var + eps)
        out = centered * _channels(invstd, local.dim())
        if w is not None:
            out = out * _channels(w, local.dim())
        if b is not None:
            out = out + _channels(b, local.dim())
        if rm is not None:
            rm.mul_(1 - momentum).add_(mean, alpha=momentum)
        if rv is not None:
            rv.mul_(1 - momentum).add_(var * (n / (n - 1)), alpha=momentum)
    return (
        as_dtensor(out, spec.mesh, spec.placements, spec.shape, spec.stride),
        as_dtensor(mean, spec.mesh, whole),
        as_dtensor(invstd, spec.mesh, whole),
    )


def _batch_norm_backward(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    import math

    import torch
    from torch.distributed.tensor import DTensor, Replicate

    if kwargs or len(args) != 10 or type(args[0]) is not DTensor or type(args[1]) is not DTensor:
        return None
    grad, x, weight, rmean, rvar, smean, sinvstd, train, eps, mask = args
    spec = x._spec  # noqa: SLF001
    split = _batch_split(spec)
    if split is None or grad._spec.placements != spec.placements or x.dim() < 2:  # noqa: SLF001
        return None
    others = _whole_locals((weight, rmean, rvar, smean, sinvstd), spec.mesh)
    if others is None:
        return None
    w, rm, rv, sm, si = others
    g, local = grad._local_tensor, x._local_tensor  # noqa: SLF001
    whole = [Replicate()] * spec.mesh.ndim
    nd = local.dim()
    dims = [0, *range(2, nd)]
    if train:
        mean, invstd = sm, si
    else:
        mean, invstd = rm, torch.rsqrt(rv + eps)
    xhat = (local - _channels(mean, nd)) * _channels(invstd, nd)
    sums = _sum_over(torch.cat([g.sum(dims), (g * xhat).sum(dims)]), spec.mesh, split)
    sum_g, sum_gx = sums.chunk(2)
    scale = invstd if w is None else invstd * w
    grad_in = None
    if mask[0]:
        if train:
            n = math.prod(spec.shape) // spec.shape[1]
            grad_in = _channels(scale / n, nd) * (
                n * g - _channels(sum_g, nd) - xhat * _channels(sum_gx, nd)
            )
        else:
            grad_in = g * _channels(scale, nd)
    whole_grad = None
    if grad_in is not None:
        whole_grad = as_dtensor(grad_in, spec.mesh, spec.placements, spec.shape, spec.stride)
    return (
        whole_grad,
        as_dtensor(sum_gx.clone(), spec.mesh, whole) if mask[1] else None,
        as_dtensor(sum_g.clone(), spec.mesh, whole) if mask[2] else None,
    )


# -- convolution's backward ------------------------------------------------------------------


def _convolution_backward(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A convolution's backward on a batch split over dim 0 with the weight replicated (a
    data-parallel conv net): per sample, and linear in the output's gradient, so each rank's
    blocks give the gradients' blocks. Per mesh dim: the batch split gives the input's gradient
    split alike and a ``Partial`` sum of the weight's and bias's (an output gradient that is
    whole there gives each rank its rows first); an output gradient that is a ``Partial`` sum (a
    tensor-parallel layer after the convolution) gives ``Partial`` sums of all three. DTensor's
    own handler (torch 2.14, a 2-D mesh) fails on the bias gradient's placements ("mixes None
    with placements across mesh dims")."""
    from torch.distributed.tensor import DTensor, Shard

    if kwargs or len(args) != 11 or type(args[0]) is not DTensor or type(args[1]) is not DTensor:
        return None
    grad, x, weight, bias_sizes, stride, padding, dilation, transposed, out_pad, groups, mask = args
    spec = x._spec  # noqa: SLF001
    whole = _whole_locals((weight,), spec.mesh)
    if whole is None or grad.device_mesh is not spec.mesh:
        return None
    summed = partial_sum()
    input_grad, param_grad, whole_rows = [], [], []
    for px, pg in zip(spec.placements, grad.placements, strict=True):
        if type(px) is Shard and px.dim == 0 and (pg.is_replicate() or pg == px):
            input_grad.append(px)
            param_grad.append(summed)
            whole_rows.append(pg.is_replicate())
        elif px.is_replicate() and (pg.is_replicate() or pg == summed):
            input_grad.append(pg)
            param_grad.append(pg)
        else:
            return None
    g_out = grad._local_tensor  # noqa: SLF001
    if any(whole_rows):  # the gradient's rows are whole on this rank: take the batch's own
        if not all(whole_rows):
            return None
        x_rows = x._local_tensor.shape[0]  # noqa: SLF001
        g_out = g_out.narrow(0, int(local_layout(spec)[1][0]), x_rows)
    g_in, g_w, g_b = func(
        g_out, x._local_tensor, whole[0], bias_sizes, stride, padding,  # noqa: SLF001
        dilation, transposed, out_pad, groups, mask,
    )  # fmt: skip
    mesh = spec.mesh
    return (
        None if g_in is None else as_dtensor(g_in, mesh, input_grad, spec.shape, spec.stride),
        None if g_w is None else as_dtensor(g_w, mesh, param_grad),
        None if g_b is None else as_dtensor(g_b, mesh, param_grad),
    )


# -- torch's fused encoder layer (nn.TransformerEncoderLayer in eval) ------------------------------


def _whole(t: Any) -> Any:
    """The whole value of a DTensor as a local tensor (replicated first if it is not)."""
    from torch.distributed.tensor import DTensor, Replicate

    if type(t) is not DTensor:
        return t
    if not all(p.is_replicate() for p in t.placements):
        t = t.redistribute(t.device_mesh, [Replicate()] * t.device_mesh.ndim)
    return t._local_tensor  # noqa: SLF001


def _encoder_layer(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``_transformer_encoder_layer_fwd`` (the layer's fused inference path), which DTensor has
    no rule for: each sample of the batch is computed on its own, so on a batch split over dim
    0 it is the op on each rank's rows with the weights whole (gathered if split) and a batch-
    shaped mask (key padding: mask_type 1, merged: 2) cut to the same rows."""
    import torch
    from torch.distributed.tensor import DTensor

    x = args[0]
    if type(x) is not DTensor or len(args) < 18:
        return None
    spec = x._spec  # noqa: SLF001
    if _batch_split(spec) is None:
        return None
    kwargs = dict(kwargs)
    mask = args[18] if len(args) > 18 else kwargs.pop("mask", None)
    mask_type = args[19] if len(args) > 19 else kwargs.pop("mask_type", None)
    local = x._local_tensor  # noqa: SLF001
    if mask is not None:
        batch_shaped = mask_type in (1, 2)
        if batch_shaped and type(mask) is DTensor and mask.placements == spec.placements:
            mask = mask._local_tensor  # noqa: SLF001
        elif batch_shaped:
            from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

            shape, offset = compute_local_shape_and_global_offset(
                spec.shape, spec.mesh, spec.placements
            )
            mask = _whole(mask).narrow(0, offset[0], shape[0])
        else:
            mask = _whole(mask)
    rest = [_whole(a) if isinstance(a, torch.Tensor) else a for a in args[1:18]]
    out = func(local, *rest, mask, mask_type, **kwargs)
    return as_dtensor(out, spec.mesh, spec.placements, spec.shape, spec.stride)


ROUTES = {
    "aten.native_batch_norm.default": _batch_norm,
    "aten.native_batch_norm_backward.default": _batch_norm_backward,
    "aten.convolution_backward.default": _convolution_backward,
    "aten._transformer_encoder_layer_fwd.default": _encoder_layer,
}

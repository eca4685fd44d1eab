"""Ops the engine runs on each rank's local shard, skipping DTensor's dispatch.

DTensor works out each op's output placements in Python (sharding propagation): on a CPU that
costs 50-300 µs per op, many times the op itself, and an optimizer step is dozens of small ops.
Where the answer is known without it, the engine runs the op on the local tensors and wraps the
result with the spec it must have:

- pointwise ops whose DTensor inputs share one mesh, shape and placements (none ``Partial``):
  the op on each rank's shards is the op (AdamW's steps, activations, scaling), where torch
  lays out the whole result as the first input (``layout_kept``: not so for a tensor that is
  not dense, such as a slice of a wider one);
- ``detach``/``alias`` and ``*_like`` factories: the input's spec;
- ``mse_loss`` and its backward on a sharded input and a target that is sharded alike or
  replicated (each rank takes its block): the local sum is a ``Partial`` sum over the sharded
  mesh dimensions. (DTensor's own rule for it gave wrong values, see aten.py.)
- a linear layer's ops on plain placements (Shard, Replicate; Partial where the op keeps a
  sum a sum): ``t``, ``mm``, ``addmm`` (the batch split over rows, the weights replicated, or a
  weight gradient's contraction over the split batch giving a ``Partial`` sum) and
  ``sum.dim_IntList``, and ``view`` of a tensor split over no dimension or by rows
  (``shard_views.py``); each placement the result gets is the one DTensor's rule gives.
- elementwise ``_foreach_`` ops (an optimizer's foreach update), position by position as
  pointwise ops are (``shard_foreach.py``);
- ``cat`` with 1-D empty tensors among others, which torch skips and DTensor does not: left out.
- ``nll_loss`` (``cross_entropy``) with mean reduction on a split batch: DTensor's rule (torch
  2.13) averages the ranks' means, which is wrong whenever their counts of counted targets
  differ (``ignore_index``, padding, class weights); it is computed here as the sum over the
  counted targets divided by their count, each summed over the ranks.
- ``native_batch_norm`` and its backward on a batch split over dim 0: the statistics are
  summed over the ranks (one all-reduce each), so they are the whole batch's, and the running
  statistics are updated in place. DTensor's rule (torch 2.13) wants the channels split, so it
  redistributes the running statistics and the op updates its copies: the forward was right
  and the running statistics never moved.
- ``convolution_backward`` on a batch split over dim 0 with the weight replicated: per sample
  and linear in the output's gradient, so each rank's blocks give the input's gradient and a
  ``Partial`` sum of the weight's and bias's (DTensor's handler, torch 2.14 on a 2-D mesh,
  fails on the bias's placements).
- ``_transformer_encoder_layer_fwd`` (``nn.TransformerEncoderLayer``'s inference path) on a
  batch split over dim 0: per sample, so each rank's rows with the weights whole.
- CPU attention (``scaled_dot_product_attention``'s CPU kernel and its backward), which DTensor
  has no rule for (torch 2.13): each (batch, head) attends within itself, so with query, key
  and value split alike over batch or heads only (dims 0 and 1; others are redistributed so,
  the sequence made whole) each rank's blocks are the op.

Each returns ``None`` when the op does not qualify, and DTensor runs it as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .dtensors import as_dtensor
from .shard_foreach import foreach_on_shards, is_elementwise, layout_kept, placed_alike
from .shard_views import view_rows

_pointwise: dict[Any, bool] = {}


def _is_pointwise(func: Any) -> bool:
    known = _pointwise.get(func)
    if known is None:
        import torch

        tags = func.tags  # random ops draw per rank: DTensor (or seeded_random) handles them
        known = torch.Tag.pointwise in tags and torch.Tag.nondeterministic_seeded not in tags
        _pointwise[func] = known
    return known


# (DTensor, torch._C.TensorBase), imported on the first op: the shard path runs for most ops of
# an optimizer step, and two imports per op cost more than some of the ops. Exact type checks
# against these: isinstance against torch.Tensor classes runs a Python __instancecheck__.
_classes: tuple[Any, Any] | None = None


def _import_classes() -> tuple[Any, Any]:
    global _classes
    import torch
    from torch.distributed.tensor import DTensor

    _classes = (DTensor, torch._C.TensorBase)  # noqa: SLF001  (the C base class)
    return _classes


def _pointwise_on_shards(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A pointwise op whose DTensor inputs share one mesh, shape and placements (none Partial)
    is the same op on each rank's shards: run it on the local tensors, and skip DTensor's
    sharding propagation (about 100 µs of Python per op on a CPU, several times the op).
    ``None`` when the op does not qualify (broadcasting, mixed placements, plain tensors, a
    result of another dtype or layout): then DTensor runs it."""
    DTensor, plain = _classes or _import_classes()
    first = first_local = None
    mixed = False  # DTensor inputs of different strides
    local_args = []
    for a in args:
        t = type(a)
        if t is DTensor:
            spec = a._spec  # noqa: SLF001  (DTensor's own fields: what from_local would build)
            if first is None:
                first, first_local = spec, a._local_tensor  # noqa: SLF001
                for p in spec.placements:
                    if p.is_partial():
                        return None
            elif spec is not first:
                if not placed_alike(spec, first):
                    return None
                mixed = mixed or spec.stride != first.stride
            local_args.append(a._local_tensor)  # noqa: SLF001
        elif t is list or t is tuple or issubclass(t, plain):
            return None
        else:
            local_args.append(a)
    if first is None or first_local is None:
        return None
    for v in kwargs.values():
        t = type(v)
        if t is list or t is tuple or issubclass(t, plain):
            return None
    out = func._op(*local_args, **kwargs)  # noqa: SLF001  (what OpOverload.__call__ calls)
    for a, local in zip(args, local_args, strict=True):
        if out is local:
            return a  # in place: the DTensor already holds this local tensor
    if (
        not issubclass(type(out), plain)
        or out.dtype != first.tensor_meta.dtype
        or out.stride() != first_local.stride()
        or out.shape != first_local.shape
        or not (_mixed_layout_kept(func, args, kwargs) if mixed else layout_kept(first))
    ):
        return None  # not the input's spec (and not in place, so DTensor may run it again)
    return DTensor.__new__(DTensor, out, first, requires_grad=False)  # see as_dtensor


_mixed_kept: dict[Any, bool] = {}


def _mixed_layout_kept(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """``layout_kept`` for an op on DTensors laid out differently (a residual added to a
    transposed tensor): whether torch lays out the whole result as the first input, worked out
    on meta tensors of the global shapes and strides (cached per op and specs)."""
    import torch

    DTensor, _ = _classes or _import_classes()
    specs = tuple(a._spec for a in args if type(a) is DTensor)  # noqa: SLF001
    key = (func, specs)
    known = _mixed_kept.get(key)
    if known is None:
        metas = [
            torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
            if type(a) is DTensor
            else a
            for a in args
        ]
        out = func(*metas, **kwargs)
        if len(_mixed_kept) > 4096:
            _mixed_kept.clear()
        known = _mixed_kept[key] = tuple(out.stride()) == tuple(specs[0].stride)
    return known


def on_shards(name: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The op's result computed on local shards, or ``None`` (then DTensor runs it)."""
    special = _SPECIAL.get(name)
    if special is not None:
        return special(func, args, kwargs)
    if _is_pointwise(func):
        return _pointwise_on_shards(func, args, kwargs)
    if is_elementwise(name):
        return foreach_on_shards(func, args, kwargs)
    return None


def route_for(name: str, func: Any) -> Any:
    """The function ``on_shards`` calls for this op (``None``: DTensor runs it): what a
    program's step calls directly (programs.py)."""
    special = _SPECIAL.get(name)
    if special is not None:
        return special
    if _is_pointwise(func):
        return _pointwise_on_shards
    if is_elementwise(name):
        return foreach_on_shards
    return None


def _plain_spec(spec: Any) -> bool:
    """Only Shard and Replicate placements (no Partial, no strided shards)."""
    from torch.distributed.tensor import Replicate, Shard

    return all(type(p) is Shard or type(p) is Replicate for p in spec.placements)


def _same_spec(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    from torch.distributed.tensor import DTensor

    x = args[0]
    if type(x) is not DTensor or len(args) != 1 or kwargs:
        return None
    return DTensor.__new__(DTensor, func(x._local_tensor), x._spec, requires_grad=False)  # noqa: SLF001


def _like(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    import torch
    from torch.distributed.tensor import DTensor

    x = args[0]
    if type(x) is not DTensor or len(args) != 1:
        return None
    spec = _without_partial(x._spec)  # noqa: SLF001
    if spec is None:
        return None
    local = x._local_tensor  # noqa: SLF001
    for k, v in kwargs.items():
        # What autograd passes for a gradient seed (ones_like(loss, dtype=..., device=...)):
        # the input's own dtype, layout and device (on the controller: the workers' kind).
        if v is None or (k == "memory_format" and v is torch.preserve_format):
            continue
        if (k == "dtype" and v == local.dtype) or (k == "layout" and v == torch.strided):
            continue
        if (k == "device" and torch.device(v).type == local.device.type) or (
            k == "pin_memory" and v is False
        ):
            continue
        return None
    out = func(local)
    if out.stride() != local.stride() or not layout_kept(spec, like=True):
        return None
    return DTensor.__new__(DTensor, out, spec, requires_grad=False)


_replicated: dict[int, tuple[Any, Any]] = {}


def _without_partial(spec: Any) -> Any:
    """``spec`` with each ``Partial`` placement made ``Replicate`` (a ``*_like`` factory's
    result does not depend on the input's values, so every rank holds all of it: the gradient
    seed ``ones_like(loss)`` of a loss that is a partial sum needs no all-reduce); ``None`` for
    strided shards. Cached per spec object (the engine reuses specs, see ``as_dtensor``)."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    found = _replicated.get(id(spec))
    if found is not None and found[0] is spec:
        return found[1]
    placements = spec.placements
    if not all(type(p) is Shard or type(p) is Replicate or isinstance(p, Partial)
               for p in placements):  # fmt: skip
        out = None
    elif not any(isinstance(p, Partial) for p in placements):
        out = spec
    else:
        new = tuple(Replicate() if isinstance(p, Partial) else p for p in placements)
        out = DTensorSpec(spec.mesh, new, tensor_meta=spec.tensor_meta)
    if len(_replicated) > 4096:
        _replicated.clear()
    _replicated[id(spec)] = (spec, out)  # holding spec keeps its id from being reused
    return out


# id(spec) -> (spec, this rank's local shape and global offset): DTensor computes them in Python
# (tens of µs), and a training loop's loss asks for the same spec every step.
_blocks: dict[int, tuple[Any, Any]] = {}


def _local_layout(spec: Any) -> Any:
    """This rank's local shape and global offset of a value laid out as ``spec`` (cached)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    found = _blocks.get(id(spec))
    if found is None or found[0] is not spec:
        if len(_blocks) > 4096:
            _blocks.clear()
        found = _blocks[id(spec)] = (spec, compute_local_shape_and_global_offset(
            spec.shape, spec.mesh, spec.placements))  # fmt: skip
    return found[1]


def _block(target: Any, spec: Any) -> Any:
    """``target``'s local block laid out as a value of ``spec`` (same global shape): its own
    local tensor when its spec matches, its slice when it is replicated or a plain tensor (a
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
            return target._local_tensor  # noqa: SLF001
        if not all(p.is_replicate() for p in tspec.placements):
            return None
        block = target._local_tensor  # noqa: SLF001
    elif type(target) is torch.Tensor and target.shape == spec.shape:
        block = target
    else:
        return None
    shape, offset = _local_layout(spec)
    for dim, (start, size) in enumerate(zip(offset, shape, strict=True)):
        if size != block.shape[dim]:  # (a dim not split over the mesh needs no narrow)
            block = block.narrow(dim, start, size)
    return block


def _reduction(args: tuple[Any, ...], kwargs: dict[str, Any], position: int) -> Any:
    return args[position] if len(args) > position else kwargs.get("reduction", 1)


def _mse_loss(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    import math

    from torch.distributed.tensor import DTensor, Partial, Replicate

    x = args[0]
    reduction = _reduction(args, kwargs, 2)
    if type(x) is not DTensor or reduction not in (1, 2) or not _plain_spec(x._spec):  # noqa: SLF001
        return None
    spec = x._spec  # noqa: SLF001
    target = _block(args[1], spec)
    if target is None:
        return None
    diff = x._local_tensor - target  # noqa: SLF001
    total = (diff * diff).sum()
    if reduction == 1:  # mean over the global tensor
        total = total / math.prod(spec.shape)
    placements = [Partial("sum") if p.is_shard() else Replicate() for p in spec.placements]
    return as_dtensor(total, spec.mesh, placements, (), ())


def _mse_loss_backward(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    import math

    from torch.distributed.tensor import DTensor

    grad, x = args[0], args[1]
    reduction = _reduction(args, kwargs, 3)
    if type(x) is not DTensor or type(grad) is not DTensor or reduction not in (1, 2):
        return None
    spec = x._spec  # noqa: SLF001
    if (
        not _plain_spec(spec)
        or grad.dim() != 0
        or not all(
            p.is_replicate()
            for p in grad._spec.placements  # noqa: SLF001
        )
    ):
        return None
    target = _block(args[2], spec)
    if target is None:
        return None
    local = x._local_tensor  # noqa: SLF001
    scale = 2 * grad._local_tensor  # noqa: SLF001
    if reduction == 1:
        scale = scale / math.prod(spec.shape)
    out = (local - target) * scale
    if out.dtype != local.dtype or out.stride() != local.stride():
        return None
    return DTensor.__new__(DTensor, out, spec, requires_grad=False)


# Ops whose shard path takes a controller tensor (a loss's target) as it is: run_aten tries it
# before making such arguments Replicate DTensors.
TAKES_CONSTANTS = frozenset({"aten.mse_loss.default", "aten.mse_loss_backward.default"})

# -- a linear layer -------------------------------------------------------------------------------

_SUM: Any = None


def _partial_sum() -> Any:
    global _SUM
    if _SUM is None:
        from torch.distributed.tensor import Partial

        _SUM = Partial("sum")
    return _SUM


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
            out.append(_partial_sum())
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
                placements.append(_partial_sum())
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


# -- nll_loss -----------------------------------------------------------------------------------


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
    total, weight = func(*args[:3], 2, *args[4:])  # reduction=sum: partial sums, exact
    whole = [Replicate()] * x.device_mesh.ndim
    total = total.redistribute(x.device_mesh, whole)
    weight = weight.redistribute(x.device_mesh, whole)
    return total / weight, weight


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
    summed = _partial_sum()
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
        g_out = g_out.narrow(0, int(_local_layout(spec)[1][0]), x_rows)
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


# -- attention on the CPU -------------------------------------------------------------------------

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


_SPECIAL = {
    "aten._transformer_encoder_layer_fwd.default": _encoder_layer,
    "aten.native_batch_norm.default": _batch_norm,
    "aten.native_batch_norm_backward.default": _batch_norm_backward,
    "aten.convolution_backward.default": _convolution_backward,
    "aten.t.default": _transpose,
    "aten.mm.default": _mm,
    "aten.addmm.default": _addmm,
    "aten.sum.dim_IntList": _sum_dims,
    "aten.view.default": _view,
    "aten._unsafe_view.default": _view,
    "aten.cat.default": _cat_skipping_empty,
    "aten.nll_loss_forward.default": _nll_loss_mean,
    "aten.nll_loss2d_forward.default": _nll_loss_mean,
    "aten._scaled_dot_product_flash_attention_for_cpu.default": _attention,
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": _attention_backward,
    "aten.detach.default": _same_spec,
    "aten.alias.default": _same_spec,
    "aten.ones_like.default": _like,
    "aten.zeros_like.default": _like,
    "aten.empty_like.default": _like,
    "aten.mse_loss.default": _mse_loss,
    "aten.mse_loss_backward.default": _mse_loss_backward,
}

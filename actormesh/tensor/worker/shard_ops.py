"""Ops the engine runs on each rank's local shard, skipping DTensor's dispatch.

DTensor works out each op's output placements in Python (sharding propagation): on a CPU that
costs 50-300 µs per op, many times the op itself, and an optimizer step is dozens of small ops.
Where the answer is known without it, the engine runs the op on the local tensors and wraps the
result with the spec it must have:

- pointwise ops whose DTensor inputs share one mesh, shape and placements (none ``Partial``):
  the op on each rank's shards is the op (AdamW's steps, activations, scaling);
- ``detach``/``alias`` and ``*_like`` factories: the input's spec;
- ``mse_loss`` and its backward on a sharded input and a target that is sharded alike or
  replicated (each rank takes its block): the local sum is a ``Partial`` sum over the sharded
  mesh dimensions. (DTensor's own rule for it gave wrong values, see aten.py.)

Each returns ``None`` when the op does not qualify, and DTensor runs it as before.
"""

from __future__ import annotations

from typing import Any

_specs: dict[Any, Any] = {}


def as_dtensor(
    local: Any, mesh: Any, placements: Any, shape: Any = None, stride: Any = None
) -> Any:
    """``DTensor.from_local(local, ..., run_check=False)`` without autograd (the engine runs
    under no_grad) and with its spec cached: from_local costs 140 µs of Python on a CPU, this
    about 5. ``shape``/``stride``: the global ones (default: the local ones, as for Replicate)."""
    import torch
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    shape = local.shape if shape is None else torch.Size(shape)
    stride = local.stride() if stride is None else tuple(stride)
    key = (id(mesh), tuple(placements), shape, stride, local.dtype)
    spec = _specs.get(key)
    if spec is None or spec.mesh is not mesh:
        if len(_specs) > 4096:
            _specs.clear()
        spec = _specs[key] = DTensorSpec(
            mesh, tuple(placements), tensor_meta=TensorMeta(shape, stride, local.dtype)
        )
    # DTensor.__new__ is torch's C constructor; DTensor(...) adds a decorated no-op __init__.
    return DTensor.__new__(DTensor, local, spec, requires_grad=False)


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
            elif spec is not first and (
                spec.mesh is not first.mesh
                or spec.placements != first.placements
                or spec.shape != first.shape
            ):
                return None
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
    ):
        return None  # not the input's spec (and not in place, so DTensor may run it again)
    return DTensor.__new__(DTensor, out, first, requires_grad=False)  # see as_dtensor


def on_shards(name: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The op's result computed on local shards, or ``None`` (then DTensor runs it)."""
    special = _SPECIAL.get(name)
    if special is not None:
        return special(func, args, kwargs)
    if _is_pointwise(func):
        return _pointwise_on_shards(func, args, kwargs)
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
    if out.stride() != local.stride():
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


def _block(target: Any, spec: Any) -> Any:
    """``target``'s local block laid out as a value of ``spec`` (same global shape): its own
    local tensor when its spec matches, its slice when it is replicated or a plain tensor (a
    controller constant: every rank holds all of it); else ``None``."""
    import torch
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

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
    found = _blocks.get(id(spec))
    if found is None or found[0] is not spec:
        if len(_blocks) > 4096:
            _blocks.clear()
        found = _blocks[id(spec)] = (spec, compute_local_shape_and_global_offset(
            spec.shape, spec.mesh, spec.placements))  # fmt: skip
    shape, offset = found[1]
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

_SPECIAL = {
    "aten.detach.default": _same_spec,
    "aten.alias.default": _same_spec,
    "aten.ones_like.default": _like,
    "aten.zeros_like.default": _like,
    "aten.empty_like.default": _like,
    "aten.mse_loss.default": _mse_loss,
    "aten.mse_loss_backward.default": _mse_loss_backward,
}

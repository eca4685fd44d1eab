"""Ops the engine runs on each rank's local shard, skipping DTensor's dispatch: the routes.

DTensor works out each op's output placements in Python (sharding propagation): on a CPU that
costs 50-300 µs per op, many times the op itself, and an optimizer step is dozens of small ops.
Where the answer is known without it, the engine runs the op on the local tensors and wraps the
result with the spec it must have. ``on_shards`` picks the route for an op; the routes, by the
family of op they take:

- here: pointwise ops whose DTensor inputs share one mesh, shape and placements (none
  ``Partial``): the op on each rank's shards is the op (AdamW's steps, activations, scaling),
  where torch lays out the whole result as the first input (``layout_kept``: not so for a
  tensor that is not dense, such as a slice of a wider one); ``detach``/``alias`` and
  ``*_like`` factories: the input's spec;
- ``shard_foreach.py``: elementwise ``_foreach_`` ops (an optimizer's foreach update), position
  by position as pointwise ops are;
- ``shard_linear.py``: a linear layer's ops (``t``, ``mm``, ``addmm``, ``sum``, ``view``; the
  views of a batch split by rows in ``shard_views.py``), and ``cat`` with empty tensors;
- ``shard_losses.py``: ``mse_loss`` and its backward, ``nll_loss`` with mean reduction;
- ``shard_batch.py``: ops on a batch split over dim 0 (batch norm, a convolution's backward,
  torch's fused encoder layer);
- ``shard_attention.py``: CPU attention and its backward;
- ``shard_rows.py``: ops that leave dim 0 alone on a batch split by rows (transposes, slices,
  splits and views per head, ``layer_norm`` and its backward, ``cat``, ``log_softmax``);
- ``shard_row_masks.py``: ops that keep a batch's rows combined with replicated values (a
  pointwise op broadcasting them, a padding mask indexed at each row, ``expand``);
- ``shard_partials.py``: ops linear in a partial sum (``add`` of two gradients, the position
  embedding's backward);
- ``shard_replicas.py``: any op whose DTensor inputs are all replicated, where the routes above
  do not take it (an attention mask built from replicated constants).

Each returns ``None`` when the op does not qualify, and DTensor runs it as before.
"""

from __future__ import annotations

from typing import Any

from . import (
    shard_attention,
    shard_batch,
    shard_linear,
    shard_losses,
    shard_partials,
    shard_row_masks,
    shard_rows,
)
from .dtensors import UNKNOWN, OutSpecs, dtensor_class, spec_of, torch_classes, wrap
from .lowered import (
    NOT_TAKEN,
    computes_locally_as,
    computes_on_locals,
    first_else,
    takes_view_sizes,
)
from .shard_foreach import ROUTES as FOREACH_ROUTES
from .shard_foreach import foreach_on_shards, is_elementwise, layout_kept, placed_alike
from .shard_replicas import on_replicas

_pointwise: dict[Any, bool] = {}


def _is_pointwise(func: Any) -> bool:
    known = _pointwise.get(func)
    if known is None:
        import torch

        tags = func.tags  # random ops draw per rank: DTensor (or seeded_random) handles them
        known = torch.Tag.pointwise in tags and torch.Tag.nondeterministic_seeded not in tags
        _pointwise[func] = known
    return known


@computes_on_locals
def _pointwise_on_shards(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A pointwise op whose DTensor inputs share one mesh, shape and placements (none Partial)
    is the same op on each rank's shards: run it on the local tensors, and skip DTensor's
    sharding propagation (about 100 µs of Python per op on a CPU, several times the op).
    ``None`` when the op does not qualify (broadcasting, mixed placements, plain tensors, a
    result of another dtype or layout): then DTensor runs it."""
    classes = torch_classes()
    DTensor, plain = classes.dtensor, classes.tensor_base
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

    DTensor = dtensor_class()
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
    return route_for(name, func)(func, args, kwargs)


def route_for(name: str, func: Any) -> Any:
    """The function ``on_shards`` calls for this op: what a program's step calls directly
    (programs.py). It gives ``None`` where it does not take the op (then DTensor runs it)."""
    special = _SPECIAL.get(name)
    if special is not None:
        return special
    if _is_pointwise(func):
        return _POINTWISE
    if is_elementwise(name):
        return foreach_on_shards
    return on_replicas


@computes_on_locals
def _same_spec(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    if type(x) is not dtensor_class() or len(args) != 1 or kwargs:
        return None
    return wrap(func(x._local_tensor), x._spec)  # noqa: SLF001


def _like_spec(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The result's spec where ``_like`` takes the op (its keywords change nothing), or None."""
    import torch

    x = args[0]
    if type(x) is not dtensor_class() or len(args) != 1:
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
    return spec if layout_kept(spec, like=True) else None


def _like_locally(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any) -> Any:
    """``_like`` on the local tensor, where it gave ``result`` (a program step's keywords are
    its literals, checked on its first run)."""
    spec = _like_spec(args, kwargs)
    if spec is None or type(result) is not dtensor_class() or result._spec is not spec:  # noqa: SLF001
        return NOT_TAKEN  # (the route declines a result laid out unlike the input)
    op = func._op  # noqa: SLF001

    def local(x: Any, **_checked: Any) -> Any:
        return op(x)

    return local


@computes_locally_as(_like_locally)
def _like(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    spec = _like_spec(args, kwargs)
    if spec is None:
        return None
    local = args[0]._local_tensor  # noqa: SLF001
    out = func(local)
    if out.stride() != local.stride():
        return None
    return wrap(out, spec)


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


def _either(first: Any, then: Any) -> Any:
    """A route that tries ``first``, then ``then`` (two families taking the same op); lowered
    (``lowered.py``) where both compute on the local tensors in the same way, or by first's
    form of its own (``computes_locally_as``) where first took the op."""

    def route(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        out = first(func, args, kwargs)
        return out if out is not None else then(func, args, kwargs)

    local_args = getattr(first, "local_args", None)
    form = getattr(first, "local_form", None)
    if (
        getattr(first, "on_locals", False)
        and getattr(then, "on_locals", False)
        and getattr(then, "local_args", None) is local_args
        and not hasattr(then, "local_form")
    ):
        route.on_locals = True  # type: ignore[attr-defined]
        route.local_args = local_args  # type: ignore[attr-defined]
        if form is not None:  # first's form where first took it, else the op on the locals
            route.local_form = first_else(form, True)  # type: ignore[attr-defined]
    elif form is not None:  # first's form where first took it; not lowered where then took it
        route.on_locals, route.local_args = True, None  # type: ignore[attr-defined]
        route.local_form = first_else(form, False)  # type: ignore[attr-defined]
    return route


_WHOLE = OutSpecs()  # a partial sum's spec -> the groups that make it whole, or None


def _compared_whole(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A comparison of a partial sum with a number (``mask.sum() == mask.numel()``, as Hugging
    Face's mask code asks): the sum made whole over its partial mesh dims (all-reduced, as
    DTensor's redistribute does), then compared on every rank; skips DTensor's dispatch. Not
    lowered: later runs need the all-reduce too. None where ``_summing_groups`` finds no way
    to sum it as DTensor would."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import Replicate

    x = args[0]
    if type(x) is not dtensor_class() or len(args) != 2 or kwargs:
        return None
    if type(args[1]) not in (int, float, bool):
        return None
    spec = x._spec  # noqa: SLF001
    groups = _WHOLE.get((spec,))
    if groups is UNKNOWN:
        groups = _WHOLE.put((spec,), None, _summing_groups(spec))
    if groups is None:
        return None
    # contiguous: NCCL refuses to all-reduce a strided tensor (a transposed partial sum), which
    # DTensor's own all-reduce copies first
    whole = x._local_tensor.clone(memory_format=torch.contiguous_format)  # noqa: SLF001
    for group in groups:
        dist.all_reduce(whole, group=group)
    out = func(whole, args[1])
    replicated = [Replicate()] * spec.mesh.ndim
    return wrap(out, spec_of(spec.mesh, replicated, spec.shape, out.stride(), out.dtype))


def _summing_groups(spec: Any) -> tuple[Any, ...] | None:
    """The process groups of ``spec``'s partial mesh dims, in order, or None unless it is a
    partial sum replicated elsewhere that DTensor would sum the same way (an integer, or one
    dim: over several, the order DTensor sums a float in decides the bits)."""
    from torch.distributed.tensor import Partial, Replicate

    partial = [d for d, p in enumerate(spec.placements) if p != Replicate()]
    if not partial or any(spec.placements[d] != Partial("sum") for d in partial):
        return None
    dtype = spec.tensor_meta.dtype
    if len(partial) > 1 and (dtype.is_floating_point or dtype.is_complex):
        return None
    return tuple(spec.mesh.get_group(d) for d in partial)


# Ops with a route of their own, by name; each family module says which it takes.
_SPECIAL: dict[str, Any] = {
    **shard_rows.ROUTES,
    **shard_row_masks.ROUTES,
    **shard_batch.ROUTES,
    **shard_linear.ROUTES,
    **shard_losses.ROUTES,
    **shard_attention.ROUTES,
    **FOREACH_ROUTES,
    "aten.detach.default": _same_spec,
    "aten.alias.default": _same_spec,
    "aten.ones_like.default": _like,
    "aten.zeros_like.default": _like,
    "aten.empty_like.default": _like,
}


def _none_partial(inputs: list[Any]) -> bool:
    return not any(p.is_partial() for x in inputs for p in x._spec.placements)  # noqa: SLF001


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    # Pointwise too: the shards' route first, lowered where it took the op (bool values: it
    # declines a comparison that changes the dtype); never where _compared_whole did, since
    # every run needs its all-reduce.
    _compare = _either(_pointwise_on_shards, _compared_whole)
    _compare.on_locals, _compare.local_args = True, None
    _compare.lowers_if = _none_partial
    _SPECIAL[f"aten.{_name}.Scalar"] = _compare
for _name, _route in shard_rows.ROUTES.items():  # the other family's first (its own tests)
    if _name in shard_linear.ROUTES:
        _SPECIAL[_name] = _either(shard_linear.ROUTES[_name], _route)
# Pointwise ops on tensors placed alike, then on rows with replicated values that broadcast
# over them; linear ones on partial sums too.
_ALIKE_OR_ROWS = _either(_pointwise_on_shards, shard_row_masks.pointwise_rows)
for _name, _route in shard_partials.ROUTES.items():
    _SPECIAL[_name] = _either(_SPECIAL.get(_name, _ALIKE_OR_ROWS), _route)


def _or_on_replicas(route: Any) -> Any:
    """``route``, then ``on_replicas`` for what it declines (an embedding of replicated position
    ids, a mask broadcast in a pointwise op), where both lower alike: a view's route lowers
    with the local result's sizes, which are a replicated view's own; not for a route that
    lowers for some inputs only."""
    if not getattr(route, "on_locals", False) or hasattr(route, "lowers_if"):
        return route  # (its own collectives or bookkeeping: it decides alone)
    if takes_view_sizes(route):
        both = _either(route, on_replicas)
        both.on_locals, both.local_args = True, route.local_args
        return both
    if getattr(route, "local_args", None) is not None:
        return route
    return _either(route, on_replicas)


for _name, _route in list(_SPECIAL.items()):
    _SPECIAL[_name] = _or_on_replicas(_route)
_POINTWISE = _or_on_replicas(_ALIKE_OR_ROWS)

# Ops whose shard path takes a controller tensor (a loss's target) as it is: run_aten tries it
# before making such arguments Replicate DTensors.
TAKES_CONSTANTS = frozenset({"aten.mse_loss.default", "aten.mse_loss_backward.default"})

"""``_foreach_`` ops run on each rank's local shards (the shard path of ``shard_ops.py``, for
the ops that take lists of tensors).

An optimizer's foreach update (``torch.optim`` with ``foreach=True``, which
``controller/optim.py`` makes the default for MeshTensor parameters) is a dozen ``_foreach_``
ops per step, each over every parameter. DTensor runs one with sharding propagation per list
element (about as slow as the per-parameter ops it replaces); but an elementwise ``_foreach_``
op is, element by element, a pointwise op, so where the tensors at each position share one mesh,
shape and placements (none ``Partial``) it is the same op on the local shards: one call for
all the parameters.
"""

from __future__ import annotations

from typing import Any

from .dtensors import dtensor_class
from .lowered import computes_on_locals

# The elementwise _foreach_ families: those whose per-tensor op torch tags pointwise (see
# ``_elementwise``), without max (a reduction per tensor) and with zero_/copy_.
_NOT_ELEMENTWISE = frozenset({"max", "norm", "mm", "powsum"})
_ALSO_ELEMENTWISE = frozenset({"zero", "copy"})
_known: dict[str, bool] = {}


def is_elementwise(name: str) -> bool:
    """Whether ``aten._foreach_<op>.<overload>`` is elementwise in each of its tensors."""
    packet = name.split(".")[1]
    known = _known.get(packet)
    if known is None:
        known = _known[packet] = _elementwise(packet)
    return known


def _elementwise(packet: str) -> bool:
    import torch

    if not packet.startswith("_foreach_"):
        return False
    base = packet.removeprefix("_foreach_").rstrip("_")
    if base in _NOT_ELEMENTWISE:
        return False
    if base in _ALSO_ELEMENTWISE:
        return True
    single = getattr(torch.ops.aten, base, None)
    if single is None:
        return False
    for overload in single.overloads():
        tags = getattr(single, overload).tags
        if torch.Tag.pointwise in tags and torch.Tag.nondeterministic_seeded not in tags:
            return True
    return False


@computes_on_locals
def foreach_on_shards(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """An elementwise ``_foreach_`` op on the local shards: ``[]`` for an in-place one (it
    returns nothing), the list of result DTensors for another; ``None`` when the op does not
    qualify (then DTensor runs it)."""
    DTensor = dtensor_class()
    specs: list[Any] | None = None  # per position, the spec of the first list's tensor
    local_args = []
    for a in args:
        local = _local(a, DTensor, specs)
        if local is None:
            return None
        if specs is None and type(a) is list and a and type(a[0]) is DTensor:
            specs = [x._spec for x in a]  # noqa: SLF001
            for spec in specs:
                for p in spec.placements:
                    if p.is_partial():
                        return None
        local_args.append(local[0])
    if specs is None:
        return None
    local_kwargs = {}
    for k, v in kwargs.items():
        local = _local(v, DTensor, specs)
        if local is None:
            return None
        local_kwargs[k] = local[0]
    out = func._op(*local_args, **local_kwargs)  # noqa: SLF001  (what OpOverload.__call__ calls)
    if out is None:
        return []  # in place: each DTensor already holds its local tensor
    first = local_args[0]
    results = []
    for o, spec, before in zip(out, specs, first, strict=True):
        if (
            o.dtype != spec.tensor_meta.dtype
            or o.shape != before.shape
            or (o.stride() != before.stride())
        ):
            return None  # not the input's spec (and not in place, so DTensor may run it again)
        if not layout_kept(spec):
            return None
        results.append(DTensor.__new__(DTensor, o, spec, requires_grad=False))
    return results


def placed_alike(spec: Any, first: Any) -> bool:
    """Two DTensor specs with one mesh, placements and global shape: an elementwise op of
    their values is the op of their local shards."""
    return (
        spec.mesh is first.mesh
        and spec.placements == first.placements
        and spec.shape == first.shape
    )


# spec -> whether a result computed from a tensor of that spec keeps its global strides
_kept: tuple[dict[Any, bool], dict[Any, bool]] = ({}, {})


def layout_kept(spec: Any, like: bool = False) -> bool:
    """Whether torch gives an elementwise op's result on a tensor of ``spec``'s global shape
    and strides (``like``: an ``*_like`` factory's) those same strides. A rank's result has
    its shard's layout, so the result's spec may be the input's only then: a tensor that is
    not dense (q of a fused qkv projection, split from a wider tensor) gives a dense result,
    and a shard of it can look dense (a batch of one row per rank), so the local strides
    alone do not tell. (A wrong global stride is no small thing: the ranks' views then
    differ from the controller's, which reshaped on the true ones.)"""
    cache = _kept[like]
    known = cache.get(spec)
    if known is None:
        import torch

        meta = torch.empty_strided(spec.shape, spec.stride, dtype=torch.float32, device="meta")
        out = torch.empty_like(meta) if like else meta + meta
        if len(cache) > 4096:
            cache.clear()
        known = cache[spec] = tuple(out.stride()) == tuple(spec.stride)
    return known


def _local(a: Any, dtensor: type, specs: list[Any] | None) -> tuple[Any] | None:
    """``(a as the local op takes it,)``, or None if it keeps the op off the shard path: a list
    of DTensors each placed as the first list's tensor at its position, a scalar or a list of
    scalars, or a 0-dim replicated DTensor (a clipping coefficient)."""
    t = type(a)
    if t is list or t is tuple:
        if not a or type(a[0]) is not dtensor:
            for e in a:
                if not isinstance(e, (int, float, bool)):
                    return None
            return (a,)
        if specs is not None and len(a) != len(specs):
            return None
        out = []
        for k, x in enumerate(a):
            if type(x) is not dtensor:
                return None
            spec = x._spec  # noqa: SLF001
            # (laid out alike too: then the result is laid out as each, see layout_kept)
            if (
                specs is not None
                and spec is not specs[k]
                and (not placed_alike(spec, specs[k]) or spec.stride != specs[k].stride)
            ):
                return None
            out.append(x._local_tensor)  # noqa: SLF001
        return (out,)
    if t is dtensor:
        if a.dim() != 0 or not all(p.is_replicate() for p in a.placements):
            return None
        return (a._local_tensor,)  # noqa: SLF001
    if isinstance(a, (int, float, bool)) or a is None:
        return (a,)
    return None  # a plain tensor, a string...: DTensor decides


# An optimizer's whole step as one op (``wire/optim_ops.py``: ``ADAM``): elementwise in each
# parameter too, so the op on the local tensors where its lists are placed alike position by
# position (each rank's function then runs its foreach ops on them).
ROUTES = {"actormesh.adam_.default": foreach_on_shards}

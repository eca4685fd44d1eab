"""Ops that keep the rows of a batch split by rows while they combine it with replicated values
(a route of ``shard_ops.py``, beside ``shard_rows.py``): what builds an attention mask from a
padding mask each step.

- a pointwise op of row-split tensors and replicated ones that broadcast over the rows (a
  position embedding of one row added to a batch's token embeddings; a causal mask and the
  padding mask combined);
- ``index`` of a row-split tensor by rows in order (Hugging Face's padding mask taken at each
  query and key position), which DTensor runs by gathering the whole tensor on every rank;
- ``expand`` that keeps the rows.

Each rank's rows of the result come from its own rows: the result is split by rows as the input
is, with the global layout torch gives the op on meta tensors of the global shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .dtensors import UNKNOWN, OutSpecs, dtensor_class, local_layout, torch_classes, wrap
from .lowered import computes_on_locals, views_locally
from .shard_rows import FOUND, inputs_ok, replicated, row_split, specs_of


@computes_on_locals
def pointwise_rows(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A pointwise op of tensors split by rows alike and replicated ones that broadcast over
    the rows (a position embedding of one row added to a batch's token embeddings): each
    rank's rows of the result from its rows and the replicated values."""
    classes = torch_classes()
    DTensor, base = classes.dtensor, classes.tensor_base
    if func._schema.is_mutable:  # noqa: SLF001
        return None  # (into a replicated value, from one rank's rows: _pointwise_on_shards's)
    rows = params = mesh = None
    for a in args:
        t = type(a)
        if t is DTensor:
            spec = a._spec  # noqa: SLF001
            if mesh is None:
                mesh = spec.mesh
            elif spec.mesh is not mesh:
                return None
            if row_split(spec):
                if rows is None:
                    rows = spec
                elif (
                    spec.placements != rows.placements
                    or len(spec.shape) != len(rows.shape)
                    or spec.shape[0] != rows.shape[0]
                ):
                    return None
            elif replicated(spec):
                params = spec
            else:
                return None
        elif t is list or t is tuple or issubclass(t, base):
            return None
    if rows is None or params is None or any(issubclass(type(v), base) for v in kwargs.values()):
        return None
    specs = tuple(a._spec for a in args if type(a) is DTensor)  # noqa: SLF001
    # The scalars' kinds decide the result's dtype, not their values; a keyword's value may
    # (div's rounding_mode), a float's never.
    extra = (
        func,
        tuple(type(a) for a in args),
        tuple(sorted((k, float if type(v) is float else v) for k, v in kwargs.items())),
    )
    out = FOUND.get(specs, extra)
    if out is UNKNOWN:
        out = FOUND.put(specs, extra, _broadcast_spec(func, args, kwargs, rows))
    if out is None:
        return None
    return wrap(func(*[a._local_tensor if type(a) is DTensor else a for a in args], **kwargs), out)  # noqa: SLF001


def _broadcast_spec(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], rows: Any) -> Any:
    """The result's spec where every replicated input broadcasts over the rows (its dims
    aligned from the right, it has none or one at the rows' dim) and the result has the rows'
    dims (a mask's rows broadcast along its other dims too); else None."""
    D = dtensor_class()
    for a in args:
        if type(a) is D and a._spec.placements != rows.placements:  # noqa: SLF001
            at = a.dim() - len(rows.shape)  # the replicated input's dim aligned with dim 0
            if at >= 0 and a.shape[at] != 1:
                return None
    x = next(a for a in args if type(a) is D and a._spec.placements == rows.placements)  # noqa: SLF001
    found = specs_of(func, args, x, (), tuple(sorted(kwargs.items())))
    return found if found is not None and len(found.shape) == len(rows.shape) else None


@views_locally
def _expand(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``expand`` that keeps the rows of a tensor split by rows (size -1 or the rows' count at
    dim 0): the local expand of the local rows."""
    if kwargs or len(args) != 2 or not isinstance(args[1], (list, tuple)) or not args[1]:
        return None
    specs = inputs_ok(args, (0,), ())
    x, sizes = args
    if specs is None or len(sizes) != x.dim() or sizes[0] not in (-1, x.shape[0]):
        return None
    extra = (func, tuple(sizes))
    out = FOUND.get(specs, extra)
    if out is UNKNOWN:
        out = FOUND.put(specs, extra, specs_of(func, args, x, ()))
    if out is None:
        return None
    return wrap(func(x._local_tensor, [-1, *sizes[1:]]), out)  # noqa: SLF001


_index_specs = OutSpecs()


def _index_rows(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``x[rows, ...]`` of a tensor split by rows, where the index of dim 0 picks each row in
    order (shaped to lead the result, ``arange(n)[:, None, None]``) and the other indices are
    replicated integers that broadcast over the rows: Hugging Face's padding mask taken at each
    query and key position. Each rank's rows of the result are its rows' (DTensor gathers the
    whole tensor on every rank). Decided by the indices' values each run (not lowered)."""
    import torch

    DTensor = dtensor_class()
    if kwargs or len(args) != 2 or type(args[0]) is not DTensor:
        return None
    x, indices = args
    spec = x._spec  # noqa: SLF001
    if not row_split(spec) or not isinstance(indices, (list, tuple)) or not indices:
        return None
    if any(type(i) is not DTensor for i in indices):
        return None  # (None: a dim not indexed; a plain tensor: DTensor decides)
    specs = (spec, *(i._spec for i in indices))  # noqa: SLF001
    out = _index_specs.get(specs)
    if out is UNKNOWN:
        out = _index_specs.put(specs, None, _index_spec(func, x, indices))
    if out is None:
        return None
    first = indices[0]._local_tensor  # noqa: SLF001
    n = len(first)
    if not torch.equal(first.reshape(n), torch.arange(n, device=first.device)):
        return None
    shape, offset = local_layout(spec)
    local_first = first.narrow(0, offset[0], shape[0]) - offset[0]
    rest = [i._local_tensor for i in indices[1:]]  # noqa: SLF001
    return wrap(func(x._local_tensor, [local_first, *rest]), out)  # noqa: SLF001


def _index_spec(func: Any, x: Any, indices: Sequence[Any]) -> Any:
    """The result's spec for ``_index_rows``, when the indices are laid out as it needs:
    replicated integers, the first of shape ``(rows, 1, ...)`` leading the result, the others
    of size 1 there; else None."""
    import torch

    first = indices[0]
    rank = max(i.dim() for i in indices)
    for k, i in enumerate(indices):
        if i.dtype not in (torch.int64, torch.int32) or not i._spec.is_replicated():  # noqa: SLF001
            return None  # (a bool index is a mask: its result's rows depend on the values)
        # by position, not identity: in x[rows, rows] the second index takes every row too
        if k and i.dim() == rank and i.shape[0] != 1:
            return None
    if first.dim() != rank or first.shape[0] != x.shape[0] or any(d != 1 for d in first.shape[1:]):
        return None
    found = specs_of(func, (x, list(indices)), x, ())
    return found if found is not None and not isinstance(found, list) else None


ROUTES: dict[str, Any] = {"aten.index.Tensor": _index_rows, "aten.expand.default": _expand}

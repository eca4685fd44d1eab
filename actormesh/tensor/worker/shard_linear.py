"""A linear layer's ops on each rank's local shards (a route of ``shard_ops.py``).

On plain placements (Shard, Replicate; Partial where the op keeps a sum a sum): ``t``, ``mm``,
``addmm`` (the batch split over rows, the weights replicated, or a weight gradient's contraction
over the split batch giving a ``Partial`` sum) and ``sum.dim_IntList``, and ``view`` of a tensor
split over no dimension or by rows (``shard_views.py``); each placement the result gets is the
one DTensor's rule gives. And ``cat`` with 1-D empty tensors among others, which torch skips and
DTensor does not: left out.
"""

from __future__ import annotations

from typing import Any

from ..wire.shapes import contiguous_strides
from .dtensors import UNKNOWN, OutSpecs, as_dtensor, dtensor_class, partial_sum, spec_of, wrap
from .lowered import NOT_TAKEN, computes_locally_as, computes_on_locals, views_locally
from .shard_views import view_rows

_T_SPECS = OutSpecs()
_MM_SPECS = OutSpecs()
_ADDMM_SPECS = OutSpecs()
_SUM_SPECS = OutSpecs()


@computes_on_locals
def _transpose(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``t`` of a 2-D DTensor: Shard(0) and Shard(1) swap, the rest stays."""
    x = args[0]
    if type(x) is not dtensor_class() or kwargs or len(args) != 1:
        return None
    spec = x._spec  # noqa: SLF001
    out = _T_SPECS.get((spec,))
    if out is UNKNOWN:
        out = _T_SPECS.put((spec,), None, _transposed(spec))
    return None if out is None else wrap(func(x._local_tensor), out)  # noqa: SLF001


def _transposed(spec: Any) -> Any:
    from torch.distributed.tensor import Shard

    if len(spec.shape) != 2:
        return None
    placements: list[Any] = []
    for p in spec.placements:
        if type(p) is Shard:
            placements.append(Shard(1 - p.dim))
        elif p.is_replicate() or p.is_partial():
            placements.append(p)
        else:
            return None
    shape, stride = spec.shape, spec.stride
    return spec_of(spec.mesh, placements, type(shape)((shape[1], shape[0])),
                   (stride[1], stride[0]), spec.tensor_meta.dtype)  # fmt: skip


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
            out.append(partial_sum())
        else:
            return None
    return out


def _product_spec(a: Any, b: Any, with_bias: Any = None) -> Any:
    """The spec of ``a @ b`` (plus ``with_bias``, a spec) where the ranks' local products are
    its blocks, else None. ``a``, ``b``: specs."""
    if a.mesh is not b.mesh or len(a.shape) != 2 or len(b.shape) != 2:
        return None
    placements = _mm_placements(a, b)
    if placements is None:
        return None
    if with_bias is not None:
        # each rank adds the whole bias to its rows: a bias replicated over the columns, a
        # product that needs no sum and whose columns are whole
        if with_bias.mesh is not a.mesh or len(with_bias.shape) != 1:
            return None
        if not all(p.is_replicate() for p in with_bias.placements):
            return None
        if any(not (p.is_replicate() or p.is_shard(0)) for p in placements):
            return None
    shape = type(a.shape)((a.shape[0], b.shape[1]))
    # torch's strides for a new product: (1, 1), not (0, 1), when it has no columns
    return spec_of(a.mesh, placements, shape, contiguous_strides(shape), a.tensor_meta.dtype)


@computes_on_locals
def _mm(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if len(args) != 2 or kwargs:
        return None
    a, b = args
    dtensor = dtensor_class()
    if type(a) is not dtensor or type(b) is not dtensor:
        return None
    specs = (a._spec, b._spec)  # noqa: SLF001
    out = _MM_SPECS.get(specs)
    if out is UNKNOWN:
        out = _MM_SPECS.put(specs, None, _product_spec(*specs))
    if out is None:
        return None
    local = func(a._local_tensor, b._local_tensor)  # noqa: SLF001
    return _checked(local, out)


@computes_on_locals
def _addmm(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``bias + a @ b`` with a replicated bias over the columns, where ``a @ b`` needs no sum
    and its columns are whole (each rank adds the whole bias to its rows)."""
    if len(args) != 3 or kwargs:
        return None
    bias, a, b = args
    dtensor = dtensor_class()
    if type(bias) is not dtensor or type(a) is not dtensor or type(b) is not dtensor:
        return None
    specs = (bias._spec, a._spec, b._spec)  # noqa: SLF001
    out = _ADDMM_SPECS.get(specs)
    if out is UNKNOWN:
        out = _ADDMM_SPECS.put(specs, None, _product_spec(specs[1], specs[2], specs[0]))
    if out is None:
        return None
    local = func(bias._local_tensor, a._local_tensor, b._local_tensor)  # noqa: SLF001
    return _checked(local, out)


def _checked(local: Any, spec: Any) -> Any:
    """``local`` wrapped as ``spec``, or None where torch gave a dtype the spec does not have
    (mixed dtypes promote): then DTensor runs the op."""
    if local.dtype is not spec.tensor_meta.dtype:
        return None
    return wrap(local, spec)


@computes_on_locals
def _sum_dims(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``sum`` over dims: a split dim summed over gives a Partial sum, other split dims move
    down past the removed ones (unless keepdim); Partial sums stay Partial sums."""
    if kwargs or len(args) < 2 or len(args) > 3:
        return None
    x, dims = args[0], args[1]
    keepdim = args[2] if len(args) > 2 else False
    if type(x) is not dtensor_class() or dims is None or not dims:
        return None
    spec = x._spec  # noqa: SLF001
    extra = (tuple(dims), keepdim)
    out = _SUM_SPECS.get((spec,), extra)
    if out is UNKNOWN:
        out = _SUM_SPECS.put((spec,), extra, _summed_spec(spec, dims, keepdim))
    if out is None:
        return None
    return _checked(func(x._local_tensor, dims, keepdim), out)  # noqa: SLF001


def _summed_spec(spec: Any, dims: Any, keepdim: bool) -> Any:
    import torch
    from torch.distributed.tensor import Shard

    nd = len(spec.shape)
    reduced = sorted({d % nd for d in dims}) if nd else []
    placements = []
    for p in spec.placements:
        if type(p) is Shard:
            if p.dim in reduced:
                placements.append(partial_sum())
            else:
                shift = 0 if keepdim else sum(1 for d in reduced if d < p.dim)
                placements.append(Shard(p.dim - shift))
        elif p.is_replicate() or (p.is_partial() and getattr(p, "reduce_op", None) == "sum"):
            placements.append(p)
        else:
            return None
    shape = [n if i not in reduced else 1 for i, n in enumerate(spec.shape)]
    if not keepdim:
        shape = [n for i, n in enumerate(spec.shape) if i not in reduced]
    dtype = spec.tensor_meta.dtype
    if not (dtype.is_floating_point or dtype.is_complex):
        dtype = torch.int64  # torch sums bools and integers as int64 (_checked sees the rest)
    return spec_of(spec.mesh, placements, torch.Size(shape), contiguous_strides(shape), dtype)


@views_locally
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


@views_locally
def _view(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``view`` (and ``_unsafe_view``) of an unsplit tensor, or of one split by rows."""
    out = _view_unsplit(func, args, kwargs)
    return out if out is not None else view_rows(func, args, kwargs)


def _kept_by_cat(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any] | None:
    """The tensors ``cat`` keeps where ``_cat_skipping_empty`` takes it (it skips some), or
    None."""
    tensors = args[0] if args else kwargs.get("tensors")
    if not isinstance(tensors, (list, tuple)) or len(tensors) < 2:
        return None
    kept = [t for t in tensors if not _empty_1d(t)]
    if len(kept) == len(tensors) or not kept or all(t.dim() == 1 for t in kept):
        return None
    return kept


def _empty_1d(t: Any) -> bool:
    return t.dim() == 1 and t.shape[0] == 0


def _cat_skipping_empty_locally(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any
) -> Any:
    """``_cat_skipping_empty`` on the local tensors, where it took the op and DTensor's ``cat``
    of what it kept is the ``cat`` of their local tensors: all placed as the result, none split
    along the dim it joins them on, no partial sum."""
    kept = _kept_by_cat(args, kwargs)
    dtensor = dtensor_class()
    if kept is None:
        return NOT_TAKEN
    if type(result) is not dtensor:
        return None
    placements = result.placements
    dim = (args[1] if len(args) > 1 else kwargs.get("dim", 0)) % result.dim()
    if any(type(t) is not dtensor or t.placements != placements for t in kept):
        return None
    if any(p.is_partial() or (p.is_shard() and p.dim == dim) for p in placements):
        return None
    op = func._op  # noqa: SLF001

    def local(tensors: list[Any], dim: int = 0) -> Any:
        return op([t for t in tensors if not _empty_1d(t)], dim)

    return local


@computes_locally_as(_cat_skipping_empty_locally)
def _cat_skipping_empty(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``cat`` with 1-D empty tensors among others: torch skips them (a legacy rule Hugging Face's
    KV cache relies on: it starts from ``torch.tensor([])``); DTensor's rule does not, so they
    are left out here before DTensor runs it."""
    kept = _kept_by_cat(args, kwargs)
    if kept is None:
        return None
    return func(kept, *args[1:], **kwargs) if args else func(kept, **kwargs)


ROUTES = {
    "aten.t.default": _transpose,
    "aten.mm.default": _mm,
    "aten.addmm.default": _addmm,
    "aten.sum.dim_IntList": _sum_dims,
    "aten.view.default": _view,
    "aten._unsafe_view.default": _view,
    "aten.cat.default": _cat_skipping_empty,
}

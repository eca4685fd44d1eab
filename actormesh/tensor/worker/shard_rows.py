"""Ops that leave dim 0 alone, on a tensor split only by rows (a data-parallel batch), on each
rank's rows (a route of ``shard_ops.py``).

A transformer's step on a batch split over dim 0 transposes, slices, splits and views its
activations per head, normalises each token (``layer_norm`` and its backward), concatenates the
gradients of a fused projection, looks up token embeddings and takes a log-softmax per row:
none of these mixes rows, so each rank's rows are the op's rows (and the sums over rows, the
embedding's gradient and ``sum``, are the ranks' partial sums). DTensor works that out per op
in Python (80-150 µs each on a CPU; in Hugging Face's GPT-2 step a quarter of a rank's time).
Here the result's specs are found once per input specs and arguments, from the op run on meta
tensors of the global shapes and strides (so they are torch's, as DTensor's are), and then only
the local op runs.

Taken: every DTensor input split over dim 0 alike (``Shard(0)`` over some mesh dims, evenly or
not, ``Replicate`` over the rest; the same global rows), the op's dims other than 0, and
parameters (``layer_norm``'s weight and bias) replicated. Results keep the input's placements,
but a parameter's gradient, which sums over the rows: ``Partial`` sums where the rows are split.
"""

from __future__ import annotations

from typing import Any

from .dtensors import (
    UNKNOWN,
    OutSpecs,
    dtensor_class,
    partial_sum,
    spec_of,
    torch_classes,
    wrap,
)
from .lowered import computes_on_locals, views_locally

FOUND = OutSpecs()


def row_split(spec: Any) -> bool:
    """Split over dim 0 by some mesh dim and replicated over the others (nothing else)."""
    classes = torch_classes()
    shard, replicate = classes.shard, classes.replicate
    split = False
    for p in spec.placements:
        if type(p) is shard and p.dim == 0:
            split = True
        elif type(p) is not replicate:
            return False
    return split


def replicated(spec: Any) -> bool:
    replicate = torch_classes().replicate
    return all(type(p) is replicate for p in spec.placements)


def _dim(args: tuple[Any, ...], at: int, default: int, ndim: int) -> int:
    d = args[at] if len(args) > at else default
    return d + ndim if d < 0 else d


def _hashable(a: Any) -> Any:
    if isinstance(a, (list, tuple)):
        return tuple(_hashable(v) for v in a)
    return a


# -- which arguments are what, per op ---------------------------------------------------------
# (rows: positions of the DTensors split by rows; params: positions of replicated DTensors or
# None; partial: results summed over the rows; ok: whether the op leaves dim 0 alone)


def _always(args: tuple[Any, ...], x: Any) -> bool:
    return True


def _ok_transpose(args: tuple[Any, ...], x: Any) -> bool:
    return len(args) == 3 and 0 not in (_dim(args, 1, 0, x.dim()), _dim(args, 2, 0, x.dim()))


def _ok_dim_at(at: int, default: int) -> Any:
    return lambda args, x: _dim(args, at, default, x.dim()) != 0


def _ok_unscaled(args: tuple[Any, ...], x: Any) -> bool:
    # scale_grad_by_freq divides by each index's count over the whole batch, which no rank
    # has: that one is DTensor's.
    return len(args) < 5 or not args[4]


def _ok_layer_norm(args: tuple[Any, ...], x: Any) -> bool:
    return len(args) >= 2 and len(args[1]) < x.dim()


def _ok_layer_norm_backward(args: tuple[Any, ...], x: Any) -> bool:
    return len(args) == 8 and len(args[2]) < x.dim()


def _ok_pad(args: tuple[Any, ...], x: Any) -> bool:
    return len(args) >= 2 and len(args[1]) // 2 < x.dim()  # (pads the last dims only)


def _ok_nll_loss_backward(args: tuple[Any, ...], x: Any) -> bool:
    # A mean divides by the counted targets' total weight, which the forward made whole (the
    # replicated argument 6): each rank's rows of the gradient are the gradient's rows.
    return len(args) == 7 and args[3] is None and args[4] in (1, 2)


_OPS: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], Any]] = {
    "aten.transpose.int": ((0,), (), (), _ok_transpose),
    "aten.slice.Tensor": ((0,), (), (), _ok_dim_at(1, 0)),
    "aten.split.Tensor": ((0,), (), (), _ok_dim_at(2, 0)),
    "aten._log_softmax.default": ((0,), (), (), _ok_dim_at(1, 0)),
    "aten._log_softmax_backward_data.default": ((0, 1), (), (), _ok_dim_at(2, 0)),
    "aten.embedding.default": ((1,), (0,), (), _always),
    "aten.embedding_dense_backward.default": ((0, 1), (), (0,), _ok_unscaled),
    "aten.sum.default": ((0,), (), (0,), _always),
    "aten.native_layer_norm.default": ((0,), (2, 3), (), _ok_layer_norm),
    "aten.native_layer_norm_backward.default": (
        (0, 1, 3, 4),
        (5, 6),
        (1, 2),
        _ok_layer_norm_backward,
    ),
    "aten.constant_pad_nd.default": ((0,), (), (), _ok_pad),
    "aten.clone.default": ((0,), (), (), _always),
    "aten._to_copy.default": ((0,), (), (), _always),
    "aten.nll_loss_backward.default": ((1, 2), (0, 6), (), _ok_nll_loss_backward),
}
# The keywords these ops may take (each of a kind DTensor's rule would keep the rows for):
# a copy's dtype, layout and memory format, on the device the input is on.
_KEYWORDS = frozenset({"dtype", "layout", "device", "memory_format", "non_blocking"})


def specs_of(
    func: Any, args: tuple[Any, ...], x: Any, partial: tuple[int, ...], kwargs: Any = ()
) -> Any:
    """The results' specs, from the op on meta tensors of the global layouts (``kwargs``: the
    keywords but ``device``, as pairs); None when a result does not keep the input's rows."""
    import torch

    DTensor = dtensor_class()

    def meta(a: Any) -> Any:
        if type(a) is DTensor:
            return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
        if isinstance(a, (list, tuple)):
            return type(a)(meta(v) for v in a)
        return a

    out = func(*[meta(a) for a in args], **dict(kwargs))
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    spec = x._spec  # noqa: SLF001
    summed = tuple(partial_sum() if p.is_shard() else p for p in spec.placements)
    specs: list[Any] = []
    for i, o in enumerate(outs):
        if o is None:
            specs.append(None)
            continue
        if i in partial:
            specs.append(spec_of(spec.mesh, summed, o.shape, o.stride(), o.dtype))
        elif o.dim() and o.shape[0] == x.shape[0]:
            specs.append(spec_of(spec.mesh, spec.placements, o.shape, o.stride(), o.dtype))
        else:
            return None
    return specs if isinstance(out, (list, tuple)) else specs[0]


def inputs_ok(args: tuple[Any, ...], rows: tuple[int, ...], params: tuple[int, ...]) -> Any:
    """The DTensor inputs' specs, if laid out as the route needs (else None)."""
    classes = torch_classes()
    DTensor, base = classes.dtensor, classes.tensor_base
    first = args[rows[0]]
    if type(first) is not DTensor or not row_split(first._spec):  # noqa: SLF001
        return None
    fspec = first._spec  # noqa: SLF001
    specs = []
    for i, a in enumerate(args):
        t = type(a)
        if t is DTensor:
            s = a._spec  # noqa: SLF001
            if s.mesh is not fspec.mesh:
                return None
            if i in rows:
                if s.placements != fspec.placements or s.shape[0] != fspec.shape[0]:
                    return None
            elif i not in params or not replicated(s):
                return None
            specs.append(s)
        elif i in rows or (isinstance(a, (list, tuple)) and any(type(v) is DTensor for v in a)):
            return None
        elif t is not list and t is not tuple and issubclass(t, base):
            return None  # a plain tensor among DTensors: DTensor decides
    return tuple(specs)


def _local(a: Any) -> Any:
    return a._local_tensor if type(a) is dtensor_class() else a  # noqa: SLF001


def _wrapped(out: Any, specs: Any) -> Any:
    if isinstance(out, (list, tuple)):
        return type(out)(None if o is None else wrap(o, s) for o, s in zip(out, specs, strict=True))
    return wrap(out, specs)


def rows(name: str) -> Any:
    """The route of op ``name`` (one of ``_OPS``)."""
    row_at, params, partial, ok = _OPS[name]

    def route(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        keywords = _keywords(kwargs, args[row_at[0]]) if kwargs else ()
        if keywords is None:
            return None
        specs = inputs_ok(args, row_at, params)
        if specs is None:
            return None
        D = torch_classes().dtensor
        # (lists here hold ints or bools: _inputs_ok refused any holding a DTensor)
        extra = (func, tuple([None if type(a) is D else tuple(a) if type(a) is list else a
                              for a in args]), keywords)  # fmt: skip
        out = FOUND.get(specs, extra)
        if out is UNKNOWN:
            x = args[row_at[0]]
            found = specs_of(func, args, x, partial, keywords) if ok(args, x) else None
            out = FOUND.put(specs, extra, found)
        if out is None:
            return None
        return _wrapped(
            func(*[a._local_tensor if type(a) is D else a for a in args], **kwargs),  # noqa: SLF001
            out,
        )

    return computes_on_locals(route)


def _keywords(kwargs: dict[str, Any], x: Any) -> tuple[tuple[str, Any], ...] | None:
    """The keywords as sorted pairs, ``device`` left out (the meta op's results stay meta);
    None for one not in ``_KEYWORDS`` or another device than ``x``'s."""
    import torch

    out = []
    for k, v in sorted(kwargs.items()):
        if k not in _KEYWORDS:
            return None
        if k == "device":
            if v is not None and (type(x) is not dtensor_class() or torch.device(v) != x.device):
                return None
            continue
        out.append((k, v))
    return tuple(out)


@computes_on_locals
def _cat(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``cat`` of tensors split by rows alike along a dim other than 0."""
    if kwargs or not args or not isinstance(args[0], (list, tuple)) or len(args[0]) < 2:
        return None
    tensors = list(args[0])
    n = len(tensors)
    specs = inputs_ok((*tensors, *args[1:]), tuple(range(n)), ())
    if specs is None or any(t.dim() != tensors[0].dim() for t in tensors):
        return None
    extra = (func, _hashable(args[1:]))
    out = FOUND.get(specs, extra)
    if out is UNKNOWN:
        x = tensors[0]
        found = specs_of(func, args, x, ()) if _dim(args, 1, 0, x.dim()) != 0 else None
        out = FOUND.put(specs, extra, found)
    if out is None:
        return None
    return wrap(func([_local(t) for t in tensors], *args[1:]), out)


@views_locally
def _view(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``view`` that keeps dim 0 (its size and stride) of a tensor split by rows, dense or not
    (a head's slice of a fused projection): the local view with the local rows."""
    if kwargs or len(args) != 2 or not isinstance(args[1], (list, tuple)) or not args[1]:
        return None
    specs = inputs_ok(args, (0,), ())
    if specs is None:
        return None
    x = args[0]
    extra = (func, tuple(args[1]))
    out = FOUND.get(specs, extra)
    if out is UNKNOWN:
        found = specs_of(func, args, x, ())
        if found is not None and found.stride[0] != x._spec.stride[0]:  # noqa: SLF001
            found = None
        out = FOUND.put(specs, extra, found)
    if out is None:
        return None
    local = x._local_tensor  # noqa: SLF001
    return wrap(func(local, [local.shape[0], *args[1][1:]]), out)


ROUTES: dict[str, Any] = {name: rows(name) for name in _OPS}
ROUTES["aten.cat.default"] = _cat
ROUTES["aten.view.default"] = _view
ROUTES["aten._unsafe_view.default"] = _view

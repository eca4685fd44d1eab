"""``t.reduce(dims, ...)`` and ``t.reduce_(...)``: PyTorch Monarch's collectives over named mesh
dimensions, for per-rank MeshTensors (those made under ``activate()``).

With ``N`` ranks along ``dims``, each rank's value ``x`` (what the kinds do, as in Monarch):

- ``"sum"``, ``"avg"``, ``"product"``, ``"min"``, ``"max"``, ``"band"``, ``"bor"``, ``"bxor"``:
  every rank gets the elementwise reduction (an all-reduce); with ``scatter=True`` ``x`` must
  have ``N`` rows and rank ``i`` gets row ``i`` of the reduction (a reduce-scatter: the result
  has ``x.shape[1:]``);
- ``"stack"``: every rank gets the ``N`` values stacked along a new dim 0 (an all-gather); with
  ``scatter=True`` ``x`` must have ``N`` rows and rank ``i`` gets row ``i`` of every rank's
  ``x``, stacked (an all-to-all: the same shape as ``x``).

Over several dims the ranks are taken row-major in the order the dims are given. Everything
that can be checked is checked here, at the user's line, before anything is recorded: the
result's shape and dtype are known without a round trip.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_map

from .. import compat
from ..wire.ops import Ref, issue_site
from .mesh import TensorMesh, view_of
from .tensor import MeshTensor, new_mesh_tensor

REDUCTIONS = ("stack", "sum", "avg", "product", "min", "max", "band", "bor", "bxor")
_BITWISE = ("band", "bor", "bxor")


def reduce(
    t: MeshTensor,
    dims: str | Sequence[str] = (),
    reduction: str = "sum",
    scatter: bool = False,
    mesh: Any = None,
    _inplace: bool = False,
    out: MeshTensor | None = None,
) -> MeshTensor:
    """The implementation of ``MeshTensor.reduce`` (see the module's docstring)."""
    what = "reduce_" if _inplace else "reduce"
    _check_input(t, what)
    tm = t.mesh
    names = _dims(tm, dims, what)
    _check_reduction(t, reduction, what)
    n = math.prod(tm.sizes[tm.labels.index(d)] for d in names)
    if scatter and len(names) > 1:
        raise compat.MeshUsageError(
            f"{what}(scatter=True) over several mesh dimensions {names}: scatter one dimension at "
            "a time (as in Monarch)"
        )
    shape = _result_shape(tuple(t.shape), n, reduction, scatter, what)
    target = _target_mesh(tm, mesh, what)
    if _inplace:
        _check_in_place(out, reduction, scatter, n, target is tm)
        result = t
    elif out is not None:
        result = _check_out(out, target, shape, t.dtype)
    else:
        result = new_mesh_tensor(target, shape, t.dtype, per_rank=True)
    ins = (t.value_id,) if out is None else (t.value_id, out.value_id)
    into = Ref(out.value_id) if out is not None else None
    payload = (Ref(t.value_id), names, reduction, scatter, tm.view_id, _inplace, into)
    tm.stream.record(
        ("reduce", (result.value_id,), ins, ((shape, t.dtype, True),), payload, issue_site())
    )
    if result is t or result is out:
        # Written in place: autograd's check that a saved tensor was not changed sees it.
        torch.autograd.graph.increment_version(result)
    return result


def _check_input(t: Any, what: str) -> None:
    """A per-rank MeshTensor."""
    if not isinstance(t, MeshTensor):
        raise compat.MeshUsageError(
            f"{what}() takes a MeshTensor, got {type(t).__name__}; make it under "
            "`with procs.activate():`"
        )
    if not t.per_rank:
        raise compat.MeshUsageError(
            f"{what}() combines the values of a per-rank MeshTensor (from activate()); a global "
            "MeshTensor is already one value: use redistribute(...) to change its placements"
        )


def _check_reduction(t: MeshTensor, reduction: str, what: str) -> None:
    """A reduction that exists and that ``t``'s dtype allows, of a tensor that needs no
    gradient."""
    if reduction not in REDUCTIONS:
        raise compat.MeshUsageError(
            f"{what}: unknown reduction {reduction!r}; use one of {', '.join(REDUCTIONS)}"
        )
    if torch.is_grad_enabled() and t.requires_grad:
        raise compat.MeshUsageError(
            f"{what}() of a tensor that requires grad: the collective is not recorded by "
            "autograd, so its gradient would be lost; reduce under `with torch.no_grad():` "
            "(gradients from grad_generator or .grad need it) or reduce t.detach()"
        )
    _check_dtype(t.dtype, reduction, what)


def _check_in_place(
    out: MeshTensor | None, reduction: str, scatter: bool, n: int, same_mesh: bool
) -> None:
    """``reduce_`` writes its result into its input: one of the input's shape, on its mesh."""
    if out is not None:
        raise compat.MeshUsageError("reduce_() writes into its input: it takes no out=")
    if reduction == "stack" and not scatter:
        raise compat.MeshUsageError(
            "reduce_(..., 'stack') cannot write in place: its result has a new leading "
            f"dimension of {n}; use t.reduce(...) for a new tensor"
        )
    if scatter and reduction != "stack":
        raise compat.MeshUsageError(
            f"reduce_(..., {reduction!r}, scatter=True) cannot write in place: its result "
            f"drops the leading dimension of {n}; use t.reduce(...) for a new tensor"
        )
    if not same_mesh:
        raise compat.MeshUsageError(
            "reduce_(mesh=...) cannot move its input to another mesh in place; use "
            "t.reduce(..., mesh=...)"
        )


def _dims(tm: TensorMesh, dims: Any, what: str) -> tuple[str, ...]:
    names = (dims,) if isinstance(dims, str) else tuple(dims)
    if not names:
        return tm.labels  # Monarch's meaning of no dims: all of them
    if len(set(names)) != len(names):
        raise compat.MeshUsageError(f"{what}: a mesh dimension is named twice in {names}")
    return tm.check_dims(names, what)


def _check_dtype(dtype: torch.dtype, reduction: str, what: str) -> None:
    if reduction in _BITWISE and (dtype.is_floating_point or dtype.is_complex):
        raise compat.MeshUsageError(
            f"{what}(..., {reduction!r}) is a bitwise reduction: it takes integer or bool "
            f"tensors, not {dtype}"
        )
    if reduction == "avg" and not (dtype.is_floating_point or dtype.is_complex):
        raise compat.MeshUsageError(
            f"{what}(..., 'avg') of a {dtype} tensor: an average is not a {dtype}; convert "
            "first (t.float()) or reduce with 'sum'"
        )
    if dtype == torch.bool and reduction in ("sum", "product"):
        raise compat.MeshUsageError(
            f"{what}(..., {reduction!r}) of a bool tensor: use 'bor'/'max' (any) or "
            "'band'/'min' (all), or convert first (t.int())"
        )


def _result_shape(
    shape: tuple[int, ...], n: int, reduction: str, scatter: bool, what: str
) -> tuple[int, ...]:
    if scatter:
        if not shape or shape[0] != n:
            raise compat.MeshUsageError(
                f"{what}(scatter=True) gives rank i row i of the result: the tensor's leading "
                f"dimension must be the {n} ranks reduced over, but its shape is {shape}"
            )
        return shape if reduction == "stack" else shape[1:]
    return (n, *shape) if reduction == "stack" else shape


def _target_mesh(tm: TensorMesh, mesh: Any, what: str) -> TensorMesh:
    """Where the result lives: ``tm``, or another view (rename, flatten, split) of the same
    processes in the same order, where each rank's value stays where it is."""
    if mesh is None or mesh is tm:
        return tm
    target = mesh if isinstance(mesh, TensorMesh) else view_of(tm, mesh)
    if target is None or target.stream is not tm.stream:
        raise compat.MeshUsageError(
            f"{what}(mesh=...): only a mesh over the same processes as the tensor's "
            f"({tm!r}: the same mesh, or a rename, flatten or split of it) can take the result; "
            "fetch a rank's value with actormesh.fetch(t, **coords) instead"
        )
    return target


def _check_out(out: Any, target: TensorMesh, shape: tuple[int, ...], dtype: Any) -> MeshTensor:
    if not isinstance(out, MeshTensor) or not out.per_rank or out.mesh is not target:
        raise compat.MeshUsageError(
            f"reduce(out=...) takes a per-rank MeshTensor of the result's mesh ({target!r}), got "
            f"{out!r}"
        )
    if tuple(out.shape) != shape or out.dtype != dtype:
        raise compat.MeshUsageError(
            f"reduce(out=...): the result is {shape} {dtype}, out is {tuple(out.shape)} {out.dtype}"
        )
    return out


def reduce_tree(
    tensors: Any,
    dims: str | Sequence[str] = (),
    reduction: str = "sum",
    scatter: bool = False,
    mesh: Any = None,
    _inplace: bool = False,
) -> Any:
    """Monarch's ``reduce(tensors, ...)``: ``t.reduce(...)`` for each MeshTensor of a pytree."""

    def one(x: Any) -> Any:
        if isinstance(x, MeshTensor):
            return reduce(x, dims, reduction, scatter, mesh, _inplace)
        return x

    return tree_map(one, tensors)


def reduce_tree_(
    tensors: Any,
    dims: str | Sequence[str] = (),
    reduction: str = "sum",
    scatter: bool = False,
    mesh: Any = None,
) -> Any:
    """Monarch's ``reduce_(tensors, ...)``: ``t.reduce_(...)`` for each MeshTensor of a pytree."""
    return reduce_tree(tensors, dims, reduction, scatter, mesh, _inplace=True)

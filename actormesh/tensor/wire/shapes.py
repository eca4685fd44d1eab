"""Shapes without a round trip: an op's outputs computed on meta tensors, and the caches that
make a repeated op cost a dictionary lookup (pure: no MeshTensor, no I/O).

DTensor has single-device semantics, so the *global* output shape does not depend on the
placements: running the op on meta tensors of the global shapes gives it. That costs 50-70 µs,
most of a recorded op, so results are cached per (op, input signature). Two levels:

- ``propagate`` keys on the op and every argument's shape, stride and dtype (floats by type
  only: a learning rate never changes a shape, and keying on it would miss on every step);
- a *plan* per (op, interned input signatures, scalars) turns a hit into building the outputs,
  with every per-op decision (output metadata, the name sent to the workers, whether the op
  draws random numbers) taken once. A MeshTensor carries its signature as a small int
  (``signature()``), so the key is a short tuple of ints and scalars.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

CACHE_SIZE = 4096

_propagated: dict[Any, Any] = {}
_sigs: dict[tuple[Any, ...], int] = {}
_sig_ids = itertools.count()
plans: dict[Any, Any] = {}


def signature(shape: Any, stride: Any, dtype: torch.dtype, per_rank: bool) -> int:
    """A small int naming (shape, stride, dtype, per_rank): what a plan's key holds per tensor.

    The table is bounded: when it is full it starts over, and a signature seen again gets a new
    int. Ints are never reused, so a MeshTensor that still carries an old one keys the plans
    made for its own signature, never another's."""
    key = (tuple(shape), tuple(stride), dtype, per_rank)
    sig = _sigs.get(key)
    if sig is None:
        if len(_sigs) >= CACHE_SIZE:
            _sigs.clear()
        sig = _sigs[key] = next(_sig_ids)
    return sig


def remember(table: dict[Any, Any], key: Any, value: Any) -> None:
    if len(table) >= CACHE_SIZE:
        table.pop(next(iter(table)))  # the oldest entry
    table[key] = value


def _to_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if type(x) is list or type(x) is tuple:
        return type(x)(_to_meta(e) for e in x)
    if type(x) is torch.device:  # ``.to(device=...)``: the copy stays on meta here
        return _META
    return x


_META = torch.device("meta")


def propagate(func: Any, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func`` run on meta tensors (cached under ``key``): the pytree spec, one entry per output
    leaf (new ``(shape, stride, dtype, shape tuple)``, an alias of the n-th tensor input (with
    its new shape and stride if the op changed them in place), or a
    plain value), and whether the result is one tensor. Raises what the op raises."""
    entry = _propagated.get(key)
    if entry is not None:
        return entry
    margs = _to_meta(args)
    mkwargs = {k: _to_meta(v) for k, v in kwargs.items()}
    inputs = [x for x in tree_flatten((margs, mkwargs))[0] if isinstance(x, torch.Tensor)]
    before = [(x.shape, x.stride()) for x in inputs]
    out = func(*margs, **mkwargs)
    leaves, spec = tree_flatten(out)
    entries: list[Any] = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            alias = next((j for j, m in enumerate(inputs) if m is leaf), None)
            if alias is not None and before[alias] == (leaf.shape, leaf.stride()):
                entries.append(("alias", alias))
            elif alias is not None:  # unsqueeze_, t_, resize_...: the input's metadata changed
                entries.append(("alias", alias, tuple(leaf.shape), leaf.stride()))
            else:
                entries.append(("new", leaf.shape, leaf.stride(), leaf.dtype, tuple(leaf.shape)))
        else:
            entries.append(("value", leaf))
    entry = (spec, entries, isinstance(out, torch.Tensor))
    remember(_propagated, key, entry)
    return entry


def contiguous_strides(shape: Any) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``shape`` (what a new global DTensor is given)."""
    strides, acc = [], 1
    for n in reversed(tuple(shape)):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))

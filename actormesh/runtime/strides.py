"""Strided rank arithmetic on plain tuples: what ``Shape`` (``shape.py``) checks when it is made,
and the labels, offset, sizes and strides of its views (a slice, a split, a flatten). Pure, as
``shape.py`` is; ``shown`` is the shape itself, which the errors name as its extent.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import NoReturn

from ..errors import MeshTypeError, MeshUsageError
from .extent import (
    Extent,
    Selector,
    as_int,
    check_known,
    check_label,
    check_labels,
    normalize_index,
)

Dims = tuple[
    tuple[str, ...], int, tuple[int, ...], tuple[int, ...]
]  # labels, offset, sizes, strides


def check_strides(extent: Extent, offset: int, strides_t: tuple[int, ...]) -> None:
    """One stride >= 1 per dimension, ordered outer to inner without overlap; offset >= 0."""
    if len(strides_t) != len(extent.sizes):
        raise MeshUsageError(
            f"got {len(strides_t)} strides {strides_t} for {len(extent.sizes)} dimensions "
            f"{extent}; give one stride per dimension"
        )
    if offset < 0:
        raise MeshUsageError(f"offset must be >= 0, got {offset}")
    for label, stride in zip(extent.labels, strides_t, strict=True):
        if stride < 1:
            raise MeshUsageError(f"dimension {label!r} has stride {stride}; strides must be >= 1")
    span = 0  # largest offset reachable through the dimensions inside the current one
    for label, size, stride in reversed(
        list(zip(extent.labels, extent.sizes, strides_t, strict=True))
    ):
        if size == 1:
            continue
        if stride <= span:
            raise MeshUsageError(
                f"strides {strides_t} of extent {extent} overlap or are not ordered outer to "
                f"inner: dimension {label!r} has stride {stride} but the dimensions inside "
                f"it reach {span}"
            )
        span += (size - 1) * stride


def sliced(
    labels: tuple[str, ...],
    offset: int,
    sizes: tuple[int, ...],
    strides: tuple[int, ...],
    selectors: Mapping[str, Selector],
    shown: object,
) -> Dims:
    """``Shape.slice``: an int selector drops its dimension, a slice keeps it (Python's
    semantics, positive steps)."""
    check_known(list(selectors), labels, sizes)
    out_labels: list[str] = []
    out_sizes: list[int] = []
    out_strides: list[int] = []
    for label, size, stride in zip(labels, sizes, strides, strict=True):
        if label not in selectors:
            out_labels.append(label)
            out_sizes.append(size)
            out_strides.append(stride)
            continue
        sel = selectors[label]
        if isinstance(sel, builtins.slice):
            start, step, count = _resolve_slice(label, size, sel, shown)
            offset += start * stride
            out_labels.append(label)
            out_sizes.append(count)
            out_strides.append(stride * step)
        elif isinstance(sel, bool) or not hasattr(sel, "__index__"):
            raise MeshTypeError(
                f"selector for dimension {label!r} must be an int or a slice, got "
                f"{type(sel).__name__} {sel!r}"
            )
        else:
            offset += normalize_index(sel, label, size, labels, sizes) * stride
    return tuple(out_labels), offset, tuple(out_sizes), tuple(out_strides)


def _resolve_slice(
    label: str, size: int, sel: builtins.slice, shown: object
) -> tuple[int, int, int]:
    try:
        start, stop, step = sel.indices(size)
    except (TypeError, ValueError) as exc:
        error = MeshTypeError if isinstance(exc, TypeError) else MeshUsageError
        raise error(f"bad selector {sel!r} for dimension {label!r}: {exc}") from exc
    if step < 0:
        raise MeshUsageError(
            f"selector {sel!r} for dimension {label!r} has a negative step; mesh views keep "
            f"rank order, so use a positive step (extent {shown})"
        )
    count = len(range(start, stop, step))
    if count == 0:
        raise MeshUsageError(
            f"selector {sel!r} selects nothing from dimension {label!r} of size {size} "
            f"(extent {shown}); a mesh view must keep at least one rank"
        )
    return start, step, count


def spacing(sizes: tuple[int, ...], strides: tuple[int, ...]) -> int | None:
    """The common difference of the ranks the strides address (for a mapped shape, before
    the mapping), or None if uneven."""
    stride = None
    span = 0  # the span that the next outer dimension's stride must equal
    for size, st in zip(reversed(sizes), reversed(strides), strict=True):
        if size == 1:  # size-1 dims do not affect spacing
            continue
        if stride is None:
            stride = st
        elif st != span:
            return None
        span = st * size
    return 1 if stride is None else stride


def not_contiguous(
    name: str,
    labels: tuple[str, ...],
    sizes: tuple[int, ...],
    strides: tuple[int, ...],
    shown: object,
) -> NoReturn:
    """Raise why a shape whose ranks are unevenly spaced cannot be flattened into ``name``."""
    big = [(lbl, sz, st) for lbl, sz, st in zip(labels, sizes, strides, strict=True) if sz > 1]
    for (outer, _, outer_stride), (inner, inner_size, inner_stride) in pairwise(big):
        if outer_stride != inner_stride * inner_size:
            raise MeshUsageError(
                f"cannot flatten extent {shown} into {name!r}: the view is not "
                f"contiguous, so no single stride describes its ranks (dimension "
                f"{outer!r} has stride {outer_stride}, but dimension {inner!r} spans "
                f"{inner_size} x {inner_stride} = {inner_size * inner_stride}); "
                f"flatten before slicing, or slice only the outermost dimension"
            )
    raise AssertionError("unreachable: spacing found a gap")  # pragma: no cover


def split_dims(
    labels: tuple[str, ...],
    sizes: tuple[int, ...],
    strides: tuple[int, ...],
    spec: Mapping[str, Sequence[str] | int],
) -> tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]]:
    """``Shape.split``: each dimension ``spec`` names becomes the dimensions it lists, whose
    sizes the other keywords give (one may be left out: it takes what is left)."""
    splits: dict[str, tuple[str, ...]] = {}
    given: dict[str, int] = {}
    for key, value in spec.items():
        if key in labels:
            if isinstance(value, str) or not isinstance(value, Sequence):
                raise MeshTypeError(
                    f"split({key}=...) takes a sequence of new dimension names, got {value!r}"
                )
            splits[key] = tuple(check_label(v, "new dimension name") for v in value)
        else:
            given[check_label(key, "new dimension name")] = as_int(value, f"size of {key!r}")
    out_labels: list[str] = []
    out_sizes: list[int] = []
    out_strides: list[int] = []
    for label, size, stride in zip(labels, sizes, strides, strict=True):
        names = splits.get(label, (label,))
        unknown = [n for n in names if n not in given]
        known = math.prod(given[n] for n in names if n in given)
        if len(unknown) > 1 or known < 1 or size % known or (not unknown and known != size):
            shown = {n: given.get(n, "?") for n in names}
            raise MeshUsageError(
                f"cannot split dimension {label!r} of size {size} into {shown}: give the "
                f"size of all but at most one new dimension, whose sizes multiply to {size}"
            )
        new_sizes = [given.pop(n) if n in given else size // known for n in names]
        inner = stride
        new_strides = []
        for n in reversed(new_sizes):
            new_strides.append(inner)
            inner *= n
        out_labels += names
        out_sizes += new_sizes
        out_strides += reversed(new_strides)
    if given:
        raise MeshUsageError(f"split: sizes given for no split dimension: {sorted(given)}")
    check_labels(out_labels)
    return tuple(out_labels), tuple(out_sizes), tuple(out_strides)

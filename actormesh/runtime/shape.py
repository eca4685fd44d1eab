"""The strided views of a rank space that every mesh is: ``Shape``, and ``MeshShape``, the
slicing methods meshes share (``Extent`` and ``Point`` are in ``extent.py``).

Everything here is pure bookkeeping: no I/O, no processes, no locks. Objects are immutable, so
they may be shared freely between threads.

A ``Shape`` is a strided view of a *global* rank space (the ranks of the mesh that was spawned):
``offset + sum(coord[i] * strides[i])`` is the global rank of the point with coordinates
``coord`` in the view. Slicing a mesh changes only its ``Shape``; no message is sent.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import Any

from ..errors import MeshIndexError, MeshTypeError, MeshUsageError
from .extent import (
    Extent,
    Point,
    Selector,
    as_int,
    check_known,
    check_label,
    check_labels,
    normalize_index,
    render_extent,
    row_major_index,
    row_major_strides,
)

__all__ = ["Shape", "unchecked_shape"]


class Shape:
    """A strided view of a global rank space, with named dimensions.

    The point with coordinates ``c`` (in this view's extent) is global rank
    ``offset + sum(c[i] * strides[i])``. Dimensions run outer to inner: among dimensions of size
    > 1, each stride exceeds the span of the dimensions inside it, so the view never overlaps
    itself and a global rank maps back to a point in O(ndims).

    Immutable, hashable and cheap to pickle (it travels in every message): a few tuples, no
    per-rank data. ``ranks()`` is computed on first use and cached in the instance, not pickled.
    Equality ignores the strides of size-1 dimensions, which select nothing.
    """

    __slots__ = ("_extent", "_labels", "_offset", "_ranks", "_sizes", "_strides")
    _labels: tuple[str, ...]
    _offset: int
    _sizes: tuple[int, ...]
    _strides: tuple[int, ...]
    _extent: Extent | None
    _ranks: tuple[int, ...] | None

    def __init__(
        self,
        labels: Sequence[str],
        offset: int,
        sizes: Sequence[int],
        strides: Sequence[int],
    ) -> None:
        extent = Extent(labels, sizes)  # validates names and sizes
        strides_t = tuple(as_int(s, "stride") for s in strides)
        offset = as_int(offset, "offset")
        if len(strides_t) != len(extent.sizes):
            raise MeshUsageError(
                f"got {len(strides_t)} strides {strides_t} for {len(extent.sizes)} dimensions "
                f"{extent}; give one stride per dimension"
            )
        if offset < 0:
            raise MeshUsageError(f"offset must be >= 0, got {offset}")
        for label, stride in zip(extent.labels, strides_t, strict=True):
            if stride < 1:
                raise MeshUsageError(
                    f"dimension {label!r} has stride {stride}; strides must be >= 1"
                )
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
        self._init(extent.labels, offset, extent.sizes, strides_t, extent)

    def _init(
        self,
        labels: tuple[str, ...],
        offset: int,
        sizes: tuple[int, ...],
        strides: tuple[int, ...],
        extent: Extent | None,
    ) -> None:
        object.__setattr__(self, "_labels", labels)
        object.__setattr__(self, "_offset", offset)
        object.__setattr__(self, "_sizes", sizes)
        object.__setattr__(self, "_strides", strides)
        object.__setattr__(self, "_extent", extent)
        object.__setattr__(self, "_ranks", None)

    @classmethod
    def _unchecked(
        cls,
        labels: tuple[str, ...],
        offset: int,
        sizes: tuple[int, ...],
        strides: tuple[int, ...],
    ) -> Shape:
        # For views derived from a valid Shape: the invariants hold by construction.
        shape = cls.__new__(cls)
        shape._init(labels, offset, sizes, strides, None)  # noqa: SLF001  a new Shape: its own
        return shape

    @classmethod
    def from_extent(cls, extent: Extent | Mapping[str, int]) -> Shape:
        """The dense row-major shape of ``extent``: offset 0, last dimension fastest."""
        if not isinstance(extent, Extent):
            extent = Extent.from_dict(extent)
        return cls(extent.labels, 0, extent.sizes, row_major_strides(extent.sizes))

    # -- accessors -------------------------------------------------------------------------------

    @property
    def extent(self) -> Extent:
        extent = self._extent
        if extent is None:
            extent = Extent(self._labels, self._sizes)
            object.__setattr__(self, "_extent", extent)
        return extent

    @property
    def labels(self) -> tuple[str, ...]:
        return self._labels

    @property
    def sizes(self) -> tuple[int, ...]:
        return self._sizes

    @property
    def strides(self) -> tuple[int, ...]:
        return self._strides

    @property
    def offset(self) -> int:
        return self._offset

    @property
    def ndim(self) -> int:
        return len(self._labels)

    def __len__(self) -> int:
        return math.prod(self._sizes)

    def ranks(self) -> tuple[int, ...]:
        """Global ranks of this view in row-major order (computed once, then cached)."""
        ranks = self._ranks
        if ranks is None:
            acc = [self._offset]
            for size, stride in zip(self._sizes, self._strides, strict=True):
                steps = [i * stride for i in range(size)]
                acc = [base + step for base in acc for step in steps]
            ranks = tuple(acc)
            # Two threads may race here; both compute the same tuple, so either write is fine.
            object.__setattr__(self, "_ranks", ranks)
        return ranks

    def global_rank(self, local_index: int) -> int:
        """Global rank of the point at row-major ``local_index`` of this view."""
        n = len(self)
        index = as_int(local_index, "local index")
        if not 0 <= index < n:
            raise MeshIndexError(
                f"local index {index} is out of range for a view of {n} ranks (extent {self})"
            )
        rank = self._offset
        for size, stride in zip(reversed(self._sizes), reversed(self._strides), strict=True):
            index, c = divmod(index, size)
            rank += c * stride
        return rank

    def local_index(self, global_rank: int) -> int | None:
        """Row-major index of ``global_rank`` in this view, or ``None`` if it is not in it."""
        rest = global_rank - self._offset
        if rest < 0:
            return None
        index = 0
        # Outer to inner: each stride exceeds the span of the dimensions inside it, so the
        # coordinate along a dimension is simply the quotient.
        for size, stride in zip(self._sizes, self._strides, strict=True):
            if size == 1:
                continue
            c = rest // stride
            if c >= size:
                return None
            rest -= c * stride
            index = index * size + c
        return index if rest == 0 else None

    def point(self, local_index: int) -> Point:
        """The point at ``local_index`` in this view's own extent."""
        return Point(local_index, self.extent)

    def point_of_global(self, global_rank: int) -> Point | None:
        """The point of ``global_rank`` in this view's extent, or ``None`` if not in the view."""
        index = self.local_index(global_rank)
        return None if index is None else Point(index, self.extent)

    def index_of_coords(self, coords: Mapping[str, int]) -> int:
        """Local (row-major) index of ``coords``; size-1 dimensions may be omitted.

        Negative coordinates count from the end, as in ``slice``.

        Raises:
            ValueError: an unknown dimension, or a missing coordinate of a dimension of size > 1.
            IndexError: a coordinate is out of range.
        """
        return row_major_index(self._labels, self._sizes, coords, allow_negative=True)

    # -- views -----------------------------------------------------------------------------------

    def slice(self, **selectors: Selector) -> Shape:
        """A sub-view. ``dim=int`` selects one index and drops the dimension (negative ints count
        from the end); ``dim=slice(start, stop, step)`` keeps it, with Python semantics.

        Raises:
            ValueError: unknown dimension, negative or zero step, or an empty selection.
            IndexError: an int selector out of range.
            TypeError: a selector that is neither an int nor a slice.
        """
        if not selectors:
            return self
        check_known(list(selectors), self._labels, self._sizes)
        labels: list[str] = []
        sizes: list[int] = []
        strides: list[int] = []
        offset = self._offset
        for label, size, stride in zip(self._labels, self._sizes, self._strides, strict=True):
            if label not in selectors:
                labels.append(label)
                sizes.append(size)
                strides.append(stride)
                continue
            sel = selectors[label]
            if isinstance(sel, builtins.slice):
                start, step, count = self._resolve_slice(label, size, sel)
                offset += start * stride
                labels.append(label)
                sizes.append(count)
                strides.append(stride * step)
            elif isinstance(sel, bool) or not hasattr(sel, "__index__"):
                raise MeshTypeError(
                    f"selector for dimension {label!r} must be an int or a slice, got "
                    f"{type(sel).__name__} {sel!r}"
                )
            else:
                offset += normalize_index(sel, label, size, self._labels, self._sizes) * stride
        return Shape._unchecked(tuple(labels), offset, tuple(sizes), tuple(strides))

    def _resolve_slice(self, label: str, size: int, sel: builtins.slice) -> tuple[int, int, int]:
        try:
            start, stop, step = sel.indices(size)
        except (TypeError, ValueError) as exc:
            error = MeshTypeError if isinstance(exc, TypeError) else MeshUsageError
            raise error(f"bad selector {sel!r} for dimension {label!r}: {exc}") from exc
        if step < 0:
            raise MeshUsageError(
                f"selector {sel!r} for dimension {label!r} has a negative step; mesh views keep "
                f"rank order, so use a positive step (extent {self})"
            )
        count = len(range(start, stop, step))
        if count == 0:
            raise MeshUsageError(
                f"selector {sel!r} selects nothing from dimension {label!r} of size {size} "
                f"(extent {self}); a mesh view must keep at least one rank"
            )
        return start, step, count

    def flatten(self, name: str) -> Shape:
        """One dimension called ``name`` holding every rank of this view, in the same order.

        Raises:
            ValueError: the view's ranks are not evenly spaced (e.g. some inner dimension was
                sliced), so no single stride describes them.
        """
        check_label(name)
        stride = self.uniform_stride()
        if stride is None:
            big = [
                (lbl, sz, st)
                for lbl, sz, st in zip(self._labels, self._sizes, self._strides, strict=True)
                if sz > 1
            ]
            for (outer, _, outer_stride), (inner, inner_size, inner_stride) in pairwise(big):
                if outer_stride != inner_stride * inner_size:
                    raise MeshUsageError(
                        f"cannot flatten extent {self} into {name!r}: the view is not "
                        f"contiguous, so no single stride describes its ranks (dimension "
                        f"{outer!r} has stride {outer_stride}, but dimension {inner!r} spans "
                        f"{inner_size} x {inner_stride} = {inner_size * inner_stride}); "
                        f"flatten before slicing, or slice only the outermost dimension"
                    )
            raise AssertionError("unreachable: uniform_stride found a gap")  # pragma: no cover
        return Shape._unchecked((name,), self._offset, (len(self),), (stride,))

    def rank_view(self, index: int) -> Shape:
        """The one-rank view of this view's ``index``-th rank, as dimension ``rank`` of size 1
        (what a tool addresses when it talks to one rank of a mesh).

        Raises:
            ValueError: the view is not evenly spaced (see ``flatten``).
            IndexError: ``index`` out of range.
        """
        return self.flatten("rank").slice(rank=builtins.slice(index, index + 1))

    def uniform_stride(self) -> int | None:
        """The common difference of ``ranks()`` (1 for a single rank), or None if uneven."""
        stride = None
        span = 0  # the span that the next outer dimension's stride must equal
        for size, st in zip(reversed(self._sizes), reversed(self._strides), strict=True):
            if size == 1:  # size-1 dims do not affect spacing
                continue
            if stride is None:
                stride = st
            elif st != span:
                return None
            span = st * size
        return 1 if stride is None else stride

    def rename(self, **old_to_new: str) -> Shape:
        """The same view with dimensions renamed (``rename(gpus="ranks")``)."""
        if not old_to_new:
            return self
        check_known(list(old_to_new), self._labels, self._sizes)
        for new in old_to_new.values():
            check_label(new, "new dimension name")
        labels = tuple(old_to_new.get(label, label) for label in self._labels)
        if len(set(labels)) != len(labels):
            dups = sorted({label for label in labels if labels.count(label) > 1})
            raise MeshUsageError(
                f"renaming {old_to_new} in extent {self} gives duplicate dimension "
                f"name{'s' if len(dups) > 1 else ''} {', '.join(map(repr, dups))}"
            )
        return Shape._unchecked(labels, self._offset, self._sizes, self._strides)

    def split(self, **spec: Sequence[str] | int) -> Shape:
        """Dimensions split into several, as Monarch's ``split``: ``split(hosts=("dp", "pp"),
        pp=4)`` makes ``hosts`` of size 8 into ``dp`` (2) and ``pp`` (4), same rank order. A
        keyword naming an existing dimension gives its new names; any other gives the size of a
        new one. One new dimension per split may be left without a size: it takes what is left.
        """
        splits: dict[str, tuple[str, ...]] = {}
        given: dict[str, int] = {}
        for key, value in spec.items():
            if key in self._labels:
                if isinstance(value, str) or not isinstance(value, Sequence):
                    raise MeshTypeError(
                        f"split({key}=...) takes a sequence of new dimension names, got {value!r}"
                    )
                splits[key] = tuple(check_label(v, "new dimension name") for v in value)
            else:
                given[check_label(key, "new dimension name")] = as_int(value, f"size of {key!r}")
        labels: list[str] = []
        sizes: list[int] = []
        strides: list[int] = []
        for label, size, stride in zip(self._labels, self._sizes, self._strides, strict=True):
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
            labels += names
            sizes += new_sizes
            strides += reversed(new_strides)
        if given:
            raise MeshUsageError(f"split: sizes given for no split dimension: {sorted(given)}")
        check_labels(labels)
        return Shape._unchecked(tuple(labels), self._offset, tuple(sizes), tuple(strides))

    # -- value semantics -------------------------------------------------------------------------

    def _key(self) -> tuple[Any, ...]:
        strides = tuple(
            st if sz > 1 else 0 for sz, st in zip(self._sizes, self._strides, strict=True)
        )
        return (self._labels, self._offset, self._sizes, strides)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Shape):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash((Shape, *self._key()))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Shape is immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Shape is immutable; cannot delete {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Only the four defining tuples travel; the caches are rebuilt on demand. Unpickling
        # skips validation: every Shape was validated where it was made, and pickles come
        # only from our own, authenticated peers (see wire.py).
        return (_restore_shape, (self._labels, self._offset, self._sizes, self._strides))

    def __repr__(self) -> str:
        return (
            f"Shape(labels={self._labels!r}, offset={self._offset}, sizes={self._sizes!r}, "
            f"strides={self._strides!r})"
        )

    def __str__(self) -> str:
        return render_extent(self._labels, self._sizes)


def unchecked_shape(
    labels: tuple[str, ...], offset: int, sizes: tuple[int, ...], strides: tuple[int, ...]
) -> Shape:
    """A ``Shape`` of fields that came from a valid one (a shape sent as plain tuples, a view of
    a mesh's own): no checks, as it is made on every message that carries one."""
    return Shape._unchecked(labels, offset, sizes, strides)  # noqa: SLF001  this module's class


def _restore_shape(
    labels: tuple[str, ...], offset: int, sizes: tuple[int, ...], strides: tuple[int, ...]
) -> Shape:
    return unchecked_shape(labels, offset, sizes, strides)

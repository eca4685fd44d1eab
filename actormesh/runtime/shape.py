"""The strided views of a rank space that every mesh is: ``Shape``, and ``MeshShape``, the
slicing methods meshes share (``Extent`` and ``Point`` are in ``extent.py``).

Everything here is pure bookkeeping: no I/O, no processes, no locks. Objects are immutable, so
they may be shared freely between threads.

A ``Shape`` is a strided view of a *global* rank space (the ranks of the mesh that was spawned):
``offset + sum(coord[i] * strides[i])`` is the global rank of the point with coordinates
``coord`` in the view. Slicing a mesh changes only its ``Shape``; no message is sent.

A shape may also *map* the ranks its strides address to other global ranks (``of_ranks``): a
mesh of some processes of another in any order, which no strided view can name (a tensor mesh
that goes on without an inner rank it lost). Its views map through the same table.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import MeshIndexError, MeshUsageError
from .extent import (
    Extent,
    Point,
    Selector,
    as_int,
    check_known,
    check_label,
    render_extent,
    row_major_index,
    row_major_strides,
)
from .strides import check_strides, not_contiguous, sliced, spacing, split_dims

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

    __slots__ = ("_extent", "_inverse", "_labels", "_map", "_offset", "_ranks", "_sizes",
                 "_strides")  # fmt: skip
    _labels: tuple[str, ...]
    _offset: int
    _sizes: tuple[int, ...]
    _strides: tuple[int, ...]
    _extent: Extent | None
    _ranks: tuple[int, ...] | None
    # of_ranks: the global rank of each rank the strides address (None: the strides' own)
    _map: tuple[int, ...] | None
    _inverse: dict[int, int] | None

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
        check_strides(extent, offset, strides_t)
        self._init(extent.labels, offset, extent.sizes, strides_t, extent)

    def _init(
        self,
        labels: tuple[str, ...],
        offset: int,
        sizes: tuple[int, ...],
        strides: tuple[int, ...],
        extent: Extent | None,
        mapping: tuple[int, ...] | None = None,
    ) -> None:
        object.__setattr__(self, "_labels", labels)
        object.__setattr__(self, "_offset", offset)
        object.__setattr__(self, "_sizes", sizes)
        object.__setattr__(self, "_strides", strides)
        object.__setattr__(self, "_extent", extent)
        object.__setattr__(self, "_ranks", None)
        object.__setattr__(self, "_map", mapping)
        object.__setattr__(self, "_inverse", None)

    @classmethod
    def _unchecked(
        cls,
        labels: tuple[str, ...],
        offset: int,
        sizes: tuple[int, ...],
        strides: tuple[int, ...],
        mapping: tuple[int, ...] | None = None,
    ) -> Shape:
        # For views derived from a valid Shape: the invariants hold by construction.
        shape = cls.__new__(cls)
        shape._init(labels, offset, sizes, strides, None, mapping)  # noqa: SLF001  its own
        return shape

    def _view(
        self,
        labels: tuple[str, ...],
        offset: int,
        sizes: tuple[int, ...],
        strides: tuple[int, ...],
    ) -> Shape:
        """A view of this one (its strides over the same ranks, mapped as this one is)."""
        return Shape._unchecked(labels, offset, sizes, strides, self._map)

    @classmethod
    def of_ranks(cls, extent: Extent | Mapping[str, int], ranks: Sequence[int]) -> Shape:
        """The shape of ``extent`` whose points, in row-major order, are global ``ranks``
        (distinct; any order): some processes of a mesh, which a strided view cannot name."""
        dense = cls.from_extent(extent)
        chosen = tuple(as_int(r, "rank") for r in ranks)
        if len(chosen) != len(dense) or len(set(chosen)) != len(chosen) or min(chosen) < 0:
            raise MeshUsageError(
                f"a shape of extent {dense} needs {len(dense)} distinct ranks >= 0, got "
                f"{list(chosen)}"
            )
        return cls._unchecked(dense.labels, 0, dense.sizes, dense.strides, chosen)

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
    def mapping(self) -> tuple[int, ...] | None:
        """``of_ranks``'s table: the global rank of each rank the strides address (None: the
        strides address global ranks themselves)."""
        return self._map

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
            mapping = self._map
            ranks = tuple(acc) if mapping is None else tuple(mapping[r] for r in acc)
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
        return rank if self._map is None else self._map[rank]

    def local_index(self, global_rank: int) -> int | None:
        """Row-major index of ``global_rank`` in this view, or ``None`` if it is not in it."""
        if self._map is not None:
            inverse = self._inverse
            if inverse is None:
                inverse = {g: i for i, g in enumerate(self._map)}
                object.__setattr__(self, "_inverse", inverse)
            found = inverse.get(global_rank)
            if found is None:
                return None
            global_rank = found
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
        dims = sliced(self._labels, self._offset, self._sizes, self._strides, selectors, self)
        return self._view(*dims)

    def flatten(self, name: str) -> Shape:
        """One dimension called ``name`` holding every rank of this view, in the same order.

        Raises:
            ValueError: the view's ranks are not evenly spaced (e.g. some inner dimension was
                sliced), so no single stride describes them.
        """
        check_label(name)
        stride = spacing(self._sizes, self._strides)
        if stride is None:
            not_contiguous(name, self._labels, self._sizes, self._strides, self)
        return self._view((name,), self._offset, (len(self),), (stride,))

    def rank_view(self, index: int) -> Shape:
        """The one-rank view of this view's ``index``-th rank, as dimension ``rank`` of size 1
        (what a tool addresses when it talks to one rank of a mesh).

        Raises:
            ValueError: the view is not evenly spaced (see ``flatten``).
            IndexError: ``index`` out of range.
        """
        return self.flatten("rank").slice(rank=builtins.slice(index, index + 1))

    def uniform_stride(self) -> int | None:
        """The common difference of ``ranks()`` (1 for a single rank), or None if uneven (or
        mapped: then the ranks are a table's, ``of_ranks``)."""
        return None if self._map is not None else spacing(self._sizes, self._strides)

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
        return self._view(labels, self._offset, self._sizes, self._strides)

    def split(self, **spec: Sequence[str] | int) -> Shape:
        """Dimensions split into several, as Monarch's ``split``: ``split(hosts=("dp", "pp"),
        pp=4)`` makes ``hosts`` of size 8 into ``dp`` (2) and ``pp`` (4), same rank order. A
        keyword naming an existing dimension gives its new names; any other gives the size of a
        new one. One new dimension per split may be left without a size: it takes what is left.
        """
        labels, sizes, strides = split_dims(self._labels, self._sizes, self._strides, spec)
        return self._view(labels, self._offset, sizes, strides)

    # -- value semantics -------------------------------------------------------------------------

    def _key(self) -> tuple[Any, ...]:
        strides = tuple(
            st if sz > 1 else 0 for sz, st in zip(self._sizes, self._strides, strict=True)
        )
        return (self._labels, self._offset, self._sizes, strides, self._map)

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
        return (_restore_shape, (self._labels, self._offset, self._sizes, self._strides, self._map))

    def __repr__(self) -> str:
        mapped = "" if self._map is None else f", ranks={self._map!r}"
        return (
            f"Shape(labels={self._labels!r}, offset={self._offset}, sizes={self._sizes!r}, "
            f"strides={self._strides!r}{mapped})"
        )

    def __str__(self) -> str:
        return render_extent(self._labels, self._sizes)


def unchecked_shape(
    labels: tuple[str, ...],
    offset: int,
    sizes: tuple[int, ...],
    strides: tuple[int, ...],
    mapping: tuple[int, ...] | None = None,
) -> Shape:
    """A ``Shape`` of fields that came from a valid one (a shape sent as plain tuples, a view of
    a mesh's own): no checks, as it is made on every message that carries one."""
    return Shape._unchecked(labels, offset, sizes, strides, mapping)  # noqa: SLF001  its class


def _restore_shape(
    labels: tuple[str, ...],
    offset: int,
    sizes: tuple[int, ...],
    strides: tuple[int, ...],
    mapping: tuple[int, ...] | None = None,
) -> Shape:
    return unchecked_shape(labels, offset, sizes, strides, mapping)

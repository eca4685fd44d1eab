"""Named dimensions and a position in them: ``Extent`` (sizes by name) and ``Point`` (coordinates
by name), with the checks and renderings every mesh shares.

Pure bookkeeping, like ``shape.py``: no I/O, no processes, no locks; objects are immutable."""

from __future__ import annotations

import difflib
import math
import operator
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NoReturn

from ..errors import MeshIndexError, MeshTypeError, MeshUsageError

Selector = int | slice
"""What ``mesh.slice(dim=...)`` accepts: an ``int`` (drops the dimension) or a ``slice``."""


def check_label(label: object, what: str = "dimension name") -> str:
    if not isinstance(label, str):
        raise MeshTypeError(f"{what} must be a str, got {type(label).__name__} {label!r}")
    if not label.isidentifier():
        raise MeshUsageError(
            f"{what} {label!r} is not a valid identifier; use names like 'hosts' or 'gpus'"
        )
    return label


def check_labels(labels: Sequence[str]) -> tuple[str, ...]:
    if isinstance(labels, str):
        raise MeshTypeError(
            f"dimension names must be a sequence of str, got the str {labels!r}; "
            f"write ({labels!r},) for a single dimension"
        )
    out = tuple(check_label(label) for label in labels)
    if len(set(out)) != len(out):
        dups = sorted({label for label in out if out.count(label) > 1})
        raise MeshUsageError(
            f"dimension names must be unique; {', '.join(map(repr, dups))} repeated in {out}"
        )
    return out


def as_int(value: object, what: str) -> int:
    # bool is an int subclass, but `gpus=True` is almost certainly a mistake.
    if isinstance(value, bool):
        raise MeshTypeError(f"{what} must be an int, got bool {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]  # TypeError below if not
    except TypeError:
        got = f"{type(value).__name__} {value!r}"
        raise MeshTypeError(f"{what} must be an int, got {got}") from None


def render_extent(labels: Sequence[str], sizes: Sequence[int]) -> str:
    return (
        "{" + ", ".join(f"{label}: {size}" for label, size in zip(labels, sizes, strict=True)) + "}"
    )


def render_coords(labels: Sequence[str], coords: Sequence[int]) -> str:
    return "{" + ", ".join(f"{label}={c}" for label, c in zip(labels, coords, strict=True)) + "}"


def no_such_dims(names: Sequence[str], labels: Sequence[str], sizes: Sequence[int]) -> NoReturn:
    which = (
        f"dimension {names[0]!r}"
        if len(names) == 1
        else "dimensions " + ", ".join(repr(n) for n in names)
    )
    msg = f"mesh has no {which}; its extent is {render_extent(labels, sizes)}"
    close = difflib.get_close_matches(names[0], labels, n=1)
    if close:
        msg += f"; did you mean {close[0]!r}?"
    raise MeshUsageError(msg)


def check_known(names: Sequence[str], labels: Sequence[str], sizes: Sequence[int]) -> None:
    unknown = [n for n in names if n not in labels]
    if unknown:
        no_such_dims(unknown, labels, sizes)


def normalize_index(
    value: object, label: str, size: int, labels: Sequence[str], sizes: Sequence[int]
) -> int:
    """An int selector/coordinate, negative counting from the end, range-checked."""
    index = as_int(value, f"index for dimension {label!r}")
    normalized = index + size if index < 0 else index
    if not 0 <= normalized < size:
        raise MeshIndexError(
            f"index {index} is out of range for dimension {label!r} of size {size} "
            f"(extent {render_extent(labels, sizes)})"
        )
    return normalized


def row_major_index(
    labels: Sequence[str],
    sizes: Sequence[int],
    coords: Mapping[str, int],
    *,
    allow_negative: bool,
) -> int:
    """Row-major index of ``coords``; dimensions of size 1 may be omitted."""
    check_known(list(coords), labels, sizes)
    missing = [
        label for label, size in zip(labels, sizes, strict=True) if size > 1 and label not in coords
    ]
    if missing:
        example = ", ".join(f"{label}=0" for label in missing)
        raise MeshUsageError(
            f"missing coordinate{'s' if len(missing) > 1 else ''} for "
            f"{', '.join(map(repr, missing))} (extent {render_extent(labels, sizes)}); "
            f"give one for every dimension of size > 1, e.g. {example}"
        )
    index = 0
    for label, size in zip(labels, sizes, strict=True):
        raw = coords.get(label, 0)
        if not allow_negative and as_int(raw, f"coordinate for {label!r}") < 0:
            raise MeshIndexError(
                f"coordinate {raw} is out of range for dimension {label!r} of size {size} "
                f"(extent {render_extent(labels, sizes)})"
            )
        index = index * size + normalize_index(raw, label, size, labels, sizes)
    return index


class Extent(Mapping[str, int]):
    """Ordered dimension names mapped to their sizes, e.g. ``{hosts: 1, gpus: 4}``.

    Immutable, hashable and picklable. Two extents are equal when they have the same names in
    the same order with the same sizes; an extent also equals a ``dict`` with the same items.
    """

    __slots__ = ("_labels", "_sizes")
    _labels: tuple[str, ...]
    _sizes: tuple[int, ...]

    def __init__(self, labels: Sequence[str], sizes: Sequence[int]) -> None:
        labels_t = check_labels(labels)
        sizes_t = tuple(as_int(s, "dimension size") for s in sizes)
        if len(labels_t) != len(sizes_t):
            raise MeshUsageError(
                f"got {len(labels_t)} dimension names {labels_t} but {len(sizes_t)} sizes "
                f"{sizes_t}; give one size per name"
            )
        for label, size in zip(labels_t, sizes_t, strict=True):
            if size < 1:
                raise MeshUsageError(f"dimension {label!r} has size {size}; sizes must be >= 1")
        object.__setattr__(self, "_labels", labels_t)
        object.__setattr__(self, "_sizes", sizes_t)

    @classmethod
    def from_dict(cls, sizes: Mapping[str, int]) -> Extent:
        """``Extent.from_dict({"hosts": 1, "gpus": 4})``; dimension order is the dict's order."""
        return cls(list(sizes.keys()), list(sizes.values()))

    @property
    def labels(self) -> tuple[str, ...]:
        return self._labels

    @property
    def sizes(self) -> tuple[int, ...]:
        return self._sizes

    @property
    def nelem(self) -> int:
        """Number of points (the product of the sizes; 1 for an extent with no dimensions)."""
        return math.prod(self._sizes)

    @property
    def nelements(self) -> int:
        """``nelem`` by Monarch's name (a property there too)."""
        return math.prod(self._sizes)

    def __getitem__(self, label: str) -> int:
        try:
            return self._sizes[self._labels.index(label)]
        except ValueError:
            raise KeyError(label) from None

    def __contains__(self, label: object) -> bool:
        return label in self._labels

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __len__(self) -> int:
        return len(self._labels)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Extent):
            return self._labels == other._labels and self._sizes == other._sizes
        if isinstance(other, dict):
            return dict(zip(self._labels, self._sizes, strict=True)) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash((Extent, self._labels, self._sizes))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Extent is immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Extent is immutable; cannot delete {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Extent, (self._labels, self._sizes))

    def __repr__(self) -> str:
        return f"Extent({dict(zip(self._labels, self._sizes, strict=True))!r})"

    def __str__(self) -> str:
        return render_extent(self._labels, self._sizes)


class Point(Mapping[str, int]):
    """A position in an ``Extent``: dimension name mapped to coordinate.

    ``rank`` is the row-major index of the point in ``extent`` (last dimension fastest), so
    ``Point(3, Extent(["hosts", "gpus"], [1, 4]))`` is ``{hosts: 0, gpus: 3}``, printed as
    Monarch prints it: ``{'hosts': 0/1, 'gpus': 3/4}``. Immutable,
    hashable, picklable; equal to another ``Point`` with the same rank and extent, and to a
    ``dict`` with the same coordinates.
    """

    __slots__ = ("_coords", "_extent", "_rank")
    _rank: int
    _extent: Extent
    _coords: tuple[int, ...]

    def __init__(self, rank: int, extent: Extent | Mapping[str, int]) -> None:
        if not isinstance(extent, Extent):
            if not isinstance(extent, Mapping):
                raise MeshTypeError(f"extent must be an Extent, got {type(extent).__name__}")
            extent = Extent.from_dict(extent)
        rank = as_int(rank, "rank")
        if not 0 <= rank < extent.nelem:
            raise MeshIndexError(
                f"rank {rank} is out of range for extent {extent} with {extent.nelem} points"
            )
        coords = []
        rest = rank
        for size in reversed(extent.sizes):
            rest, c = divmod(rest, size)
            coords.append(c)
        object.__setattr__(self, "_rank", rank)
        object.__setattr__(self, "_extent", extent)
        object.__setattr__(self, "_coords", tuple(reversed(coords)))

    @classmethod
    def from_coords(cls, extent: Extent, coords: Mapping[str, int]) -> Point:
        """The point at ``coords`` in ``extent``; dimensions of size 1 may be omitted.

        Raises:
            ValueError: a name is not in ``extent``, or a dimension of size > 1 is missing.
            IndexError: a coordinate is out of range (negative coordinates are rejected).
        """
        rank = row_major_index(extent.labels, extent.sizes, coords, allow_negative=False)
        return cls(rank, extent)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def extent(self) -> Extent:
        return self._extent

    def size(self, label: str) -> int:
        """The size of dimension ``label`` of this point's extent (Monarch's ``Point.size``).

        Raises:
            KeyError: the extent has no such dimension (as ``point[label]`` does).
        """
        return self._extent[label]

    def __getitem__(self, label: str) -> int:
        try:
            return self._coords[self._extent.labels.index(label)]
        except ValueError:
            raise KeyError(label) from None

    def __contains__(self, label: object) -> bool:
        return label in self._extent.labels

    def __iter__(self) -> Iterator[str]:
        return iter(self._extent.labels)

    def __len__(self) -> int:
        return len(self._coords)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Point):
            return self._rank == other._rank and self._extent == other._extent
        if isinstance(other, dict):
            return dict(zip(self._extent.labels, self._coords, strict=True)) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash((Point, self._rank, self._extent))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Point is immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Point is immutable; cannot delete {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Point, (self._rank, self._extent))

    def __repr__(self) -> str:
        # Monarch's form, which Monarch programs print and parse: each coordinate over its size.
        parts = zip(self._extent.labels, self._coords, self._extent.sizes, strict=True)
        return "{" + ", ".join(f"{label!r}: {c}/{size}" for label, c, size in parts) + "}"

    __str__ = __repr__


def point_label(point: Point) -> str:
    """``{hosts=0, gpus=3}``: how actormesh names a rank in failures and messages (``str`` of
    a ``Point`` is Monarch's ``{'hosts': 0/1, 'gpus': 3/4}``)."""
    return render_coords(point.extent.labels, [point[label] for label in point.extent.labels])


def row_major_strides(sizes: Sequence[int]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for size in reversed(sizes):
        strides.append(acc)
        acc *= size
    return tuple(reversed(strides))

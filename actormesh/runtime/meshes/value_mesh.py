"""``ValueMesh``: one value per point of a mesh, as returned by ``endpoint.call(...).get()``."""

from __future__ import annotations

import html
from collections.abc import Iterator, Sequence
from typing import Any, Generic, TypeVar

from ...errors import MeshIndexError, MeshTypeError
from ..extent import Point
from ..mesh_shape import MeshShape, NoPublicConstructor
from ..shape import Shape
from .display import value_cell

__all__ = ["ValueMesh", "new_value_mesh"]

T = TypeVar("T")

_REPR_LIMIT = 16  # entries shown by repr() before "... (N more)"
_HTML_LIMIT = 64  # rows shown by _repr_html_
_VALUE_REPR_CHARS = 60


def _one_line(value: object) -> str:
    # Values are often tensors whose repr spans many lines; keep one entry on one line.
    return " ".join(repr(value).split())


def _short_repr(value: object) -> str:
    text = _one_line(value)
    if len(text) > _VALUE_REPR_CHARS:
        text = text[: _VALUE_REPR_CHARS - 3] + "..."
    return text


def new_value_mesh(shape: Shape, values: Sequence[T]) -> ValueMesh[T]:
    """A value mesh over ``shape``, ``values`` in the shape's row-major order: how the runtime
    and its tools make one (users get theirs from ``endpoint.call(...).get()``).

    Raises:
        ValueError: not one value per rank of ``shape``.
    """
    return ValueMesh._create(shape, values)  # noqa: SLF001  the factory of this module's class


def _rebuild(shape: Shape, values: tuple[Any, ...]) -> ValueMesh[Any]:
    return new_value_mesh(shape, values)


class ValueMesh(MeshShape, Generic[T], metaclass=NoPublicConstructor):
    """One value per point of a mesh, e.g. the losses of every trainer.

    Users get one from ``endpoint.call(...).get()``; it cannot be constructed directly. It has
    the shape algebra of every mesh (``slice``, ``flatten``, ``rename``, ``size``, ``sizes``,
    ``extent``, ``len``): slicing is pure bookkeeping, and the values follow their points.
    Iterating yields ``(Point, value)`` pairs, like ``items()``. Immutable (the values
    themselves are not copied) and picklable when the values are.
    """

    __slots__ = ("_base", "_shape", "_values")
    _shape: Shape
    # ``_values[i]`` belongs to global rank ``_base.global_rank(i)``. Slices share ``_base`` and
    # ``_values`` and differ only in ``_shape`` (a sub-view of ``_base``), so slicing copies
    # nothing.
    _base: Shape
    _values: tuple[T, ...]

    _not_constructed = (
        "ValueMesh is created by the runtime; get one from endpoint.call(...).get() "
        "(internally: new_value_mesh(shape, values))"
    )

    @classmethod
    def _create(cls, shape: Shape, values: Sequence[T]) -> ValueMesh[T]:
        """A value mesh over ``shape``; ``values`` are in the shape's row-major order."""
        values_t = tuple(values)
        if len(values_t) != len(shape):
            raise ValueError(
                f"got {len(values_t)} values for a mesh of {len(shape)} ranks (extent {shape})"
            )
        return cls._view(shape, shape, values_t)

    @classmethod
    def _view(cls, shape: Shape, base: Shape, values: tuple[T, ...]) -> ValueMesh[T]:
        mesh: ValueMesh[T] = cls.__new__(cls)
        object.__setattr__(mesh, "_shape", shape)
        object.__setattr__(mesh, "_base", base)
        object.__setattr__(mesh, "_values", values)
        return mesh

    def _new_with_shape(self, shape: Shape) -> ValueMesh[T]:
        return self._view(shape, self._base, self._values)

    def _value_at(self, local_index: int) -> T:
        base_index = self._base.local_index(self._shape.global_rank(local_index))
        assert base_index is not None, "a ValueMesh view must stay inside its base shape"
        return self._values[base_index]

    def values(self) -> list[T]:
        """The values in row-major order of this mesh's extent."""
        base, values = self._base, self._values
        if self._shape is base:
            return list(values)
        ranks = self._shape.ranks()
        stride = base.uniform_stride()
        if stride is not None:  # the base's ranks are evenly spaced: index arithmetically
            offset = base.offset
            return [values[(g - offset) // stride] for g in ranks]
        position = {g: i for i, g in enumerate(base.ranks())}
        return [values[position[g]] for g in ranks]

    def items(self) -> Iterator[tuple[Point, T]]:
        """``(Point, value)`` pairs in row-major order; points are in this mesh's extent."""
        extent = self._shape.extent
        for i, value in enumerate(self.values()):
            yield Point(i, extent), value

    def __iter__(self) -> Iterator[tuple[Point, T]]:
        return self.items()

    def item(self, **coords: int) -> T:
        """The value at ``coords``, e.g. ``losses.item(hosts=0, gpus=3)``.

        Dimensions of size 1 may be left out, so ``item()`` returns the only value of a
        one-element mesh. Negative coordinates count from the end.

        Raises:
            ValueError: an unknown dimension, or a dimension of size > 1 without a coordinate.
            IndexError: a coordinate out of range.
        """
        return self._value_at(self._shape.index_of_coords(coords))

    def get(self, rank: int) -> T:
        """The value of the ``rank``-th point of this mesh, in row-major order of its extent
        (Monarch's ``ValueMesh.get``: ``vm.get(i) == vm.values()[i]``).

        Raises:
            IndexError: ``rank`` is not in ``range(len(self))``.
        """
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise MeshTypeError(f"ValueMesh.get takes an int rank, got {rank!r}")
        if not 0 <= rank < len(self._shape):
            raise MeshIndexError(
                f"rank {rank} is out of range for a ValueMesh of {len(self._shape)} values "
                f"(extent {self._shape.extent})"
            )
        return self._value_at(rank)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"ValueMesh is immutable; cannot set {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Send only this view's values, re-based on this view's shape, not the whole base.
        return (_rebuild, (self._shape, tuple(self.values())))

    def _shown_dims(self) -> list[int]:
        """Indices of the dimensions shown in reprs: size-1 ones are hidden if others remain."""
        sizes = self._shape.sizes
        shown = [i for i, size in enumerate(sizes) if size > 1]
        return shown if shown else list(range(len(sizes)))

    def _render_point(self, point: Point, shown: list[int]) -> str:
        labels = self._shape.labels
        text = ", ".join(f"{labels[i]}={point[labels[i]]}" for i in shown)
        return text if len(shown) == 1 else f"({text})"

    def __repr__(self) -> str:
        shown = self._shown_dims()
        entries = []
        for n, (point, value) in enumerate(self.items()):
            if n == _REPR_LIMIT:
                entries.append(f"... ({len(self) - _REPR_LIMIT} more)")
                break
            entries.append(f"{self._render_point(point, shown)}: {_short_repr(value)}")
        return "ValueMesh({" + ", ".join(entries) + "})"

    def _repr_html_(self) -> str:
        shown = self._shown_dims()
        rows = []
        for n, (point, value) in enumerate(self.items()):
            if n == _HTML_LIMIT:
                more = html.escape(f"... ({len(self) - _HTML_LIMIT} more)")
                rows.append(f"<tr><td colspan='2'>{more}</td></tr>")
                break
            rows.append(
                f"<tr><td>{html.escape(self._render_point(point, shown))}</td>"
                # Shown rounded (0.3, not 0.30000000000000004), the exact repr on hover.
                f"{value_cell(_one_line(value), _VALUE_REPR_CHARS)}</tr>"
            )
        caption = html.escape(f"ValueMesh {self._shape.extent}")
        return (
            f"<table class='jp-actormesh-valuemesh'><caption>{caption}</caption>"
            "<thead><tr><th>point</th><th>value</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>"
        )

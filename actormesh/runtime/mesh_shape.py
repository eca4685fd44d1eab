"""What every mesh shares: ``MeshShape`` (slicing, flattening, renaming, splitting on a mesh's
``Shape``), and the guard that keeps meshes from being constructed directly."""

from __future__ import annotations

from abc import ABC, ABCMeta, abstractmethod
from collections.abc import Sequence
from typing import NoReturn, TypeVar

from .extent import (
    Extent,
    Selector,
    no_such_dims,
)
from .shape import Shape

_MeshT = TypeVar("_MeshT", bound="MeshShape")


def view_shape(mesh: MeshShape) -> Shape:
    """The ``Shape`` a mesh covers (a function, not a property: a property on meshes would hide
    an actor's endpoint of the same name)."""
    return mesh._shape  # noqa: SLF001  the one reader of the field outside the mesh classes


def with_shape(mesh: _MeshT, shape: Shape) -> _MeshT:
    """The view of ``mesh`` (any mesh) on ``shape``, a shape of the same global ranks: for tools
    that compute a view's shape themselves (the kernel's rank selections); no message is sent."""
    return mesh._new_with_shape(shape)  # noqa: SLF001  the hook every mesh class implements


class NoPublicConstructor(ABCMeta):
    """The metaclass of what the runtime builds and users only receive (meshes, value meshes,
    port receivers): calling the class raises ``TypeError`` with the class's own advice,
    ``_not_constructed``. The runtime builds them with its factories (``new_value_mesh``,
    ``new_proc_mesh``, ...), whose ``_create`` classmethods never call the class. ``MeshShape``
    itself stays an open mixin. Trio's guard of the same name (``trio/_util.py``) is the
    model."""

    _not_constructed: str

    def __call__(cls, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError(cls._not_constructed)


class MeshShape(ABC):
    """Shape algebra shared by ``HostMesh``, ``ProcMesh``, ``ActorMesh`` and ``ValueMesh``.

    Subclasses hold their view in ``_shape`` and implement ``_new_with_shape``. Every method here
    is pure bookkeeping: it never blocks and no message is sent, so any thread may call it.
    """

    __slots__ = ()
    _shape: Shape

    @abstractmethod
    def _new_with_shape(self: _MeshT, shape: Shape) -> _MeshT:
        """A copy of this mesh that covers ``shape`` (a view of the same global ranks)."""

    @property
    def _labels(self) -> tuple[str, ...]:
        """The dimension names, under the private name Monarch's own examples read
        (``dict.fromkeys(proc_mesh._labels, 0)``); ``mesh.extent.labels`` is the public one."""
        return tuple(self._shape.labels)

    def slice(self: _MeshT, **selectors: Selector) -> _MeshT:
        """A view of part of this mesh; no message is sent.

        ``dim=int`` picks one index and drops the dimension (negative counts from the end);
        ``dim=slice(start, stop, step)`` keeps the dimension (positive steps only).
        ``procs.slice(gpus=slice(0, 2))`` has extent ``{hosts: 1, gpus: 2}``.

        Raises:
            ValueError: unknown dimension (the message shows the extent), bad step, or an
                empty selection.
            IndexError: an int selector out of range.
            TypeError: a selector that is neither an int nor a slice.
        """
        return self._new_with_shape(self._shape.slice(**selectors))

    def flatten(self: _MeshT, name: str) -> _MeshT:
        """This mesh as one dimension called ``name``, same rank order; no message is sent.

        Raises:
            ValueError: the view is not evenly spaced (an inner dimension was sliced);
                flatten before slicing.
        """
        return self._new_with_shape(self._shape.flatten(name))

    def rank_view(self: _MeshT, index: int) -> _MeshT:
        """The one-actor (one-process) view of this mesh's ``index``-th rank, in a dimension
        ``rank`` of size 1; no message is sent."""
        return self._new_with_shape(self._shape.rank_view(index))

    def split(self: _MeshT, **spec: Sequence[str] | int) -> _MeshT:
        """This mesh with dimensions split, as Monarch's ``split``: ``mesh.split(gpus=("dp",
        "tp"), tp=2)``; no message is sent. See ``Shape.split``."""
        return self._new_with_shape(self._shape.split(**spec))

    def rename(self: _MeshT, **old_to_new: str) -> _MeshT:
        """This mesh with dimensions renamed, e.g. ``rename(gpus="ranks")``; no message is sent."""
        return self._new_with_shape(self._shape.rename(**old_to_new))

    def size(self, dim: str | None = None) -> int:
        """Number of ranks, or the size of dimension ``dim``."""
        if dim is None:
            return len(self._shape)
        shape = self._shape
        if dim not in shape.labels:
            no_such_dims([dim], shape.labels, shape.sizes)
        return shape.sizes[shape.labels.index(dim)]

    @property
    def sizes(self) -> dict[str, int]:
        """Dimension name to size, in dimension order (a new dict each time)."""
        return dict(zip(self._shape.labels, self._shape.sizes, strict=True))

    @property
    def extent(self) -> Extent:
        return self._shape.extent

    def __len__(self) -> int:
        return len(self._shape)

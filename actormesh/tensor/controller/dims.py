"""A tensor mesh's dimensions as a user names them: coordinates, dimension names, and sharding
specs turned into DTensor placements, each checked with an error that says what to pass.
``mesh.TensorMesh`` is a ``MeshDims``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import compat


class MeshDims:
    """Labels and sizes of a mesh (row-major), and what user code names with them."""

    labels: tuple[str, ...]
    sizes: tuple[int, ...]

    def __repr__(self) -> str:
        dims = ", ".join(f"{n}: {s}" for n, s in zip(self.labels, self.sizes, strict=True))
        return "{" + dims + "}"

    @property
    def ndim(self) -> int:
        return len(self.labels)

    def index_of(self, coords: dict[str, int], what: str) -> int:
        """Row-major rank of ``coords`` (omitted dimensions mean 0)."""
        unknown = [k for k in coords if k not in self.labels]
        if unknown:
            raise compat.MeshUsageError(
                f"{what}: unknown mesh dimension(s) {unknown}; this mesh has {self!r}"
            )
        index = 0
        for label, size in zip(self.labels, self.sizes, strict=True):
            c = coords.get(label, 0)
            if not isinstance(c, int) or not -size <= c < size:
                raise compat.MeshUsageError(
                    f"{what}: coordinate {label}={c!r} is outside 0..{size - 1}"
                )
            index = index * size + (c % size)
        return index

    def coords_of(self, index: int) -> str:
        return compat.point_label(
            compat.Point(index, compat.Extent(list(self.labels), list(self.sizes)))
        )

    def check_dims(self, dims: Sequence[str], what: str) -> tuple[str, ...]:
        dims = (dims,) if isinstance(dims, str) else tuple(dims)
        for d in dims:
            if d not in self.labels:
                raise compat.MeshUsageError(
                    f"{what}: unknown mesh dimension {d!r}; this mesh has {self!r}"
                )
        return dims

    def placements(
        self, ndim: int, sharding_spec: Sequence[Any] | None, placements: Sequence[Any] | None
    ) -> tuple[Any, ...]:
        """DTensor placements (one per mesh dim) from a sharding spec (one entry per tensor dim:
        a mesh dimension name, a tuple of names, or None), or as given (checked)."""
        from torch.distributed.tensor import Replicate

        if sharding_spec is not None and placements is not None:
            raise compat.MeshUsageError("pass sharding_spec or placements, not both")
        if placements is not None:
            return self._checked(tuple(placements))
        out: list[Any] = [Replicate()] * self.ndim
        if sharding_spec is None:
            return tuple(out)
        spec = list(sharding_spec)
        if len(spec) != ndim:
            raise compat.MeshUsageError(
                f"sharding_spec has {len(spec)} entries but the tensor has {ndim} dimensions; "
                "give one entry per tensor dimension (a mesh dimension name, a tuple of "
                "names, or None)"
            )
        for tdim, entry in enumerate(spec):
            if entry is not None:
                self._shard(out, spec, tdim, entry)
        return tuple(out)

    def _checked(self, placements: tuple[Any, ...]) -> tuple[Any, ...]:
        from torch.distributed.tensor import Placement

        if len(placements) != self.ndim or not all(isinstance(p, Placement) for p in placements):
            raise compat.MeshUsageError(
                f"placements needs one torch.distributed.tensor Placement per mesh "
                f"dimension ({self.ndim} for {self!r}), got {placements!r}"
            )
        return placements

    def _shard(self, out: list[Any], spec: list[Any], tdim: int, entry: Any) -> None:
        """Place tensor dim ``tdim`` as sharding-spec ``entry`` says, in ``out``."""
        from torch.distributed.tensor import Replicate, Shard

        names = (entry,) if isinstance(entry, str) else entry
        if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) for n in names):
            raise compat.MeshUsageError(
                f"sharding_spec entry {entry!r} (tensor dim {tdim}) is not a mesh "
                "dimension name: give a name, a tuple of names or None for each tensor "
                f"dimension (this mesh has {self!r}: {self.labels[0]!r} shards over its "
                f"first dimension), or DTensor placements=[Shard({tdim}), ...]"
            )
        positions = []
        for name in names:
            if name not in self.labels:
                raise compat.MeshUsageError(
                    f"sharding_spec entry {entry!r} (tensor dim {tdim}) names an unknown "
                    f"mesh dimension {name!r}; this mesh has {self!r}"
                )
            pos = self.labels.index(name)
            if not isinstance(out[pos], Replicate):
                raise compat.MeshUsageError(
                    f"mesh dimension {name!r} appears twice in sharding_spec {spec!r}; "
                    "each mesh dimension shards at most one tensor dimension"
                )
            out[pos] = Shard(tdim)
            positions.append(pos)
        if positions != sorted(positions):
            raise compat.MeshUsageError(
                f"sharding_spec entry {entry!r}: list the mesh dimensions in mesh order "
                f"({', '.join(n for n in self.labels if n in names)})"
            )

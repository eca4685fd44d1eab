"""``ProcMesh.to_table()``'s grid (Monarch's ``to_table``), pure."""

from __future__ import annotations

from actormesh.runtime.meshes.rank_table import rank_table
from actormesh.runtime.shape import Shape


def test_a_row_per_outer_point_and_a_column_per_last_index() -> None:
    assert rank_table(["hosts", "dp", "tp"], [1, 2, 2], [0, 1, 2, 3]).splitlines() == [
        "hosts dp | tp=0 tp=1",
        "    0  0 |    0    1",
        "    0  1 |    2    3",
    ]
    assert rank_table(["gpu"], [4], [0, 1, 2, 3]).splitlines() == [
        "gpu=0 gpu=1 gpu=2 gpu=3",
        "    0     1     2     3",
    ]


def test_a_slice_shows_which_processes_it_covers() -> None:
    shape = Shape.from_extent({"host": 2, "gpu": 2}).rename(host="pp").slice(pp=1)
    assert rank_table(shape.labels, shape.sizes, shape.ranks()).splitlines() == [
        "gpu=0 gpu=1",
        "    2     3",
    ]
    split = Shape.from_extent({"host": 2, "gpu": 2}).split(host=("dp", "pp"), pp=2)
    assert rank_table(split.labels, split.sizes, split.ranks()).splitlines()[0] == (
        "dp pp | gpu=0 gpu=1"
    )

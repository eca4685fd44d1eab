"""Pure tests of the shape algebra: Extent, Point, Shape, MeshShape."""

from __future__ import annotations

import pickle
import time
from itertools import pairwise
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import actormesh as am
from actormesh.runtime.extent import Extent, Point, point_label
from actormesh.runtime.mesh_shape import MeshShape
from actormesh.runtime.meshes.value_mesh import new_value_mesh
from actormesh.runtime.shape import Shape

HG = Extent(["hosts", "gpus"], [1, 4])
BIG = Shape.from_extent({"hosts": 2, "gpus": 4})


# -- Extent ----------------------------------------------------------------------------------


def test_extent_basics() -> None:
    assert HG.labels == ("hosts", "gpus")
    assert HG.sizes == (1, 4)
    assert HG.nelem == 4
    assert dict(HG) == {"hosts": 1, "gpus": 4}
    assert HG["gpus"] == 4
    assert "gpus" in HG and "gpu" not in HG
    assert len(HG) == 2
    assert list(HG) == ["hosts", "gpus"]
    assert Extent([], []).nelem == 1


def test_extent_from_dict_eq_hash_repr() -> None:
    assert Extent.from_dict({"hosts": 1, "gpus": 4}) == HG
    assert hash(Extent.from_dict({"hosts": 1, "gpus": 4})) == hash(HG)
    assert HG == {"hosts": 1, "gpus": 4}
    assert Extent(["gpus", "hosts"], [4, 1]) != HG  # order matters between extents
    assert repr(HG) == "Extent({'hosts': 1, 'gpus': 4})"
    assert str(HG) == "{hosts: 1, gpus: 4}"
    assert str(Extent([], [])) == "{}"
    assert pickle.loads(pickle.dumps(HG)) == HG
    with pytest.raises(KeyError):
        HG["gpu"]
    assert HG.get("gpu") is None


@pytest.mark.parametrize(
    ("labels", "sizes", "exc", "match"),
    [
        (["hosts", "gpus"], [1, 0], ValueError, "dimension 'gpus' has size 0; sizes must be >= 1"),
        (["a"], [-2], ValueError, "size -2"),
        (["a", "a"], [1, 2], ValueError, "unique; 'a' repeated"),
        ([""], [1], ValueError, "not a valid identifier"),
        (["my gpus"], [1], ValueError, "not a valid identifier"),
        ([3], [1], TypeError, "must be a str"),
        (["a"], [1.5], TypeError, "must be an int, got float"),
        (["a"], [True], TypeError, "got bool"),
        (["a", "b"], [1], ValueError, "2 dimension names"),
        ("gpus", [4], TypeError, "single dimension"),
    ],
)
def test_extent_validation(labels: Any, sizes: Any, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        Extent(labels, sizes)


def test_extent_immutable() -> None:
    with pytest.raises(AttributeError):
        HG._sizes = (2, 2)


# -- Point -----------------------------------------------------------------------------------


def test_point_basics() -> None:
    p = Point(3, HG)
    assert p.rank == 3
    assert p.extent is HG
    assert dict(p) == {"hosts": 0, "gpus": 3}
    assert p["gpus"] == 3
    # Printed as Monarch prints a point (Monarch programs parse it); actormesh's rank labels
    # are point_label's.
    assert str(p) == repr(p) == "{'hosts': 0/1, 'gpus': 3/4}"
    assert point_label(p) == "{hosts=0, gpus=3}"
    assert p == {"hosts": 0, "gpus": 3}
    assert p == Point(3, Extent.from_dict({"hosts": 1, "gpus": 4}))
    assert p != Point(2, HG)
    assert len({p, Point(3, HG), Point(2, HG)}) == 2
    assert pickle.loads(pickle.dumps(p)) == p
    assert Point.from_coords(HG, {"hosts": 0, "gpus": 3}) == p
    assert Point.from_coords(HG, {"gpus": 3}) == p  # size-1 dims may be omitted
    assert Point(0, Extent([], [])) == {}


def test_point_row_major() -> None:
    ext = Extent(["a", "b", "c"], [2, 3, 4])
    assert dict(Point(0, ext)) == {"a": 0, "b": 0, "c": 0}
    assert dict(Point(1, ext)) == {"a": 0, "b": 0, "c": 1}
    assert dict(Point(4, ext)) == {"a": 0, "b": 1, "c": 0}
    assert dict(Point(23, ext)) == {"a": 1, "b": 2, "c": 3}
    for rank in range(ext.nelem):
        assert Point.from_coords(ext, Point(rank, ext)).rank == rank


def test_point_errors() -> None:
    with pytest.raises(
        IndexError, match=r"rank 4 is out of range for extent \{hosts: 1, gpus: 4\}"
    ):
        Point(4, HG)
    with pytest.raises(IndexError):
        Point(-1, HG)
    with pytest.raises(IndexError, match="coordinate -1"):
        Point.from_coords(HG, {"gpus": -1})
    with pytest.raises(IndexError, match="index 4 is out of range for dimension 'gpus'"):
        Point.from_coords(HG, {"gpus": 4})
    with pytest.raises(ValueError, match=r"missing coordinate for 'gpus'"):
        Point.from_coords(HG, {"hosts": 0})
    with pytest.raises(ValueError, match="mesh has no dimension 'gpu'"):
        Point.from_coords(HG, {"gpu": 0})


# -- Shape: construction, ranks, round trips -------------------------------------------------


def test_from_extent() -> None:
    s = Shape.from_extent(HG)
    assert s.labels == ("hosts", "gpus")
    assert s.sizes == (1, 4)
    assert s.strides == (4, 1)
    assert s.offset == 0
    assert s.extent == HG
    assert len(s) == 4
    assert s.ranks() == (0, 1, 2, 3)
    assert Shape.from_extent({"hosts": 1, "gpus": 4}) == s
    assert str(s) == "{hosts: 1, gpus: 4}"
    assert "strides=(4, 1)" in repr(s)


def test_zero_dim_shape() -> None:
    s = Shape.from_extent(Extent([], []))
    assert len(s) == 1
    assert s.ranks() == (0,)
    assert s.point(0) == {}
    assert s.slice() is s
    f = s.flatten("all")
    assert f.sizes == (1,) and f.labels == ("all",)


@pytest.mark.parametrize(
    ("labels", "offset", "sizes", "strides", "match"),
    [
        (["a", "b"], 0, [2, 2], [1, 2], "not ordered outer to inner"),
        (["a", "b"], 0, [2, 3], [2, 1], "overlap"),
        (["a"], 0, [2], [0], "strides must be >= 1"),
        (["a"], -1, [2], [1], "offset must be >= 0"),
        (["a"], 0, [2], [1, 1], "one stride per dimension"),
    ],
)
def test_shape_validation(
    labels: list[str], offset: int, sizes: list[int], strides: list[int], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        Shape(labels, offset, sizes, strides)


def test_shape_size_one_dims_any_stride() -> None:
    s = Shape(["a", "b"], 5, [1, 3], [1, 2])
    assert s.ranks() == (5, 7, 9)
    assert s == Shape(["a", "b"], 5, [1, 3], [100, 2])  # size-1 strides select nothing


def test_global_local_round_trip() -> None:
    s = BIG.slice(gpus=slice(1, None, 2))
    assert s.ranks() == (1, 3, 5, 7)
    for i, g in enumerate(s.ranks()):
        assert s.global_rank(i) == g
        assert s.local_index(g) == i
    for g in (-1, 0, 2, 4, 6, 8, 100):
        assert s.local_index(g) is None
        assert s.point_of_global(g) is None
    assert s.point_of_global(5) == {"hosts": 1, "gpus": 0}
    assert s.point(3) == Point(3, s.extent)
    with pytest.raises(IndexError, match="local index 4 is out of range"):
        s.global_rank(4)
    with pytest.raises(IndexError):
        s.global_rank(-1)


def test_index_of_coords() -> None:
    assert BIG.index_of_coords({"hosts": 1, "gpus": 2}) == 6
    assert BIG.index_of_coords({"hosts": -1, "gpus": -1}) == 7
    assert Shape.from_extent(HG).index_of_coords({"gpus": 2}) == 2
    with pytest.raises(ValueError, match="missing coordinates for 'hosts', 'gpus'"):
        BIG.index_of_coords({})
    with pytest.raises(ValueError, match="no dimension 'x'"):
        BIG.index_of_coords({"hosts": 0, "gpus": 0, "x": 0})
    with pytest.raises(IndexError, match="index 2 is out of range for dimension 'hosts'"):
        BIG.index_of_coords({"hosts": 2, "gpus": 0})


def test_ranks_1024_fast_and_cached() -> None:
    s = Shape.from_extent({"hosts": 8, "gpus": 8, "x": 16})
    t0 = time.perf_counter()
    ranks = s.ranks()
    assert time.perf_counter() - t0 < 0.05
    assert ranks == tuple(range(1024))
    assert s.ranks() is ranks
    sl = s.slice(x=slice(None, None, 3))
    assert all(sl.local_index(g) == i for i, g in enumerate(sl.ranks()))


def test_shape_pickle_small_and_without_cache() -> None:
    s = Shape.from_extent({"hosts": 8, "gpus": 8, "x": 16}).slice(gpus=slice(2, 6))
    s.ranks()
    data = pickle.dumps(s)
    assert len(data) < 200
    t = pickle.loads(data)
    assert t == s and hash(t) == hash(s)
    assert t.ranks() == s.ranks()


def test_shape_immutable() -> None:
    with pytest.raises(AttributeError):
        BIG._offset = 3


# -- Shape.slice ------------------------------------------------------------------------------


def test_slice_int_drops_dim() -> None:
    s = BIG.slice(gpus=2)
    assert s.labels == ("hosts",)
    assert s.ranks() == (2, 6)
    s = BIG.slice(hosts=1)
    assert s.extent == {"gpus": 4}
    assert s.ranks() == (4, 5, 6, 7)
    s = BIG.slice(hosts=1, gpus=3)
    assert s.labels == () and s.ranks() == (7,)


def test_slice_negative_int() -> None:
    assert BIG.slice(gpus=-1).ranks() == (3, 7)
    assert BIG.slice(gpus=-4).ranks() == (0, 4)


def test_slice_slices() -> None:
    assert BIG.slice(gpus=slice(0, 2)).ranks() == (0, 1, 4, 5)
    assert BIG.slice(gpus=slice(None, None, 2)).ranks() == (0, 2, 4, 6)
    assert BIG.slice(gpus=slice(-2, None)).ranks() == (2, 3, 6, 7)
    assert BIG.slice(gpus=slice(1, 100)).sizes == (2, 3)  # clamped, like Python
    assert BIG.slice(hosts=slice(1, 2)).extent == {"hosts": 1, "gpus": 4}


def test_uniform_stride_is_the_common_difference_of_the_ranks() -> None:
    assert BIG.uniform_stride() == 1  # 0..7
    assert BIG.slice(gpus=slice(None, None, 2)).uniform_stride() == 2  # 0 2 4 6
    assert BIG.slice(hosts=1).uniform_stride() == 1  # 4 5 6 7
    assert BIG.slice(gpus=slice(0, 2)).uniform_stride() is None  # 0 1 4 5: uneven
    assert BIG.slice(hosts=0, gpus=3).uniform_stride() == 1  # one rank


def test_chained_slices() -> None:
    s = Shape.from_extent({"a": 3, "b": 10})
    t = s.slice(b=slice(1, None, 2))  # b: 1 3 5 7 9
    u = t.slice(b=slice(1, None, 2), a=slice(1, None))  # b: 3 7 ; a: 1 2
    assert u.ranks() == (13, 17, 23, 27)
    v = u.slice(b=-1)
    assert v.ranks() == (17, 27)
    assert set(v.ranks()) <= set(u.ranks()) <= set(t.ranks()) <= set(s.ranks())


def test_slice_errors() -> None:
    s = Shape.from_extent(HG)
    with pytest.raises(ValueError) as info:
        s.slice(gpu=1)
    assert str(info.value).startswith(
        "mesh has no dimension 'gpu'; its extent is {hosts: 1, gpus: 4}"
    )
    assert "did you mean 'gpus'" in str(info.value)
    with pytest.raises(IndexError) as info2:
        s.slice(gpus=7)
    assert str(info2.value) == (
        "index 7 is out of range for dimension 'gpus' of size 4 (extent {hosts: 1, gpus: 4})"
    )
    with pytest.raises(IndexError, match="index -5"):
        s.slice(gpus=-5)
    with pytest.raises(ValueError, match=r"negative step.*\{hosts: 1, gpus: 4\}"):
        s.slice(gpus=slice(None, None, -1))
    with pytest.raises(ValueError, match="zero"):
        s.slice(gpus=slice(None, None, 0))
    with pytest.raises(ValueError, match=r"selects nothing from dimension 'gpus' of size 4"):
        s.slice(gpus=slice(3, 1))
    with pytest.raises(TypeError, match="must be an int or a slice, got str"):
        s.slice(gpus="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got bool"):
        s.slice(gpus=True)
    with pytest.raises(TypeError, match="got float"):
        s.slice(gpus=1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bad selector"):
        s.slice(gpus=slice("a", None))


def test_slice_accepts_index_types() -> None:
    assert BIG.slice(gpus=np.int64(1)).ranks() == (1, 5)


# -- flatten / rename ------------------------------------------------------------------------


def test_flatten_ok() -> None:
    f = BIG.flatten("ranks")
    assert f.labels == ("ranks",) and f.sizes == (8,)
    assert f.ranks() == BIG.ranks()
    g = BIG.slice(hosts=1).flatten("r")
    assert g.ranks() == (4, 5, 6, 7)
    h = Shape.from_extent({"a": 4, "b": 1, "c": 3}).slice(a=slice(1, 3)).flatten("x")
    assert h.ranks() == tuple(range(3, 9))
    k = BIG.slice(gpus=slice(None, None, 2), hosts=0).flatten("x")
    assert k.strides == (2,) and k.ranks() == (0, 2)
    # A strided outer slice over a dense inner dim is still not one stride.
    with pytest.raises(ValueError, match="not contiguous"):
        Shape.from_extent({"a": 4, "b": 2}).slice(a=slice(None, None, 2)).flatten("x")


def test_flatten_error() -> None:
    with pytest.raises(ValueError) as info:
        BIG.slice(gpus=slice(0, 2)).flatten("x")
    msg = str(info.value)
    assert "{hosts: 2, gpus: 2}" in msg
    assert "not contiguous" in msg
    assert "flatten before slicing" in msg
    with pytest.raises(ValueError, match="not a valid identifier"):
        BIG.flatten("a b")


def test_rename() -> None:
    r = BIG.rename(gpus="ranks")
    assert r.labels == ("hosts", "ranks")
    assert r.ranks() == BIG.ranks()
    assert BIG.rename(hosts="gpus", gpus="hosts").labels == ("gpus", "hosts")
    with pytest.raises(
        ValueError, match=r"no dimension 'gpu'; its extent is \{hosts: 2, gpus: 4\}"
    ):
        BIG.rename(gpu="x")
    with pytest.raises(ValueError, match="duplicate dimension name 'hosts'"):
        BIG.rename(gpus="hosts")
    with pytest.raises(ValueError, match="not a valid identifier"):
        BIG.rename(gpus="1x")


# -- MeshShape mixin -------------------------------------------------------------------------


class _Mesh(MeshShape):
    def __init__(self, shape: Shape) -> None:
        self._shape = shape

    def _new_with_shape(self, shape: Shape) -> _Mesh:
        return _Mesh(shape)


def test_mesh_shape_mixin() -> None:
    m = _Mesh(BIG)
    assert len(m) == 8
    assert m.size() == 8
    assert m.size("gpus") == 4
    assert m.sizes == {"hosts": 2, "gpus": 4}
    assert m.extent == Extent(["hosts", "gpus"], [2, 4])
    s = m.slice(gpus=slice(0, 2))
    assert isinstance(s, _Mesh) and s.sizes == {"hosts": 2, "gpus": 2}
    assert m.flatten("r").sizes == {"r": 8}
    assert m.rename(hosts="h").sizes == {"h": 2, "gpus": 4}
    with pytest.raises(
        ValueError, match=r"no dimension 'gpu'; its extent is \{hosts: 2, gpus: 4\}"
    ):
        m.size("gpu")
    with pytest.raises(TypeError):
        MeshShape()  # type: ignore[abstract]


# -- property tests against a numpy oracle ---------------------------------------------------

NAMES = ("a", "b", "c", "d")


@st.composite
def extents(draw: st.DrawFn) -> Extent:
    ndim = draw(st.integers(0, 4))
    sizes = draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim))
    return Extent(NAMES[:ndim], sizes)


@st.composite
def selectors(draw: st.DrawFn, shape: Shape) -> dict[str, int | slice]:
    out: dict[str, int | slice] = {}
    for label, size in zip(shape.labels, shape.sizes, strict=True):
        kind = draw(st.sampled_from(["skip", "skip", "int", "slice"]))
        if kind == "int":
            out[label] = draw(st.integers(-size, size - 1))
        elif kind == "slice":
            start = draw(st.none() | st.integers(-size - 1, size + 1))
            stop = draw(st.none() | st.integers(-size - 1, size + 1))
            step = draw(st.none() | st.integers(1, 4))
            if len(range(*slice(start, stop, step).indices(size))) > 0:
                out[label] = slice(start, stop, step)
    return out


def _apply(array: np.ndarray, labels: tuple[str, ...], sel: dict[str, Any]) -> np.ndarray:
    return array[tuple(sel.get(label, slice(None)) for label in labels)]


def _check_view(shape: Shape, oracle: np.ndarray, parent: Shape, universe: int) -> None:
    assert shape.sizes == oracle.shape
    assert shape.ranks() == tuple(int(r) for r in oracle.reshape(-1))
    assert set(shape.ranks()) <= set(parent.ranks())
    for i, g in enumerate(shape.ranks()):
        assert shape.global_rank(i) == g
        assert shape.local_index(g) == i
        assert shape.point(i).rank == i
        assert shape.point_of_global(g) == shape.point(i)
        assert shape.index_of_coords(shape.point(i)) == i
    members = set(shape.ranks())
    for g in range(universe):
        if g not in members:
            assert shape.local_index(g) is None


@settings(max_examples=100, deadline=None, database=None)
@given(data=st.data())
def test_random_chained_slices(data: st.DataObject) -> None:
    extent = data.draw(extents())
    shape = Shape.from_extent(extent)
    oracle = np.arange(extent.nelem).reshape(extent.sizes)
    _check_view(shape, oracle, shape, extent.nelem)
    for _ in range(data.draw(st.integers(1, 3))):
        sel = data.draw(selectors(shape))
        child = shape.slice(**sel)
        oracle = _apply(oracle, shape.labels, sel)
        _check_view(child, oracle, shape, extent.nelem)
        child2 = pickle.loads(pickle.dumps(child))
        assert child2 == child and hash(child2) == hash(child)
        shape = child
    ranks = shape.ranks()
    evenly_spaced = len({b - a for a, b in pairwise(ranks)}) <= 1
    if evenly_spaced:
        flat = shape.flatten("flat")
        assert flat.ranks() == ranks
        _check_view(flat, np.array(ranks), shape, extent.nelem)
    else:
        with pytest.raises(ValueError, match="not contiguous"):
            shape.flatten("flat")


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selectors", "builtin"),
    [
        ({"cpus": 0}, ValueError),  # no such dimension
        ({"gpus": 9}, IndexError),  # out of range
        ({"gpus": "0"}, TypeError),  # neither an int nor a slice
        ({"gpus": slice(0, 2, "x")}, TypeError),  # a slice Python cannot use
        ({"gpus": slice(3, 1)}, ValueError),  # selects nothing
    ],
)
def test_a_bad_slice_of_a_mesh_is_a_mesh_error_and_still_its_builtin(
    selectors: dict[str, Any], builtin: type[Exception]
) -> None:
    mesh = new_value_mesh(BIG, list(range(len(BIG))))
    try:
        mesh.slice(**selectors)
    except am.MeshError as exc:
        assert isinstance(exc, am.MeshUsageError) and isinstance(exc, builtin), type(exc)
    else:
        pytest.fail(f"slice({selectors}) raised nothing")


def test_a_bad_extent_or_flatten_is_a_usage_error() -> None:
    with pytest.raises(am.MeshUsageError, match="sizes must be >= 1"):
        am.Extent(["gpus"], [0])
    with pytest.raises(am.MeshUsageError, match="not contiguous"):
        BIG.slice(gpus=slice(0, 2)).flatten("ranks")
    with pytest.raises(am.MeshUsageError):
        BIG.rank_view(8)

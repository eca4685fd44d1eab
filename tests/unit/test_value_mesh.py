"""Pure tests of ValueMesh: values follow their points through slicing."""

from __future__ import annotations

import pickle

import pytest

from actormesh.runtime.extent import Extent, Point
from actormesh.runtime.meshes.value_mesh import ValueMesh, new_value_mesh
from actormesh.runtime.shape import Shape

HG = Shape.from_extent({"hosts": 1, "gpus": 4})


def grid(**sizes: int) -> ValueMesh[int]:
    shape = Shape.from_extent(sizes)
    return new_value_mesh(shape, list(range(len(shape))))


def test_not_user_constructible() -> None:
    with pytest.raises(TypeError, match=r"endpoint.call\(...\).get\(\)"):
        ValueMesh()


def test_create_checks_length() -> None:
    with pytest.raises(ValueError, match=r"got 3 values for a mesh of 4 ranks \(extent \{hosts"):
        new_value_mesh(HG, [1, 2, 3])


def test_items_values_iter() -> None:
    vm = new_value_mesh(HG, [16, 16, 11, 11])
    assert vm.values() == [16, 16, 11, 11]
    items = list(vm.items())
    assert items[2] == (Point(2, HG.extent), 11)
    assert items[2][0] == {"hosts": 0, "gpus": 2}
    assert list(vm) == items
    assert len(vm) == 4
    assert vm.sizes == {"hosts": 1, "gpus": 4}
    assert vm.extent == Extent(["hosts", "gpus"], [1, 4])
    assert vm.size("gpus") == 4


def test_item() -> None:
    vm = grid(hosts=2, gpus=3)
    assert vm.item(hosts=1, gpus=2) == 5
    assert vm.item(hosts=-1, gpus=0) == 3
    with pytest.raises(ValueError, match="missing coordinate for 'gpus'"):
        vm.item(hosts=0)
    with pytest.raises(ValueError, match="missing coordinates for 'hosts', 'gpus'"):
        vm.item()
    with pytest.raises(
        ValueError, match=r"no dimension 'gpu'; its extent is \{hosts: 2, gpus: 3\}"
    ):
        vm.item(hosts=0, gpu=1)
    with pytest.raises(IndexError, match="index 3 is out of range for dimension 'gpus'"):
        vm.item(hosts=0, gpus=3)
    one = new_value_mesh(HG, ["a", "b", "c", "d"]).slice(gpus=2)
    assert one.item() == "c"
    assert one.item(hosts=0) == "c"
    assert new_value_mesh(HG, [1, 2, 3, 4]).item(gpus=1) == 2  # size-1 hosts omitted


def test_slicing_values_follow() -> None:
    vm = grid(hosts=2, gpus=4)
    s = vm.slice(gpus=slice(1, None, 2))
    assert isinstance(s, ValueMesh)
    assert s.values() == [1, 3, 5, 7]
    assert s.item(hosts=1, gpus=0) == 5
    assert [dict(p) for p, _ in s.items()][-1] == {"hosts": 1, "gpus": 1}
    t = s.slice(hosts=1)
    assert t.values() == [5, 7]
    assert t.sizes == {"gpus": 2}
    assert t.slice(gpus=-1).item() == 7
    assert vm.slice(hosts=0).flatten("r").values() == [0, 1, 2, 3]
    assert vm.rename(gpus="g").item(hosts=1, g=0) == 4
    # The parent is unaffected.
    assert vm.values() == list(range(8))


def test_slicing_from_uneven_base() -> None:
    # A call on a sliced mesh: the base itself is a view with uneven rank spacing.
    base = Shape.from_extent({"hosts": 3, "gpus": 8}).slice(gpus=slice(1, 7, 2))
    assert base.ranks() == (1, 3, 5, 9, 11, 13, 17, 19, 21)
    vm = new_value_mesh(base, [f"r{g}" for g in base.ranks()])
    assert vm.slice(gpus=slice(1, None)).values() == ["r3", "r5", "r11", "r13", "r19", "r21"]
    assert vm.slice(hosts=2).flatten("g").values() == ["r17", "r19", "r21"]
    assert vm.slice(gpus=1).values() == ["r3", "r11", "r19"]
    assert vm.slice(gpus=1, hosts=-1).item() == "r19"
    for point, value in vm.slice(hosts=slice(1, None, 1)).items():
        assert value == vm.item(hosts=point["hosts"] + 1, gpus=point["gpus"])


def test_pickle_round_trip() -> None:
    vm = grid(hosts=2, gpus=4)
    back = pickle.loads(pickle.dumps(vm))
    assert back.values() == vm.values()
    assert back.sizes == vm.sizes
    sl = vm.slice(gpus=slice(2, None))
    back = pickle.loads(pickle.dumps(sl))
    assert back.values() == [2, 3, 6, 7]
    assert back.item(hosts=1, gpus=1) == 7
    assert back._values == (2, 3, 6, 7)  # only the view's values travel


def test_repr() -> None:
    vm = new_value_mesh(HG, [16, 16, 11, 11])
    assert repr(vm) == "ValueMesh({gpus=0: 16, gpus=1: 16, gpus=2: 11, gpus=3: 11})"
    assert repr(grid(a=2, b=1)) == "ValueMesh({a=0: 0, a=1: 1})"
    assert repr(grid(a=1, b=2, c=2).slice(c=0)) == "ValueMesh({b=0: 0, b=1: 2})"
    assert repr(grid(a=2, b=2)) == (
        "ValueMesh({(a=0, b=0): 0, (a=0, b=1): 1, (a=1, b=0): 2, (a=1, b=1): 3})"
    )
    assert repr(grid(a=1, b=1)) == "ValueMesh({(a=0, b=0): 0})"
    assert repr(new_value_mesh(Shape.from_extent({}), ["x"])) == "ValueMesh({(): 'x'})"
    assert repr(grid(r=20)).endswith("r=15: 15, ... (4 more)})")
    assert repr(grid(r=16)).endswith("r=15: 15})")


def test_repr_long_values() -> None:
    vm = new_value_mesh(Shape.from_extent({"r": 1}), ["line\n" * 50])
    text = repr(vm)
    assert "\n" not in text
    assert text.endswith("...})")
    assert len(text) < 100


def test_repr_html() -> None:
    vm = new_value_mesh(HG, ["<b>", 1, 2, 3])
    out = vm._repr_html_()
    assert out.startswith("<table")
    assert "<th>point</th><th>value</th>" in out
    assert "&#x27;&lt;b&gt;&#x27;" in out
    assert "<td>gpus=3</td><td>3</td>" in out
    assert "(36 more)" in grid(r=100)._repr_html_()


def test_immutable() -> None:
    vm = grid(r=2)
    with pytest.raises(AttributeError):
        vm._values = ()

"""``t.reduce(...)``/``t.reduce_(...)`` with PyTorch Monarch's meaning, on 4 real ranks
({dp: 2, tp: 2}, gloo): every kind, ``scatter``, in place, ``out=``, ``mesh=``, over one, two
and all dimensions, each compared with the same reduction of the ranks' values in one process
(float64)."""

from __future__ import annotations

import functools
import itertools
import operator
from typing import Any

import pytest
import torch

import actormesh as am
from actormesh.tensor import fetch

WAIT = 60
COORDS = [(d, p) for d in range(2) for p in range(2)]


def per_rank(t: Any) -> dict[tuple[int, int], torch.Tensor]:
    return {(d, p): fetch(t, dp=d, tp=p).get(timeout=WAIT) for d, p in COORDS}


def group(coords: tuple[int, int], dims: tuple[str, ...]) -> list[tuple[int, int]]:
    """The ranks reduced together with ``coords`` over ``dims``, row-major in the given order."""
    axes = {"dp": 0, "tp": 1}
    ranges = [range(2) for _ in dims]
    out = []
    for values in itertools.product(*ranges):
        c = list(coords)
        for d, v in zip(dims, values, strict=True):
            c[axes[d]] = v
        out.append((c[0], c[1]))
    return out


LOCAL = {
    "sum": lambda xs: functools.reduce(operator.add, xs),
    "avg": lambda xs: functools.reduce(operator.add, xs) / len(xs),
    "product": lambda xs: functools.reduce(operator.mul, xs),
    "min": lambda xs: functools.reduce(torch.minimum, xs),
    "max": lambda xs: functools.reduce(torch.maximum, xs),
    "band": lambda xs: functools.reduce(torch.bitwise_and, xs),
    "bor": lambda xs: functools.reduce(torch.bitwise_or, xs),
    "bxor": lambda xs: functools.reduce(torch.bitwise_xor, xs),
    "stack": torch.stack,
}


@pytest.mark.parametrize("dims", [("dp",), ("tp",), ("dp", "tp"), ("tp", "dp"), ()])
def test_every_kind_over_every_dims_is_the_local_reduction(
    mesh: Any, dims: tuple[str, ...]
) -> None:
    with mesh.activate():
        x = torch.rand(3, 4, dtype=torch.float64) + 0.5
        ints = torch.randint(0, 64, (3, 4))
        floats = {k: x.reduce(dims, k) for k in ("sum", "avg", "product", "min", "max", "stack")}
        bits = {k: ints.reduce(dims, k) for k in ("band", "bor", "bxor", "sum", "max", "stack")}
    xs, ns = per_rank(x), per_rank(ints)
    names = dims or ("dp", "tp")  # no dims: all of them (Monarch)
    assert floats["stack"].shape == (4 if len(names) == 2 else 2, 3, 4)
    for results, values in ((floats, xs), (bits, ns)):
        for kind, result in results.items():
            assert result.dtype == values[0, 0].dtype, kind
            for coords, got in per_rank(result).items():
                want = LOCAL[kind]([values[c] for c in group(coords, names)])
                assert torch.allclose(got, want, rtol=1e-12, atol=0), (kind, coords)


def test_scatter_is_a_reduce_scatter_and_stack_scatter_an_all_to_all(mesh: Any) -> None:
    with mesh.activate():
        x = torch.rand(2, 3, dtype=torch.float64)  # one row per rank along tp
        summed = x.reduce("tp", "sum", scatter=True)
        averaged = x.reduce("dp", "avg", scatter=True)
        swapped = x.reduce("tp", "stack", scatter=True)
    assert summed.shape == averaged.shape == (3,) and swapped.shape == (2, 3)
    xs = per_rank(x)
    for (d, p), got in per_rank(summed).items():
        assert torch.allclose(got, xs[d, 0][p] + xs[d, 1][p], rtol=1e-12, atol=0)
    for (d, p), got in per_rank(averaged).items():
        assert torch.allclose(got, (xs[0, p][d] + xs[1, p][d]) / 2, rtol=1e-12, atol=0)
    for (d, p), got in per_rank(swapped).items():
        assert torch.equal(got, torch.stack([xs[d, 0][p], xs[d, 1][p]]))


def test_reduce_in_place_and_into_out(mesh: Any) -> None:
    with mesh.activate():
        x = torch.rand(2, 3, dtype=torch.float64)
    xs = per_rank(x)
    with torch.no_grad(), mesh.activate():
        g = x.clone()
        same = g.reduce_("dp", "sum")
        swapped = x.clone()
        swapped.reduce_("tp", "stack", scatter=True)
        out = torch.zeros(2, 3, dtype=torch.float64)
        written = x.reduce("tp", "max", out=out)
        tree = am.tensor.reduce({"a": x, "b": [x * 2]}, "dp")
        in_place = {"a": x.clone(), "b": [x * 2]}
        am.tensor.reduce_(in_place, "tp")  # each MeshTensor of the tree
    assert same is g and written is out
    checks = {
        "reduce_ sum": (g, lambda d, p: xs[0, p] + xs[1, p]),
        "reduce_ stack scatter": (swapped, lambda d, p: torch.stack([xs[d, 0][p], xs[d, 1][p]])),
        "out=": (out, lambda d, p: torch.maximum(xs[d, 0], xs[d, 1])),
        "tree": (tree["b"][0], lambda d, p: 2 * (xs[0, p] + xs[1, p])),
        "tree in place": (in_place["b"][0], lambda d, p: 2 * (xs[d, 0] + xs[d, 1])),
    }
    for what, (result, want) in checks.items():
        for (d, p), got in per_rank(result).items():
            assert torch.allclose(got, want(d, p), rtol=1e-12, atol=0), (what, d, p)
    assert torch.equal(per_rank(x)[1, 1], xs[1, 1])  # reduce() left its input alone


def test_reduce_to_another_shape_of_the_same_processes(mesh: Any) -> None:
    flat = mesh.flatten("all")
    with mesh.activate():
        x = torch.rand(3, dtype=torch.float64)
        total = x.reduce("dp", "sum", mesh=flat)
    assert total.mesh is am.tensor.device_mesh(flat)
    with flat.activate():
        doubled = total * 2  # an op of the flat mesh
    xs = per_rank(x)
    for i in range(4):
        p = i % 2
        assert torch.allclose(fetch(doubled, all=i).get(timeout=WAIT), 2 * (xs[0, p] + xs[1, p]))


def test_bad_reductions_are_refused_at_the_users_line(mesh: Any) -> None:
    with mesh.activate():
        x = torch.rand(2, 3)
        ints = torch.ones(2, 3, dtype=torch.int64)
        flags = torch.ones(2, dtype=torch.bool)
        w = torch.rand(2, 3).requires_grad_()
    cases = [
        (lambda: x.reduce("gpus"), "unknown mesh dimension 'gpus'"),
        (lambda: x.reduce(("dp", "dp")), "named twice"),
        (lambda: x.reduce("dp", "median"), "unknown reduction 'median'"),
        (lambda: x.reduce("dp", "bxor"), "bitwise reduction"),
        (lambda: ints.reduce("dp", "avg"), "convert first"),
        (lambda: flags.reduce("dp", "sum"), "bool tensor"),
        (lambda: x.reduce(("dp", "tp"), scatter=True), "one dimension at a time"),
        (lambda: x.T.reduce("tp", scatter=True), "leading dimension must be the 2 ranks"),
        (lambda: x.reduce_("dp", "stack"), "cannot write in place"),
        (lambda: x.reduce_("dp", "sum", scatter=True), "cannot write in place"),
        (lambda: w.reduce("dp"), "requires grad"),
        (lambda: x.reduce("dp", out=ints), "out is"),
        (lambda: x.reduce("dp", mesh=mesh.slice(dp=0)), "same processes"),
    ]
    for make, message in cases:
        with pytest.raises(am.MeshUsageError, match=message):
            make()
    with torch.no_grad():
        assert w.reduce("dp").shape == (2, 3)  # what Monarch asks for: a reduce outside autograd

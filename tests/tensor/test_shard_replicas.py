"""The route of ops whose DTensor inputs are all replicated (``shard_replicas.py``) gives what
DTensor's own dispatch gives on the same rank (values, placements, global and local shapes and
strides) and declines what it must leave to DTensor. 4 real ranks, gloo, CPU, float64."""

from __future__ import annotations

from typing import Any

import torch
from test_shard_rows import differences_by_route

from actormesh.tensor import distribute, fetch, remote

WAIT = 60


@remote(propagate="inspect")
def _against_dtensor(weights: Any, ids: Any, causal: Any, padding: Any, x: Any, rows: Any) -> str:
    """On a rank: each op through ``on_shards`` against DTensor's dispatch of the same op."""
    from torch.distributed.tensor import DTensor

    from actormesh.tensor.worker.aten import resolve_op as _op
    from actormesh.tensor.worker.shard_replicas import on_replicas

    if type(x) is not DTensor:
        return ""
    both = _op("aten.bitwise_and.Tensor")(causal, padding)  # (4, 1, 8, 8) from broadcasting
    zero, low = x.sum() * 0, x.sum() * 0 - 1e9  # replicated 0-dim floats (a mask's fill values)
    cases: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        ("aten.embedding.default", (weights, ids), {}),  # position ids: no rows to split
        ("aten.bitwise_and.Tensor", (causal, padding), {}),
        ("aten.expand.default", (both, [4, -1, 8, 8]), {}),
        ("aten.where.self", (both, zero, low), {}),
        ("aten._to_copy.default", (ids,), {"dtype": torch.bool}),
        ("aten.split.Tensor", (x, 3, 1), {}),
        ("aten.native_layer_norm.default", (x, [16], None, None, 1e-5), {}),
        ("aten.mul.Tensor", (x, 0.5), {}),
        ("aten.sum.dim_IntList", (x, [0, 2]), {}),
    ]
    problems = differences_by_route(cases)
    plain = torch.ones(8, 16, dtype=torch.float64)
    declined = [
        ("aten.index.Tensor", (x, [ids[0]])),  # its result's shape may depend on the values
        ("aten.native_dropout.default", (x, 0.5, True)),  # each rank would draw its own
        ("aten.add_.Tensor", (x, x)),  # writes its input
        ("aten.add.Tensor", (x, rows)),  # rows split over dp
        ("aten.add.Tensor", (x, plain)),  # a plain tensor
        ("aten.upsample_nearest2d.vec", (x.unsqueeze(0), None, [2.0, 1.0])),  # a float: shape
        ("aten._local_scalar_dense.default", (zero,)),  # a number, not a tensor
    ]
    for name, args in declined:
        if on_replicas(_op(name), args, {}) is not None:
            problems.append(f"{name}: taken")
    if on_replicas(_op("aten.add.Tensor"), (x, x), {"alpha": 1, "out": x}) is not None:
        problems.append("a tensor among the keywords: taken")
    return "; ".join(problems)


def test_ops_on_replicated_values_give_what_dtensor_gives(mesh: Any) -> None:
    torch.manual_seed(0)
    weights = distribute(torch.randn(32, 16, dtype=torch.float64), mesh)
    ids = distribute(torch.arange(8).unsqueeze(0), mesh)
    causal = distribute(torch.ones(8, 8, dtype=torch.bool).tril().view(1, 1, 8, 8), mesh)
    padding = distribute(torch.rand(4, 1, 1, 8) > 0.3, mesh)
    x = distribute(torch.randn(4, 8, 16, dtype=torch.float64), mesh)
    rows = distribute(torch.randn(4, 8, 16, dtype=torch.float64), mesh, ["dp", None, None])
    result = _against_dtensor(weights, ids, causal, padding, x, rows)
    for dp in range(2):
        for tp in range(2):
            assert fetch(result, dp=dp, tp=tp).get(timeout=WAIT) == "", (dp, tp)

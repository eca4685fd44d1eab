"""The routes of ops linear in a partial sum (``shard_partials.py``) give what DTensor's own
dispatch gives on the same rank, and decline what is not linear in it. 4 real ranks, gloo,
CPU, float64."""

from __future__ import annotations

from typing import Any

import torch
from test_shard_rows import differences_by_route

from actormesh.tensor import distribute, fetch, remote

WAIT = 60


@remote(propagate="inspect")
def _against_dtensor(x: Any, ids: Any) -> str:
    """On a rank: each route against DTensor's dispatch of the same op and inputs."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    from actormesh.tensor.worker.aten import resolve_op as _op
    from actormesh.tensor.worker.shard_ops import on_shards

    if type(x) is not DTensor:
        return ""
    mesh, dp = x.device_mesh, x.device_mesh.get_local_rank("dp")
    local = x._local_tensor

    def summed(t: torch.Tensor, op: str = "sum") -> Any:  # this dp rank's part of a sum
        return DTensor.from_local(t, mesh, [Partial(op), Replicate()], run_check=False)

    a, b = summed(local * (dp + 1)), summed(local - dp)
    grad = summed(local[:1, :, :] * (dp + 2))  # (1, 8, 16): a position embedding's gradient
    cases: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        ("aten.add.Tensor", (a, b), {}),  # a tied embedding's two gradients
        ("aten.add.Tensor", (a, b), {"alpha": 0.5}),
        ("aten.sub.Tensor", (a, a), {}),
        ("aten.embedding_dense_backward.default", (grad, ids, 32, -1, False), {}),
    ]
    problems = differences_by_route(cases)
    declined = [
        ("aten.add.Tensor", (a, x)),  # a sum's part plus a whole value: the value n times
        ("aten.mul.Tensor", (a, b)),  # not linear
        ("aten.add.Tensor", (summed(local, "max"), summed(local, "max"))),
        ("aten.embedding_dense_backward.default", (grad, ids, 32, -1, True)),  # counts: whole
    ]
    for name, args in declined:
        if on_shards(name, _op(name), args, {}) is not None:
            problems.append(f"{name}: taken")
    return "; ".join(problems)


def test_ops_linear_in_partial_sums_give_what_dtensor_gives(mesh: Any) -> None:
    torch.manual_seed(0)
    x = distribute(torch.randn(4, 8, 16, dtype=torch.float64), mesh)
    ids = distribute(torch.arange(8).unsqueeze(0), mesh)
    result = _against_dtensor(x, ids)
    for dp in range(2):
        for tp in range(2):
            assert fetch(result, dp=dp, tp=tp).get(timeout=WAIT) == "", (dp, tp)

"""The routes of ops that leave dim 0 alone on a batch split by rows (``shard_rows.py``) give
what DTensor's own dispatch gives on the same rank: values, placements, global shapes and
strides, local strides; and decline what they do not take. 4 real ranks, gloo, CPU, float64."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from actormesh.tensor import distribute, fetch, remote

WAIT = 60


def _differences(name: str, got: Any, want: Any) -> list[str]:
    from torch.distributed.tensor import DTensor

    if got is None:
        return [f"{name}: not taken"]
    gots = list(got) if isinstance(got, (list, tuple)) else [got]
    wants = list(want) if isinstance(want, (list, tuple)) else [want]
    if len(gots) != len(wants):
        return [f"{name}: {len(gots)} results, DTensor {len(wants)}"]
    out = []
    for i, (g, w) in enumerate(zip(gots, wants, strict=True)):
        if g is None or w is None:
            if g is not w:
                out.append(f"{name}[{i}]: {g!r} against {w!r}")
            continue
        if type(g) is not DTensor:
            out.append(f"{name}[{i}]: a {type(g).__name__}")
            continue
        seen = (g.placements, g.shape, g.stride(), g.dtype, g._local_tensor.stride())
        wanted = (w.placements, w.shape, w.stride(), w.dtype, w._local_tensor.stride())
        if seen != wanted:
            out.append(f"{name}[{i}]: {seen} against DTensor's {wanted}")
        elif not torch.equal(g._local_tensor, w._local_tensor):
            out.append(f"{name}[{i}]: values differ")
    return out


def differences_by_route(cases: list[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> list[str]:
    """On a rank: each op through ``on_shards`` against DTensor's dispatch of it, twice (the
    second round runs on the specs the first one found)."""
    from actormesh.tensor.worker.aten import resolve_op
    from actormesh.tensor.worker.shard_ops import on_shards

    problems = []
    for _ in range(2):
        for name, args, kwargs in cases:
            func = resolve_op(name)
            got = on_shards(name, func, args, kwargs)
            problems += _differences(name, got, func(*args, **kwargs))
    return problems


def _padding_mask_rows(tokens: Any, rows: int) -> list[str]:
    """On a rank: Hugging Face's padding mask taken at each row, query and key (``index``),
    combined with a causal mask and expanded, on each rank's rows; DTensor gathers the rows
    for the ``index``, so its values (not its placements) are the reference there."""
    from torch.distributed.tensor import DTensor, Replicate

    from actormesh.tensor.worker.aten import resolve_op as _op
    from actormesh.tensor.worker.shard_ops import on_shards

    mesh = tokens.device_mesh

    def replicated(t: torch.Tensor) -> Any:
        return DTensor.from_local(t, mesh, [Replicate()] * mesh.ndim, run_check=False)

    padding = _op("aten.gt.Scalar")(tokens, 3)  # (rows, 8) bool
    at_rows = replicated(torch.arange(rows).view(-1, 1, 1, 1))
    at_keys = replicated(torch.arange(8).view(1, 1, 1, 8))
    index = _op("aten.index.Tensor")
    problems = []
    for _ in range(2):
        got = on_shards("aten.index.Tensor", index, (padding, [at_rows, at_keys]), {})
        want = index(padding, [at_rows, at_keys])
        if got is None or got.placements != padding.placements:
            problems.append(f"index: {None if got is None else got.placements}")
            continue
        if not torch.equal(got.full_tensor(), want.full_tensor()):
            problems.append("index: values differ")
    causal = replicated(torch.ones(8, 8, dtype=torch.bool).tril().view(1, 1, 8, 8))
    both = _op("aten.bitwise_and.Tensor")(causal, got)  # (rows, 1, 8, 8), on the rows
    problems += differences_by_route([
        ("aten.bitwise_and.Tensor", (causal, got), {}),
        ("aten.expand.default", (both, [rows, -1, 8, 8]), {}),
        ("aten.expand.default", (both, [-1, 2, 8, 8]), {}),
        ("aten.expand.default", (causal, [2, 2, 8, 8]), {}),  # replicated
    ])  # fmt: skip
    declined = [
        (padding, [replicated(torch.arange(rows).flip(0).view(-1, 1, 1, 1)), at_keys]),  # order
        # the rows along the result's dim 1: its dim 0 runs over the keys
        (padding, [replicated(torch.arange(rows).view(1, -1)), at_keys.view(-1, 1)]),
        (padding, [replicated(torch.ones(rows, 8, dtype=torch.bool))]),  # a mask
        # the same index twice (a diagonal): the second runs over every row too
        (tokens, [replicated(torch.arange(rows)), replicated(torch.arange(rows))][:1] * 2),
    ]
    for args in declined:
        if on_shards("aten.index.Tensor", index, args, {}) is not None:
            problems.append(f"index {[tuple(i.shape) for i in args[1]]}: taken")
    return problems


@remote(propagate="inspect")
def _against_dtensor(x: Any, qkv: Any, w: Any, b: Any, w2: Any, tokens: Any) -> str:
    """On a rank: each route's result against DTensor's dispatch of the same op and inputs."""
    from torch.distributed.tensor import DTensor

    from actormesh.tensor.worker.shard_ops import on_shards

    if type(x) is not DTensor:
        return ""
    from actormesh.tensor.worker.aten import resolve_op as _op

    rows = x.shape[0]
    q, k, _ = _op("aten.split.Tensor")(qkv, 16, 2)  # not dense: cut from a wider tensor
    heads = _op("aten.transpose.int")(_op("aten.view.default")(q, [rows, 8, -1, 8]), 1, 2)
    ln, mean, rstd = _op("aten.native_layer_norm.default")(x, [16], w, b, 1e-5)
    flat = _op("aten.sum.dim_IntList")(x, [1])  # (rows, 16)
    logp = _op("aten._log_softmax.default")(flat, 1, False)
    cases: list[tuple[str, tuple[Any, ...]]] = [
        ("aten.transpose.int", (heads, 1, 2)),
        ("aten.transpose.int", (x, -1, 1)),
        ("aten.slice.Tensor", (heads, 2, 0, 4)),
        ("aten.slice.Tensor", (x, 1, 1, 9223372036854775807)),
        ("aten.split.Tensor", (qkv, 16, 2)),
        ("aten.view.default", (q, [rows, 8, -1, 8])),
        ("aten.view.default", (heads, [rows, 2, 8, 8])),
        ("aten._log_softmax.default", (flat, 1, False)),
        ("aten._log_softmax_backward_data.default", (flat, logp, 1, torch.float64)),
        ("aten.native_layer_norm.default", (x, [16], w, b, 1e-5)),
        ("aten.native_layer_norm.default", (k, [16], None, None, 1e-5)),
        (
            "aten.native_layer_norm_backward.default",
            (ln, x, [16], mean, rstd, w, b, [True, True, True]),
        ),
        (
            "aten.native_layer_norm_backward.default",
            (ln, x, [16], mean, rstd, w, b, [True, False, True]),
        ),
        ("aten.embedding.default", (w2, tokens)),
        ("aten.embedding_dense_backward.default", (x, tokens, 64, -1, False)),
        ("aten.sum.default", (x,)),
        ("aten.sum.default", (tokens,)),
        ("aten.cat.default", ([q, k, x], 2)),
        ("aten.cat.default", ([q, x], -1)),
        ("aten.constant_pad_nd.default", (tokens, [0, 1], -100.0)),  # a causal LM's labels
        ("aten.add.Tensor", (x, w)),  # a replicated value broadcast over the rows
        ("aten.add.Tensor", (x, w2[:8][None])),  # (1, 8, 16): a position embedding
        ("aten.add.Tensor", (x, w2[:8])),  # (8, 16)
        ("aten.where.self", (_op("aten.gt.Scalar")(x, 0), x, w)),
    ]
    logits, labels = x[:, 0], tokens[:, 0] % 16  # (rows, 16) and (rows,)
    loss_grad = _op("aten.sum.default")(w) * 0 + 1
    total = _op("aten.sum.default")(w) * 0 + float(rows)  # the forward's whole count
    for reduction in (1, 2):
        cases.append(("aten.nll_loss_backward.default",
                      (loss_grad, logits, labels, None, reduction, -100, total)))  # fmt: skip
    with_keywords: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        ("aten.clone.default", (q,), {"memory_format": torch.contiguous_format}),
        ("aten._to_copy.default", (tokens,), {"dtype": torch.bool, "device": tokens.device}),
        ("aten._to_copy.default", (x,), {"dtype": torch.float32}),
        # one op, specs and scalars, another keyword value: another dtype (int, then float)
        ("aten.div.Tensor_mode", (tokens, tokens[:1] + 1), {"rounding_mode": "floor"}),
        ("aten.div.Tensor_mode", (tokens, tokens[:1] + 1), {"rounding_mode": None}),
    ]
    problems = differences_by_route([(n, a, {}) for n, a in cases] + with_keywords)
    problems += _padding_mask_rows(tokens, rows)
    # What leaves dim 0 alone only: these are DTensor's.
    declined = [
        ("aten.transpose.int", (x, 0, 1)),
        ("aten.slice.Tensor", (x, 0, 0, 1)),
        ("aten.split.Tensor", (x, 1)),
        ("aten._log_softmax.default", (flat, 0, False)),
        ("aten.native_layer_norm.default", (x, [rows, 8, 16], None, None, 1e-5)),
        ("aten.cat.default", ([x, x], 0)),
        ("aten.view.default", (x, [rows * 8, 16])),  # dim 0 merged: not this family's
        # scaled by each index's count over the whole batch, which no rank has
        ("aten.embedding_dense_backward.default", (x, tokens, 64, -1, True)),
        ("aten.constant_pad_nd.default", (x, [0, 0, 0, 0, 1, 0], 0.0)),  # pads the rows
        ("aten.add.Tensor", (x, w2[:rows][:, None])),  # (rows, 1, 16) replicated: whole rows
        ("aten.mul_.Tensor", (w2[:1, :16] * 1, x[:, 0])),  # writes a replicated value
    ]
    for name, args in declined:
        func = _op(name)
        if name == "aten.view.default":
            from actormesh.tensor.worker.shard_rows import ROUTES

            got = ROUTES[name](func, args, {})
        else:
            got = on_shards(name, func, args, {})
        if got is not None:
            problems.append(f"{name}{tuple(a for a in args[1:])}: taken")
    return "; ".join(problems)


@pytest.mark.parametrize("rows", [4, 3])  # 3: uneven blocks over dp
@pytest.mark.parametrize("split", [["dp", None, None], [("dp", "tp"), None, None]])
def test_row_routes_give_what_dtensor_gives(mesh: Any, rows: int, split: list[Any]) -> None:
    if rows == 3 and split[0] == ("dp", "tp"):
        pytest.skip("3 rows over 4 ranks: a rank without rows (DTensor's own views refuse)")
    torch.manual_seed(0)
    x = distribute(torch.randn(rows, 8, 16, dtype=torch.float64), mesh, split)
    qkv = distribute(torch.randn(rows, 8, 48, dtype=torch.float64), mesh, split)
    w = distribute(torch.randn(16, dtype=torch.float64), mesh)
    b = distribute(torch.randn(16, dtype=torch.float64), mesh)
    w2 = distribute(torch.randn(64, 16, dtype=torch.float64), mesh)
    tokens = distribute(torch.randint(0, 64, (rows, 8)), mesh, split[:2])
    result = _against_dtensor(x, qkv, w, b, w2, tokens)
    for dp in range(2):
        for tp in range(2):
            assert fetch(result, dp=dp, tp=tp).get(timeout=WAIT) == "", (dp, tp)

"""``actormesh::adam_`` (``tensor/wire/optim_ops.py``) is torch's foreach Adam(W) step, bit for
bit: its kernel beside torch's own function, in one process, for every option it takes. A torch
release that changes its function fails here."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

from actormesh.tensor.wire import optim_ops

NAMES = ("amsgrad", "maximize", "weight_decay", "decoupled_weight_decay")
OPTIONS = [
    dict(zip(NAMES, values, strict=True))
    for values in itertools.product((False, True), (False, True), (0.0, 0.1), (False, True))
]
DTYPES = [(torch.float32,), (torch.float64,), (torch.float32, torch.float64)]


def _state(dtypes: tuple[torch.dtype, ...], seed: int) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(5, 3), (3,), (2, 2, 2)]
    params = [torch.randn(s, generator=g).to(d) for s, d in zip(shapes, itertools.cycle(dtypes))]
    return [params, *([torch.zeros_like(p) for p in params] for _ in range(3))]


@pytest.mark.parametrize(
    "dtypes", [(torch.float32,), (torch.float64,), (torch.float32, torch.float64)]
)
@pytest.mark.parametrize(
    "options", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items())
)
def test_the_op_is_torchs_foreach_step_bit_for_bit(options: dict[str, Any], dtypes: Any) -> None:
    ours, theirs = _state(dtypes, 0), _state(dtypes, 0)
    steps = [torch.tensor(0.0) for _ in ours[0]]
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        grads = [torch.randn(p.shape, generator=g).to(p.dtype) for p in ours[0]]
        for s in steps:
            s += 1
        params, exp_avgs, exp_avg_sqs, max_sqs = ours
        torch.ops.actormesh.adam_(
            params, grads, exp_avgs, exp_avg_sqs, max_sqs if options["amsgrad"] else [],
            [s.item() for s in steps], options["amsgrad"], 0.9, 0.999, 1e-2,
            options["weight_decay"], 1e-8, options["maximize"], options["decoupled_weight_decay"],
        )  # fmt: skip
        params, exp_avgs, exp_avg_sqs, max_sqs = theirs
        optim_ops.multi_tensor_adam(
            params, grads, exp_avgs, exp_avg_sqs, max_sqs, [s - 1 for s in steps], None, None,
            has_complex=False, beta1=0.9, beta2=0.999, lr=1e-2, eps=1e-8, capturable=False,
            differentiable=False, **options,
        )  # fmt: skip
    for mine, torchs in zip(ours, theirs, strict=True):
        for a, b in zip(mine, torchs, strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b)


def test_on_meta_tensors_a_shape_that_does_not_fit_raises() -> None:
    # What the controller's shape pass runs: torch's own errors, before anything is sent.
    params, exp_avgs, exp_avg_sqs, _ = (
        [t.to("meta") for t in ts] for ts in _state((torch.float32,), 0)
    )
    exp_avgs[0] = torch.empty(5, 2, device="meta")
    with pytest.raises(RuntimeError, match="broadcast"):
        torch.ops.actormesh.adam_(params, params, exp_avgs, exp_avg_sqs, [], [1.0] * 3,
                                  False, 0.9, 0.999, 1e-2, 0.0, 1e-8, False, True)  # fmt: skip

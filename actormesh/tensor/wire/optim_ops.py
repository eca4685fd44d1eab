"""An optimizer's whole update as one op (issue 43): ``actormesh::adam_``.

torch's foreach Adam and AdamW (``torch.optim.adam._multi_tensor_adam``) record eight
``_foreach_`` ops per step over MeshTensors, each dispatched and keyed by the controller and
decoded and run by every rank. Their arithmetic is elementwise in each parameter, so on each
rank it is the same arithmetic on the local shards: the controller records this one op in their
place (``controller/optim.py``), and each rank runs it on its local tensors
(``worker/shard_foreach.py``), or on the DTensors where their placements do not line up
(``worker/aten.py``).

Its kernel is the foreach ops of torch's function (2.13, ``capturable=False``: the step sizes
and bias corrections as Python floats from the step counts), in the same order with the same
scalars, without the function's own bookkeeping (its checks, grouping and step tensors cost
twice its ops on a rank). So the results are those of torch's foreach step in one process, bit
for bit: ``tests/unit/test_optim_ops.py`` holds the two side by side for every option, and
fails when a torch release changes its function.

The op is defined with ``torch.library.Library``, not ``custom_op``, whose Python wrappers
(version counters, autograd) cost 100 µs a call on the controller and on every rank; the
optimizer runs under ``no_grad`` on both sides. Both sides import this module.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim import adam as torch_adam

# torch's own function, held before controller/optim.py puts its own in the module's place.
multi_tensor_adam = torch_adam._multi_tensor_adam  # noqa: SLF001

ADAM = "actormesh.adam_.default"  # the op's name on the wire (str() of the overload)

_LIBRARY = torch.library.Library("actormesh", "DEF")  # held for the process: the op lives as long
_LIBRARY.define(
    "adam_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, "
    "Tensor(c!)[] exp_avg_sqs, Tensor(d!)[] max_exp_avg_sqs, float[] steps, bool amsgrad, "
    "float beta1, float beta2, float lr, float weight_decay, float eps, bool maximize, "
    "bool decoupled_weight_decay) -> ()"
)


def adam_step(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    max_exp_avg_sqs: list[torch.Tensor],
    steps: list[float],
    amsgrad: bool,
    beta1: float,
    beta2: float,
    lr: float,
    weight_decay: float,
    eps: float,
    maximize: bool,
    decoupled_weight_decay: bool,
) -> None:
    """torch's foreach Adam(W) step; ``steps``: each parameter's step count after this step's
    increment (the controller keeps the counters, in the optimizer's state as torch does).
    Parameters of several dtypes are stepped a dtype at a time, as torch groups them."""
    dtypes = {p.dtype for p in params}
    if len(dtypes) > 1:
        for dtype in dtypes:
            at = [k for k, p in enumerate(params) if p.dtype == dtype]

            def pick(tensors: list[torch.Tensor], at: list[int] = at) -> list[torch.Tensor]:
                return [tensors[k] for k in at]

            adam_step(
                pick(params), pick(grads), pick(exp_avgs), pick(exp_avg_sqs),
                pick(max_exp_avg_sqs) if amsgrad else [], [steps[k] for k in at],
                amsgrad, beta1, beta2, lr, weight_decay, eps, maximize, decoupled_weight_decay,
            )  # fmt: skip
        return
    if maximize:
        grads = torch._foreach_neg(grads)  # type: ignore[assignment]  # noqa: SLF001
    if weight_decay != 0:
        if decoupled_weight_decay:
            torch._foreach_mul_(params, 1 - lr * weight_decay)
        elif maximize:
            torch._foreach_add_(grads, params, alpha=weight_decay)
        else:
            grads = torch._foreach_add(grads, params, alpha=weight_decay)  # type: ignore[assignment]  # noqa: SLF001
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    step_sizes = [(lr / (1 - beta1**step)) * -1 for step in steps]
    corrections = [(1 - beta2**step) ** 0.5 for step in steps]
    if amsgrad:
        torch._foreach_maximum_(max_exp_avg_sqs, exp_avg_sqs)
        denominators = torch._foreach_sqrt(max_exp_avg_sqs)  # noqa: SLF001
    else:
        denominators = torch._foreach_sqrt(exp_avg_sqs)  # noqa: SLF001
    torch._foreach_div_(denominators, corrections)
    torch._foreach_add_(denominators, eps)
    torch._foreach_addcdiv_(params, exp_avgs, denominators, step_sizes)


# Every backend, meta tensors included: the controller's shape pass runs it on meta tensors, so a
# shape or dtype torch refuses raises at the user's line, before anything is sent.
_LIBRARY.impl("adam_", adam_step, "CompositeExplicitAutograd")

# The ops of this module by wire name, with what runs them on DTensors (each rank, when the
# local tensors are not placed alike): the kernel itself, whose foreach ops DTensor then runs.
ON_DTENSORS: dict[str, Any] = {ADAM: adam_step}

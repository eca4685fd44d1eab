"""An optimizer's whole update as one op (issue 43): ``actormesh::adam_``.

torch's foreach Adam and AdamW (``torch.optim.adam._multi_tensor_adam``) record eight
``_foreach_`` ops per step over MeshTensors, each dispatched and keyed by the controller and
decoded and run by every rank. Their arithmetic is elementwise in each parameter, so on each
rank it is the same function on the local shards: the controller records this one op in their
place (``controller/optim.py``), and each rank runs it by calling torch's own function on its
local tensors (``worker/shard_foreach.py``), or on the DTensors where their placements do not
line up (``worker/aten.py``). Same function, same operations in the same order: the results are
those of torch's foreach step in one process, bit for bit.

Both sides import this module: it defines the op (its schema names the tensors it writes) and
its implementation on plain tensors.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim import adam as torch_adam

# torch's own function, held before controller/optim.py puts its own in the module's place.
multi_tensor_adam = torch_adam._multi_tensor_adam  # noqa: SLF001

ADAM = "actormesh.adam_.default"  # the op's name on the wire (str() of the overload)


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
    increment (the controller keeps the counters, as torch's optimizer state)."""
    # float64 counters, one short: torch's function adds the step's 1 (exact, as the
    # controller's own increment) and reads each back as the same Python float.
    state_steps = [torch.tensor(s - 1.0, dtype=torch.float64) for s in steps]
    multi_tensor_adam(
        params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, None, None,
        amsgrad=amsgrad, has_complex=False, beta1=beta1, beta2=beta2, lr=lr,
        weight_decay=weight_decay, eps=eps, maximize=maximize, capturable=False,
        differentiable=False, decoupled_weight_decay=decoupled_weight_decay,
    )  # fmt: skip


adam_ = torch.library.custom_op(
    "actormesh::adam_", mutates_args=("params", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs")
)(adam_step)


@adam_.register_fake
def _adam_shapes(*args: Any, **kwargs: Any) -> None:
    """No outputs: it writes its tensors in place. The controller's shape pass runs torch's
    function on the meta tensors, so that a shape or dtype torch refuses raises at the user's
    line, as its foreach ops did, rather than on every rank at the next sync point."""
    adam_step(*args, **kwargs)


# The ops of this module by wire name, with what runs them on DTensors (each rank, when the
# local tensors are not placed alike): the same function, whose foreach ops DTensor then runs.
ON_DTENSORS = {ADAM: adam_step}

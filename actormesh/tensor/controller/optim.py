"""``torch.optim`` over MeshTensor parameters takes its ``foreach`` implementation by default.

torch picks an optimizer's implementation when ``foreach`` is left ``None``: foreach only for
plain tensors on CUDA (and a few other accelerators), the per-parameter loop otherwise. On the
CPU a MeshTensor therefore got the loop: AdamW recorded 8 ops per parameter per step, each sent
to and run by every rank. Its foreach implementation records about a dozen ops per step,
whatever the number of parameters, each run on the local shards (``worker/shard_foreach.py``),
with the same arithmetic in the same order (the differential tests compare with one process).

An optimizer step pre-hook (torch's own, global) turns ``foreach`` on for the step of each
parameter group that left it ``None`` and holds only MeshTensors, and a post-hook puts ``None``
back, so the optimizer's ``state_dict`` stays the user's. A group that chose (``foreach=False``,
``fused=True``, ``differentiable=True``) is left alone. The post-hook also marks the end of a
training step in the stream of each mesh the step wrote to (``Stream.mark``): a step that
repeats is then sent by reference (``programs.py``).

The foreach step of Adam and AdamW (``torch.optim.adam._multi_tensor_adam``, which AdamW calls
too) runs as one op over MeshTensors: torch's function in that module is replaced by one that
increments the step counters as torch does, on the controller where torch keeps them, and
records ``actormesh::adam_`` per mesh, which each rank runs as the foreach ops of torch's
function on its local tensors (``wire/optim_ops.py``: bit for bit torch's step). A group with
parameters on several meshes gets one op per mesh. Any other call (plain tensors, tensor
learning rates or betas, ``capturable``, complex parameters, grad mode on) goes to torch's
function as it is, and what it refuses it still refuses.

``torch.nn.utils.clip_grad_norm_`` (and ``clip_grad_value_``) choose by the tensors' type: with
MeshTensor among torch's foreach types they record a norm and a scale for all the gradients
(8 ops) instead of one of each per parameter.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim import adam as torch_adam
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils import _foreach_utils

from ..wire import optim_ops
from .tensor import MeshTensor

_installed = False
_CHOSEN = "_actormesh_foreach"  # a group's mark while its step runs with our choice


def _before_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    for group in optimizer.param_groups:
        if (
            group.get("foreach", False) is not None
            or group.get("fused")
            or group.get("differentiable")
        ):
            continue
        if not group.get("capturable") and _tensor_hyperparameters(group):
            continue  # torch's foreach path refuses them (and so does not choose it itself)
        params = group["params"]
        if params and all(type(p) is MeshTensor for p in params):
            group["foreach"] = True
            group[_CHOSEN] = True


def _tensor_hyperparameters(group: dict[str, Any]) -> bool:
    betas = group.get("betas", ())
    return isinstance(group.get("lr"), torch.Tensor) or any(
        isinstance(b, torch.Tensor) for b in betas
    )


def _after_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    streams = []
    for group in optimizer.param_groups:
        if group.pop(_CHOSEN, False):
            group["foreach"] = None
        for p in group["params"]:  # a group may span meshes (pipeline stages)
            if type(p) is MeshTensor and p.mesh.stream not in streams:
                streams.append(p.mesh.stream)
    for stream in streams:
        stream.mark()  # a training step ends here: the next one may repeat it (programs.py)


def _adam_on_meshes(
    params: list[Any],
    grads: list[Any],
    exp_avgs: list[Any],
    exp_avg_sqs: list[Any],
    max_exp_avg_sqs: list[Any],
    state_steps: list[Any],
    grad_scale: Any,
    found_inf: Any,
    **options: Any,
) -> None:
    """torch's foreach Adam(W) step (same arguments): one ``actormesh::adam_`` op per mesh for
    MeshTensor parameters, torch's own function for anything else."""
    lists = (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps)
    if not _one_op_takes(lists, grad_scale, found_inf, options):
        optim_ops.multi_tensor_adam(*lists, grad_scale, found_inf, **options)
        return
    # As torch's function does first: the counters are plain tensors here (its optimizer state).
    torch._foreach_add_(state_steps, torch.tensor(1.0), alpha=1.0)
    by_mesh: dict[Any, list[int]] = {}
    for k, p in enumerate(params):
        by_mesh.setdefault((p.mesh, p.per_rank), []).append(k)
    amsgrad = options["amsgrad"]
    for positions in by_mesh.values():
        torch.ops.actormesh.adam_(
            [params[k] for k in positions],
            [grads[k] for k in positions],
            [exp_avgs[k] for k in positions],
            [exp_avg_sqs[k] for k in positions],
            [max_exp_avg_sqs[k] for k in positions] if amsgrad else [],
            [state_steps[k].item() for k in positions],
            amsgrad,
            float(options["beta1"]),
            float(options["beta2"]),
            float(options["lr"]),
            float(options["weight_decay"]),
            float(options["eps"]),
            options["maximize"],
            options["decoupled_weight_decay"],
        )


def _one_op_takes(
    lists: tuple[list[Any], ...], grad_scale: Any, found_inf: Any, options: dict[str, Any]
) -> bool:
    """Whether ``actormesh::adam_`` does exactly what torch's function would: MeshTensors of one
    mesh at each position (plain counters), real, scalar hyperparameters, no autograd."""
    params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps = lists
    if not params or type(params[0]) is not MeshTensor:
        return False
    if grad_scale is not None or found_inf is not None:
        return False
    if options["capturable"] or options["differentiable"] or options["has_complex"]:
        return False
    if torch.is_grad_enabled():  # (the functional API called with grad on: torch's ops decide)
        return False
    for name in ("lr", "beta1", "beta2", "weight_decay", "eps"):
        if type(options[name]) not in (float, int):
            return False
    state = [exp_avgs, exp_avg_sqs, *([max_exp_avg_sqs] if options["amsgrad"] else [])]
    for k, p in enumerate(params):
        if type(p) is not MeshTensor:
            return False
        for tensors in (grads, *state):
            x = tensors[k]
            if type(x) is not MeshTensor or x.mesh is not p.mesh or x.per_rank is not p.per_rank:
                return False
        step = state_steps[k]
        if (
            type(step) is not torch.Tensor
            or step.device.type != "cpu"
            or step.numel() != 1
            or step.dtype not in (torch.float32, torch.float64)  # torch's function refuses others
        ):
            return False
    return True


def install() -> None:
    """Register the hooks, once per process (``actormesh.tensor`` does on import)."""
    global _installed
    if not _installed:
        _installed = True
        register_optimizer_step_pre_hook(_before_step)
        register_optimizer_step_post_hook(_after_step)
        torch_adam._multi_tensor_adam = _adam_on_meshes  # noqa: SLF001  (see the docstring)
        # clip_grad_norm_ (and clip_grad_value_) take their foreach path for the types torch
        # lists here: a norm and a scale per device, not per parameter.
        supported = _foreach_utils._foreach_supported_types  # noqa: SLF001  (torch's own list)
        if MeshTensor not in supported:
            supported.append(MeshTensor)

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

``torch.nn.utils.clip_grad_norm_`` (and ``clip_grad_value_``) choose by the tensors' type: with
MeshTensor among torch's foreach types they record a norm and a scale for all the gradients
(8 ops) instead of one of each per parameter.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils import _foreach_utils

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
        params = group["params"]
        if params and all(type(p) is MeshTensor for p in params):
            group["foreach"] = True
            group[_CHOSEN] = True


def _after_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    streams = []
    for group in optimizer.param_groups:
        if group.pop(_CHOSEN, False):
            group["foreach"] = None
        for p in group["params"][:1]:
            if type(p) is MeshTensor and p.mesh.stream not in streams:
                streams.append(p.mesh.stream)
    for stream in streams:
        stream.mark()  # a training step ends here: the next one may repeat it (programs.py)


def install() -> None:
    """Register the hooks, once per process (``actormesh.tensor`` does on import)."""
    global _installed
    if not _installed:
        _installed = True
        register_optimizer_step_pre_hook(_before_step)
        register_optimizer_step_post_hook(_after_step)
        # clip_grad_norm_ (and clip_grad_value_) take their foreach path for the types torch
        # lists here: a norm and a scale per device, not per parameter.
        supported = _foreach_utils._foreach_supported_types  # noqa: SLF001  (torch's own list)
        if MeshTensor not in supported:
            supported.append(MeshTensor)

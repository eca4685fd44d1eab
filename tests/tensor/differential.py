"""A differential harness: one model trained through a mesh and in this process, side by side.

``compare_training(make_model, mesh, options, batches, loss_of)`` builds the model once (call
``.double()`` in ``make_model``: float64, so that any difference is a bug, not rounding), puts a
copy on the mesh with ``module_to_mesh(copy, mesh, **options)``, and runs the same steps on both
as a user writes them: ``zero_grad``, ``loss_of(model, batch)``, ``loss.backward()``,
``clip_grad_norm_``, the optimizer's ``step`` (AdamW unless ``optimizer`` makes another). After
every step it compares the loss, every gradient (after clipping) and, at the end, every parameter
and buffer, and fails naming the step and the tensor that differ. It returns the losses, so a
caller can also check that the model learnt.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from actormesh.tensor import inspect, module_to_mesh

ATOL = 1e-9


def _close(name: str, got: torch.Tensor, want: torch.Tensor, atol: float) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (
        f"{name}: {tuple(got.shape)} {got.dtype} on the mesh, {tuple(want.shape)} {want.dtype} "
        "in one process"
    )
    if got.is_floating_point():
        worst = (got - want).abs().max().item() if got.numel() else 0.0
        assert worst <= atol, f"{name}: differs by {worst:.3g} (> {atol:g}) from one process"
    else:
        assert torch.equal(got, want), f"{name}: differs from one process"


def compare_training(
    make_model: Callable[[], nn.Module],
    mesh: Any,
    options: dict[str, Any],
    batches: Sequence[Any],
    loss_of: Callable[[nn.Module, Any], torch.Tensor],
    *,
    lr: float = 1e-2,
    max_norm: float | None = 1.0,
    atol: float = ATOL,
    weights_atol: float | None = None,
    optimizer: Callable[[Any], torch.optim.Optimizer] | None = None,
) -> list[float]:
    """Train ``make_model()`` on the mesh and locally over ``batches``; assert they agree
    (losses and gradients within ``atol``, the final weights within ``weights_atol``, by default
    the same)."""
    local = make_model()
    meshed = module_to_mesh(copy.deepcopy(local), mesh, **options)
    assert [n for n, _ in meshed.named_parameters()] == [n for n, _ in local.named_parameters()]
    make_optimizer = optimizer or (lambda params: torch.optim.AdamW(params, lr=lr))
    optimizers = [make_optimizer(m.parameters()) for m in (local, meshed)]
    losses = []
    for step, batch in enumerate(batches):
        values = []
        for model, optimizer in zip((local, meshed), optimizers, strict=True):
            optimizer.zero_grad()
            loss = loss_of(model, batch)
            loss.backward()
            if max_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
            values.append((loss, grads))
            optimizer.step()
        (want_loss, want_grads), mesh_values = values[0], values[1]
        got_loss, got_grads = inspect(mesh_values)  # one sync point for the step
        _close(f"step {step}: loss", got_loss, want_loss.detach(), atol)
        assert sorted(got_grads) == sorted(want_grads), f"step {step}: other parameters got grads"
        for name, want in want_grads.items():
            _close(f"step {step}: grad of {name}", got_grads[name], want, atol)
        losses.append(want_loss.item())
    final = inspect(dict(meshed.state_dict()))
    for name, want in local.state_dict().items():
        _close(f"after {len(batches)} steps: {name}", final[name], want, weights_atol or atol)
    return losses

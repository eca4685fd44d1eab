"""``grad_generator``: PyTorch Monarch's backward pass that hands out one gradient at a time.

``for param, grad in zip(params, grad_generator(loss, params))`` gives the gradient of each of
``with_respect_to`` in turn, as ``torch.autograd.grad(roots, with_respect_to,
allow_unused=True)`` would (``None`` for one the roots do not depend on), without touching
``.grad``. Monarch computes each gradient as late as it can, so that a collective on one
gradient (``grad.reduce_("dp", "sum")``) overlaps the backward of the next on another CUDA
stream. Here every rank runs its ops in one stream, in the order they were issued, so there is
no overlap to win: the whole backward is recorded at the first ``next()`` (it returns at once;
the ranks run it as usual), and the gradients are then handed out one by one, each released by
the generator as it goes. The values are the same either way.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.autograd.graph import GradientEdge

from .. import compat

TensorOrEdge = torch.Tensor | GradientEdge


class GradGenerator(Iterator[torch.Tensor | None]):
    """The iterator ``grad_generator`` returns (not constructed by users)."""

    def __init__(
        self,
        roots: list[TensorOrEdge],
        with_respect_to: list[TensorOrEdge],
        grad_roots: list[torch.Tensor | None],
    ) -> None:
        self._roots = roots
        self._inputs = with_respect_to
        self._grad_roots = grad_roots
        self._grads: list[torch.Tensor | None] | None = None

    def __iter__(self) -> GradGenerator:
        return self

    def __next__(self) -> torch.Tensor | None:
        if self._grads is None:
            self._grads = self._backward()
            self._grads.reverse()  # popped from the end: each is released as it is handed out
        if not self._grads:
            raise StopIteration
        return self._grads.pop()

    def __len__(self) -> int:
        return len(self._inputs) if self._grads is None else len(self._grads)

    def _backward(self) -> list[torch.Tensor | None]:
        if not self._inputs:
            return []
        grad_outputs = self._grad_roots or None
        # Set free as soon as they are used: the graph and the roots are not kept alive by the
        # generator (torch.autograd.grad frees the graph, as backward() does).
        roots, inputs = self._roots, self._inputs
        self._roots, self._inputs = [], []
        with torch.enable_grad():
            # torch's stub takes all tensors or all edges; the function takes any mix of them.
            grads = torch.autograd.grad(
                roots,  # type: ignore[arg-type]
                inputs,  # type: ignore[arg-type]
                grad_outputs,
                allow_unused=True,
            )
        return list(grads)


def grad_generator(
    roots: torch.Tensor | Sequence[TensorOrEdge] = (),
    with_respect_to: Sequence[TensorOrEdge] = (),
    grad_roots: Sequence[torch.Tensor | None] = (),
) -> GradGenerator:
    """An iterator over the gradients of ``roots`` with respect to each of ``with_respect_to``,
    in that order (Monarch's ``grad_generator``); ``None`` for one that ``roots`` do not depend
    on. ``grad_roots``: the gradient of each root (none: ones, for scalar roots). Works on
    MeshTensors (per-rank or global) and on plain tensors alike. The backward pass is recorded at
    the first ``next()``, which returns without waiting for the ranks; ``.grad`` is left alone.
    Each generator runs once (the graph is freed, as by ``backward()``).
    """
    root_list: list[TensorOrEdge] = [roots] if isinstance(roots, torch.Tensor) else list(roots)
    inputs = list(with_respect_to)
    grads = list(grad_roots)
    if not root_list and inputs:
        raise compat.MeshUsageError("grad_generator needs at least one root (the loss)")
    if grads and len(grads) != len(root_list):
        raise compat.MeshUsageError(
            f"grad_generator: {len(grads)} grad_roots for {len(root_list)} roots; give one "
            "gradient (or None) per root"
        )
    for i, x in enumerate(root_list + inputs):
        if not isinstance(x, (torch.Tensor, GradientEdge)):
            what = "roots" if i < len(root_list) else "with_respect_to"
            raise compat.MeshUsageError(
                f"grad_generator: {what} holds a {type(x).__name__}; give tensors (or "
                "GradientEdges)"
            )
    return GradGenerator(root_list, inputs, grads)

"""The ranks' side of ``activate.py``: per-rank tensors. Each rank runs a torch factory
itself (``factory``) and knows its own coordinate (``rank``); ``reduce.py`` has the collectives
that combine a per-rank tensor over mesh dimensions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .aten import tensor_leaves

if TYPE_CHECKING:
    from .state import EngineState


_RANDOM = frozenset({"rand", "randn", "randint"})


def run_factory(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    import torch

    name, args, kwargs = payload
    kwargs = dict(kwargs, device=engine.device)
    if name in _RANDOM and "generator" not in kwargs:
        kwargs["generator"] = engine.generator  # the engine's: a process may run several
    return tensor_leaves(getattr(torch, name)(*engine.resolve(args), **engine.resolve(kwargs)))


def run_rank(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    import torch

    dims, view_id = payload
    value = engine.view(view_id).index(dims)  # row-major position within the named dimensions
    return [torch.tensor(value, dtype=torch.int64, device=engine.device)]

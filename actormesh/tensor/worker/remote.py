"""The ranks' side of ``remote.py``: a remote function's code (``define``), its calls
(``remote_call``), and the tensors of a result that rank 0 described, under the ids the
controller gave them (``unpack``, for ``rref.py`` too)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .aten import tensor_leaves

if TYPE_CHECKING:
    from .state import EngineState


def run_define(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    fn_id, fn = payload
    engine.fns[fn_id] = fn
    return []


def run_call(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    import torch

    fn_id, name, args, kwargs, structured = payload
    with torch.enable_grad():  # user code: torch's default grad mode, as in a local call
        result = engine.fns[fn_id](*engine.resolve(args), **engine.resolve(kwargs))
    if not structured:  # "inspect": the whole result is one opaque value
        return [result]
    values = tensor_leaves(result)
    op = engine.current
    if op is not None:
        _check_as_described(name, values, op[3])  # the op's (shape, dtype, per_rank) per result
    return values


def _check_as_described(name: str, values: Sequence[Any], meta: Sequence[Any]) -> None:
    """A result must be what the controller recorded for it (``propagate``'s answer, or the
    first rank's cached one): a per-rank tensor as it is, a DTensor by its global shape. Later
    ops are shaped on the controller from that, so a result that differs would mislead every
    op after it without a word."""
    from torch.distributed.tensor import DTensor

    for k, (value, described) in enumerate(zip(values, meta, strict=False)):
        if described is None:
            continue
        if not described[2] and not isinstance(value, DTensor):
            continue  # a global result kept as this rank's part: its whole shape is not here
        shape, dtype = tuple(described[0]), described[1]
        if tuple(value.shape) != shape or value.dtype != dtype:
            raise RuntimeError(
                f"remote function {name} returned a {tuple(value.shape)} {value.dtype} tensor "
                f"as its result {k} on this rank, where the controller was told {shape} "
                f"{dtype}; make its propagate return what the function returns (or leave "
                "propagate out: the function then runs once to learn its results' shapes)"
            )


def run_unpack(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    (whole,) = payload
    return tensor_leaves(engine.resolve(whole))

"""How the stream pickles a batch of ops (``stream.py``)."""

from __future__ import annotations

import copyreg
import io
import pickle
from typing import Any

import torch

from ..wire.kinds import PLAIN_KINDS
from ..wire.ops import Op, torch_constant


def pack(ops: list[Op]) -> list[Op] | bytes:
    """A batch of only ``plain`` kinds (kinds.py) pickled by the plain C pickler, several times
    faster than the runtime's cloudpickle (whose per-object hook dominated the controller's
    cost per op); other batches as they are (the runtime's codec pickles them)."""
    for op in ops:
        if op[0] not in PLAIN_KINDS:
            return ops
    buffer = io.BytesIO()
    _BatchPickler(buffer, protocol=5).dump(ops)
    return buffer.getvalue()


def _by_name(x: Any) -> tuple[Any, tuple[str]]:  # torch.channels_last -> "channels_last"
    return torch_constant, (str(x).removeprefix("torch."),)


class _BatchPickler(pickle.Pickler):
    """The C pickler, with torch's memory formats by name. Pickle finds the module of an object
    without ``__module__`` by scanning every loaded module: ``preserve_format`` (in the kwargs
    autograd gives ``ones_like`` for a loss's gradient seed) cost 60-80 µs per batch that way,
    a training step's whole batch of 41 ops 25."""

    dispatch_table = {**copyreg.dispatch_table, torch.memory_format: _by_name}

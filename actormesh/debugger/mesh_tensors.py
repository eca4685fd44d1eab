"""``%mesh dbg inspect NAME`` on a MeshTensor or a ``module_to_mesh`` module: per-rank shard
summaries, side by side.

The summaries are computed on the ranks by the tensor engine, in stream order (after the ops
issued before), with the same ``summarize`` as the other inspects: only small dicts travel.
Each carries the block of the global value its rank holds, so :class:`Comparison` flags a
rank whose piece differs from the other ranks holding the same piece (a diverged replica), as
well as NaN/Inf. This module imports the tensor layer only when a value is a MeshTensor (and
therefore torch and the tensor layer are already loaded).
"""

from __future__ import annotations

import sys
from typing import Any

from ..errors import MeshError
from .tensors import DEFAULT_CAP, Comparison, param_row, summarize

INSPECT_TIMEOUT = 60.0


def mesh_value(name: str, namespace: dict[str, Any]) -> Any:
    """The MeshTensor or MeshModule the dotted ``name`` names in the kernel, else None."""
    if "actormesh.tensor" not in sys.modules:
        return None  # no tensor was ever made in this kernel
    from ..tensor.tools import is_mesh_value

    head, *rest = name.split(".")
    value = namespace.get(head)
    try:
        for attr in rest:
            value = getattr(value, attr)
    except AttributeError:
        return None
    return value if is_mesh_value(value) else None


def extent(value: Any) -> dict[str, int]:
    """The mesh dimensions of a MeshTensor or MeshModule (for ``-r`` selections)."""
    from ..tensor.tools import mesh_extent

    return dict(mesh_extent(value))


def compare(name: str, value: Any, ranks: list[int] | None = None) -> Comparison:
    """Summaries of ``value``'s shards on every rank (or ``ranks``, by row-major index)."""
    from ..tensor.tools import shard_summaries

    labels, future = shard_summaries(value, summarize, param_row, DEFAULT_CAP)
    wanted = range(len(labels)) if ranks is None else ranks
    summaries: dict[str, dict[str, Any] | str]
    try:
        values = future.get(timeout=INSPECT_TIMEOUT).values()
        summaries = {labels[r]: values[r] for r in wanted}
    except MeshError as exc:  # a failed value: its failure, on every rank
        text = str(exc).strip().splitlines()
        summaries = dict.fromkeys((labels[r] for r in wanted), (text[0] if text else "")[:160])
    return Comparison(name, summaries)

"""What the kernel, the sidebar and the debugger need from the tensor layer (it never imports
them: they sit above it and call these).

- ``for_rank(value)``: what ``%mesh push`` sends for a MeshTensor: it unpickles on each rank
  as that rank's value in the engine (the DTensor of a global MeshTensor, the tensor of a
  per-rank one), after the ops issued before the push, without moving data.
- ``cell_launched(cell, name, processes)``: the kernel launches a ``%%mesh`` cell; what it
  waits for before it touches engine values, and what waits for it (``local.py``).
- ``activity(instance)``: the sidebar's busy text for a tensor engine ("tensor engine: op 12
  aten.mm"; on a slice or a pipeline stage, "tensor engine (pp=1, stage 1 of 2): op 12
  aten.mm"), read from another thread while the engine runs a batch; ``between_ops(instance)``
  whether it runs no op now (another busy actor of the rank says more).
- ``shard_summaries(obj, summarize)``: one small dict per rank of a MeshTensor or MeshModule,
  computed on the ranks by ``summarize`` (the debugger's), never the data itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from . import compat
from .controller.mesh import TensorMesh
from .controller.module import MeshModule, model_mesh
from .controller.remote import RemoteFunction
from .controller.tensor import MeshTensor
from .worker.engine import _TensorEngine
from .worker.local import local_value

logger = logging.getLogger(__name__)


def _mesh_of(value: MeshTensor | MeshModule) -> TensorMesh:
    return model_mesh(value) if isinstance(value, MeshModule) else value.mesh


class _RankValue:
    """Pickles as a call that, on a rank, returns the engine's value of a MeshTensor."""

    def __init__(self, t: MeshTensor) -> None:
        tm = _mesh_of(t)
        tm.stream.flush()
        self.args = (tm.key, t.value_id, tm.stream.batches, True)
        self.keep = t  # the value must outlive the push: a drop could overtake it

    def __reduce__(self) -> tuple[Any, ...]:
        return (local_value, self.args)


def for_rank(value: Any) -> Any:
    """``value``, or for a MeshTensor what hands each rank its own value of it."""
    if isinstance(value, MeshTensor):
        return _RankValue(value)
    return value


def cell_launched(cell: int, name: str, processes: set[bytes]) -> dict[str, int]:
    """The kernel launches ``%%mesh`` cell number ``cell`` (numbers only grow) called ``name``
    on the processes with these mailboxes. Sends every tensor mesh's buffered ops; returns how
    many batches each engine (by key) was sent before the cell: one that touches engine values
    runs after those (``local.CellTurn``). Each engine's next message waits, on those
    processes, for the cell to take its turn (``local.wait_for_cell``)."""
    from .controller.mesh import meshes

    sent = {}
    for tm in meshes():
        if tm.stream.lost is not None or compat.is_stopped(tm.origin):
            continue  # its values are gone: no cell can touch them
        try:
            # Not flush(): a background send's error stays for the next sync point, which
            # reports it (and a rank death) to the user.
            sent[tm.key] = tm.stream.cell_launched(cell, name, processes)
        except Exception:
            logger.debug("sending the tensor ops before a %%mesh cell failed", exc_info=True)
    return sent


def activity(instance: Any) -> str | None:
    """The busy text of a tensor engine (None for any other actor): "tensor engine: op 12
    aten.mm", and for an engine on a slice or a pipeline stage where and what it is, "tensor
    engine (pp=1, stage 1 of 2): op 12 aten.mm"."""
    if not isinstance(instance, _TensorEngine):
        return None
    what = instance.serves()
    name = f"tensor engine ({what})" if what else "tensor engine"
    doing = instance.doing()
    return f"{name}: {doing}" if doing else name


def between_ops(instance: Any) -> bool:
    """Whether ``instance`` is a tensor engine that runs no op now (it starts, or reads its next
    batch): a rank's status names another busy actor, one in an op, before it."""
    return isinstance(instance, _TensorEngine) and instance.doing() is None


def is_mesh_value(value: Any) -> bool:
    return isinstance(value, (MeshTensor, MeshModule))


def mesh_extent(value: MeshTensor | MeshModule) -> dict[str, int]:
    """The mesh dimensions of a MeshTensor's or MeshModule's tensor engine."""
    tm = _mesh_of(value)
    return dict(zip(tm.labels, tm.sizes, strict=True))


def shard_summaries(
    value: MeshTensor | MeshModule,
    summarize: Callable[[Any, int], dict[str, Any]],
    param_row: Callable[[str, Any, Any, int], dict[str, Any]],
    cap: int,
) -> tuple[list[str], Any]:
    """``(rank labels, Future[ValueMesh of summaries])``: on every rank, in stream order,
    ``summarize(local, cap)`` runs on its shard of a tensor, ``param_row(name, local, grad,
    cap)`` on its shard of each parameter of a module (the caller's own summaries: this layer
    only finds the shards). Each summary carries ``"block"``: which piece of the global value
    the rank holds, so that ranks holding the same piece (replicas) can be compared."""
    tm = _mesh_of(value)
    if isinstance(value, MeshModule):
        params = dict(value.named_parameters())
        grads = {n: p.grad for n, p in params.items() if isinstance(p.grad, MeshTensor)}
        future = _MODULE_SUMMARY.call(type(value).__name__, params, grads, param_row, cap)
    else:
        future = _TENSOR_SUMMARY.call(value, summarize, cap)
    n = 1
    for size in tm.sizes:
        n *= size
    return [tm.coords_of(i) for i in range(n)], future


def _block(v: Any) -> str | None:
    """Where a rank's piece sits in the global value: ranks with the same block are replicas.
    None for a per-rank tensor: its ranks' values are not meant to agree."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not isinstance(v, DTensor):
        return None
    shape, offset = compute_local_shape_and_global_offset(v.shape, v.device_mesh, v.placements)
    partial = any(p.is_partial() for p in v.placements)
    return f"{tuple(shape)}@{tuple(offset)}{' partial' if partial else ''}"


def _local(v: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return v.to_local() if isinstance(v, DTensor) else v


def _tensor_summary(v: Any, summarize: Any, cap: int) -> dict[str, Any]:
    out = dict(summarize(_local(v), cap))
    out["block"] = _block(v)
    return out


def _module_summary(
    type_name: str, params: dict[str, Any], grads: dict[str, Any], param_row: Any, cap: int
) -> dict[str, Any]:
    rows = []
    for name, p in params.items():
        g = grads.get(name)
        row = param_row(name, _local(p), None if g is None else _local(g), cap)
        rows.append(dict(row, block=_block(p)))
    return {"kind": "module", "type": type_name, "params": rows}


# One remote function each (defined once per engine, not once per inspect).
_TENSOR_SUMMARY = RemoteFunction(_tensor_summary, "inspect")
_MODULE_SUMMARY = RemoteFunction(_module_summary, "inspect")


def recovery_of(mesh_id: str) -> dict[str, Any] | None:
    """The last recovery of a training run on proc mesh ``mesh_id`` (``FaultTolerant``), as the
    sidebar shows it (kernel/panel/protocol.py's ``recovery``); None if it had none."""
    from .controller.recovery import RECOVERIES

    shown = RECOVERIES.get(mesh_id)
    return None if shown is None else dict(shown)

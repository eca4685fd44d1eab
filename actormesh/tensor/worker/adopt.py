"""The ranks' side of ``adopt.py``: a tensor a ``%%mesh`` cell made on this rank becomes a value
of the engine (``_TensorEngine.adopt`` runs it)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import compat

if TYPE_CHECKING:
    from .state import EngineState

# What adopt_value tells the controller: (per_rank, shape, dtype, stride).
Adopted = tuple[bool, tuple[int, ...], Any, tuple[int, ...]]


def adopt_value(engine: EngineState, id: int, name: str) -> Adopted:
    """Make ``name`` from this process's ``%%mesh`` namespace engine value ``id``: a DTensor is
    a global value (moved onto the engine's DeviceMesh if the cell made its own of the same
    shape), a tensor a per-rank one. ``(per_rank, global shape, dtype, stride)`` for the
    controller, which checks that the ranks agree."""
    import torch
    from torch.distributed.tensor import DTensor

    found = [ns[name] for ns in compat.cell_namespaces() if name in ns]
    if not found:
        raise NameError(
            f"adopt: {name!r} is not defined in the %%mesh namespace on {engine.rank_str}; "
            "make it in a %%mesh cell on every rank of the mesh first"
        )
    value = found[0]
    if isinstance(value, DTensor):
        mesh = value.device_mesh
        if mesh is not engine.mesh:
            if tuple(mesh.shape) != engine.sizes or mesh.mesh_dim_names != engine.labels:
                raise ValueError(
                    f"adopt: {name!r} is a DTensor over a DeviceMesh {tuple(mesh.shape)} "
                    f"{mesh.mesh_dim_names}, not the engine's {engine.sizes} {engine.labels}; "
                    "make it on the engine's mesh (a pushed DTensor's .device_mesh)"
                )
            value = DTensor.from_local(
                value.to_local(), engine.mesh, value.placements, run_check=False,
                shape=value.shape, stride=value.stride(),
            )  # fmt: skip
        per_rank = False
    elif isinstance(value, torch.Tensor):
        per_rank = True
        value = value.to(engine.device)
    else:
        raise TypeError(
            f"adopt: {name!r} on {engine.rank_str} is a {type(value).__name__}, not a tensor "
            "or DTensor"
        )
    # The cell's own object where it can be (a later cell touching it then takes the lock);
    # detached if it needs grad (the engine's values never do), sharing its storage.
    engine.env[id] = value.detach() if value.requires_grad else value
    return per_rank, tuple(value.shape), value.dtype, tuple(value.stride())

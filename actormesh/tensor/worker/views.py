"""Other shapes of one engine's processes: a ``rename``, ``flatten`` or ``split`` of the mesh it
runs on (worker side).

The processes and their row-major order are the same, so a per-rank value needs nothing new;
what changes is which ranks a mesh dimension groups (the process groups of a collective) and
each rank's coordinates. The controller numbers each shape it uses (view 0 is the engine's own)
and sends a ``mesh_view`` op before any op that names it; every rank builds the view's
``DeviceMesh`` there, in stream order (making its process groups is a collective over all the
ranks).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .state import MeshView

if TYPE_CHECKING:
    from .state import EngineState


def run_mesh_view(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    view_id, labels, sizes = payload
    if engine.ranks is None:
        ranks = torch.arange(len(engine.mesh.mesh.flatten())).reshape(sizes)
        mesh = DeviceMesh(engine.device, ranks, mesh_dim_names=tuple(labels))
    else:  # the engine runs on part of its group: the view's groups are its own (groups.py)
        from .groups import sub_device_mesh

        name = f"{engine.key}-view{view_id}"
        mesh = sub_device_mesh(engine.device, name, engine.ranks, sizes, labels)
    engine.views[view_id] = MeshView(mesh, tuple(labels), tuple(sizes), engine.index)
    return []

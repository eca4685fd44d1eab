"""The one place the tensor layer reaches below actormesh's public API.

Everything else in ``actormesh.tensor`` imports the runtime through this module (or through
``import actormesh``), so when the runtime's internals move, only these imports change. Each
name says why the public API is not enough.
"""

from __future__ import annotations

from typing import Any, TypeVar

from ..errors import MeshUsageError, RemoteFailure
from ..runtime.distributed import destroy_process_group, init_process_group
from ..runtime.future import Future, then, when_all
from ..runtime.supervision import unhandled_fault_hook
from ..runtime.value_mesh import ValueMesh

T = TypeVar("T")

__all__ = [
    "Future",
    "MeshUsageError",
    "RemoteFailure",
    "ValueMesh",
    "completed",
    "destroy_process_group",
    "failed",
    "helper_mesh_with_args",
    "init_process_group",
    "mesh_id",
    "mesh_shape",
    "report_unhandled",
    "then",
    "value_mesh",
    "when_all",
]


def completed(value: T) -> Future[T]:
    """A future that is already done (the public API only hands out futures, never makes them)."""
    return Future._completed(value)


def failed(exc: BaseException) -> Future[Any]:
    return Future._failed(exc)


def value_mesh(like: Any, values: list[Any]) -> ValueMesh[Any]:
    """A ValueMesh over the shape of mesh ``like`` (``remote_fn.call`` builds its own)."""
    return ValueMesh._create(like._shape, values)


def mesh_shape(mesh: Any) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(labels, sizes) of a mesh or slice: ``sizes`` of the public API loses nothing, but the
    global ranks (below) need the shape object."""
    shape = mesh._shape
    return tuple(shape.labels), tuple(shape.sizes)


def mesh_id(mesh: Any) -> tuple[str, tuple[int, ...]]:
    """Which processes a mesh covers: the same processes must get one engine, however the
    mesh object that names them was made (sliced, renamed, unpickled)."""
    return mesh._procs.mesh_id, tuple(mesh._shape.ranks())


def report_unhandled(error: Exception) -> None:
    """A tensor failure that no sync point touched goes where a failed broadcast goes."""
    unhandled_fault_hook(error)  # type: ignore[arg-type]


def helper_mesh_with_args(procs: Any, name: str, cls: type, *args: Any) -> Any:
    """Spawn ``cls(*args)`` on exactly ``procs``'s processes without recording it for ``heal``
    (a healed process has no process group, so re-creating the engine there cannot work)."""
    from ..runtime.proc_mesh import ProcMesh

    return ProcMesh._create(procs._procs, procs._shape, None).spawn(name, cls, *args)

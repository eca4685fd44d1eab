"""The one place the tensor layer imports the runtime.

Everything else in ``actormesh.tensor`` gets the runtime through this module, so when the
runtime's modules move, only these imports change. The first group are public names (the tensor
layer sits below the ``actormesh`` namespace, so it imports them from where they live); the
helpers below them are the few places where the public API is not enough, each saying why.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import MeshUsageError, RemoteFailure
from ..runtime.actors import (
    Actor,
    Future,
    completed_future,
    endpoint,
    failed_future,
    local_actor_host,
    set_exception,
    set_result,
    then,
    waiting_for,
    when_all,
)
from ..runtime.dataplane import destroy_process_group, init_process_group
from ..runtime.extent import Extent, Point, point_label
from ..runtime.faults import unhandled_fault_hook
from ..runtime.mesh_shape import view_shape, with_shape
from ..runtime.meshes import (
    ProcMesh,
    ValueMesh,
    message_readers,
    new_value_mesh,
    on_unsent,
    proc_table_of,
    subset,
    unrecorded,
)
from ..runtime.meshes.tensor_seam import TensorLayer
from ..runtime.meshes.tensor_seam import install as install_tensor_layer
from ..runtime.messaging import current_node, loads

T = TypeVar("T")

__all__ = [
    "Actor",
    "Extent",
    "Future",
    "MeshUsageError",
    "Point",
    "ProcMesh",
    "RemoteFailure",
    "TensorLayer",
    "ValueMesh",
    "actor_mesh_as",
    "cell_namespaces",
    "completed",
    "destroy_process_group",
    "endpoint",
    "failed",
    "helper_mesh_with_args",
    "in_this_process",
    "init_process_group",
    "install_tensor_layer",
    "is_stopped",
    "loads",
    "local_actor",
    "mailboxes",
    "mesh_id",
    "mesh_name",
    "message_readers",
    "on_failure",
    "on_unsent",
    "open_port",
    "places",
    "point_label",
    "proc_state",
    "report_unhandled",
    "subset_mesh",
    "then",
    "value_mesh",
    "when_all",
]


def completed(value: T) -> Future[T]:
    """A future that is already done (the public API only hands out futures, never makes them)."""
    return completed_future(value)


def failed(exc: BaseException) -> Future[Any]:
    return failed_future(exc)


def on_failure(future: Future[T], translate: Callable[[BaseException], BaseException]) -> Future[T]:
    """``future``, failing with ``translate(its exception)`` instead where it fails."""

    def describe() -> str:  # a timed-out wait names the ranks the reply still waits for
        return waiting_for(future) or "the tensor engines' reply"

    out: Future[T] = Future(describe, future.pending_ranks)

    def settle(done: Future[T]) -> None:
        exc = done.exception()
        if exc is None:
            set_result(out, done.get())
            return
        try:
            error = translate(exc)
        except BaseException as err:  # a bug in translate: still fail the future
            error = err
        if error is not exc and error.__cause__ is None:
            error.__cause__ = exc
        set_exception(out, error)

    future.add_done_callback(settle)
    return out


def value_mesh(like: Any, values: list[Any]) -> ValueMesh[Any]:
    """A ValueMesh over the shape of mesh ``like`` (``remote_fn.call`` builds its own)."""
    return new_value_mesh(view_shape(like), values)


def mesh_id(mesh: Any) -> tuple[str, tuple[int, ...]]:
    """Which processes a mesh covers: the same processes must get one engine, however the
    mesh object that names them was made (sliced, renamed, unpickled)."""
    return proc_table_of(mesh).mesh_id, tuple(view_shape(mesh).ranks())


def mailboxes(mesh: Any) -> list[bytes]:
    """The mailbox of each process of ``mesh``, in row-major order (a process group's ranks)."""
    table = proc_table_of(mesh)
    return [table.addresses[r].mailbox for r in view_shape(mesh).ranks()]


def processes_here(mesh: Any) -> int:
    """How many processes of ``mesh`` run on the controller's host (the others have a host
    agent that relays to them)."""
    table = proc_table_of(mesh)
    ranks = list(view_shape(mesh).ranks())
    if table.relays is None:
        return len(ranks)
    return sum(table.relays[r] is None for r in ranks)


def mesh_name(mesh: Any) -> str:
    """What messages call the proc mesh under ``mesh`` (``procs``, ``procs-2``)."""
    return str(proc_table_of(mesh).name)


def proc_state(mesh: Any) -> Any:
    """An object whose ``closed`` turns True when the processes under ``mesh`` are stopped
    (the op stream reads it on every recorded op: an attribute costs less than a call)."""
    return proc_table_of(mesh)


def open_port(handler: Any) -> Any:
    """A port of this process whose messages go to ``handler`` on the I/O thread (its
    ``on_message``; ``on_death`` hears of every process death): an engine's inbox, where other
    engines send it the values they move (``to_mesh``). ``Channel.open`` would queue them for
    one reader; an inbox files them by transfer, for whichever op wants each."""
    return current_node().open_port(handler)


def in_this_process(address: Any) -> bool:
    return bool(address.mailbox == current_node().address.mailbox)


def places(mesh: Any) -> tuple[str, ...] | None:
    """Where each process of ``mesh`` sits in its whole proc mesh (``{pp=1, dp=0}``), row-major;
    None when ``mesh`` covers the whole proc mesh in order (its own coordinates say it then).
    A failure on a slice's engine names the rank so: which stage, not just which dp rank."""
    table = proc_table_of(mesh)
    ranks = list(view_shape(mesh).ranks())
    if ranks == list(range(len(table.addresses))):
        return None
    return tuple("{" + table.labels[r].replace(",", ", ") + "}" for r in ranks)


def is_stopped(mesh: Any) -> bool:
    """Whether the processes under ``mesh`` were stopped (the public API says so only by
    raising MeshClosedError on the next call)."""
    return bool(proc_table_of(mesh).closed)


def report_unhandled(error: Exception) -> None:
    """A tensor failure that no sync point touched goes where a failed broadcast goes."""
    unhandled_fault_hook(error)  # type: ignore[arg-type]


def helper_mesh_with_args(procs: Any, name: str, cls: type, *args: Any) -> Any:
    """Spawn ``cls(*args)`` on exactly ``procs``'s processes without recording it for ``heal``
    (a healed process has no process group, so re-creating the engine there cannot work)."""
    return unrecorded(procs).spawn(name, cls, *args)


def subset_mesh(procs: Any, indices: list[int], sizes: dict[str, int]) -> Any:
    """The processes of ``procs`` at ``indices`` (row-major) as a mesh of shape ``sizes``: a
    tensor mesh that shrank (recovery.py) runs on some processes of its mesh, which a slice,
    a strided view, cannot name when the one left out is an inner rank."""
    return subset(procs, indices, sizes)


def actor_mesh_as(actors: Any, procs: Any) -> Any:
    """The actors of ``actors`` addressed in the shape of ``procs``, another shape of the same
    processes in the same order (a tensor mesh view sends to its engine with its own labels)."""
    return with_shape(actors, view_shape(procs))


def local_actor(key: str, timeout: float) -> Any:
    """The runner of actor mesh ``key``'s actor in this process, waiting up to ``timeout`` s for
    its spawn (``None`` if none comes): ``rref`` runs an endpoint on its thread (``run_task``)
    with the engine's local values."""
    host = local_actor_host()
    return None if host is None else host.wait_for_actor(key, timeout)


def cell_namespaces() -> list[dict[str, Any]]:
    """The namespaces of this process's actors that run notebook cells (``%%mesh``). The kernel's
    executor says it runs user code (``runs_user_code``, which the runtime's stack view reads
    too) and keeps its names in ``ns``; looked up here, not imported: the kernel sits above the
    tensor layer."""
    host = local_actor_host()
    found = []
    for runner in list(host.actors.values()) if host is not None else ():
        ns = getattr(runner.instance, "ns", None)
        if getattr(runner.instance, "runs_user_code", False) and isinstance(ns, dict):
            found.append(ns)
    return found

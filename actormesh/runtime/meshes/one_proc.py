"""One process as a one-proc mesh: ``this_proc()``, and an actor's own process
(``context().actor_instance.proc``, which ``actor_context.proc_factory`` builds with this)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..actors import ActorRunner, proc_factory
from ..shape import unchecked_shape
from .proc_mesh import ProcMesh, new_proc_mesh
from .proc_table import ProcTable, live_table

if TYPE_CHECKING:
    from ..messaging import Address


def one_proc_mesh(
    mesh_id: str, address: Address, rank: int, label: str, table: ProcTable | None = None
) -> ProcMesh:
    """The process at ``address``, rank ``rank`` of its proc mesh, as a one-proc mesh (on
    ``table`` when one is known)."""
    # Its one point is the process's own rank in its proc mesh (what its ActorHost accepts a
    # spawn for); the table holds only that rank's address, at that index.
    if table is None:
        table = ProcTable(mesh_id, [address] * (rank + 1), [label] * (rank + 1))
    return new_proc_mesh(table, unchecked_shape((), rank, (), ()), None)


def _own_proc(runner: ActorRunner) -> ProcMesh:
    """The process of ``runner`` as a one-proc mesh (``context().actor_instance.proc``), under
    an id of its own (``this_proc()``'s is the same in every process)."""
    node = runner.node
    mesh_id = f"proc-{node.address.mailbox.hex()}"
    label = node.mesh_id or "controller"
    return one_proc_mesh(mesh_id, node.address, runner.proc_rank, label, live_table(mesh_id))


proc_factory[0] = _own_proc

"""The meshes behind a ``%%mesh`` TARGET: the kernel's helper actors on each proc mesh
(``MeshTools``), what a TARGET expression names (``Target``) and the registry of both.

The kernel runs on meshes it did not wrap: it finds them through the controller's records
(``Controller.live_record``, ``MeshRecord.proc_mesh``), never through the user's objects alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..runtime.mesh_shape import view_shape
from ..runtime.meshes import ActorMesh, ProcMesh, ProcTable, actor_key, proc_table_of
from ..runtime.procs import MeshRecord, controller_if_started
from ..runtime.shape import Shape
from .executor import EXECUTOR_NAME, STATUS_NAME, MeshExecutor, MeshStatus
from .selection import SelectionError


class MeshTools:
    """The kernel's helpers living on one proc mesh: the executor (and status) actors."""

    def __init__(self, table: ProcTable, record: MeshRecord) -> None:
        self.table = table
        self.record = record
        self.procs = record.proc_mesh()
        self.shape = view_shape(self.procs)
        self.n = len(self.shape)
        self._executor: ActorMesh[MeshExecutor] | None = None
        self._status: ActorMesh[MeshStatus] | None = None
        self.labels = {label: rank for rank, label in enumerate(table.labels)}

    def rank_shape(self, rank: int) -> Shape:
        return self.shape.rank_view(rank)

    def executor_mesh(self) -> ActorMesh[MeshExecutor]:
        """The executors of every rank (spawned on first use; cells queue behind the spawn)."""
        if self._executor is None:
            self._executor = self.procs.spawn(EXECUTOR_NAME, MeshExecutor)
        return self._executor

    def executor(self, rank: int) -> ActorMesh[MeshExecutor]:
        """The executor of one rank."""
        return self.executor_mesh().rank_view(rank)

    def status_actors(self) -> ActorMesh[MeshStatus]:
        if self._status is None:
            self._status = self.procs.spawn(STATUS_NAME, MeshStatus)
        return self._status

    def status_actors_if_spawned(self) -> ActorMesh[MeshStatus] | None:
        """The status actors if they run already (asking them then starts no thread)."""
        return self._status

    def proc(self, rank: int) -> ProcMesh:
        return self.procs.rank_view(rank)

    def interrupt(self, ranks: list[int]) -> None:
        if len(ranks) == self.n:
            self.procs.interrupt()
            return
        for r in ranks:
            self.proc(r).interrupt()


@dataclass
class Target:
    """What a TARGET expression names: a view of a proc mesh, maybe an actor mesh on it."""

    tools: MeshTools
    shape: Shape  # the view the TARGET covers
    actor_key: str | None  # an ActorMesh target: the rank's actor is `actor` in cells
    text: str

    @property
    def procs(self) -> ProcMesh:
        return self.tools.record.proc_mesh(self.shape)


class MeshRegistry:
    """The kernel's ``MeshTools`` per proc mesh, dropped when the mesh is stopped."""

    def __init__(self) -> None:
        self._tools: dict[str, MeshTools] = {}

    def tools(self, table: ProcTable) -> MeshTools:
        cached = self._tools.get(table.mesh_id)
        if cached is not None and cached.table is table and not table.closed:
            return cached
        ctl = controller_if_started()
        record = None if ctl is None else ctl.meshes.get(table.mesh_id)
        if record is None or table.closed:
            raise SelectionError(
                f"proc mesh {table.mesh_id} is stopped or was not spawned by this kernel"
            )
        tools = self._tools[table.mesh_id] = MeshTools(table, record)
        return tools

    def target(self, obj: Any, text: str) -> Target:
        if isinstance(obj, ProcMesh):
            return Target(self.tools(proc_table_of(obj)), view_shape(obj), None, text)
        if isinstance(obj, ActorMesh):
            return Target(self.tools(proc_table_of(obj)), view_shape(obj), actor_key(obj), text)
        raise SelectionError(
            f"TARGET {text!r} is a {type(obj).__name__}; give a ProcMesh or an ActorMesh"
        )

    def live(self) -> list[MeshTools]:
        """Every live proc mesh of this kernel's controller."""
        ctl = controller_if_started()
        if ctl is None:
            return []
        return [self.tools(record.table) for record in ctl.live_records()]

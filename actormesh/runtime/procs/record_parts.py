"""How the record of a proc mesh (``mesh_record.MeshRecord``) and its neighbours see each other:
``MeshController``, the ``Controller`` (``controller.py``) as a record uses it, and
``HealedMesh``, the record as ``rehost.py`` moves its ranks.

``controller.py`` imports ``mesh_record.py``, which imports ``rehost.py``; typed against these
protocols, neither imports back, not even for types. mypy checks that the classes are what the
protocols say where one is handed to the other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ...errors import ProcDeath
from ..meshes import ProcTable
from ..messaging import Address, LogSink, Node
from .agent_handle import AgentHandle


class MeshController(Protocol):
    """The controller that owns a proc mesh, as its record uses it."""

    @property
    def node(self) -> Node: ...
    @property
    def logs(self) -> LogSink: ...
    @property
    def run_dir(self) -> str: ...
    @property
    def meshes(self) -> dict[str, Any]: ...  # mesh id -> MeshRecord
    @property
    def stopped_ids(self) -> set[str]: ...
    @property
    def local_tcp(self) -> dict[str, Any] | None: ...
    @property
    def find_spare(self) -> Callable[[], AgentHandle | None] | None: ...

    def local_agent(self) -> AgentHandle: ...

    def notify_death(self, record: Any, address: Address, death: ProcDeath) -> None: ...

    def broadcast_to_workers(self, envelope: tuple[Any, ...]) -> None: ...


class HealedMesh(Protocol):
    """A proc mesh whose lost hosts' ranks move to spare hosts (``rehost.py``)."""

    @property
    def ctl(self) -> MeshController: ...
    @property
    def table(self) -> ProcTable: ...
    @property
    def agents(self) -> list[AgentHandle]: ...
    @property
    def per_host(self) -> int: ...
    @property
    def n(self) -> int: ...

    def agent_of(self, rank: int) -> AgentHandle: ...

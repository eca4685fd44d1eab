"""The one seam between the kernel and the debugger: everything the kernel asks of the debugger,
typed (``Debugger``), and the one that is loaded.

The debugger builds on the kernel (``%mesh dbg`` is a kernel magic) and the kernel never imports
it: when it loads (``%load_ext actormesh``, the actormesh kernel) it ``install``s itself here.
Without it the kernel works, and says so where a command needs it.

=====================================  ==========================================================
the kernel asks                        for
=====================================  ==========================================================
``run(words)``                         ``%mesh dbg ...``
``annotate_stacks(stacks, mesh_id)``   ``%mesh stacks``: where the paused ranks of a mesh are
``paused(mesh_id)``                    a blocking cell's status strip: which ranks are paused
``raise_if_paused(mesh_id, ranks)``    a blocking cell whose running ranks are all paused ends
``cell_paused()``                      ... and shows the debugger
``paused_ranks()``                     the sidebar's paused ranks, every mesh
``add_listener(callback)``             the sidebar redraws when they change
``pause(mesh_id, ranks)``, ``resume``  the sidebar's buttons
=====================================  ==========================================================
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..runtime.meshes import ValueMesh


@dataclass(frozen=True)
class PausedRank:
    """A rank stopped in the debugger, and where."""

    mesh_id: str  # ProcTable.mesh_id of the proc mesh the rank belongs to
    rank: int  # flat rank within that proc mesh
    file: str  # as the user should see it: a notebook cell shows as "In [3]"
    line: int
    function: str


class Debugger(Protocol):
    """The debugger as the kernel uses it. Every method may be called from any thread and
    returns at once, except ``run`` (a magic: the kernel's main thread) and ``raise_if_paused``
    (the blocking cell's thread)."""

    def run(self, words: list[str]) -> Any:
        """``%mesh dbg WORDS...``: the command's result (shown as a cell's output)."""
        ...

    def annotate_stacks(self, stacks: ValueMesh[str], mesh_id: str) -> ValueMesh[str]:
        """``%mesh stacks``: each rank's stack, a paused rank's with where it is paused."""
        ...

    def paused(self, mesh_id: str) -> dict[int, str]:
        """The ranks of ``mesh_id`` paused in the debugger: ``{rank: "paused at ..."}``."""
        ...

    def raise_if_paused(self, mesh_id: str, ranks: list[int]) -> None:
        """Raise (in the cell's thread) when all of ``ranks`` are paused: waiting on them
        would block the notebook that has to continue them."""
        ...

    def cell_paused(self) -> None:
        """A cell ended because its remaining ranks are paused (show the debugger)."""
        ...

    def paused_ranks(self) -> list[PausedRank]:
        """Every rank paused now, all meshes of this controller, by mesh and rank."""
        ...

    def add_listener(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` (any thread; quick) when the paused ranks or where they are
        change; returns what unsubscribes it."""
        ...

    def pause(self, mesh_id: str, ranks: Sequence[int]) -> None:
        """Ask ``ranks`` of ``mesh_id`` to pause; listeners hear when they are."""
        ...

    def resume(self, mesh_id: str, ranks: Sequence[int]) -> None:
        """Let the paused ``ranks`` of ``mesh_id`` continue."""
        ...


_installed: Debugger | None = None


def install(debugger: Debugger | None) -> None:
    """The debugger loaded into this kernel (``None``: none); the debugger calls it."""
    global _installed
    _installed = debugger


def installed() -> Debugger | None:
    """The debugger loaded into this kernel, or ``None``."""
    return _installed

"""What the user is told when a MeshTensor's values are gone, and how a tensor changes mesh.

A mesh's tensor values live in its processes: ``stop()`` ends them for good, a rank's death
loses the values of every rank (DTensor's collectives need them all), and ``heal()`` brings the
processes back empty. Each message says which of these happened and an action that works then,
in the words of the public API (never the engine actor's or its endpoints' names).
"""

from __future__ import annotations

from ...errors import MeshClosedError, SupervisionError

SPAWN = "spawn new procs with am.this_host().spawn_procs(...)"
MAKE_AGAIN = "distribute (or module_to_mesh) the tensors again"


def move_hint() -> str:
    """How a MeshTensor gets onto another mesh: ``to_mesh``, rank to rank. One place, so that
    every message that asks for a move says it the same way."""
    return (
        "t.to_mesh(procs) moves MeshTensor t onto proc mesh procs, rank to rank (placed as on "
        "its mesh, dimension by dimension by name; sharding_spec=... places it otherwise)"
    )


def stopped(name: str) -> MeshClosedError:
    """A MeshTensor of a stopped mesh was used."""
    return MeshClosedError(
        f"the mesh of this MeshTensor, {name!r}, was stopped, and its tensor values ended "
        f"with its processes; {SPAWN}, then {MAKE_AGAIN} on those"
    )


def stopped_mesh(name: str, what: str) -> MeshClosedError:
    """``what`` (``distribute``, ``module_to_mesh``...) was given a stopped mesh."""
    return MeshClosedError(
        f"{what}: proc mesh {name!r} was stopped, so it holds no tensors any more; {SPAWN} and "
        "pass those"
    )


def lost(name: str, cause: BaseException, healed: bool) -> MeshClosedError:
    """A MeshTensor of a mesh that lost a rank was used; ``healed``: the mesh was healed since."""
    what = deaths(cause)
    if healed:
        return MeshClosedError(
            f"this MeshTensor's values were lost when its mesh, {name!r}, lost a rank ({what}); "
            f"the mesh was healed since, with new, empty processes: {MAKE_AGAIN}"
        )
    return MeshClosedError(
        f"the mesh of this MeshTensor, {name!r}, lost a rank ({what}), and with it the tensor "
        f"values of every rank; heal the mesh (procs.heal().get()), then {MAKE_AGAIN}"
    )


def rank_died(name: str, cause: SupervisionError) -> SupervisionError:
    """The error of the sync point that first meets a rank's death (the runtime's names the
    engine's endpoint): which process ended how, its stderr, and that ``heal`` helps."""
    if not cause.deaths:
        return cause
    return SupervisionError(
        list(cause.deaths), f"the tensor values of mesh {name!r} are lost (a rank died)"
    )


def deaths(cause: BaseException) -> str:
    """Which processes died, and how, without the runtime's wording around it."""
    if isinstance(cause, SupervisionError) and cause.deaths:
        return "; ".join(d.describe() for d in cause.deaths[:4])
    return str(cause).splitlines()[0] if str(cause) else type(cause).__name__

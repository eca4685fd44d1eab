"""The worker side of a sync point: what one rank answers to ``engine.fetch`` (fetch.py is the
controller's side, which assembles the answers).

Every rank of the mesh answers, in stream order: with the value's poison when it failed there
(so a failure on rank 3 surfaces even when rank 0's shard was asked for), else with its piece
when it holds a wanted one. A global value goes as this rank's block and its global offset; a
small partial sum (a training loop's loss) goes as this rank's *term*, added up on the
controller, so that reading it runs no collective here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .dtensors import local_layout

if TYPE_CHECKING:
    from .state import EngineState

# A Partial value up to this many elements is fetched as every rank's term, added up on the
# controller: no collective (DTensor's redistribute costs a few hundred µs of Python on each rank
# and waits for the slowest one). A training loop's ``loss.item()`` is such a value.
COMBINE_ON_CONTROLLER = 1 << 16


def answer_fetch(engine: EngineState, requests: list[tuple[int, int | None]]) -> dict[str, Any]:
    """Per requested ``(id, want)``: this rank's poison, or its data when wanted.

    ``want`` is a rank index (that rank's local value) or ``None`` (the global value: every
    rank holding a distinct piece sends it, with its offset). Every rank runs this, in stream
    order, so the collectives that make a value gatherable (Partial -> Replicate) have all
    their members, stand-ins included."""
    import torch
    from torch.distributed.tensor import DTensor

    poison: dict[int, Any] = {}
    data: dict[int, Any] = {}
    with torch.no_grad():
        for id, want in requests:
            v = engine.value(id)
            divisor = None
            if want is None and isinstance(v, DTensor):
                divisor = combinable(v)
                if divisor is None:
                    v = gatherable(v)
            root = engine.poison.get(id)
            if root is not None:
                poison[id] = root
                engine.surfaced.add(root.serial)
                continue
            if want is None:
                if isinstance(v, DTensor):
                    piece = _piece(engine, v, divisor)
                    if piece is not None:
                        data[id] = piece
                elif engine.index == 0:
                    data[id] = ("value", v)
            elif want == engine.index:
                data[id] = ("value", v.to_local() if isinstance(v, DTensor) else v)
    return {"poison": poison, "data": data}


def _piece(engine: EngineState, v: Any, divisor: int | None) -> tuple[Any, ...] | None:
    """This rank's block of ``v`` with its global offset, or ``None`` when another rank sends
    the same block. ``divisor``: ``v`` is a partial sum that the controller adds up (then
    divides by it), so every rank along its Partial dimensions sends its term."""
    from torch.distributed.tensor import Replicate

    mesh = v.device_mesh
    coords = mesh.get_coordinate()
    for dim, p in enumerate(v.placements):
        if isinstance(p, Replicate) and coords[dim] != 0:
            return None  # rank 0 along this dimension sends the same piece
    if not _first_copy(mesh, engine.ranks[0] if engine.ranks else 0):
        return None  # a sub-mesh (a TP plan's): the one with rank 0 sends the same pieces
    _, offset = local_layout(v._spec)  # noqa: SLF001
    return ("piece", v._local_tensor, tuple(offset), tuple(v.shape), divisor)  # noqa: SLF001


_first: dict[int, tuple[Any, bool]] = {}


def _first_copy(mesh: Any, first: int) -> bool:
    """Whether ``mesh`` holds the engine's rank 0 (``first``: its rank in the process group). A
    value on the engine's mesh or a view of it (all the ranks) does; one on a sub-mesh (a slice
    along some dimensions: each slice holds its own copy) is sent by the slice at coordinate 0
    of the others, the one that holds rank 0."""
    found = _first.get(id(mesh))
    if found is None or found[0] is not mesh:
        found = _first[id(mesh)] = (mesh, bool((mesh.mesh == first).any()))
    return found[1]


def combinable(v: Any) -> int | None:
    """For a small ``v`` that is a Partial sum or average over some mesh dimensions (and
    Shard/Replicate over the others): what the controller divides the sum of the ranks' terms
    by (1 for a sum). ``None``: reduce it on the workers (``gatherable``)."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    count, op = 1, None
    for dim, p in enumerate(v.placements):
        if type(p) is Shard or type(p) is Replicate:
            continue
        if type(p) is not Partial or p.reduce_op not in ("sum", "avg"):
            return None
        if op is not None and p.reduce_op != op:
            return None
        op = p.reduce_op
        count *= v.device_mesh.size(dim)
    if op is None or v.numel() > COMBINE_ON_CONTROLLER:
        return None
    if op == "avg" and not v.dtype.is_floating_point:
        return None  # the division would change the dtype
    return count if op == "avg" else 1


def gatherable(v: Any) -> Any:
    """``v`` with Partial sums reduced and strided shards gathered: then each rank's local tensor
    is one block of the global value at a known offset."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    placements = list(v.placements)
    if all(type(p) is Shard or isinstance(p, Replicate) for p in placements):
        return v
    if any(isinstance(p, Partial) for p in placements) and all(
        type(p) is Shard or isinstance(p, (Replicate, Partial)) for p in placements
    ):
        new = [Replicate() if isinstance(p, Partial) else p for p in placements]
    else:
        new = [Replicate()] * len(placements)
    return v.redistribute(v.device_mesh, new)

"""The ranks' side of ``MeshTensor.to_mesh``: a value moves rank to rank between two engines.

Each engine has an *inbox*: a port of its process (``compat.open_port``) that the controller
hands the engines that send to it (a ``link`` op, once per pair). A ``send`` op on the source
engine sends, from every source rank to every destination rank it serves, one message: the
pieces of its value that rank needs (with their global offsets), the destination placements
and the value's failure if it failed. Messages travel as any port message does, straight from
process to process (shared memory on one host, the direct socket between hosts), never through
the controller; a destination in the same process gets a copy without pickling. The ``recv``
op on the destination engine waits for its messages in its inbox (the I/O thread files them
as they arrive, so a busy engine never holds them up) and assembles its local value.

Global values: every source rank sends a message to every destination rank, empty when it
holds nothing that rank needs or when another replica sends it (the replicas of a piece take
turns by destination rank), so a destination knows how many to wait for, and learns the
placements from them (by default the source's, dimension by dimension by name, which only the
source knows). Per-rank values: the source rank of each coordinate sends its tensor to the
destination ranks of the same coordinates (several, when the destination has dimensions the
source lacks); a destination that gets several adds them up (the backward of such a
broadcast).

A failed source value still sends (its stand-in, and the failure): the destination's value
inherits that failure, so the error names the rank and op that failed on the *source* mesh,
and nothing waits for a message that never comes. A source process that dies, or a message
that does not come within the op's timeout, fails the receive instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..compat import in_this_process
from ..wire.ops import FailureInfo
from .inbox import inboxes

if TYPE_CHECKING:
    from .state import EngineState


class Inherited(Exception):
    """A receive whose value failed on the source mesh: its outputs carry that failure (with
    ``values`` as their stand-ins), not a new one of this rank's."""

    def __init__(self, values: list[Any], root: FailureInfo) -> None:
        super().__init__(root.message)
        self.values = values
        self.root = root


def run_link(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    """Remember the inboxes of engine ``peer`` (by its index), where ``send`` ops go."""
    peer, ports = payload
    engine.peers[peer] = ports
    return []


# -- sending -------------------------------------------------------------------------------------


def run_send(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    ref, peer, key, placements, dst_labels, dst_sizes, targets = payload
    ports = engine.peers[peer]
    root = engine.poison.get(ref.id)
    try:
        value = engine.value(ref.id)
        if targets is None:
            messages = _global_messages(engine, value, key, placements, dst_labels, dst_sizes)
        else:
            local = value.to_local() if hasattr(value, "to_local") else value
            messages = {j: (None, [((), local)]) for j in targets[engine.index]}
    except Exception as exc:
        # Every destination rank waits for a message from this one: each gets the failure.
        failure = engine.new_failure(exc)
        for port in ports if targets is None else [ports[j] for j in targets[engine.index]]:
            _post(port, (key, engine.index, None, [], failure))
        raise
    for j, (placed, pieces) in messages.items():
        _post(ports[j], (key, engine.index, placed, pieces, root))
    return []


def _post(port: Any, message: tuple[Any, ...]) -> None:
    """A message is ``(key, source index, placements or None, [(offset, tensor)], failure)``."""
    if not in_this_process(port.address):
        port.send(message)
        return
    # In this process (an engine over a slice of this one's processes): a copy, not a pickle.
    key, index, placed, pieces, failure = message
    copies = [(o, t.detach().clone()) for o, t in pieces]
    inboxes[port.port_id].put((key, index, placed, copies, failure))


def _global_messages(
    engine: EngineState,
    value: Any,
    key: int,
    placements: tuple[Any, ...] | None,
    dst_labels: tuple[str, ...],
    dst_sizes: tuple[int, ...],
) -> dict[int, tuple[Any, ...]]:
    """Destination rank -> (its placements, the pieces of this rank's block it needs)."""
    from torch.distributed.tensor import Replicate

    from .fetch import gatherable

    value = gatherable(value)  # Partial sums reduced (a collective of the source ranks)
    src_mesh = value.device_mesh
    src_labels = tuple(src_mesh.mesh_dim_names or ())
    if placements is None:
        placements = default_placements(value.placements, src_labels, src_mesh.shape, dst_labels,
                                        dst_sizes)  # fmt: skip
    shape = tuple(value.shape)
    coords = src_mesh.get_coordinate()
    mine = box(shape, tuple(src_mesh.shape), value.placements, coords)
    # The replicas of this block (ranks that differ only along Replicate dimensions) take
    # turns: destination rank j gets it from replica j mod (their number).
    replicas, replica = 1, 0
    for dim, p in enumerate(value.placements):
        if isinstance(p, Replicate):
            replica = replica * src_mesh.shape[dim] + coords[dim]
            replicas *= src_mesh.shape[dim]
    local = value.to_local()
    messages = {}
    for j in range(_numel(dst_sizes)):
        pieces = []
        if j % replicas == replica:
            theirs = box(shape, dst_sizes, placements, _coords(j, dst_sizes))
            common = _intersect(mine, theirs)
            if common is not None:
                piece = local
                for d, (start, stop) in enumerate(common):
                    piece = piece.narrow(d, start - mine[d][0], stop - start)
                pieces.append((tuple(start for start, _ in common), piece.contiguous()))
        messages[j] = (placements, pieces)
    return messages


def default_placements(
    src: Sequence[Any],
    src_labels: tuple[str, ...],
    src_sizes: Sequence[int],
    dst_labels: tuple[str, ...],
    dst_sizes: tuple[int, ...],
) -> tuple[Any, ...]:
    """A destination dimension with the name and size of a source one keeps its placement
    (Shard or Replicate); any other is Replicate."""
    from torch.distributed.tensor import Replicate, Shard

    out = []
    for label, size in zip(dst_labels, dst_sizes, strict=True):
        p: Any = Replicate()
        if label in src_labels:
            i = src_labels.index(label)
            if src_sizes[i] == size and type(src[i]) is Shard:
                p = src[i]
        out.append(p)
    return tuple(out)


def box(
    shape: tuple[int, ...], sizes: Sequence[int], placements: Sequence[Any], coords: Sequence[int]
) -> tuple[tuple[int, int], ...]:
    """The block ``[start, stop)`` per tensor dimension that the rank at ``coords`` of a mesh of
    ``sizes`` holds of a tensor of ``shape`` placed so (Shard and Replicate only)."""
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    local, offset = _compute_local_shape_and_global_offset(
        shape, tuple(sizes), list(coords), list(placements)
    )
    return tuple((o, o + n) for o, n in zip(offset, local, strict=True))


def _intersect(
    a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]
) -> tuple[tuple[int, int], ...] | None:
    out = []
    for (a0, a1), (b0, b1) in zip(a, b, strict=True):
        lo, hi = max(a0, b0), min(a1, b1)
        if lo >= hi:
            return None
        out.append((lo, hi))
    return tuple(out)


def _numel(sizes: Sequence[int]) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


def _coords(index: int, sizes: Sequence[int]) -> list[int]:
    out = []
    for s in reversed(sizes):
        index, c = divmod(index, s)
        out.append(c)
    return out[::-1]


# -- receiving -----------------------------------------------------------------------------------


def run_recv(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    key, sender, count, view_id, shape, dtype, timeout = payload
    mailboxes = {port.address.mailbox for port in engine.peers[sender]}
    engine.span_close()  # waiting is not being busy
    try:
        messages = engine.inbox.take(key, count, mailboxes, timeout)
    finally:
        engine.span_open()
    messages.sort(key=lambda m: m[1])  # in the senders' order: a sum is the same every run
    failure = next((m[4] for m in messages if m[4] is not None), None)
    if failure is not None and all(m[2] is None and not m[3] for m in messages):
        # Nothing to assemble (the senders failed before they had a value): no stand-in here.
        raise Inherited([], _local_copy(engine, failure))
    if messages[0][2] is None:  # per-rank: one tensor from each sender, added up
        value = messages[0][3][0][1]
        for m in messages[1:]:
            value = value + m[3][0][1]
        value = value.to(engine.device)
    else:
        value = _assemble(engine, view_id, messages, tuple(shape), dtype)
    if failure is not None:
        raise Inherited([value], _local_copy(engine, failure))
    return [value]


def _assemble(
    engine: EngineState, view_id: int, messages: list[Any], shape: tuple[int, ...], dtype: Any
) -> Any:
    import torch

    from .dtensors import as_dtensor

    placements = messages[0][2]
    view = engine.view(view_id)
    mesh = view.mesh
    mine = box(shape, view.sizes, placements, [view.coords[d] for d in view.labels])
    block = [b - a for a, b in mine]
    pieces = [piece for m in messages for piece in m[3]]
    whole = pieces[0][1] if len(pieces) == 1 else None
    if (
        whole is not None
        and list(whole.shape) == block
        and whole.is_contiguous()
        and whole.device.type == engine.device
    ):
        # One piece is the whole block (a slice sent to the same placements, or one rank to
        # one rank): it is this rank's own (unpickled, or copied in this process), so no copy.
        local = whole if whole.dtype == dtype else whole.to(dtype)
    else:
        local = torch.empty(block, dtype=dtype, device=engine.device)
        filled = 0
        for offset, piece in pieces:
            target = local
            for d, start in enumerate(offset):
                target = target.narrow(d, start - mine[d][0], piece.shape[d])
            target.copy_(piece)
            filled += piece.numel()
        if filled != local.numel():
            raise RuntimeError(
                f"to_mesh assembled {filled} of the {local.numel()} elements of this rank's "
                "block (the sending ranks disagree on what they hold); this is a bug"
            )
    from ..wire.shapes import contiguous_strides

    size = torch.Size(shape)
    return as_dtensor(local, mesh, list(placements), size, contiguous_strides(size))


def _local_copy(engine: EngineState, failure: FailureInfo) -> FailureInfo:
    """The source rank's failure under a serial of this engine's (serials are per engine: the
    count of values holding a failure is kept by it). Counted as reported already: a fetch
    here raises it, but its values going unread here is not news; the source engine reports
    the failure once, if nothing read it there."""
    engine.serial += 1
    engine.surfaced.add(engine.serial)
    return replace(failure, serial=engine.serial)

"""``MeshTensor.to_mesh(mesh)``: a tensor moves to another tensor mesh (Monarch's name).

Two ops, recorded at once: a ``send`` on the source mesh's stream and a ``recv`` on the
destination's, which the ranks match by a key (the result's id). The data goes from rank to
rank (worker/transfer.py), never through the controller, so ``to_mesh`` returns at once, as any
recorded op does. The destination's ranks wait for the source's: the only order between two
streams is what moves between them, and a stream that sends what another waits for is sent
first when that one is (``Stream.upstream``).

What arrives:

- A global MeshTensor (from ``distribute``, a module's parameters and outputs) is the same
  global tensor on the destination, placed as ``sharding_spec``/``placements`` say there, or by
  default as on the source, dimension by dimension by name (a dimension the destination lacks,
  or one it has with another size, is Replicate). Partial sums are reduced on the source first.
- A per-rank MeshTensor (made under ``activate()``) moves as in Monarch: each mesh dimension of
  the source must be a dimension of the destination of the same size, and the rank at each
  coordinate gets the tensor of the source rank at the same coordinates; a destination
  dimension the source lacks gets copies (a broadcast).

Gradients flow back through it: the gradient moves to the source mesh the same way (for a
broadcast, the copies' gradients are added up).
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from .. import compat
from ..wire.ops import Ref, issue_site
from .mesh import TensorMesh, tensor_mesh
from .tensor import MeshTensor, new_mesh_tensor

# Seconds a destination rank waits for the source's ranks (the process group's own default).
RECV_TIMEOUT = 1800.0

# A per-rank move: for each source rank, its destination ranks; and how many messages each
# destination rank adds up.
Plan = tuple[tuple[tuple[int, ...], ...], int]


def to_mesh(
    t: MeshTensor, mesh: Any, sharding_spec: Any = None, *, placements: Any = None
) -> MeshTensor:
    """``t`` on ``mesh`` (see the module docs). Returns at once; the ranks of ``mesh`` wait
    for the ranks of ``t``'s mesh in their stream."""
    if not isinstance(t, MeshTensor):
        raise compat.MeshUsageError(
            f"to_mesh moves MeshTensors, got {type(t).__name__}; put a controller tensor on a "
            "mesh with actormesh.distribute(t, mesh, ...)"
        )
    dst = tensor_mesh(mesh)
    t.mesh.stream.check()
    if t.per_rank:
        if sharding_spec is not None or placements is not None:
            raise compat.MeshUsageError(
                "a per-rank MeshTensor (made under activate()) moves rank by rank; placements "
                "are for global ones (distribute, module_to_mesh)"
            )
        plan: Plan | None = per_rank_plan(t.mesh, dst)
        placed = None
    else:
        plan = None
        placed = None
        if sharding_spec is not None or placements is not None:
            placed = dst.placements(t.dim(), sharding_spec, placements)
            _check_target(placed)
    out: MeshTensor = _ToMesh.apply(t, dst, placed, plan)
    return out


def to_mesh_tree(tree: Any, mesh: Any, sharding_spec: Any = None, *, placements: Any = None) -> Any:
    """Every MeshTensor of ``tree`` (a tensor, or lists, tuples and dicts of them) on ``mesh``:
    ``t.to_mesh(mesh, ...)`` for each (Monarch's ``monarch.to_mesh``)."""
    from torch.utils._pytree import tree_map

    def one(x: Any) -> Any:
        if isinstance(x, MeshTensor):
            return to_mesh(x, mesh, sharding_spec, placements=placements)
        return x

    return tree_map(one, tree)


def _check_target(placed: tuple[Any, ...]) -> None:
    from torch.distributed.tensor import Replicate, Shard

    for p in placed:
        if type(p) is not Shard and not isinstance(p, Replicate):
            raise compat.MeshUsageError(
                f"to_mesh places the tensor with Shard and Replicate, got {p!r}; a Partial "
                "value on the destination would be a sum nobody asked for"
            )


def per_rank_plan(src: TensorMesh, dst: TensorMesh) -> Plan:
    """Monarch's rule: the source's dimensions are the destination's (same sizes); the
    destination's others are broadcast to."""
    for label, size in zip(src.labels, src.sizes, strict=True):
        if label not in dst.labels:
            raise compat.MeshUsageError(
                f"to_mesh of a per-rank tensor: the destination {dst!r} has no dimension "
                f"{label!r} of the source {src!r}; reduce over it first (t.reduce({label!r}, "
                "...)), or slice the source"
            )
        if dst.sizes[dst.labels.index(label)] != size:
            raise compat.MeshUsageError(
                f"to_mesh of a per-rank tensor: dimension {label!r} has {size} ranks on the "
                f"source {src!r} and {dst.sizes[dst.labels.index(label)]} on the destination "
                f"{dst!r}; rank i goes to rank i, so the sizes must agree"
            )
    targets: list[list[int]] = [[] for _ in range(_numel(src.sizes))]
    for j, coords in enumerate(itertools.product(*(range(s) for s in dst.sizes))):
        at = dict(zip(dst.labels, coords, strict=True))
        targets[src.index_of({k: at[k] for k in src.labels}, "to_mesh")].append(j)
    return tuple(tuple(ts) for ts in targets), 1


def _reverse(plan: Plan, dst_size: int) -> Plan:
    """The plan of a per-rank move's gradient: every destination rank back to its source rank,
    each source rank adding up the gradients of its copies."""
    back: list[tuple[int, ...]] = [()] * dst_size
    for i, ts in enumerate(plan[0]):
        for j in ts:
            back[j] = (i,)
    copies = {len(ts) for ts in plan[0]}
    return tuple(back), copies.pop() if len(copies) == 1 else 0


def _numel(sizes: tuple[int, ...]) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


def move(
    t: MeshTensor, dst: TensorMesh, placed: tuple[Any, ...] | None, plan: Plan | None
) -> MeshTensor:
    """Record the ``send`` on ``t``'s stream and the ``recv`` on ``dst``'s (no autograd)."""
    return Sent(t, dst, placed, plan).receive()


class Sent:
    """A move whose ``send`` is recorded on the source's stream and whose ``recv`` is recorded
    on the destination's by ``receive()``, maybe later: a pipeline sends an activation right
    after the stage that made it, and receives it right before the stage that needs it, so
    that neither stream waits in between for what it does not need yet. (A plain loop that
    calls ``to_mesh`` just before the next stage gets that order by itself.)"""

    def __init__(
        self, t: MeshTensor, dst: TensorMesh, placed: tuple[Any, ...] | None, plan: Plan | None
    ) -> None:
        src = t.mesh
        _link(src, dst)  # where the source's ranks send
        _link(dst, src)  # whose death the destination's ranks watch for while they wait
        self.src, self.dst = src, dst
        self.out: MeshTensor | None = new_mesh_tensor(dst, t.shape, t.dtype, per_rank=t.per_rank)
        self.key = self.out.value_id  # unique among what dst's engine receives
        targets = None if plan is None else plan[0]
        self.count = _numel(src.sizes) if plan is None else plan[1]
        send = (Ref(t.value_id), dst.base.key, self.key, placed, dst.labels, dst.sizes, targets)
        src.stream.record(("send", (), (t.value_id,), (), send, issue_site()))

    def receive(self) -> MeshTensor:
        """The moved tensor on the destination (its ``recv`` recorded now); once."""
        out, self.out = self.out, None
        if out is None:
            raise compat.MeshUsageError("this move was received already")
        src, dst = self.src, self.dst
        recv = (self.key, src.base.key, self.count, dst.view_id, tuple(out.shape), out.dtype,
                RECV_TIMEOUT)  # fmt: skip
        meta = ((tuple(out.shape), out.dtype, out.per_rank),)
        dst.stream.record(("recv", (out.value_id,), (), meta, recv, issue_site()))
        if dst.stream is not src.stream:
            dst.stream.wait_for(src.stream)
        return out


def send(t: MeshTensor, mesh: Any) -> Sent:
    """Record ``t``'s move to ``mesh`` (by default placements), to ``receive()`` later."""
    dst = tensor_mesh(mesh)
    plan = per_rank_plan(t.mesh, dst) if t.per_rank else None
    return Sent(t, dst, None, plan)


def _link(src: TensorMesh, dst: TensorMesh) -> None:
    """Tell ``src``'s ranks where ``dst``'s inboxes are, once per ordered pair of engines."""
    stream = src.stream
    if dst.base.key in stream.links:
        return
    with stream.lock:  # the first of two threads records it
        if dst.base.key in stream.links:
            return
        stream.links.add(dst.base.key)
    ports = dst.base.inbox_ports
    stream.record(("link", (), (), (), (dst.base.key, ports), issue_site()))


class _ToMesh(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, t: MeshTensor, dst: TensorMesh, placed: Any, plan: Plan | None
    ) -> MeshTensor:
        ctx.src, ctx.dst, ctx.plan = t.mesh, dst, plan
        return move(t, dst, placed, plan)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        src: TensorMesh = ctx.src
        if not isinstance(grad, MeshTensor):
            raise compat.MeshUsageError(
                "the gradient of a to_mesh result must be a MeshTensor on its mesh, got a "
                f"{type(grad).__name__}"
            )
        plan = None if ctx.plan is None else _reverse(ctx.plan, _numel(ctx.dst.sizes))
        if plan is not None and plan[1] == 0:
            raise compat.MeshUsageError(
                "the backward of this to_mesh would add up different numbers of copies on "
                "different ranks; this is a bug"
            )
        return move(grad, src, None, plan), None, None, None

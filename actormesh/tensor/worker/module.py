"""The worker side of ``module_to_mesh``: build, parallelise, run forward and backward.

A module is one value in the engine's ``env``, and each call is one op each way. Forward runs
the module on this rank's slice of the batch (split along the data dimension) and presents the
output as one global DTensor; the autograd graph stays here under an id the controller's
autograd context owns. Backward runs ``torch.autograd.backward`` from that output, synchronises
the gradients, hands them out under the ids the controller allocated and clears ``p.grad``, so
gradient accumulation stays the controller's business (as with local tensors).

Gradient synchronisation. The controller computes the loss on the *global* output, so each
rank's gradient is a partial sum of the true gradient over the data dimension: replicated
(and tensor-parallel) parameters are summed over the data-dimension group, in buckets of up to
``BUCKET_BYTES`` (one all_reduce per bucket, not one per parameter, and none in ``step()``).
FSDP reduce-scatters them itself; its divide factor is set to 1 for the same reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..wire.shapes import contiguous_strides
from .shard_ops import as_dtensor
from .stand_ins import StoodIn

if TYPE_CHECKING:
    from .engine import _TensorEngine

BUCKET_BYTES = 25 * 2**20


@dataclass
class ModuleState:
    module: Any
    params: list[Any]  # the module's parameters, in the controller's order
    data_dim: str | None
    fsdp: bool
    tp_dim: str | None
    graphs: dict[int, Any] = field(default_factory=dict)
    last_input: tuple[int, Any] = (0, None)  # (constant id, this rank's slice of it)


def _data_placements(engine: _TensorEngine, data_dim: str | None) -> list[Any]:
    from torch.distributed.tensor import Replicate, Shard

    return [Shard(0) if label == data_dim else Replicate() for label in engine.labels]


def _as_global(engine: _TensorEngine, t: Any) -> Any:
    """A parameter/buffer/gradient as the engine holds global values: DTensors stay, plain
    (replicated) tensors become Replicate DTensors sharing their storage."""
    from torch.distributed.tensor import DTensor, Replicate

    t = t.detach()
    if isinstance(t, DTensor):
        return t
    return as_dtensor(t, engine.mesh, [Replicate()] * engine.mesh.ndim)


def run_build(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    import torch

    source, is_factory, seed, data_dim, fsdp, tp_plan, tp_dim = payload
    if is_factory:
        # The same initial weights on every rank, without resetting the ranks' own generators
        # (per-rank factories under activate() must keep drawing differently).
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = source()
    else:
        module = source
    module = module.to(engine.device)
    if tp_plan:
        from torch.distributed.tensor.parallel import parallelize_module

        parallelize_module(module, engine.mesh[tp_dim], tp_plan)
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        fully_shard(module, mesh=engine.mesh[data_dim])
        module.set_gradient_divide_factor(1.0)  # see the module docs: grads are partial sums
    params = list(module.parameters())
    buffers = list(module.buffers())
    state = ModuleState(module, params, data_dim, fsdp, tp_dim)
    values = [_as_global(engine, p) for p in params] + [_as_global(engine, b) for b in buffers]
    return [*values, state]


def run_mode(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    ref, training = payload
    engine.resolve(ref).module.train(training)
    return []


def run_forward(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    import torch
    from torch.distributed.tensor import DTensor, Replicate, distribute_tensor

    ref, xref, global_shape, grad_enabled, input_grad = payload
    state: ModuleState = engine.resolve(ref)
    x = engine.resolve(xref)
    placements = _data_placements(engine, state.data_dim)
    if isinstance(x, DTensor):
        local = x.redistribute(x.device_mesh, placements).to_local()
    elif state.last_input[0] == xref.id:  # the same controller batch as the last call
        local = state.last_input[1]
    else:  # a controller tensor: every rank has the batch, each keeps its slice
        local = distribute_tensor(
            x.to(engine.device), engine.mesh, placements, src_data_rank=None
        ).to_local()
        state.last_input = (xref.id, local)  # ids are never reused: no stale hit
    local = local.detach()
    if input_grad:
        local.requires_grad_(True)
    before = _collectives(engine)
    failure = None
    with torch.set_grad_enabled(grad_enabled):
        try:
            y = state.module(local)
        except Exception as exc:
            if not _may_stand_in(engine, state, before):
                raise
            failure = exc
            y = _forward_on_zeros(state, local, exc)
        if isinstance(y, DTensor):  # e.g. a tensor-parallel plan that keeps DTensor outputs
            y = y.redistribute(y.device_mesh, [Replicate()] * y.device_mesh.ndim).to_local()
    # The output as a global DTensor split over the data dimension, wrapped without DTensor's
    # autograd (from_local costs 140 µs of Python): backward starts from the local ``y`` itself.
    shape = torch.Size(global_shape)
    result = as_dtensor(y.detach(), engine.mesh, placements, shape, contiguous_strides(shape))
    graph = (y, result, local if input_grad else None, tuple(x.shape)) if grad_enabled else None
    if failure is not None:
        raise StoodIn([result, graph], failure)
    return [result, graph]


# -- a forward that failed on some ranks -----------------------------------------------------------
#
# With FSDP or a tensor-parallel plan, forward and backward run collectives: a rank whose
# forward raised would leave the others blocked in them until the process group's timeout. So
# the failed rank stands in, as for plain ops: it runs the forward again on a batch of zeros,
# which takes part in the collectives the others run, and keeps that graph, so that its
# backward takes part in theirs too (the results stay poisoned). That is only right when the
# failure came before the forward's own collectives (input checks, bad values in the batch), or
# after FSDP's all-gather alone (the failed forward left the parameters unsharded, and a second
# forward does not gather them again). The process groups' sequence numbers say which: in any
# other case the re-run would pair different collectives across ranks, so the failure is left
# as it is (and the others wait for the group's timeout, a documented limit).


def _collectives(engine: _TensorEngine) -> dict[int, tuple[Any, int]]:
    """id(group) -> (group, collectives issued so far) for the mesh's process groups."""
    import torch.distributed as dist

    groups: list[Any] = [engine.mesh.get_group(d) for d in engine.labels]
    if engine.ranks is None:  # WORLD is this engine's (an engine on a slice has its own groups)
        groups.append(dist.group.WORLD)
    return {id(g): (g, g._get_sequence_number_for_group()) for g in groups}  # noqa: SLF001


def _may_stand_in(engine: _TensorEngine, state: ModuleState, before: dict[int, Any]) -> bool:
    fsdp_group = engine.mesh.get_group(state.data_dim) if state.fsdp else None
    for key, (group, count) in _collectives(engine).items():
        if count != before[key][1] and group is not fsdp_group:
            return False
    return True


def _forward_on_zeros(state: ModuleState, local: Any, cause: BaseException) -> Any:
    """The module's output for a batch of zeros, its buffers (running statistics) untouched."""
    import torch

    saved = [b.detach().clone() for b in state.module.buffers()]
    zeros = torch.zeros_like(local).requires_grad_(local.requires_grad)
    try:
        y = state.module(zeros)
    except Exception:
        raise cause from None  # no stand-in: report the original failure
    finally:
        with torch.no_grad():
            for b, old in zip(state.module.buffers(), saved, strict=True):
                b.copy_(old)
    return y


def run_backward(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    import torch
    from torch.distributed.tensor import DTensor

    ref, graph_ref, grad_ref, wanted, input_grad = payload
    state: ModuleState = engine.resolve(ref)
    graph = engine.value(graph_ref.id)
    if graph is None and graph_ref.id in engine.poison and not state.fsdp and not input_grad:
        # The forward failed on this rank only: take part in the gradient sum with zeros, so
        # that the other ranks' all_reduce completes (the results here stay poisoned).
        for p in state.params:
            p.grad = torch.zeros_like(p) if p.requires_grad else None
        if state.data_dim is not None:
            _sum_over_data(engine, state)
        return _hand_out(engine, state, wanted)
    if graph is None:
        raise RuntimeError(
            "backward through this module call a second time (or after forward ran under "
            "no_grad): the graph on the workers is freed after the first backward"
        )
    y, result, local, input_shape = graph
    engine.env[graph_ref.id] = None  # the graph is freed by its first backward
    grad = engine.resolve(grad_ref)
    spec = result._spec  # noqa: SLF001  (the output's mesh and placements)
    if not isinstance(grad, DTensor):  # a controller tensor: the whole gradient
        from torch.distributed.tensor import distribute_tensor

        grad = distribute_tensor(grad.to(engine.device), spec.mesh, spec.placements,
                                 src_data_rank=None)  # fmt: skip
    elif grad._spec.placements != spec.placements:  # noqa: SLF001
        grad = grad.redistribute(spec.mesh, spec.placements)
    with torch.enable_grad():
        torch.autograd.backward([y], [grad._local_tensor])  # noqa: SLF001
    if not state.fsdp and state.data_dim is not None:
        _sum_over_data(engine, state)
    grads = _hand_out(engine, state, wanted)
    if input_grad:
        g = local.grad if local.grad is not None else torch.zeros_like(local)
        placements = _data_placements(engine, state.data_dim)
        shape = torch.Size(input_shape)
        grads.append(as_dtensor(g, engine.mesh, placements, shape, contiguous_strides(shape)))
    return grads


def _hand_out(engine: _TensorEngine, state: ModuleState, wanted: Sequence[bool]) -> list[Any]:
    """The wanted parameters' gradients as engine values; ``p.grad`` is cleared (accumulation
    is the controller's business)."""
    import torch

    grads = []
    for p, want in zip(state.params, wanted, strict=True):
        if want:
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            grads.append(_as_global(engine, g))
        p.grad = None
    return grads


def _sum_over_data(engine: _TensorEngine, state: ModuleState) -> None:
    """Sum the local gradients over the data dimension, in buckets (one all_reduce each)."""
    from torch.distributed.tensor import DTensor, Partial

    group = engine.mesh.get_group(state.data_dim)
    bucket: list[Any] = []
    size = 0
    for p in state.params:
        g = p.grad
        if g is None:
            continue
        if isinstance(g, DTensor):
            if any(isinstance(pl, Partial) for pl in g.placements):
                g = p.grad = g.redistribute(g.device_mesh, p.placements)
            g = g.to_local()
        if bucket and (g.dtype != bucket[0].dtype or size + g.nbytes > BUCKET_BYTES):
            _all_reduce(bucket, group)
            bucket, size = [], 0
        bucket.append(g)
        size += g.nbytes
    if bucket:
        _all_reduce(bucket, group)


def _all_reduce(tensors: list[Any], group: Any) -> None:
    import torch
    import torch.distributed as dist

    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n

"""The worker side of ``module_to_mesh``: build the module, place its tensors, and the ops
that keep placements what the options chose (``grad_sync``, ``relayout``).

The module's forward runs on the controller (``controller/module.py``), so here a module is
only where its parameters come from: each rank builds it (the instance as sent, or the factory
under one seed), places each parameter over the whole mesh (``tp_plan``: as torch's
``parallelize_module`` places it over the tp dimension; ``fsdp``: also split along dim 0 over
the data dimension; otherwise replicated) and hands out every distinct parameter and buffer
as a DTensor under the ids the controller allocated, tied ones once.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .dtensors import as_dtensor, spec_of, wrap

if TYPE_CHECKING:
    from .state import EngineState

BUCKET_BYTES = 25 * 2**20


def run_build(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    import torch

    source, is_factory, seed, names, data_dim, fsdp, tp_plan, tp_dim = payload
    if is_factory:
        # The same initial weights on every rank, without resetting the ranks' own generators
        # (per-rank factories under activate() must keep drawing differently).
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = source()
    else:
        module = source
    module = module.to(engine.device)
    params = _distinct(module.named_parameters(remove_duplicate=False))
    buffers = _distinct(module.named_buffers(remove_duplicate=False))
    _check_names(names, params, buffers)
    if tp_plan:
        from torch.distributed.tensor.parallel import parallelize_module

        parallelize_module(module, engine.mesh[tp_dim], tp_plan)
    values = []
    report = {}
    for name, _ in params:
        # After parallelize_module a planned parameter is a DTensor over the tp dimension (and
        # a tied one may be so only under one of its names: the first name decides).
        v = _over_mesh(engine, module.get_parameter(name).detach(), tp_dim)
        if fsdp and v.dim() > 0:
            v = _split_over(engine, v, data_dim)
        values.append(v)
        report[name] = str(tuple(v.placements))
    for name, _ in buffers:
        v = _over_mesh(engine, module.get_buffer(name).detach(), tp_dim)
        values.append(v)
        report[name] = str(tuple(v.placements))
    # Everything alive now (the libraries the module's unpickling imported: torch, transformers,
    # its classes) stays: exempt from the collector, whose full collection every few steps
    # walked it all (GPT-2's step: 120 ms every 10 steps, a quarter of a rank's CPU).
    gc.freeze()
    return [*values, report]


def _distinct(named: Any) -> list[tuple[str, Any]]:
    seen: set[int] = set()
    out = []
    for name, t in named:
        if t is not None and id(t) not in seen:
            seen.add(id(t))
            out.append((name, t))
    return out


def _check_names(names: Any, params: Any, buffers: Any) -> None:
    """The ranks' module must have the controller's parameters and buffers, in its order."""
    for kind, expected, got in (("parameters", names[0], params), ("buffers", names[1], buffers)):
        mine = [n for n, _ in got]
        if mine != list(expected):
            missing = [n for n in expected if n not in mine][:5]
            extra = [n for n in mine if n not in expected][:5]
            raise RuntimeError(
                f"the module built on this rank has other {kind} than the controller's copy "
                f"(missing here: {missing}, only here: {extra}, or another order); a factory "
                "must build the same module on the meta device as on the ranks"
            )


def _over_mesh(engine: EngineState, t: Any, tp_dim: str | None) -> Any:
    """``t`` as a DTensor over the whole mesh: a DTensor over the tp dimension keeps its
    placement there (replicated over the others); a plain tensor is replicated. No
    communication: each rank already holds its block."""
    from torch.distributed.tensor import DTensor, Replicate

    placements: list[Any] = [Replicate()] * engine.mesh.ndim
    if isinstance(t, DTensor):
        if t.device_mesh is engine.mesh:
            return t
        placements[engine.labels.index(tp_dim)] = t.placements[0]
        local = t.to_local()
        return as_dtensor(local, engine.mesh, placements, t.shape, t.stride())
    return as_dtensor(t, engine.mesh, placements)


def _split_over(engine: EngineState, v: Any, dim: str) -> Any:
    """``v`` also split along its dim 0 over mesh dimension ``dim`` (a local slice)."""
    from torch.distributed.tensor import Shard

    placements = list(v.placements)
    placements[engine.labels.index(dim)] = Shard(0)
    return v.redistribute(engine.mesh, placements)


def run_relayout(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    ref, axis, placement = payload
    v = engine.resolve(ref)
    placements = list(v.placements)
    if placements[axis] == placement:
        return [v]
    placements[axis] = placement
    return [v.redistribute(v.device_mesh, placements)]


def run_grad_sync(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    """Each gradient moved to its parameter's placements, in place (the same ids).

    A gradient that is a partial sum where its parameter is replicated (the usual case: the
    batch was split over the data dimension) is summed with the others over the same mesh
    dimensions in buckets of up to ``BUCKET_BYTES`` (one all_reduce per bucket, not one per
    parameter); any other difference is DTensor's redistribute (a reduce-scatter for a
    parameter split over the data dimension). The global values do not change. What to do
    with each gradient is worked out once per specs of the gradients and parameters (a
    training loop meets the same ones every step: ``_SyncPlan``)."""
    (pairs,) = payload
    grads = [engine.resolve(g) for g, _ in pairs]
    targets = [engine.resolve(p) for _, p in pairs]
    plan = _SyncPlan.of(grads, targets)
    result = list(grads)
    for k in plan.redistributed:
        result[k] = grads[k].redistribute(grads[k].device_mesh, targets[k].placements)
    for groups, members, specs, layouts in plan.buckets:
        # (the local tensors themselves: the engine runs under no_grad, where to_local
        # returns this same tensor after a grad-mode check, 0.2 µs; 7 µs only with grad on)
        locals_ = [grads[k]._local_tensor for k in members]  # noqa: SLF001
        summed = _all_reduce(locals_, [engine.mesh.get_group(d) for d in groups], layouts)
        for k, local, spec in zip(members, summed, specs, strict=True):
            result[k] = wrap(local, spec)
    return result


class _SyncPlan:
    """What ``grad_sync`` does with each gradient, for gradients and parameters of these specs:
    which DTensor redistributes, and the buckets summed over which mesh dimensions, with each
    summed gradient's spec (its parameter's placements, its own shape and strides) and its
    local tensor's ``_layout``."""

    __slots__ = ("buckets", "redistributed", "specs")
    _known: dict[tuple[int, ...], _SyncPlan] = {}

    def __init__(self, grads: Sequence[Any], targets: Sequence[Any], specs: tuple[Any, ...]):
        self.specs = specs  # held: no other spec takes their ids while this plan is kept
        self.redistributed: list[int] = []
        self.buckets: list[tuple[tuple[int, ...], list[int], list[Any], list[Any]]] = []
        by_dims: dict[tuple[int, ...], list[int]] = {}
        for k, (g, p) in enumerate(zip(grads, targets, strict=True)):
            if tuple(g.placements) == tuple(p.placements):
                continue
            dims = _summed_dims(g.placements, p.placements)
            if dims is None:
                self.redistributed.append(k)
            else:
                by_dims.setdefault(dims, []).append(k)
        for dims, members in by_dims.items():
            for bucket in _bucketed(grads, members):
                specs_ = [
                    spec_of(grads[k].device_mesh, targets[k].placements, grads[k].shape,
                            grads[k].stride(), grads[k].dtype)
                    for k in bucket
                ]  # fmt: skip
                layouts = [_layout(grads[k]._local_tensor) for k in bucket]  # noqa: SLF001
                self.buckets.append((dims, bucket, specs_, layouts))

    @classmethod
    def of(cls, grads: Sequence[Any], targets: Sequence[Any]) -> _SyncPlan:
        specs = tuple([x._spec for x in grads] + [x._spec for x in targets])  # noqa: SLF001
        key = tuple(map(id, specs))
        plan = cls._known.get(key)
        if plan is None or any(a is not b for a, b in zip(plan.specs, specs, strict=True)):
            if len(cls._known) > 64:
                cls._known.clear()
            plan = cls._known[key] = cls(grads, targets, specs)
        return plan


def _summed_dims(have: Sequence[Any], want: Sequence[Any]) -> tuple[int, ...] | None:
    """The mesh dimensions where ``have`` is a partial sum and ``want`` replicated, if that is
    the only difference; else None."""
    dims = []
    for i, (h, w) in enumerate(zip(have, want, strict=True)):
        if h == w:
            continue
        if h.is_partial() and getattr(h, "reduce_op", None) == "sum" and w.is_replicate():
            dims.append(i)
            continue
        return None
    return tuple(dims)


def _bucketed(grads: Sequence[Any], members: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    size = 0
    for k in members:
        local = grads[k]._local_tensor  # noqa: SLF001
        if out and (local.dtype == grads[out[-1][0]].dtype) and size + local.nbytes <= BUCKET_BYTES:
            out[-1].append(k)
            size += local.nbytes
        else:
            out.append([k])
            size = local.nbytes
    return out


def _all_reduce(
    tensors: list[Any], groups: list[Any], layouts: list[tuple[int, bool]] | None = None
) -> list[Any]:
    """The sums of ``tensors`` over ``groups``, as new tensors laid out as they are: views of
    one summed buffer, no copy each. A tensor whose elements fill a run of its storage (a
    dense gradient, or a transposed one) goes into the buffer as that run, and comes out as
    the same strides over its part of the buffer; any other is copied in and out.
    ``layouts``: each tensor's ``_layout`` (a gradient sync's plan keeps them)."""
    import torch
    import torch.distributed as dist

    if layouts is None:
        layouts = [_layout(t) for t in tensors]
    flat = torch.cat(
        [
            t.as_strided((n,), (1,), t.storage_offset()) if run else t.reshape(-1)
            for t, (n, run) in zip(tensors, layouts, strict=True)
        ]
    )
    for group in groups:
        dist.all_reduce(flat, group=group)
    out = []
    offset = 0
    for t, (n, run) in zip(tensors, layouts, strict=True):
        if run:
            out.append(flat.as_strided(t.shape, t.stride(), offset))
        else:  # (the gradient's own layout, as its spec says)
            out.append(torch.empty_like(t).copy_(flat[offset : offset + n].view(t.shape)))
        offset += n
    return out


def _layout(t: Any) -> tuple[int, bool]:
    """``t``'s element count, and whether its elements fill a run of its storage from its
    offset, each once (strides that are a permutation of a contiguous tensor's)."""
    n = t.numel()
    expected = 1
    for size, stride in sorted(zip(t.shape, t.stride(), strict=True), key=lambda d: d[1]):
        if size == 1:
            continue
        if stride != expected:
            return n, False
        expected *= size
    return n, True

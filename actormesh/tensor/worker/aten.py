"""The worker's handlers for the tensor ops (see engine.py for how they are run).

Each handler gets the engine, the op's payload and its output ids, and returns one value per
output id. They run under ``torch.no_grad()``: autograd lives on the controller.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..wire.ops import IN
from .registry import handler
from .shard_ops import TAKES_CONSTANTS, as_dtensor, on_shards

if TYPE_CHECKING:
    from .engine import _TensorEngine

logger = logging.getLogger(__name__)

_ops: dict[str, Any] = {}
_decompose: set[Any] = set()  # ops DTensor has no sharding rule for: run their decomposition

# Ops whose DTensor sharding rule gives wrong values (torch 2.13, gloo, CPU; measured on a
# {dp: 2, tp: 2} mesh, input [Shard(0), Replicate()], target replicated): mse_loss was off by
# 0.29, smooth_l1/huber by 0.08, mse_loss_backward by up to 1.27; [Shard(0), Shard(1)] and
# replicated inputs were right. Their decompositions (elementwise ops and a mean) are exact.
_DECOMPOSE_FIRST = {"aten.mse_loss.default", "aten.mse_loss_backward.default",
                    "aten.smooth_l1_loss.default", "aten.smooth_l1_loss_backward.default",
                    "aten.huber_loss.default", "aten.huber_loss_backward.default"}  # fmt: skip

# Random ops on a CPU DTensor: DTensor's RNG needs CUDA, so every rank draws the *global*
# tensor from the op's one seed and keeps its slice (the same values for every placement).
_RANDOM = {"aten.rand_like.default", "aten.randn_like.default", "aten.uniform_.default",
           "aten.normal_.default", "aten.bernoulli_.float"}  # fmt: skip


# In-place ops that change only a tensor's shape or strides: DTensor has no sharding rule for
# them (torch 2.13), so on a DTensor the engine runs the view they stand for, under the same id.
_IN_PLACE_VIEWS = {
    "aten.unsqueeze_.default": "aten.unsqueeze.default",
    "aten.squeeze_.default": "aten.squeeze.default",
    "aten.squeeze_.dim": "aten.squeeze.dim",
    "aten.squeeze_.dims": "aten.squeeze.dims",
    "aten.t_.default": "aten.t.default",
    "aten.transpose_.default": "aten.transpose.int",
    "aten.swapdims_.default": "aten.swapdims.default",
    "aten.swapaxes_.default": "aten.swapaxes.default",
    "aten.as_strided_.default": "aten.as_strided.default",
}


def resolve_op(name: str) -> Any:
    op = _ops.get(name)
    if op is None:
        import torch

        _, packet, overload = name.split(".")
        op = _ops[name] = getattr(getattr(torch.ops.aten, packet), overload)
    return op


def tensor_leaves(result: Any) -> list[Any]:
    """The tensors in an op's result, in pytree order (the controller numbers them the same)."""
    import torch
    from torch.utils._pytree import tree_leaves

    if issubclass(type(result), torch._C.TensorBase):  # noqa: SLF001  (see _pointwise_on_shards)
        return [result]
    return [x for x in tree_leaves(result) if isinstance(x, torch.Tensor)]


def _flat(args: Any, kwargs: dict[str, Any]) -> Iterator[Any]:
    """The arguments of an aten op, one list level deep (Tensor[] arguments): no pytree calls,
    which cost more than many ops themselves."""
    for x in (*args, *kwargs.values()):
        if type(x) is list or type(x) is tuple:
            yield from x
        else:
            yield x


def lift_constants(engine: _TensorEngine, args: Any, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """Controller tensors in an op with DTensors become Replicate DTensors (DTensor rejects
    mixed Tensor/DTensor arguments); on the DTensor arguments' mesh."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate

    mesh = None
    plain = False
    for x in _flat(args, kwargs):
        if isinstance(x, DTensor):
            mesh = mesh or x.device_mesh
        elif isinstance(x, torch.Tensor):
            plain = True
    if mesh is None or not plain:
        return args, kwargs
    device = engine.device
    placements = [Replicate()] * mesh.ndim

    def lift(x: Any) -> Any:
        if type(x) is list or type(x) is tuple:
            return type(x)(lift(e) for e in x)
        if isinstance(x, torch.Tensor) and not isinstance(x, DTensor):
            return as_dtensor(x.to(device), mesh, placements)
        return x

    return tuple(lift(a) for a in args), {k: lift(v) for k, v in kwargs.items()}


@handler("aten")
def run_aten(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    name, args, kwargs, seed = payload[:4]
    func = resolve_op(name)
    if len(payload) > 4:  # from the controller's fast path: inputs as IN, in the order of ins
        # (and no controller tensors: nothing to lift)
        try:
            env = engine.env
            values = iter([env[i] for i in payload[4]])
        except KeyError:
            values = map(engine.value, payload[4])  # raises, saying which value is gone
        args = tuple([next(values) if a is IN else a for a in args])
        if kwargs:
            kwargs = {k: next(values) if v is IN else v for k, v in kwargs.items()}
    else:
        args, kwargs = engine.resolve(args), engine.resolve(kwargs)
        if name in TAKES_CONSTANTS:
            # A loss's target from the controller: the shard path takes its block as it is
            # (wrapping it as a Replicate DTensor only to slice it again cost ~15 µs a step).
            local = on_shards(name, func, args, kwargs)
            if local is not None:
                return [local]
        args, kwargs = lift_constants(engine, args, kwargs)
    if seed is not None and name in _RANDOM and engine.device == "cpu":
        return [seeded_random(name, args, kwargs, seed)]
    view = _IN_PLACE_VIEWS.get(name)
    if view is not None:
        from torch.distributed.tensor import DTensor

        if isinstance(args[0], DTensor):
            # The op keeps its id (an alias output): the id now names the view.
            func = resolve_op(view)
    local = on_shards(name, func, args, kwargs)
    if local is not None:
        return [local]
    if func in _decompose or name in _DECOMPOSE_FIRST:
        return tensor_leaves(_decomposed(func, args, kwargs))
    try:
        return tensor_leaves(func(*args, **kwargs))
    except NotImplementedError as exc:
        if "sharding strateg" not in str(exc):
            raise
        _decompose.add(func)
        return tensor_leaves(_decomposed(func, args, kwargs))


def _decomposed(func: Any, args: Any, kwargs: Any) -> Any:
    from torch._decomp import decomposition_table

    decomp = decomposition_table.get(func)
    if decomp is None:
        raise NotImplementedError(
            f"{func} has no DTensor sharding rule and no decomposition; call it inside a "
            "@actormesh.remote function on the local shards instead"
        )
    return decomp(*args, **kwargs)


def seeded_random(name: str, args: Any, kwargs: dict[str, Any], seed: int) -> Any:
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    target = args[0]
    if not isinstance(target, DTensor):
        return resolve_op(name)(*args, **kwargs)
    gen = torch.Generator().manual_seed(seed)
    shape, dtype = tuple(target.shape), kwargs.get("dtype") or target.dtype
    if name == "aten.rand_like.default":
        full = torch.rand(shape, generator=gen, dtype=dtype)
    elif name == "aten.randn_like.default":
        full = torch.randn(shape, generator=gen, dtype=dtype)
    elif name == "aten.uniform_.default":
        full = torch.empty(shape, dtype=dtype).uniform_(*args[1:], generator=gen)
    elif name == "aten.normal_.default":
        full = torch.empty(shape, dtype=dtype).normal_(*args[1:], generator=gen)
    else:
        full = torch.empty(shape, dtype=dtype).bernoulli_(*args[1:], generator=gen)
    mine = distribute_tensor(
        full, target.device_mesh, _plain(target.placements), src_data_rank=None
    )
    if name.endswith("_.default") or name.endswith("_.float"):
        target.to_local().copy_(mine.to_local())
        return target
    return mine


def _plain(placements: Sequence[Any]) -> list[Any]:
    from torch.distributed.tensor import Replicate, Shard

    return [p if type(p) is Shard else Replicate() for p in placements]


@handler("distribute")
def run_distribute(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    from torch.distributed.tensor import distribute_tensor

    tensor, placements = payload
    # src_data_rank=None: every rank already has the whole tensor; each keeps its slice.
    return [
        distribute_tensor(tensor.to(engine.device), engine.mesh, placements, src_data_rank=None)
    ]


@handler("distribute_staged")
def run_distribute_staged(
    engine: _TensorEngine, payload: Any, out: tuple[int, ...]
) -> Sequence[Any]:
    import torch
    from torch.distributed.tensor import DTensor

    staged_id, placements, shape = payload
    # The block came on its own, sent to this rank alone (engine.stage): no communication.
    block = engine.staged.pop(staged_id).to(engine.device)
    stride = torch.empty(shape, device="meta").stride()
    return [
        DTensor.from_local(
            block, engine.mesh, placements, run_check=False, shape=torch.Size(shape),
            stride=stride,
        )
    ]  # fmt: skip


@handler("constant")
def run_constant(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    # A controller tensor that ops read by id (Stream.constant): kept plain, and lifted to a
    # Replicate DTensor where an op mixes it with DTensors (lift_constants).
    return [payload.to(engine.device)]


@handler("random")
def run_random(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    import torch
    from torch.distributed.tensor import distribute_tensor

    fn, shape, dtype, seed, placements = payload
    if engine.device == "cuda":
        return [_dtensor_random(engine, fn, shape, dtype, seed, placements)]
    # DTensor's RNG needs a GPU: on CPU every rank draws the whole tensor and keeps its part.
    gen = torch.Generator().manual_seed(seed)
    full = getattr(torch, fn)(*shape, generator=gen, dtype=dtype)
    return [distribute_tensor(full.to(engine.device), engine.mesh, placements, src_data_rank=None)]


def _dtensor_random(
    engine: _TensorEngine, fn: str, shape: Any, dtype: Any, seed: int, placements: Any
) -> Any:
    """DTensor's own factory: each rank draws only its shard, at its offset in one stream, so
    the global tensor is the same for every placement. The rank's generators are restored
    afterwards (per-rank factories under activate() keep drawing differently per rank)."""
    import torch
    from torch.distributed import tensor as dtensor

    with torch.random.fork_rng(devices=[torch.cuda.current_device()]):
        torch.manual_seed(seed)
        return getattr(dtensor, fn)(
            *shape, device_mesh=engine.mesh, placements=placements, dtype=dtype
        )


@handler("redistribute")
def run_redistribute(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    ref, placements = payload
    v = engine.resolve(ref)
    return [v.redistribute(engine.mesh, placements)]


@handler("placements")
def run_placements(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    return [tuple(engine.resolve(payload).placements)]


# -- per-rank tensors (ProcMesh.activate) --------------------------------------------------------


@handler("factory")
def run_factory(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    import torch

    name, args, kwargs = payload
    kwargs = dict(kwargs, device=engine.device)
    return tensor_leaves(getattr(torch, name)(*engine.resolve(args), **engine.resolve(kwargs)))


@handler("rank")
def run_rank(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    import torch

    dims = payload
    value = 0
    for d in dims:  # row-major position within the named dimensions
        value = value * engine.sizes[engine.labels.index(d)] + engine.coords[d]
    return [torch.tensor(value, dtype=torch.int64, device=engine.device)]


@handler("reduce")
def run_reduce(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    import torch
    import torch.distributed as dist

    ref, dims, reduction, scatter = payload
    local = engine.resolve(ref)
    groups = [engine.mesh.get_group(d) for d in dims]
    if reduction == "stack":
        result = local.unsqueeze(0)
        for d, group in reversed(list(zip(dims, groups, strict=True))):
            n = engine.sizes[engine.labels.index(d)]
            parts = [torch.empty_like(result) for _ in range(n)]
            dist.all_gather(parts, result.contiguous(), group=group)
            result = torch.cat(parts, 0) if result is not local else torch.stack(parts)
        total = 1
        for d in dims:
            total *= engine.sizes[engine.labels.index(d)]
        result = result.reshape(total, *local.shape)
    else:
        op = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
              "min": dist.ReduceOp.MIN, "product": dist.ReduceOp.PRODUCT}[reduction]  # fmt: skip
        result = local.clone()
        for group in groups:
            dist.all_reduce(result, op=op, group=group)
        if reduction == "avg":
            n = 1
            for d in dims:
                n *= engine.sizes[engine.labels.index(d)]
            result = result / n
    if scatter:
        # Rank i (row-major within ``dims``) keeps chunk i of dim 0.
        index = 0
        for d in dims:
            index = index * engine.sizes[engine.labels.index(d)] + engine.coords[d]
        n = 1
        for d in dims:
            n *= engine.sizes[engine.labels.index(d)]
        result = result.chunk(n, 0)[index].clone()
    return [result]


# -- remote functions -----------------------------------------------------------------------------


@handler("define")
def run_define(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    fn_id, fn = payload
    engine.fns[fn_id] = fn
    return []


@handler("remote_call")
def run_call(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    import torch

    fn_id, name, args, kwargs, structured = payload
    with torch.enable_grad():  # user code: torch's default grad mode, as in a local call
        result = engine.fns[fn_id](*engine.resolve(args), **engine.resolve(kwargs))
    if not structured:  # "inspect": the whole result is one opaque value
        return [result]
    values = tensor_leaves(result)
    op = engine.current
    if op is not None:
        _check_as_described(name, values, op[3])  # the op's (shape, dtype, per_rank) per result
    return values


def _check_as_described(name: str, values: Sequence[Any], meta: Sequence[Any]) -> None:
    """A result must be what the controller recorded for it (``propagate``'s answer, or the
    first rank's cached one): a per-rank tensor as it is, a DTensor by its global shape. Later
    ops are shaped on the controller from that, so a result that differs would mislead every
    op after it without a word."""
    from torch.distributed.tensor import DTensor

    for k, (value, described) in enumerate(zip(values, meta, strict=False)):
        if described is None:
            continue
        if not described[2] and not isinstance(value, DTensor):
            continue  # a global result kept as this rank's part: its whole shape is not here
        shape, dtype = tuple(described[0]), described[1]
        if tuple(value.shape) != shape or value.dtype != dtype:
            raise RuntimeError(
                f"remote function {name} returned a {tuple(value.shape)} {value.dtype} tensor "
                f"as its result {k} on this rank, where the controller was told {shape} "
                f"{dtype}; make its propagate return what the function returns (or leave "
                "propagate out: the function then runs once to learn its results' shapes)"
            )


@handler("unpack")
def run_unpack(engine: _TensorEngine, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    return tensor_leaves(engine.resolve(payload))

"""The ranks' side of ``recording.py``: an ``aten`` op run on DTensors (and ``constant``, the
controller tensors those ops read).

Each handler of the stream (here and in ``distribute``, ``activate``, ``remote``, ``module``,
``rref``; ``handlers.py`` says which runs which kind) gets the engine, the op's payload and its
output ids, and returns one value per output id. They run under ``torch.no_grad()``: autograd
lives on the controller.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..wire.ops import IN
from .dtensors import as_dtensor, dtensor_class, replicated_on, torch_classes
from .shard_ops import TAKES_CONSTANTS, on_shards

if TYPE_CHECKING:
    from .state import EngineState

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


# Ops DTensor has no rule for (torch 2.13, CPU) whose decomposition, run on DTensors, takes
# minutes (it goes through torch's reference implementations): refused at once instead, saying
# what works. (shard_ops.py runs them on each rank's blocks where that is exact.)
_ATTENTION = (
    "attention on the CPU (scaled_dot_product_attention) runs on DTensors without dropout and "
    "with a mask that is replicated or split as the batch and heads are; set the attention's "
    "dropout to 0 (its random numbers cannot be the same as in one process), or use an "
    "attention written with matmul and softmax (Hugging Face: attn_implementation='eager')"
)
_REFUSED = {
    "aten._scaled_dot_product_flash_attention_for_cpu.default": _ATTENTION,
    "aten._scaled_dot_product_flash_attention_for_cpu_backward.default": _ATTENTION,
}

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

        namespace, packet, overload = name.split(".")
        if namespace == "actormesh":
            from ..wire import optim_ops  # noqa: F401  (defines the op)
        op = _ops[name] = getattr(getattr(getattr(torch.ops, namespace), packet), overload)
    return op


def tensor_leaves(result: Any) -> list[Any]:
    """The tensors in an op's result, in pytree order (the controller numbers them the same)."""
    base = torch_classes().tensor_base
    t = type(result)
    if issubclass(t, base):
        return [result]
    if t is list or t is tuple:  # a _foreach_ op's tensors (none for an in-place one)
        flat = [x for x in result if issubclass(type(x), base)]
        if len(flat) == len(result):
            return flat
    import torch
    from torch.utils._pytree import tree_leaves

    return [x for x in tree_leaves(result) if isinstance(x, torch.Tensor)]


def _flat(args: Any, kwargs: dict[str, Any]) -> Iterator[Any]:
    """The arguments of an aten op, one list level deep (Tensor[] arguments): no pytree calls,
    which cost more than many ops themselves."""
    for x in (*args, *kwargs.values()):
        if type(x) is list or type(x) is tuple:
            yield from x
        else:
            yield x


def lift_constants(engine: EngineState, args: Any, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """Controller tensors in an op with DTensors become Replicate DTensors (DTensor rejects
    mixed Tensor/DTensor arguments); on the DTensor arguments' mesh."""
    import torch
    from torch.distributed.tensor import DTensor

    mesh = None
    plain = False
    for x in _flat(args, kwargs):
        if isinstance(x, DTensor):
            mesh = mesh or x.device_mesh
        elif isinstance(x, torch.Tensor):
            plain = True
    if mesh is None or not plain:
        return args, kwargs

    def lift(x: Any) -> Any:
        if type(x) is list or type(x) is tuple:
            return type(x)(lift(e) for e in x)
        if isinstance(x, torch.Tensor) and not isinstance(x, DTensor):
            return _lifted_one(engine, x, mesh)
        return x

    return tuple(lift(a) for a in args), {k: lift(v) for k, v in kwargs.items()}


def lift_inputs(engine: EngineState, inputs: list[Any]) -> list[Any]:
    """``inputs`` with each controller tensor as a Replicate DTensor on the mesh of the DTensor
    among them (``lift_constants`` for a program's step, whose inputs are in order)."""
    dtensor = dtensor_class()
    mesh = next((x.device_mesh for x in inputs if type(x) is dtensor), None)
    if mesh is None:
        return inputs
    base = torch_classes().tensor_base
    return [
        x if type(x) is dtensor or not isinstance(x, base) else _lifted_one(engine, x, mesh)
        for x in inputs
    ]


# id(controller tensor) -> (it, its Replicate DTensor), for small ones: a program's step lifts
# the same pooled constants every run (a mask's fill values, the positions; controller/
# constants.py pools those of at most POOL_BYTES). The entry keeps the tensor alive, so a
# large one (a batch) is not kept.
_lifted: dict[int, tuple[Any, Any]] = {}
_LIFTED_BYTES = 1024


def _lifted_one(engine: EngineState, x: Any, mesh: Any) -> Any:
    """Controller tensor ``x`` as a Replicate DTensor on ``mesh``, on the engine's device."""
    found = _lifted.get(id(x))
    if found is not None and found[0] is x and found[1].device_mesh is mesh:
        return found[1]
    moved = x.to(engine.device)
    lifted = as_dtensor(moved, mesh, replicated_on(mesh.ndim))
    if moved is x and x.numel() * x.element_size() <= _LIFTED_BYTES:
        # (not a copy on another device: that one would not see in-place changes)
        if len(_lifted) > 4096:
            _lifted.clear()
        _lifted[id(x)] = (x, lifted)
    return lifted


def run_aten(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    name, args, kwargs, seed, inputs = payload  # one shape for both paths (wire/kinds.py)
    func = resolve_op(name)
    if inputs is not None:  # from the controller's fast path: inputs as IN, in the order of ins
        # (and no controller tensors: nothing to lift)
        try:
            env = engine.env
            values = iter([env[i] for i in inputs])
        except KeyError:
            values = map(engine.value, inputs)  # raises, saying which value is gone
        args = tuple([next(values) if a is IN else _inputs(a, values) for a in args])
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
        return tensor_leaves(local)
    return on_dtensors(name, func, args, kwargs)


def on_dtensors(name: str, func: Any, args: Any, kwargs: dict[str, Any]) -> list[Any]:
    """The op run by DTensor (the shard path did not take it): its results' tensors."""
    if name in _REFUSED:
        raise NotImplementedError(f"{_REFUSED[name]} ({_placed(args, kwargs)})")
    if name.startswith("actormesh."):  # an op of our own: its torch code, whose ops DTensor runs
        from ..wire.optim_ops import ON_DTENSORS

        return tensor_leaves(ON_DTENSORS[name](*args, **kwargs))
    if func in _decompose or name in _DECOMPOSE_FIRST:
        return tensor_leaves(_decomposed(func, args, kwargs))
    if name in _VIEWS and _split_oddly(args[0]):
        # DTensor's view of a strided split (a batch merged with another dim, as in
        # MultiheadAttention) may refuse, and its view of an uneven split (6 rows over 4 ranks)
        # gives blocks of other sizes than the ranks hold; the same program run SPMD views a
        # plain local tensor. Gathered first, it is exact.
        args = (_gathered(args[0]), *args[1:])
    try:
        return tensor_leaves(func(*args, **kwargs))
    except NotImplementedError as exc:
        if "sharding strateg" not in str(exc):
            raise
        _decompose.add(func)
        return tensor_leaves(_decomposed(func, args, kwargs))
    except RuntimeError as exc:
        if name not in _VIEWS or "requires redistribution" not in str(exc):
            raise
        # Another split DTensor has no view rule for: gathered first too (exact).
        logger.debug("%s of %s: gathered first", name, _placed(args, kwargs))
        return tensor_leaves(func(_gathered(args[0]), *args[1:], **kwargs))


# Views DTensor may refuse for a placement ("would remove or reshape sharded dimension").
_VIEWS = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"}


def _split_oddly(x: Any) -> bool:
    """Whether DTensor ``x`` is split strided, or unevenly, along a dim."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(x, DTensor):
        return False
    blocks: dict[int, int] = {}
    for axis, p in enumerate(x.placements):
        if p.is_shard():
            if type(p) is not Shard:  # _StridedShard
                return True
            blocks[p.dim] = blocks.get(p.dim, 1) * x.device_mesh.size(axis)
    return any(x.shape[d] % n for d, n in blocks.items())


def _gathered(x: Any) -> Any:
    """``x`` whole along every mesh dim it is split over (Partial sums stay as they are)."""
    from torch.distributed.tensor import Replicate

    placements = [p if p.is_replicate() or p.is_partial() else Replicate() for p in x.placements]
    return x.redistribute(x.device_mesh, placements)


def _inputs(a: Any, values: Iterator[Any]) -> Any:
    """A fast-path argument that is not IN itself: a Tensor[] of inputs (``[IN, IN, ...]``, a
    _foreach_ op's) as their values; anything else as it is."""
    if type(a) is list and a and a[0] is IN:
        return [next(values) for _ in a]
    return a


def _placed(args: Any, kwargs: dict[str, Any]) -> str:
    """How an op's tensor arguments were placed, for a message: ``S(0)/R``..."""
    from torch.distributed.tensor import DTensor

    out = []
    for x in _flat(args, kwargs):
        if isinstance(x, DTensor):
            out.append("/".join(str(p) for p in x.placements))
        elif x is not None and hasattr(x, "shape"):
            out.append("a plain tensor")
    return "its tensors were placed " + ", ".join(out)


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


def run_constant(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    # A controller tensor that ops read by id (Stream.constant): kept plain, and lifted to a
    # Replicate DTensor where an op mixes it with DTensors (lift_constants).
    (tensor,) = payload
    return [tensor.to(engine.device)]

"""``module_to_mesh``: an ``nn.Module`` whose parameters are MeshTensors.

The controller keeps a *mirror* of the module: the same submodules, with every parameter and
buffer replaced by a MeshTensor, so ``parameters()``, ``state_dict()``, ``torch.optim`` and
``clip_grad_norm_`` work unchanged. Calling it is one op each way (a custom autograd Function):
forward runs the real module on the workers (worker/module.py), backward runs its backward
there and returns the parameters' gradients as MeshTensors, which the controller's autograd
accumulates into ``p.grad`` like any gradient. The output's shape comes from running a meta
copy of the module on the controller, cached per input shape.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from .. import compat
from ..wire.ops import Op, Ref, issue_site
from .mesh import TensorMesh, engine_mesh
from .tensor import MeshTensor, new_mesh_tensor

DATA_DIM_NAMES = ("data_parallel", "dp", "data")


class _Owned:
    """A worker value owned by a controller object: dropped when that object is collected."""

    def __init__(self, tm: TensorMesh, id: int) -> None:
        self.id = id
        self.build: Op | None = None  # the op that built it (recovery builds it again)
        weakref.finalize(self, tm.stream.died, id)


class _ModuleCall(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, call: MeshModule, grad_on: bool, x: Any, *params: Any) -> Any:
        tm = call.mesh
        shape, dtype = call.output_meta(x)
        out = new_mesh_tensor(tm, shape, dtype, per_rank=False)
        graph = _Owned(tm, tm.stream.new_id())
        is_mesh = isinstance(x, MeshTensor)
        input_grad = bool(grad_on and is_mesh and x.requires_grad)
        # A controller input (a batch) is uploaded once, not with every step that reuses it.
        xid = x.value_id if is_mesh else tm.stream.constant(x)
        ins: tuple[int, ...] = (call.remote_state.id, xid)
        arg = Ref(xid)
        payload = (Ref(call.remote_state.id), arg, tuple(shape), grad_on, input_grad)
        # The output is split over the data dimension: a failed rank's stand-in must be too.
        meta = ((tuple(shape), dtype, False, call.data_dim), None)
        tm.stream.record(
            ("module_forward", (out.value_id, graph.id), ins, meta, payload, issue_site())
        )
        ctx.call, ctx.graph, ctx.x_meta = call, graph, (tuple(x.shape), x.dtype)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Any) -> Any:
        call: MeshModule = ctx.call
        tm = call.mesh
        wanted = tuple(bool(w) for w in ctx.needs_input_grad[3:])
        input_grad = bool(ctx.needs_input_grad[2])
        grads: list[Any] = []
        out_ids, meta = [], []
        for p, want in zip(call.param_list, wanted, strict=True):
            g = new_mesh_tensor(tm, p.shape, p.dtype, per_rank=False) if want else None
            grads.append(g)
            if g is not None:
                out_ids.append(g.value_id)
                meta.append((tuple(p.shape), p.dtype, False))
        gx = None
        if input_grad:
            gx = new_mesh_tensor(tm, ctx.x_meta[0], ctx.x_meta[1], per_rank=False)
            out_ids.append(gx.value_id)
            meta.append((ctx.x_meta[0], ctx.x_meta[1], False))
        # The parameters are inputs too: a poisoned parameter poisons its gradient, and a failed
        # rank's stand-in gradients take their parameters' placements.
        params = tuple(p.value_id for p in call.param_list)
        ins: tuple[int, ...]
        if isinstance(grad_out, MeshTensor):
            ins = (call.remote_state.id, ctx.graph.id, grad_out.value_id, *params)
            garg = Ref(grad_out.value_id)
        else:
            ins, garg = (call.remote_state.id, ctx.graph.id, *params), grad_out.detach()
        payload = (Ref(call.remote_state.id), Ref(ctx.graph.id), garg, wanted, input_grad)
        tm.stream.record(
            ("module_backward", tuple(out_ids), ins, tuple(meta), payload, issue_site())
        )
        return (None, None, gx, *grads)


class MeshModule(nn.Module):
    """A module living on a mesh (made by ``module_to_mesh``). Its parameters and buffers are
    MeshTensors; calling it records one op (and its backward one more). ``train()``/``eval()``
    reach the workers' module; ``fetch_module()`` gives a local copy with the current weights."""

    mesh: TensorMesh
    param_list: list[MeshTensor]
    remote_state: _Owned
    meta_module: nn.Module
    shapes: dict[Any, tuple[torch.Size, torch.dtype]]
    inner_name: str
    data_dim: str | None

    def __init__(
        self,
        tm: TensorMesh,
        meta: nn.Module,
        mirror: nn.Module,
        state: _Owned,
        data_dim: str | None,
    ) -> None:
        super().__init__()
        for name, child in mirror.named_children():
            self.add_module(name, child)
        for name, p in mirror.named_parameters(recurse=False):
            self.register_parameter(name, p)
        for name, b in mirror.named_buffers(recurse=False):
            self.register_buffer(name, b)
        # Plain attributes, not submodules: nn.Module.__setattr__ would register the meta copy.
        object.__setattr__(self, "mesh", tm)
        object.__setattr__(self, "meta_module", meta)
        object.__setattr__(self, "remote_state", state)
        object.__setattr__(self, "param_list", list(self.parameters()))
        object.__setattr__(self, "shapes", {})
        object.__setattr__(self, "inner_name", type(meta).__name__)
        object.__setattr__(self, "data_dim", data_dim)

    def __repr__(self) -> str:
        return f"MeshModule({self.inner_name}, mesh={self.mesh!r})"

    def output_meta(self, x: Any) -> tuple[torch.Size, torch.dtype]:
        key = (tuple(x.shape), x.dtype)
        found = self.shapes.get(key)
        if found is None:
            with torch.no_grad():
                y = self.meta_module(torch.empty(x.shape, dtype=x.dtype, device="meta"))
            if not isinstance(y, torch.Tensor):
                raise compat.MeshUsageError(
                    f"module_to_mesh supports modules that return one tensor; "
                    f"{self.inner_name} returned {type(y).__name__}"
                )
            found = self.shapes[key] = (y.shape, y.dtype)
        return found

    def forward(self, x: Any) -> MeshTensor:
        if not isinstance(x, torch.Tensor):
            raise compat.MeshUsageError(
                f"a MeshModule takes one tensor (a controller tensor or a MeshTensor), got "
                f"{type(x).__name__}"
            )
        if isinstance(x, MeshTensor) and (x.mesh is not self.mesh or x.per_rank):
            raise compat.MeshUsageError(
                "the input MeshTensor must be a global MeshTensor on the module's mesh"
            )
        grad_on = torch.is_grad_enabled()
        return _ModuleCall.apply(self, grad_on, x, *self.param_list)

    def train(self, mode: bool = True) -> MeshModule:
        super().train(mode)
        if "remote_state" in self.__dict__:
            state = self.remote_state
            self.mesh.stream.record(
                ("module_mode", (), (state.id,), (), (Ref(state.id), mode), issue_site())
            )
        return self

    def fetch_module(self) -> nn.Module:
        """A local copy of the module with the current parameters and buffers (a sync point)."""
        from .fetch import inspect

        local = copy.deepcopy(self.meta_module).to_empty(device="cpu")
        local.load_state_dict(inspect(dict(self.state_dict())))
        return local


def module_to_mesh(
    module_or_factory: nn.Module | Callable[[], nn.Module],
    mesh: Any,
    *,
    data_dim: str | None = None,
    fsdp: bool = False,
    tp_plan: Mapping[str, Any] | None = None,
    tp_dim: str | None = None,
) -> MeshModule:
    """Put a module on a mesh; its parameters become MeshTensors (see ``MeshModule``).

    Without options the parameters are replicated, inputs are split along ``data_dim`` (default:
    the first of ``data_parallel``/``dp``/``data``, else the mesh's first dimension) and the
    gradients are summed over it in backward (bucketed). ``fsdp=True`` shards the parameters
    over ``data_dim`` with FSDP2 (``fully_shard``); ``tp_plan`` (``{"fc1": ColwiseParallel(),
    ...}``) applies ``parallelize_module`` over ``tp_dim`` (default: the first other dimension);
    both give 2-D parallelism. A factory (``lambda: Model()``) builds the module on the workers
    under one seed, for models too large to ship; a module instance is sent as it is.

    Blocks only while a new mesh's engine starts. Optimise with ``torch.optim`` as usual.
    """
    tm = engine_mesh(mesh, "module_to_mesh")
    is_factory = not isinstance(module_or_factory, nn.Module)
    if is_factory:
        if not callable(module_or_factory):
            raise compat.MeshUsageError(
                "module_to_mesh takes an nn.Module or a function that returns one, got "
                f"{type(module_or_factory).__name__}"
            )
        with torch.device("meta"):
            meta = module_or_factory()
        if not isinstance(meta, nn.Module):
            raise compat.MeshUsageError(
                f"the factory given to module_to_mesh returned {type(meta).__name__}, not an "
                "nn.Module"
            )
    else:
        assert isinstance(module_or_factory, nn.Module)
        meta = copy.deepcopy(module_or_factory).to("meta")
    data_dim, tp_dim = _dims(tm, data_dim, fsdp, tp_plan, tp_dim)
    names = dict(meta.named_parameters())
    buffers = dict(meta.named_buffers())
    mts: dict[int, MeshTensor] = {}  # id(meta tensor) -> its MeshTensor (tied weights share)
    out_ids, out_meta = [], []
    for p in names.values():
        t = new_mesh_tensor(tm, p.shape, p.dtype, per_rank=False, requires_grad=p.requires_grad)
        # torch's mark for a tensor subclass that acts as a Parameter (isinstance holds, and
        # register_parameter accepts it): what nn.Parameter(t) itself sets on subclasses.
        t._is_param = True  # noqa: SLF001
        mts[id(p)] = t
        out_ids.append(t.value_id)
        out_meta.append((tuple(p.shape), p.dtype, False))
    for b in buffers.values():
        t = new_mesh_tensor(tm, b.shape, b.dtype, per_rank=False)
        mts[id(b)] = t
        out_ids.append(t.value_id)
        out_meta.append((tuple(b.shape), b.dtype, False))
    state = _Owned(tm, tm.stream.new_id())
    seed = int(torch.randint(0, 2**62, ()).item())
    payload = (module_or_factory, is_factory, seed, data_dim, fsdp, dict(tp_plan or {}), tp_dim)
    state.build = ("module_build", (*out_ids, state.id), (), (*out_meta, None), payload,
                   issue_site())  # fmt: skip
    tm.stream.record(state.build)
    mirror = copy.deepcopy(meta)
    originals = {id(p): p for p in [*meta.parameters(), *meta.buffers()]}
    # MeshTensors marked _is_param pass register_parameter's isinstance check; typed as Any.
    by_position: dict[int, Any] = {id(m): mts[id(o)] for m, o in zip(
        [*mirror.parameters(), *mirror.buffers()], originals.values(), strict=True)}  # fmt: skip
    for sub in mirror.modules():
        for name, value in list(sub.named_parameters(recurse=False, remove_duplicate=False)):
            sub.register_parameter(name, by_position[id(value)])
        for name, buf in list(sub.named_buffers(recurse=False, remove_duplicate=False)):
            sub.register_buffer(name, by_position[id(buf)])
    return MeshModule(tm, meta, mirror, state, data_dim)


def _dims(
    tm: TensorMesh, data_dim: str | None, fsdp: bool, tp_plan: Any, tp_dim: str | None
) -> tuple[str | None, str | None]:
    labels = tm.labels
    if data_dim is not None:
        tm.check_dims([data_dim], "module_to_mesh data_dim")
    if tp_dim is not None:
        tm.check_dims([tp_dim], "module_to_mesh tp_dim")
    if tp_plan and tp_dim is None:
        others = [d for d in labels if d != data_dim] if data_dim else list(labels)
        if data_dim is None and len(labels) > 1:
            data_dim = next((d for d in DATA_DIM_NAMES if d in labels), labels[0])
            others = [d for d in labels if d != data_dim]
        tp_dim = others[0] if others else None
    if data_dim is None and not (tp_plan and len(labels) == 1):
        data_dim = next((d for d in DATA_DIM_NAMES if d in labels), labels[0])
    if tp_plan and tp_dim is None:
        raise compat.MeshUsageError("tp_plan needs a mesh dimension for tensor parallelism")
    if tp_plan and tp_dim == data_dim:
        raise compat.MeshUsageError(
            f"tp_dim and data_dim are both {tp_dim!r}; tensor parallelism needs its own "
            "mesh dimension"
        )
    if fsdp and data_dim is None:
        raise compat.MeshUsageError("fsdp=True needs a data dimension to shard over")
    return data_dim, tp_dim

"""``module_to_mesh``: the user's own model, its parameters and buffers living on a mesh.

The model that comes back *is* the user's: a copy of it (the same class, every attribute, the
same submodules) in which each parameter and buffer is a MeshTensor, with tied parameters
still one object. Its class is a subclass made on the fly (``MeshGPT``: ``MeshModule`` and the
user's class, as FSDP2's ``fully_shard`` does), so ``isinstance`` holds for both. Calling it runs
the user's ``forward`` here, on the controller: every op it issues is recorded and runs on the
ranks as DTensor ops (``recording.py``), and the controller's autograd records the backward.
So any forward works (several inputs, keyword arguments, ``None``, nested containers; tuples,
dicts, dataclasses or ``ModelOutput`` out), and so do methods that call it (``generate``), with
the meaning of one process: DTensor has single-device semantics, whatever the placements.

Placements are what the options choose, never what the numbers mean:

- the ranks build the module (``worker/module.py``) and place each parameter: replicated; with
  ``tp_plan``, as ``parallelize_module`` places it on the ``tp_dim`` dimension; with ``fsdp=True``
  also split along dim 0 over ``data_dim``;
- a call splits each controller tensor it is given along dim 0 over ``data_dim`` (data
  parallelism); MeshTensors are taken as they are;
- after each backward one op brings every gradient to its parameter's placements (``grad_sync``:
  the data-parallel sum, bucketed; a reduce-scatter for sharded parameters), so that
  ``optimizer.step()`` runs without collectives;
- a plan's layouts are applied around the planned submodules (``plans.py``).

Why not one op per module call (the fast path this module had)? It ran the forward on each
rank's slice of the batch, which equals the whole batch's forward only when no op mixes rows:
a loss computed inside ``forward`` (``labels=``), BatchNorm in training, attention masks and
padding, a ``Shard`` input layout all came out different from one process. Measured on the T1
step (bench/bench_tensor.py) the recorded forward costs the same (see bench/RESULTS-tensors.md).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from .. import compat
from ..wire.errors import RemoteTensorError
from ..wire.ops import issue_site
from .fetch import fetch_value
from .grad_sync import sync_after_backward
from .inputs import to_mesh
from .mesh import TensorMesh, engine_mesh
from .plans import check_plan, install_layouts, relayout
from .tensor import MeshTensor, OpaqueRef, new_mesh_tensor

DATA_DIM_NAMES = ("data_parallel", "dp", "data")
BUILD_TIMEOUT = 300.0  # seconds for the ranks to build (and check) a module


class _Placement:
    """What a meshed model keeps besides the user's attributes (one attribute, ``_actormesh``)."""

    def __init__(
        self,
        tm: TensorMesh,
        data_dim: str | None,
        fsdp: bool,
        cls: type,
        placements: dict[str, str],
    ) -> None:
        self.tm = tm
        self.data_dim = data_dim
        self.fsdp = fsdp
        self.calling = threading.local()  # within a call that gathered the parameters
        self.cls = cls  # the user's class
        self.placements = placements  # parameter name -> its placements, as the ranks said
        self.grad_sync: Any = None
        # id(x) -> (x's weakref, its version, its MeshTensor, that one's version, the value
        # the ranks were sent if known (known.py), the stream's ``foreign`` then)
        self.inputs: dict[int, tuple[Any, int, MeshTensor, int, Any, int]] = {}


class MeshModule(nn.Module):
    """A model whose parameters and buffers live on a mesh (made by ``module_to_mesh``).

    Each meshed model's class derives from this *and* from the user's class: every attribute
    and method of the user's model works, and ``isinstance(model, UserClass)`` holds. Calling
    it runs the user's ``forward`` on the controller, recording its ops (see the module docs);
    ``state_dict()`` holds MeshTensors under the original keys. ``to()``/``double()``/``cuda()``
    are refused (convert the module before ``module_to_mesh``). ``fetch_module()`` gives a
    local copy with the current weights.
    """

    _actormesh: _Placement

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        state = self._actormesh
        if getattr(state.calling, "gathered", False):  # functional_call's own call, below
            return super().__call__(*args, **kwargs)
        args, kwargs = tree_map(lambda x: to_mesh(state, x), (args, kwargs))
        if not state.fsdp:
            return super().__call__(*args, **kwargs)
        # FSDP: the parameters rest split over the data dimension and are gathered for the
        # call (one relayout each, differentiable: their gradients come back to the split
        # parameters, and grad_sync reduce-scatters them). The forward's ops then see the
        # placements of the other options, as FSDP's forward sees whole parameters.
        axis = state.tm.labels.index(state.data_dim)
        whole = _replicate()
        gathered: dict[str, Any] = {}
        once: dict[int, Any] = {}  # a tied parameter is gathered once
        for name, p in self.named_parameters(remove_duplicate=False):
            if id(p) not in once:
                once[id(p)] = relayout(p, whole, state.tm, axis)
            gathered[name] = once[id(p)]
        state.calling.gathered = True
        try:
            return torch.func.functional_call(self, gathered, args, kwargs, strict=False)
        finally:
            state.calling.gathered = False

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        raise compat.MeshUsageError(
            f"{type(self).__name__}: its parameters live on the mesh, so they cannot be moved "
            "or converted here (to(), double(), cuda()...); convert the module before "
            "module_to_mesh, or fetch_module() for a local copy"
        )

    def fetch_module(self) -> nn.Module:
        """A local copy of the model (the user's class) with the current parameters and
        buffers (a sync point)."""
        from .fetch import inspect

        meshed = [*self.parameters(), *self.buffers()]
        values = inspect(meshed)
        memo: dict[int, Any] = {id(self._actormesh): None}  # not copied: dropped below
        for m, v in zip(meshed, values, strict=True):
            memo[id(m)] = nn.Parameter(v, requires_grad=m.requires_grad) if _is_param(m) else v
        local = copy.deepcopy(self, memo)
        del local.__dict__["_actormesh"]
        local.__class__ = self._actormesh.cls
        return local


def _replicate() -> Any:
    from torch.distributed.tensor import Replicate

    return Replicate()


def _is_param(t: Any) -> bool:
    return isinstance(t, nn.Parameter)


_classes: dict[type, type] = {}
_classes_lock = threading.Lock()


def mesh_class(cls: type) -> type:
    """``Mesh<cls>``: MeshModule first, then the user's class (made once per class)."""
    if issubclass(cls, MeshModule):
        return cls
    with _classes_lock:
        found = _classes.get(cls)
        if found is None:
            found = _classes[cls] = type(f"Mesh{cls.__name__}", (MeshModule, cls), {})
            found.__module__ = cls.__module__
            found.__qualname__ = f"Mesh{cls.__qualname__}"
        return found


def module_to_mesh(
    module_or_factory: nn.Module | Callable[[], nn.Module],
    mesh: Any,
    *,
    data_dim: str | None = None,
    fsdp: bool = False,
    tp_plan: Mapping[str, Any] | None = None,
    tp_dim: str | None = None,
) -> Any:
    """Put a model on a mesh: the same model (its class, attributes and methods), with each
    parameter and buffer a MeshTensor (see ``MeshModule``).

    Calls split controller tensors along dim 0 over ``data_dim`` (default: the first of
    ``data_parallel``/``dp``/``data``, else the mesh's first dimension); parameters are
    replicated, and after each backward their gradients are summed over it (bucketed).
    ``fsdp=True`` also splits each parameter along dim 0 over ``data_dim``; ``tp_plan``
    (``{"fc1": ColwiseParallel(), ...}``, torch's parallel styles) places parameters as
    ``parallelize_module`` does over ``tp_dim`` (default: the first other dimension) and
    redistributes the planned modules' inputs and outputs to the plan's layouts. Whatever the
    options, the numbers are those of one process (DTensor semantics).

    An instance (``module_to_mesh(GPT(), procs)``) is sent to the ranks as it is, and the
    controller keeps a copy of it with MeshTensors; a factory (``lambda: GPT()``) builds the
    module on each rank under one seed (for models too large to send) and on the controller
    on the meta device. Both give the same model, tied parameters staying tied.

    Blocks until the ranks have built the module (and a new mesh's engine has started); raises
    ``MeshUsageError`` here for a bad option or plan, or if the ranks' module differs from the
    controller's (names of parameters and buffers).
    """
    tm = engine_mesh(mesh, "module_to_mesh")
    is_factory = not isinstance(module_or_factory, nn.Module)
    model = _controller_copy(module_or_factory, is_factory)
    data_dim, tp_dim = _dims(tm, data_dim, fsdp, tp_plan, tp_dim)
    plan = check_plan(model, dict(tp_plan or {}))
    params = _unique(model.named_parameters(remove_duplicate=False))
    buffers = _unique(model.named_buffers(remove_duplicate=False))
    meshed = {id(t): _mesh_tensor(tm, t) for _, t in [*params, *buffers]}  # tied ones share
    names = ([n for n, _ in params], [n for n, _ in buffers])
    source = module_or_factory if is_factory else _unmeshed(model)
    build = (source, is_factory, names, data_dim, fsdp, plan, tp_dim)
    placements = _build_on_ranks(tm, list(meshed.values()), build)
    # The controller's model: a copy whose parameters and buffers are the MeshTensors (deepcopy
    # with them in its memo keeps ties and every other attribute).
    result = copy.deepcopy(model, dict(meshed))
    cls = type(result)
    state = _Placement(tm, data_dim, fsdp, cls, placements)
    object.__setattr__(result, "_actormesh", state)
    result.__class__ = mesh_class(cls)
    state.grad_sync = sync_after_backward(tm, [p for p in result.parameters() if p.requires_grad])
    if plan:
        install_layouts(result, plan, tm, tp_dim)
    return result


def _mesh_tensor(tm: TensorMesh, t: torch.Tensor) -> MeshTensor:
    """The MeshTensor that stands for parameter or buffer ``t`` (the ranks build its value)."""
    m = new_mesh_tensor(tm, t.shape, t.dtype, per_rank=False)
    if isinstance(t, nn.Parameter):
        m.requires_grad_(t.requires_grad)
        # torch's mark for a tensor subclass acting as a Parameter (isinstance holds,
        # register_parameter accepts it): what nn.Parameter(t) sets on subclasses.
        m._is_param = True  # noqa: SLF001
    return m


def _build_on_ranks(tm: TensorMesh, tensors: list[MeshTensor], build: tuple[Any, ...]) -> Any:
    """Record the ``module_build`` op whose outputs are ``tensors`` and wait for the ranks to
    build the module: the placements they gave each parameter, by name."""
    source, is_factory, names, data_dim, fsdp, plan, tp_dim = build
    report = tm.stream.new_id()
    out_ids = tuple(m.value_id for m in tensors)
    out_meta = tuple((tuple(m.shape), m.dtype, False) for m in tensors)
    seed = int(torch.randint(0, 2**62, ()).item())
    payload = (source, is_factory, seed, names, data_dim, fsdp, plan, tp_dim)
    tm.stream.record(
        ("module_build", (*out_ids, report), (), (*out_meta, None), payload, issue_site())
    )
    ref = OpaqueRef(tm, report, per_rank=False)
    try:
        return fetch_value(ref, tm, 0).get(timeout=BUILD_TIMEOUT)
    except RemoteTensorError as exc:
        raise compat.MeshUsageError(
            f"module_to_mesh: the ranks could not build the module: {exc}"
        ) from exc


def _controller_copy(source: Any, is_factory: bool) -> nn.Module:
    """The module the controller copies: the instance itself, or the factory's module built on
    the meta device (its tensors only describe the ranks')."""
    if not is_factory:
        if isinstance(source, MeshModule):
            raise compat.MeshUsageError(
                "this model is already on a mesh; fetch_module() gives a local copy to put on "
                "another"
            )
        return source
    if not callable(source):
        raise compat.MeshUsageError(
            "module_to_mesh takes an nn.Module or a function that returns one, got "
            f"{type(source).__name__}"
        )
    with torch.device("meta"):
        built = source()
    if not isinstance(built, nn.Module):
        raise compat.MeshUsageError(
            f"the factory given to module_to_mesh returned {type(built).__name__}, not an nn.Module"
        )
    return built


def _unmeshed(module: nn.Module) -> nn.Module:
    if any(isinstance(t, MeshTensor) for t in [*module.parameters(), *module.buffers()]):
        raise compat.MeshUsageError(
            "module_to_mesh: this module already holds MeshTensors; build it from local "
            "tensors (or pass a factory)"
        )
    return module


def _unique(named: Any) -> list[tuple[str, torch.Tensor]]:
    """(first name, tensor) per distinct tensor, in module order (tied ones once)."""
    seen: set[int] = set()
    out = []
    for name, t in named:
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        out.append((name, t))
    return out


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


def placement(model: nn.Module) -> _Placement:
    """What module_to_mesh keeps on a meshed model (its one attribute of ours)."""
    state: _Placement = model.__dict__["_actormesh"]
    return state


def model_mesh(model: MeshModule) -> TensorMesh:
    """The tensor mesh a meshed model lives on."""
    return placement(model).tm


def forget_engine_values(model: nn.Module) -> None:
    """The model's engine was replaced (recovery restored its parameters and buffers under
    their ids): forget what only the old engine held, the gradients of the step that failed
    and the batches this model put on the mesh."""
    for p in model.parameters():
        p.grad = None
    placement(model).inputs.clear()

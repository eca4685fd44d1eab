"""What a checkpoint holds: the user's ``state`` as ``torch.distributed.checkpoint`` lays it out,
with MeshTensors standing for the ranks' DTensors (the *spec* worker/checkpoint.py takes).

``state`` is what ``dcp.save`` takes: a dict whose values are modules, optimizers, other objects
with ``state_dict()``/``load_state_dict()`` (DCP's ``Stateful``), MeshTensors, controller
tensors, and plain Python values, nested in dicts and lists. The layout is DCP's own, the one
``torch.distributed.checkpoint.state_dict.get_state_dict`` gives an SPMD program, so a
checkpoint written by either loads into the other:

- a module: its ``state_dict()`` (``{"fc1.weight": ...}``);
- an optimizer: ``{"state": {fqn: {"exp_avg": ..., "step": ...}}, "param_groups": [{...,
  "params": [fqn, ...]}]}``, parameters named by their names in a module of the same ``state``.

In the spec a global MeshTensor becomes ``Ref(id)``; controller tensors and Python values travel
by value. After a load, :func:`write_back` puts what rank 0 read for those back into the user's
objects, in place (DCP's ``load`` semantics).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .. import compat
from ..wire.ops import Ref
from .mesh import TensorMesh
from .tensor import MeshTensor


@dataclass
class Spec:
    """The spec of one state, and what building it found."""

    tree: dict[str, Any]
    ids: list[int] = field(default_factory=list)  # the MeshTensors' value ids (the op's ins)
    mesh: TensorMesh | None = None
    nbytes: int = 0  # the MeshTensors' bytes (what the ranks write, replicas once)


def build(state: Any, what: str) -> Spec:
    """The spec of ``state``; raises ``MeshUsageError`` naming the entry that cannot be saved."""
    if not isinstance(state, dict):
        raise compat.MeshUsageError(
            f"{what} takes a dict of state (as torch.distributed.checkpoint does), e.g. "
            f'{{"model": model, "optim": optimizer, "step": 10}}; got {type(state).__name__}'
        )
    spec = Spec({})
    names = _parameter_names(state)
    for key, value in state.items():
        _check_key(key, what)
        spec.tree[key] = _encode(_state_dict_of(value, names, key), spec, key, what)
    if spec.mesh is None:
        raise compat.MeshUsageError(
            f"{what}: the state holds no MeshTensor (no meshed model, optimizer or tensor), so "
            "there is nothing for the ranks to write; use torch.distributed.checkpoint (or "
            "torch.save) on the controller"
        )
    return spec


def _check_key(key: Any, what: str) -> None:
    if not isinstance(key, str):
        raise compat.MeshUsageError(
            f"{what}: the state's keys name its entries in the checkpoint and must be str, got "
            f"{key!r}"
        )


def _parameter_names(state: dict[str, Any]) -> dict[int, str]:
    """id(parameter) -> its name, from the modules of ``state`` (what names an optimizer's
    parameters, as DCP's ``get_optimizer_state_dict(model, optim)`` does)."""
    names: dict[int, str] = {}
    for value in state.values():
        if isinstance(value, nn.Module):
            for name, p in value.named_parameters(remove_duplicate=False):
                names.setdefault(id(p), name)
    return names


def _state_dict_of(value: Any, names: dict[int, str], key: str) -> Any:
    if isinstance(value, nn.Module):
        return dict(value.state_dict(keep_vars=True))  # the tensors themselves: no detach op
    if isinstance(value, torch.optim.Optimizer):
        return optimizer_state(value, names, key)
    if _is_stateful(value):
        return value.state_dict()
    return value


def _is_stateful(value: Any) -> bool:
    return callable(getattr(value, "state_dict", None)) and callable(
        getattr(value, "load_state_dict", None)
    )


def optimizer_state(opt: torch.optim.Optimizer, names: dict[int, str], key: str) -> dict[str, Any]:
    """``opt``'s state in DCP's layout (parameters by name, not by position)."""

    def name(p: Any) -> str:
        found = names.get(id(p))
        if found is None:
            raise compat.MeshUsageError(
                f"state[{key!r}] is an optimizer over a parameter that no module of the same "
                "state holds; put the model in the state too (DCP names an optimizer's "
                'parameters by their names in the model): {"model": model, "optim": optim}'
            )
        return found

    state: dict[str, Any] = {}
    groups = []
    for group in opt.param_groups:
        fqns = [name(p) for p in group["params"]]
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": fqns})
        for p, fqn in zip(group["params"], fqns, strict=True):
            if p in opt.state:
                state[fqn] = dict(opt.state[p])
    return {"state": state, "param_groups": groups}


def _encode(value: Any, spec: Spec, where: str, what: str) -> Any:
    if isinstance(value, MeshTensor):
        if value.per_rank:
            raise compat.MeshUsageError(
                f"{what}: {where} is a per-rank MeshTensor (a different value on each rank); "
                "a checkpoint holds global values: reduce it, or keep one rank's with fetch"
            )
        if spec.mesh is None:
            spec.mesh = value.mesh
        elif value.mesh is not spec.mesh:
            raise compat.MeshUsageError(
                f"{what}: {where} lives on mesh {value.mesh!r} and other entries on "
                f"{spec.mesh!r}; save the state of each mesh with its own call"
            )
        value.mesh.stream.check()
        if value.value_id not in spec.ids:
            spec.ids.append(value.value_id)
            spec.nbytes += value.numel() * value.element_size()
        return Ref(value.value_id)
    if isinstance(value, torch.Tensor):
        return value.detach().clone()  # a snapshot: the op is pickled later
    if isinstance(value, dict):
        return {k: _encode(v, spec, f"{where}[{k!r}]", what) for k, v in value.items()}
    if isinstance(value, list):
        return [_encode(v, spec, f"{where}[{i}]", what) for i, v in enumerate(value)]
    return value


def init_optimizer_state(opt: torch.optim.Optimizer) -> None:
    """Give ``opt`` state for every parameter before a load fills it: one step with zero
    gradients and a learning rate of 0, which makes the state tensors (with the parameters'
    shapes and placements) and leaves the parameters as they are (what DCP's
    ``set_optimizer_state_dict`` does for a fresh optimizer)."""
    params = [p for g in opt.param_groups for p in g["params"]]
    if all(p in opt.state for p in params):
        return
    lrs = [g.get("lr") for g in opt.param_groups]
    given = []
    for g in opt.param_groups:
        if "lr" in g:
            g["lr"] = 0.0
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
            given.append(p)
    try:
        opt.step()
    finally:
        for g, lr in zip(opt.param_groups, lrs, strict=True):
            if lr is not None:
                g["lr"] = lr
        for p in given:
            p.grad = None


def write_back(state: dict[str, Any], loaded: dict[str, Any]) -> None:
    """Put what rank 0 read (the spec's shape; ``None`` where a MeshTensor was, those were
    loaded in place on the ranks) into ``state``'s objects."""
    for key, value in list(state.items()):
        got = loaded[key]
        if isinstance(value, nn.Module):
            _into(dict(value.state_dict(keep_vars=True)), got)
        elif isinstance(value, torch.optim.Optimizer):
            _into_optimizer(value, got)
        elif _is_stateful(value):
            value.load_state_dict(_merge(value.state_dict(), got))
        else:
            state[key] = _merge(value, got)


def _merge(old: Any, got: Any) -> Any:
    """``got`` with ``old``'s MeshTensors where the ranks loaded them, and controller tensors
    loaded into in place."""
    if isinstance(old, MeshTensor):
        return old
    if isinstance(old, torch.Tensor):
        with torch.no_grad():
            old.copy_(got)
        return old
    if isinstance(old, dict):
        return {k: _merge(v, got[k]) for k, v in old.items()}
    if isinstance(old, list):
        return [_merge(v, g) for v, g in zip(old, got, strict=True)]
    return got


def _into(target: dict[str, Any], got: dict[str, Any]) -> None:
    for k, v in target.items():
        _merge(v, got[k])


def _into_optimizer(opt: torch.optim.Optimizer, got: dict[str, Any]) -> None:
    by_name: dict[str, Any] = {}
    for group, loaded in zip(opt.param_groups, got["param_groups"], strict=True):
        for k, v in loaded.items():
            if k != "params":
                group[k] = v
        by_name.update(zip(loaded["params"], group["params"], strict=True))
    for fqn, entries in got["state"].items():
        per_param = opt.state[by_name[fqn]]
        for k, v in entries.items():
            per_param[k] = _merge(per_param[k], v) if k in per_param else v

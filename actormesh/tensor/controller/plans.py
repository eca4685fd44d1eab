"""A tensor-parallel plan on a meshed model: what torch's parallel styles mean on the mesh.

In an SPMD program a style does two things: it places its module's parameters
(``ColwiseParallel`` splits a Linear's weight along dim 0 over the tp dimension...), and it
hooks the module's calls to give each rank's *local* tensors a meaning (``input_layouts``: this
rank holds shard ``r`` of the input) and to move them to the layout the module computes in
(``desired_input_layouts``, ``output_layouts``). On the mesh every tensor is global: the
controller's batch *is* the global input, so a ``Shard`` input layout needs no slicing of ours
(each rank already computes on its shard of the controller's batch, and the gradients are those
of one process, as SPMD's are). What is left of a style is where the values sit, and that is
what this module keeps: the ranks place the parameters with torch's own ``parallelize_module``
(``worker/module.py``), and hooks on the controller's submodules redistribute their inputs and
outputs over the tp dimension to the style's layouts (one ``relayout`` op each, which changes
placements, never values), and their gradients back to the layouts SPMD's have there.

Refused here, at the user's line, naming the plan entry: a key that matches no submodule, a
style that is not one of torch's (its hooks run SPMD code on local tensors, which has no meaning
for a global value), and a style on a module type torch does not support it for.
"""

from __future__ import annotations

from fnmatch import fnmatch
from typing import Any

import torch
from torch import nn

from .. import compat
from ..wire.ops import Ref, issue_site
from .mesh import TensorMesh
from .tensor import MeshTensor, new_mesh_tensor


def _styles() -> dict[str, type]:
    from torch.distributed.tensor.parallel import style

    names = ["ColwiseParallel", "RowwiseParallel", "SequenceParallel", "PrepareModuleInput",
             "PrepareModuleOutput", "PrepareModuleInputOutput"]  # fmt: skip
    return {n: getattr(style, n) for n in names if hasattr(style, n)}


def matching(model: nn.Module, key: str) -> list[tuple[str, nn.Module]]:
    """The submodules a plan key names, as ``parallelize_module`` resolves it (each dotted
    part an ``fnmatch`` pattern for a child's name; ``""`` is the model itself)."""
    if key == "":
        return [("", model)]
    parts = key.split(".")
    found = []
    for name, sub in model.named_modules():
        names = name.split(".") if name else []
        if len(names) == len(parts) and all(
            fnmatch(n, p) for n, p in zip(names, parts, strict=True)
        ):
            found.append((name, sub))
    return found


def check_plan(model: nn.Module, plan: dict[str, Any]) -> dict[str, Any]:
    """``plan`` if every entry can mean on the mesh what it means SPMD; else MeshUsageError."""
    if not plan:
        return plan
    styles = _styles()
    for key, style in plan.items():
        if not isinstance(key, str):
            raise compat.MeshUsageError(
                f"tp_plan keys are submodule names (patterns such as 'layers.*.mlp'), got {key!r}"
            )
        kind = type(style).__name__
        if styles.get(kind) is not type(style):
            raise compat.MeshUsageError(
                f"tp_plan entry {key!r}: {kind} is not one of torch's parallel styles "
                f"({', '.join(styles)}); on a mesh a style's meaning must be known, since its "
                "SPMD hooks would run on local tensors: express it with those styles, or "
                "place tensors yourself (distribute, t.redistribute)"
            )
        subs = matching(model, key)
        if not subs:
            raise compat.MeshUsageError(
                f"tp_plan entry {key!r} names no submodule of {type(model).__name__} (each "
                "dotted part is a pattern for a child's name, as in parallelize_module)"
            )
        if kind in ("ColwiseParallel", "RowwiseParallel"):
            for name, sub in subs:
                if not isinstance(sub, (nn.Linear, nn.Embedding)):
                    raise compat.MeshUsageError(
                        f"tp_plan entry {key!r}: {kind} applies to nn.Linear and nn.Embedding "
                        f"(as in torch), but {name or 'the model'} is a "
                        f"{type(sub).__name__}; plan its Linear submodules instead"
                    )
    return plan


def install_layouts(model: nn.Module, plan: dict[str, Any], tm: TensorMesh, tp_dim: Any) -> None:
    """Hooks on the controller's planned submodules that move their inputs and outputs to the
    style's layouts over ``tp_dim``."""
    axis = tm.labels.index(tp_dim)
    for key, style in plan.items():
        for _name, sub in matching(model, key):
            _hook(sub, style, tm, axis, key)


def _hook(sub: nn.Module, style: Any, tm: TensorMesh, axis: int, key: str) -> None:
    # Each relayout's gradient goes back to the layout SPMD's gradient has at that boundary
    # (``back``): a style's input hook turns the input's gradient into its ``input_layouts``,
    # its output hook the output's into the layout the module computed in (Partial as Replicate,
    # as DTensor's redistribute does in backward). Left as they came, the gradients took
    # layouts SPMD never has: a Colwise input's Partial gradient, reduce-scattered by a
    # LayerNorm's backward, split the batch over tp too, which DTensor cannot view back
    # (nn.TransformerEncoder's attention).
    kind = type(style).__name__
    if kind == "PrepareModuleInputOutput":
        _hook(sub, style.prepare_module_input, tm, axis, key)
        _hook(sub, style.prepare_module_output, tm, axis, key)
    elif kind in ("ColwiseParallel", "RowwiseParallel", "SequenceParallel"):
        _parallel_hooks(sub, style, kind, tm, axis)
    elif kind == "PrepareModuleInput":
        _input_hook(sub, style, tm, axis, key)
    elif kind == "PrepareModuleOutput":
        _output_hook(sub, style, tm, axis, key)


def _parallel_hooks(sub: nn.Module, style: Any, kind: str, tm: TensorMesh, axis: int) -> None:
    """A parallel style's layouts: its first input as the style wants it, its output as the
    style's ``output_layouts`` say (a ``SequenceParallel`` output stays as it is)."""
    if kind == "SequenceParallel":
        wanted = given = style.sequence_sharding[0]
    else:
        given = style.input_layouts[0]
        if kind == "ColwiseParallel" or isinstance(sub, nn.Embedding):
            wanted = _replicate()
        else:
            wanted = _shard(-1)

    def first_input(_: Any, args: tuple[Any, ...]) -> Any:
        if args:
            return (relayout(args[0], wanted, tm, axis, back=given), *args[1:])
        return None

    sub.register_forward_pre_hook(first_input)
    if kind != "SequenceParallel":
        out_layout = style.output_layouts[0]
        # Colwise computes its output split along the last dim; Rowwise a Partial sum
        computed = _shard(-1) if kind == "ColwiseParallel" else _replicate()

        def output(_: Any, args: Any, out: Any) -> Any:
            return relayout(out, out_layout, tm, axis, back=computed)

        sub.register_forward_hook(output)


def _input_hook(sub: nn.Module, style: Any, tm: TensorMesh, axis: int, key: str) -> None:
    """``PrepareModuleInput``: the inputs (positional and keyword) in the desired layouts."""

    def inputs(_: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        desired = style.desired_input_layouts
        if style.input_layouts is not None:
            if len(args) != len(style.input_layouts):
                raise compat.MeshUsageError(
                    f"tp_plan entry {key!r}: PrepareModuleInput has "
                    f"{len(style.input_layouts)} input_layouts, but the module was called "
                    f"with {len(args)} positional inputs"
                )
            args = tuple(
                relayout(a, d, tm, axis, back=i) if i is not None else a
                for a, i, d in zip(args, style.input_layouts, desired, strict=True)
            )
        kw, given = style.desired_input_kwarg_layouts, style.input_kwarg_layouts
        kwargs = {k: relayout(v, kw.get(k), tm, axis, back=given.get(k)) for k, v in kwargs.items()}
        return args, kwargs

    sub.register_forward_pre_hook(inputs, with_kwargs=True)


def _output_hook(sub: nn.Module, style: Any, tm: TensorMesh, axis: int, key: str) -> None:
    """``PrepareModuleOutput``: the outputs in the desired layouts."""

    def outputs(_: Any, args: Any, out: Any) -> Any:
        single = not isinstance(out, tuple)
        outs = (out,) if single else out
        if len(outs) != len(style.output_layouts):
            raise compat.MeshUsageError(
                f"tp_plan entry {key!r}: PrepareModuleOutput has "
                f"{len(style.output_layouts)} output_layouts, but the module returned "
                f"{len(outs)} outputs"
            )
        moved = tuple(
            relayout(o, d, tm, axis, back=i) if i is not None else o
            for o, i, d in zip(
                outs, style.output_layouts, style.desired_output_layouts, strict=True
            )
        )
        return moved[0] if single else moved

    sub.register_forward_hook(outputs)


def _replicate() -> Any:
    from torch.distributed.tensor import Replicate

    return Replicate()


def _shard(dim: int) -> Any:
    from torch.distributed.tensor import Shard

    return Shard(dim)


def _record_relayout(x: Any, placement: Any, tm: TensorMesh, axis: int) -> Any:
    if getattr(placement, "dim", None) is not None and placement.dim < 0:
        placement = _shard(placement.dim + x.dim())
    out = new_mesh_tensor(tm, x.shape, x.dtype, per_rank=False, stride=x.stride())
    meta = ((tuple(x.shape), x.dtype, False),)
    tm.stream.record(
        ("relayout", (out.value_id,), (x.value_id,), meta, (Ref(x.value_id), axis, placement),
         issue_site())
    )  # fmt: skip
    return out


def _placed(x: Any, tm: TensorMesh) -> bool:
    return type(x) is MeshTensor and not x.per_rank and x.mesh is tm


class _Relayout(torch.autograd.Function):
    """A new placement over one mesh dimension: the same global value, so its gradient is the
    output's gradient, placed as ``back`` says (as it came when ``back`` is None)."""

    @staticmethod
    def forward(ctx: Any, x: Any, placement: Any, tm: TensorMesh, axis: int, back: Any) -> Any:
        ctx.tm, ctx.axis, ctx.back = tm, axis, back
        return _record_relayout(x, placement, tm, axis)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        if ctx.back is not None and _placed(grad, ctx.tm):
            grad = _record_relayout(grad, ctx.back, ctx.tm, ctx.axis)
        return grad, None, None, None, None


def relayout(x: Any, placement: Any, tm: TensorMesh, axis: int, back: Any = None) -> Any:
    """``x`` placed as ``placement`` over mesh dimension ``axis`` (other dimensions as they
    are), its gradient placed as ``back`` over it (a Partial one as Replicate: a gradient is
    never wanted as unsummed parts; None: as it comes); anything but a global MeshTensor of
    ``tm``, or no placement, passes unchanged."""
    if placement is None or not _placed(x, tm):
        return x
    if back is not None and back.is_partial():
        back = _replicate()
    return _Relayout.apply(x, placement, tm, axis, back)

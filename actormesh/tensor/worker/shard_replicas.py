"""Ops whose DTensor inputs are all replicated, run on the local tensors (a shard route of
``shard_ops.py``).

Every rank holds the whole of a replicated value, so such an op is the op itself on each rank's
local tensors, and its results are replicated: what DTensor's dispatch gives, without its
sharding propagation (~100 µs of Python per op on a CPU). A model's constants are replicated
(position ids, a causal mask and the numbers it is filled with, rotary tables), and so are the
ops that build an attention mask from them each step: Hugging Face's ``embedding`` of the
position ids, the mask's ``bitwise_and``, ``expand`` and ``where``.

Declined (DTensor runs them, as before): ops that write an argument, draw random numbers (each
rank would draw its own), or give results whose shape depends on the values (``nonzero``,
indexing by a mask: a lowered step keeps the first run's spec); an op with an argument that is a
plain tensor, or a replicated value of another mesh; a list of floats among the arguments of an
op that is not pointwise (scale factors decide an upsampling's shape, and a program's later runs
fill in other floats); a result that is not a tensor.
"""

from __future__ import annotations

from typing import Any

from .dtensors import as_dtensor, replicated_on, torch_classes
from .lowered import computes_on_locals

# op -> (whether this route may take it, whether it is pointwise)
_ops: dict[Any, tuple[bool, bool]] = {}
_RESULTS = frozenset({"Tensor", "List[Tensor]"})


def _kind(func: Any) -> tuple[bool, bool]:
    known = _ops.get(func)
    if known is None:
        import torch

        tags, schema = func.tags, func._schema  # noqa: SLF001
        refused = (
            torch.Tag.nondeterministic_seeded,
            torch.Tag.dynamic_output_shape,
            torch.Tag.data_dependent_output,
        )
        takes = (
            func.namespace == "aten"
            and not schema.is_mutable
            and not any(t in tags for t in refused)
            and bool(schema.returns)
            and all(str(r.type) in _RESULTS for r in schema.returns)
        )
        known = _ops[func] = (takes, torch.Tag.pointwise in tags)
    return known


class _Declined(Exception):
    """An argument this route does not take."""


@computes_on_locals
def on_replicas(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The op on the local tensors of its replicated DTensor inputs, its results replicated on
    their mesh; ``None`` when it does not qualify (see the module's docstring)."""
    takes, pointwise = _kind(func)
    if not takes:
        return None
    classes = torch_classes()
    DTensor, plain = classes.dtensor, classes.tensor_base
    meshes: list[Any] = []

    def local(a: Any, tensors: bool = True, listed: bool = False) -> Any:
        t = type(a)
        if t is DTensor and tensors:
            spec = a._spec  # noqa: SLF001
            if not spec.is_replicated() or (meshes and spec.mesh is not meshes[0]):
                raise _Declined
            meshes.append(spec.mesh)
            return a._local_tensor  # noqa: SLF001
        if t is list or t is tuple:
            return t(local(e, tensors, True) for e in a)
        if issubclass(t, plain) or (listed and t is float and not pointwise):
            raise _Declined
        return a

    try:
        local_args = [local(a) for a in args]
        for v in kwargs.values():
            local(v, tensors=False)  # (a tensor among the keywords: declined)
    except _Declined:
        return None
    if not meshes:
        return None
    mesh = meshes[0]
    device = kwargs.get("device")
    if device is not None and _device_type(device) != mesh.device_type:
        return None
    out = func._op(*local_args, **kwargs)  # noqa: SLF001  (what OpOverload.__call__ calls)
    placements = replicated_on(mesh.ndim)
    if type(out) is list or type(out) is tuple:  # (None: a result the op did not compute)
        return type(out)(None if o is None else as_dtensor(o, mesh, placements) for o in out)
    return as_dtensor(out, mesh, placements)


def _device_type(device: Any) -> str:
    import torch

    return torch.device(device).type

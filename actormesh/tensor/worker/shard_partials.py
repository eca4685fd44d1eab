"""Linear ops on partial sums, on each rank's part (a route of ``shard_ops.py``).

A gradient summed over a split batch is a ``Partial`` sum until it is synchronised: the whole
value is the sum of the ranks' parts. An op linear in it gives, on each rank's part, that rank's
part of the result, which is what DTensor's rules give too, without their Python:

- ``add``/``sub`` of two values with one spec (a tied embedding's two gradients, from the input
  embedding and from the output projection), ``alpha`` included;
- ``embedding_dense_backward`` of a partial gradient at replicated indices (the position
  embedding's gradient: its ids are the same for every row).
"""

from __future__ import annotations

from typing import Any

from .dtensors import dtensor_class, spec_of, wrap
from .lowered import computes_on_locals
from .shard_foreach import layout_kept, placed_alike


def _summed(spec: Any) -> bool:
    """Partial sums over some mesh dims, replicated over the others."""
    partial = False
    for p in spec.placements:
        if p.is_partial():
            if p.reduce_op != "sum":
                return False
            partial = True
        elif not p.is_replicate():
            return False
    return partial


@computes_on_locals
def _added(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``a + alpha b`` (or ``-``) of partial sums placed and laid out alike."""
    DTensor = dtensor_class()
    if len(args) != 2 or any(type(a) is not DTensor for a in args):
        return None
    if any(k != "alpha" or type(v) not in (int, float) for k, v in kwargs.items()):
        return None
    first, second = args[0]._spec, args[1]._spec  # noqa: SLF001
    if not _summed(first) or not (
        second is first or (placed_alike(second, first) and second.stride == first.stride)
    ):
        return None
    local = args[0]._local_tensor  # noqa: SLF001
    out = func(local, args[1]._local_tensor, **kwargs)  # noqa: SLF001
    if out.dtype != local.dtype or out.stride() != local.stride() or not layout_kept(first):
        return None
    return wrap(out, first)


@computes_on_locals
def _embedding_backward(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The weight's gradient of a partial-sum gradient at replicated indices (no scaling by
    frequency): the same partial sums, of the whole weight."""
    DTensor = dtensor_class()
    if kwargs or len(args) != 5 or args[4] or type(args[0]) is not DTensor:
        return None
    grad, indices = args[0], args[1]
    spec = grad._spec  # noqa: SLF001
    if type(indices) is not DTensor or not _summed(spec):
        return None
    ispec = indices._spec  # noqa: SLF001
    if ispec.mesh is not spec.mesh or not ispec.is_replicated():
        return None
    out = func(grad._local_tensor, indices._local_tensor, *args[2:])  # noqa: SLF001
    return wrap(out, spec_of(spec.mesh, spec.placements, out.shape, out.stride(), out.dtype))


ROUTES = {
    "aten.add.Tensor": _added,
    "aten.sub.Tensor": _added,
    "aten.embedding_dense_backward.default": _embedding_backward,
}

"""DTensors on a rank, fast: ``as_dtensor`` wraps a local tensor (the one constructor every worker
module uses for the values it makes: shard routes, views, distribute, modules, recovery), and
what the shard routes ask of a spec (its local layout, whether its placements are plain) is
cached per spec, as the engine reuses specs."""

from __future__ import annotations

from typing import Any, NamedTuple

_specs: dict[Any, Any] = {}


class TorchClasses(NamedTuple):
    """torch's classes the ranks' hot paths check types against and construct."""

    size: Any  # torch.Size
    dtensor: Any  # DTensor: exact type checks (isinstance runs a Python __instancecheck__)
    new: Any  # DTensor.__new__, torch's C constructor
    spec: Any  # DTensorSpec
    meta: Any  # TensorMeta
    tensor_base: Any  # torch._C.TensorBase, the C base of every tensor class
    shard: Any
    replicate: Any


_torch: TorchClasses | None = None


def torch_classes() -> TorchClasses:
    """``TorchClasses``, imported on first use (this module loads before any process group
    exists): a function-level import costs about half a microsecond per name on every call,
    which is a quarter of what wrapping a tensor costs here."""
    global _torch
    if _torch is None:
        import torch
        from torch.distributed.tensor import DTensor, Replicate, Shard
        from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

        _torch = TorchClasses(
            torch.Size, DTensor, DTensor.__new__, DTensorSpec, TensorMeta,
            torch._C.TensorBase, Shard, Replicate,  # noqa: SLF001  (the C base class)
        )  # fmt: skip
    return _torch


def as_dtensor(
    local: Any, mesh: Any, placements: Any, shape: Any = None, stride: Any = None
) -> Any:
    """``DTensor.from_local(local, ..., run_check=False)`` without autograd (the engine runs
    under no_grad) and with its spec cached: from_local costs 140 µs of Python on a CPU, this
    about 2. ``shape``/``stride``: the global ones (default: the local ones, as for Replicate)."""
    shape = local.shape if shape is None else (_torch or torch_classes()).size(shape)
    stride = local.stride() if stride is None else tuple(stride)
    return wrap(local, spec_of(mesh, placements, shape, stride, local.dtype))


def spec_of(mesh: Any, placements: Any, shape: Any, stride: tuple[int, ...], dtype: Any) -> Any:
    """The one spec of a global value so laid out (``shape`` a ``torch.Size``)."""
    key = (id(mesh), tuple(placements), shape, stride, dtype)
    spec = _specs.get(key)
    if spec is None or spec.mesh is not mesh:
        if len(_specs) > 4096:
            _specs.clear()
        classes = _torch or torch_classes()
        spec = _specs[key] = classes.spec(
            mesh, tuple(placements), tensor_meta=classes.meta(shape, stride, dtype)
        )
    return spec


def wrap(local: Any, spec: Any) -> Any:
    """``local`` as this rank's part of a DTensor of ``spec``."""
    classes = _torch or torch_classes()
    # DTensor.__new__ is torch's C constructor; DTensor(...) adds a decorated no-op __init__.
    return classes.new(classes.dtensor, local, spec, requires_grad=False)


_all_replicated: dict[int, tuple[Any, ...]] = {}


def replicated_on(ndim: int) -> tuple[Any, ...]:
    """``(Replicate(),) * ndim``, made once per ``ndim``."""
    found = _all_replicated.get(ndim)
    if found is None:
        found = _all_replicated[ndim] = ((_torch or torch_classes()).replicate(),) * ndim
    return found


def size_of(shape: Any) -> Any:
    """``torch.Size(shape)``."""
    return (_torch or torch_classes()).size(shape)


def dtensor_class() -> Any:
    return (_torch or torch_classes()).dtensor


UNKNOWN = object()


class OutSpecs:
    """A shard route's output spec by its inputs' specs (and the op's other arguments), found
    once: working it out again (placement objects, shapes, a spec lookup) costs several times
    the local op on small tensors, and the engine reuses specs, so a training loop's op meets
    the same ones every step. Keyed by the specs' identity, each kept alive by its entry so that
    no other spec takes its id. ``None`` is kept too: the op does not qualify."""

    __slots__ = ("table",)

    def __init__(self) -> None:
        self.table: dict[Any, tuple[tuple[Any, ...], Any]] = {}

    def get(self, specs: tuple[Any, ...], extra: Any = None) -> Any:
        """The spec found for these inputs, None, or ``UNKNOWN``."""
        found = self.table.get((tuple(map(id, specs)), extra))
        if found is None:
            return UNKNOWN
        for kept, spec in zip(found[0], specs, strict=True):
            if kept is not spec:
                return UNKNOWN
        return found[1]

    def put(self, specs: tuple[Any, ...], extra: Any, out: Any) -> Any:
        if len(self.table) > 4096:
            self.table.clear()
        self.table[(tuple(map(id, specs)), extra)] = (specs, out)
        return out


def plain_spec(spec: Any) -> bool:
    """Only Shard and Replicate placements (no Partial, no strided shards)."""
    from torch.distributed.tensor import Replicate, Shard

    return all(type(p) is Shard or type(p) is Replicate for p in spec.placements)


# id(spec) -> (spec, this rank's local shape and global offset): DTensor computes them in Python
# (tens of µs), and a training loop's loss asks for the same spec every step.
_blocks: dict[int, tuple[Any, Any]] = {}


def local_layout(spec: Any) -> Any:
    """This rank's local shape and global offset of a value laid out as ``spec`` (cached)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    found = _blocks.get(id(spec))
    if found is None or found[0] is not spec:
        if len(_blocks) > 4096:
            _blocks.clear()
        found = _blocks[id(spec)] = (spec, compute_local_shape_and_global_offset(
            spec.shape, spec.mesh, spec.placements))  # fmt: skip
    return found[1]


_SUM: Any = None


def partial_sum() -> Any:
    """``Partial("sum")``, made once."""
    global _SUM
    if _SUM is None:
        from torch.distributed.tensor import Partial

        _SUM = Partial("sum")
    return _SUM

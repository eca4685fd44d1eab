"""PyTorch Monarch's tensor-engine style: ``with procs.activate():`` and per-rank tensors.

Inside ``activate()`` the torch factories (``torch.rand``, ``zeros``, ``arange``, ...) make
per-rank MeshTensors: each rank runs the factory itself, so ``torch.rand(3, 4)`` differs by
rank. Elementwise ops stay per rank; ``t.reduce(dims, "sum")`` is the collective over mesh
dimensions; ``rank(procs, "dp")`` is each rank's coordinate as a tensor. ``no_mesh.activate()``
(or ``with no_mesh:``) turns factories back into ordinary controller tensors for a block.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

from .. import compat
from ..wire.ops import issue_site
from .constants import snapshot
from .mesh import TensorMesh, tensor_mesh
from .tensor import MeshTensor, new_mesh_tensor

_FACTORIES = {
    torch.rand: "rand", torch.randn: "randn", torch.randint: "randint", torch.zeros: "zeros",
    torch.ones: "ones", torch.full: "full", torch.empty: "empty", torch.arange: "arange",
    torch.eye: "eye", torch.linspace: "linspace", torch.tensor: "tensor",
}  # fmt: skip

_local = threading.local()


def _stack() -> list[TensorMesh | None]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def active_mesh() -> TensorMesh | None:
    """The mesh of the innermost ``activate()`` on this thread (``None`` under ``no_mesh``)."""
    stack = _stack()
    return stack[-1] if stack else None


class _FactoryMode(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = _FACTORIES.get(func)
        tm = active_mesh()
        if name is None or tm is None or kwargs.get("device") == "meta":
            return func(*args, **kwargs)
        return factory(tm, name, func, args, kwargs)


def factory(tm: TensorMesh, name: str, func: Any, args: Any, kwargs: dict[str, Any]) -> MeshTensor:
    """A per-rank MeshTensor: every rank runs ``torch.<name>(*args, **kwargs)`` itself, on its
    own device (its GPU, else the CPU): a ``device=`` argument names the mesh's devices, as in
    Monarch, so a program written for GPUs (``device="cuda"``) also runs on a CPU mesh."""
    if any(isinstance(a, MeshTensor) for a in args):
        raise compat.MeshUsageError(f"torch.{name} under activate() takes controller values")
    if kwargs.get("generator") is not None:
        raise compat.MeshUsageError(
            f"torch.{name}(generator=...) under activate(): a controller generator cannot be "
            "used on the ranks; seed them with a remote function instead"
        )
    kwargs = {k: v for k, v in kwargs.items() if k != "device"}
    args, kwargs = tree_map(snapshot, (args, kwargs))
    meta = func(*args, **kwargs, device="meta")  # the shape and dtype, here
    out = new_mesh_tensor(tm, meta.shape, meta.dtype, per_rank=True)
    meta_out = ((tuple(meta.shape), meta.dtype, True),)
    tm.stream.record(("factory", (out.value_id,), (), meta_out, (name, args, kwargs), issue_site()))
    return out


@contextlib.contextmanager
def activate(mesh: Any) -> Iterator[TensorMesh]:
    """Make ``mesh`` the current mesh of this thread: torch factories give per-rank MeshTensors."""
    tm = tensor_mesh(mesh, "activate")
    stack = _stack()
    stack.append(tm)
    try:
        with _FactoryMode():
            yield tm
    finally:
        stack.pop()


class _NoMesh:
    """``no_mesh``: inside ``with no_mesh.activate():`` (or ``with no_mesh:``) factories make
    ordinary controller tensors again, even within an ``activate()`` block."""

    @contextlib.contextmanager
    def activate(self) -> Iterator[None]:
        stack = _stack()
        stack.append(None)
        try:
            yield
        finally:
            stack.pop()

    def __enter__(self) -> None:
        self._cm = self.activate()
        self._cm.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._cm.__exit__(*exc)

    def __repr__(self) -> str:
        return "no_mesh"


no_mesh = _NoMesh()


def rank(mesh: Any, dims: str | tuple[str, ...]) -> MeshTensor:
    """Each rank's coordinate along ``dims`` (row-major over several) as a per-rank int64 scalar."""
    tm = tensor_mesh(mesh, "rank")
    dims = tm.check_dims(dims, "rank")
    out = new_mesh_tensor(tm, (), torch.int64, per_rank=True)
    meta = (((), torch.int64, True),)
    tm.stream.record(("rank", (out.value_id,), (), meta, (dims, tm.view_id), issue_site()))
    return out

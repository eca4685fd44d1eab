"""The tensor layer's late-bound calls, bound in one place. ``install()`` (which
``actormesh/tensor/__init__.py`` calls) gives

- MeshTensor the methods that live in the modules built on it (``tensor.Methods``: those modules
  import ``tensor.py``, so it cannot import them), and
- the runtime what it calls up into this layer (``TensorLayer`` of
  ``runtime/meshes/tensor_seam.py``: ``procs.activate()``, ``procs.rank(dims)``,
  ``endpoint.rref(...)``; the runtime never imports this layer), and
- ``torch.optim`` its hooks that make MeshTensor parameters' steps foreach (``optim.py``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from .. import compat
from . import activate, fetch, optim, recording, reduce, rref, transfer
from .tensor import Methods, install_methods


class _ForTheRuntime:
    """The runtime's ``TensorLayer``: each method is the tensor layer's function of that name."""

    def activate(self, procs: compat.ProcMesh) -> AbstractContextManager[Any]:
        return activate.activate(procs)

    def rank(self, procs: compat.ProcMesh, dims: str | tuple[str, ...]) -> Any:
        return activate.rank(procs, dims)

    def rref(
        self, actor_key: str, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        return rref.rref(actor_key, endpoint, args, kwargs)


def _to_mesh(t: Any, mesh: Any, sharding_spec: Any, placements: Any) -> Any:
    return transfer.to_mesh(t, mesh, sharding_spec, placements=placements)


def install() -> None:
    install_methods(
        Methods(
            dispatch=recording.dispatch,
            get=fetch.get,
            fetch_value=fetch.fetch_value,
            reduce=reduce.reduce,
            to_mesh=_to_mesh,
        )
    )
    layer: compat.TensorLayer = _ForTheRuntime()
    compat.install_tensor_layer(layer)
    optim.install()

"""The one seam between the runtime and the tensor layer above it (``actormesh.tensor``), as
Monarch's ``tensor_engine_shim.py`` is for its actor layer: every call the runtime makes up into
the tensor layer goes through :class:`TensorLayer`, whose one implementation the tensor layer
installs when it is imported (``tensor/controller/seams.py``).

==========================  ======================================================================
``ProcMesh.activate()``     ``TensorLayer.activate(procs)``: ``with procs.activate():``
``ProcMesh.rank(dims)``     ``TensorLayer.rank(procs, dims)``
``Endpoint.rref(...)``      ``TensorLayer.rref(actor_key, endpoint, args, kwargs)``
==========================  ======================================================================

The runtime never imports ``actormesh.tensor`` (tests/unit/test_layers.py), and ``import
actormesh`` does not import torch: the ``actormesh`` namespace tells this module how to load the
tensor layer on first use (``load_with``). The other way, the tensor layer reaches the runtime
through ``tensor/compat.py`` alone.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from ...errors import MeshUsageError

if TYPE_CHECKING:
    from .proc_mesh import ProcMesh


class TensorLayer(Protocol):
    """What the runtime asks of the tensor layer (implemented in ``tensor/controller/seams.py``)."""

    def activate(self, procs: ProcMesh) -> AbstractContextManager[Any]:
        """Torch factories make per-rank MeshTensors on ``procs`` inside the block."""
        ...

    def rank(self, procs: ProcMesh, dims: str | tuple[str, ...]) -> Any:
        """Each rank's coordinate along ``dims``, as a per-rank MeshTensor."""
        ...

    def rref(
        self, actor_key: str, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Endpoint ``endpoint`` of actor mesh ``actor_key`` as a step of the tensor stream."""
        ...


_layer: TensorLayer | None = None
_load: Callable[[], object] | None = None


def install(layer: TensorLayer) -> None:
    """The tensor layer's implementation (it calls this as it is imported)."""
    global _layer
    _layer = layer


def load_with(load: Callable[[], object]) -> None:
    """``load()`` imports the tensor layer, which then installs itself (``actormesh`` sets it)."""
    global _load
    _load = load


def tensor_layer(what: str) -> TensorLayer:
    """The tensor layer, imported first if need be; ``what`` names the caller for the error
    when there is none."""
    if _layer is None and _load is not None:
        _load()
    if _layer is None:
        raise MeshUsageError(f"{what} needs the tensor layer: import actormesh.tensor first")
    return _layer

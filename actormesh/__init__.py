"""actormesh: a single-controller actor runtime for interactive distributed PyTorch.

```python
import actormesh as am

class Counter(am.Actor):
    def __init__(self, start): self.value = start
    @am.endpoint
    def incr(self, by=1): self.value += by
    @am.endpoint
    def get(self): return self.value

procs = am.this_host().spawn_procs(per_host={"gpus": 4})
counters = procs.spawn("counter", Counter, 10)
counters.incr.broadcast()
print(counters.get.call().get())
procs.stop().get()
```
"""

from __future__ import annotations

import copyreg as _copyreg
import importlib as _importlib
import logging as _logging
import sys as _sys
import types as _types
from collections.abc import Callable as _Callable

from .errors import ActorError as ActorError
from .errors import ActorSupervisionError as ActorSupervisionError
from .errors import MeshClosedError as MeshClosedError
from .errors import MeshError as MeshError
from .errors import MeshFailure as MeshFailure
from .errors import MeshTimeoutError as MeshTimeoutError
from .errors import MeshUsageError as MeshUsageError
from .errors import SupervisionError as SupervisionError
from .hosts import SlurmJob as SlurmJob
from .hosts import listen_for_hosts as listen_for_hosts
from .hosts import wait_for_hosts as wait_for_hosts
from .runtime.actors import Actor as Actor
from .runtime.actors import Context as Context
from .runtime.actors import Future as Future
from .runtime.actors import concurrent_endpoint as concurrent_endpoint
from .runtime.actors import context as context
from .runtime.actors import current_actor_name as current_actor_name
from .runtime.actors import current_rank as current_rank
from .runtime.actors import current_size as current_size
from .runtime.actors import endpoint as endpoint
from .runtime.dataplane import TensorBuffer as TensorBuffer
from .runtime.dataplane import destroy_process_group as destroy_process_group
from .runtime.dataplane import init_process_group as init_process_group
from .runtime.extent import Extent as Extent
from .runtime.extent import Point as Point
from .runtime.faults import FaultHook as _FaultHook
from .runtime.faults import current_fault_hook as _current_fault_hook
from .runtime.faults import set_fault_hook as _set_fault_hook
from .runtime.meshes import Accumulator as Accumulator
from .runtime.meshes import ActorMesh as ActorMesh
from .runtime.meshes import Channel as Channel
from .runtime.meshes import Endpoint as Endpoint
from .runtime.meshes import Port as Port
from .runtime.meshes import PortReceiver as PortReceiver
from .runtime.meshes import ProcMesh as ProcMesh
from .runtime.meshes import ValueMesh as ValueMesh
from .runtime.meshes import as_endpoint as as_endpoint
from .runtime.meshes import send as send
from .runtime.meshes.tensor_seam import load_with as _load_tensor_layer_with
from .runtime.messaging import log_metrics as log_metrics
from .runtime.procs import HostMesh as HostMesh
from .runtime.procs import get_or_spawn_controller as get_or_spawn_controller
from .runtime.procs import shutdown_context as shutdown_context
from .runtime.procs import this_host as this_host
from .runtime.procs import this_proc as this_proc

__version__ = "0.1.0"

# The tensor layer imports torch (a second or more), which most actor programs never need: its
# names resolve on first use (PEP 562), so ``import actormesh`` stays light.
_TENSOR_NAMES = frozenset(
    {"FaultTolerant", "MeshTensor", "Stream", "call_on_shard_and_fetch", "distribute", "fetch",
     "get_active_stream", "grad_generator", "inspect", "module_to_mesh", "no_mesh", "remote",
     "show", "to_mesh"}
)  # fmt: skip

__all__ = [
    "Accumulator",
    "Actor",
    "ActorError",
    "ActorMesh",
    "ActorSupervisionError",
    "Channel",
    "Context",
    "Endpoint",
    "Extent",
    "FaultTolerant",
    "Future",
    "HostMesh",
    "MeshClosedError",
    "MeshError",
    "MeshFailure",
    "MeshTensor",
    "MeshTimeoutError",
    "MeshUsageError",
    "Point",
    "Port",
    "PortReceiver",
    "ProcMesh",
    "SlurmJob",
    "Stream",
    "SupervisionError",
    "TensorBuffer",
    "ValueMesh",
    "as_endpoint",
    "call_on_shard_and_fetch",
    "checkpoint",
    "concurrent_endpoint",
    "context",
    "current_actor_name",
    "current_rank",
    "current_size",
    "destroy_process_group",
    "distribute",
    "endpoint",
    "fetch",
    "get_active_stream",
    "get_or_spawn_controller",
    "grad_generator",
    "init_process_group",
    "inspect",
    "listen_for_hosts",
    "log_metrics",
    "module_to_mesh",
    "no_mesh",
    "remote",
    "send",
    "show",
    "shutdown_context",
    "this_host",
    "this_proc",
    "to_mesh",
    "unhandled_fault_hook",
    "wait_for_hosts",
]

_logging.getLogger(__name__).addHandler(_logging.NullHandler())


class _Package(_types.ModuleType):
    """This package, with ``unhandled_fault_hook`` as Monarch has it: a module attribute that
    code replaces (``actormesh.unhandled_fault_hook = fn``). Reading it gives the hook in use;
    assigning it installs ``fn`` for every failure that no caller and no ``__supervise__``
    handled (``None`` or ``del`` restores the default)."""

    @property
    def unhandled_fault_hook(self) -> _FaultHook:
        return _current_fault_hook()

    @unhandled_fault_hook.setter
    def unhandled_fault_hook(self, hook: _FaultHook | None) -> None:
        _set_fault_hook(hook)

    @unhandled_fault_hook.deleter
    def unhandled_fault_hook(self) -> None:
        _set_fault_hook(None)


def _by_name(module: _Package) -> tuple[_Callable[[str], _Package], tuple[str]]:
    return (_importlib.import_module, (module.__name__,))  # type: ignore[return-value]


_sys.modules[__name__].__class__ = _Package
# Pickled by name as any module is (cloudpickle looks modules up by exact type).
_copyreg.pickle(_Package, _by_name)


def _load_tensor_layer() -> object:
    from . import tensor

    return tensor


# ProcMesh.activate(), ProcMesh.rank(dims) and endpoint.rref(...) are the tensor layer's: the
# runtime's seam (runtime/meshes/tensor_seam.py) imports it on first use through this.
_load_tensor_layer_with(_load_tensor_layer)


def __getattr__(name: str) -> object:
    if name == "checkpoint":  # a module of its own (am.checkpoint.save, like dcp.save)
        return _importlib.import_module(".checkpoint", __name__)
    if name in _TENSOR_NAMES:
        from . import tensor

        value = getattr(tensor, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'actormesh' has no attribute {name!r}")


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext actormesh``: the ``%%mesh`` magics and the debugger in any IPython (an IPython
    hook, not API)."""
    from .debugger import load_ipython_extension as load

    load(ipython)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where the built JupyterLab sidebar is, for ``jupyter labextension develop`` (a Jupyter
    hook, not API; ``pip install`` puts it in place by itself)."""
    return [{"src": "labextension", "dest": "actormesh"}]

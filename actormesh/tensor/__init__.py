"""Distributed tensors driven from the controller (issue 19).

```python
import torch, actormesh as am

procs = am.this_host().spawn_procs(per_host={"dp": 2, "tp": 2})
x = torch.randn(8, 8)
dt = am.distribute(x, procs, sharding_spec=["dp", None])   # a MeshTensor
r = dt @ dt.T                     # recorded and streamed; returns at once
print(r.shape, am.inspect(r))     # metadata is local; inspect is a sync point
```

Modules: ``proxy`` (MeshTensor), ``recording`` and ``shapes`` (ops into the stream, shapes
on the controller), ``stream`` (ids, batches, constants), ``engine`` and ``handlers`` (the
workers), ``fetch`` and ``fetch_worker`` (sync points, either side), ``module``
(``module_to_mesh``), ``remote`` (remote functions), ``activate`` (per-rank tensors, Monarch's
tensor engine style), ``side_effects`` (what a failed op poisons besides its outputs),
``local`` (the engines for code beside them on a worker: actors, ``%%mesh`` cells) and
``adopt`` (a cell's tensor as a MeshTensor).
"""

from __future__ import annotations

from .controller.activate import activate as activate
from .controller.activate import no_mesh as no_mesh
from .controller.activate import rank as rank
from .controller.adopt import adopt as adopt
from .controller.distribute import distribute as distribute
from .controller.distribute import rand as rand
from .controller.distribute import randn as randn
from .controller.fetch import fetch as fetch
from .controller.fetch import inspect as inspect
from .controller.fetch import live as live
from .controller.mesh import device_mesh as device_mesh
from .controller.module import MeshModule as MeshModule
from .controller.module import module_to_mesh as module_to_mesh
from .controller.remote import call_on_shard_and_fetch as call_on_shard_and_fetch
from .controller.remote import remote as remote
from .controller.seams import install as _install_seams
from .controller.stream import flush_all as flush_all
from .controller.tensor import MeshTensor as MeshTensor
from .wire.errors import RemoteTensorError as RemoteTensorError

# MeshTensor's methods that live in the modules built on it, and what the runtime calls up here.
_install_seams()

__all__ = [
    "MeshModule",
    "MeshTensor",
    "RemoteTensorError",
    "activate",
    "adopt",
    "call_on_shard_and_fetch",
    "device_mesh",
    "distribute",
    "fetch",
    "flush_all",
    "inspect",
    "live",
    "module_to_mesh",
    "no_mesh",
    "rand",
    "randn",
    "rank",
    "remote",
]

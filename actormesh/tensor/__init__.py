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

from .activate import activate as activate
from .activate import no_mesh as no_mesh
from .activate import rank as rank
from .adopt import adopt as adopt
from .errors import RemoteTensorError as RemoteTensorError
from .fetch import fetch as fetch
from .fetch import inspect as inspect
from .fetch import live as live
from .mesh import device_mesh as device_mesh
from .module import MeshModule as MeshModule
from .module import module_to_mesh as module_to_mesh
from .proxy import MeshTensor as MeshTensor
from .recording import dispatch as _dispatch  # noqa: F401  (installs MeshTensor's op recorder)
from .remote import call_on_shard_and_fetch as call_on_shard_and_fetch
from .remote import remote as remote
from .rref import rref as _rref  # noqa: F401  (installs endpoint.rref)
from .stream import flush_all as flush_all
from .tensor_api import distribute as distribute
from .tensor_api import rand as rand
from .tensor_api import randn as randn

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

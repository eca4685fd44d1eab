"""Meshes: proc, actor and value meshes, the adverbs of an endpoint, and gathering replies.

The face of ``runtime/meshes``: other layers import these names from here, never from its
modules (``tests/unit/test_faces.py``).

- ``ProcMesh`` (processes, one per rank; ``new_proc_mesh``), ``ActorMesh`` (an actor per rank;
  ``new_actor_mesh``), ``ValueMesh`` (a value per rank; ``new_value_mesh``); for tools:
  ``proc_table_of(mesh)``, ``actor_key(mesh)``, ``ProcTable`` (where the ranks live;
  ``note_move``: where a healed rank lives now, for copies of a table unpickled later);
  ``subset`` (some processes of a mesh, in a shape of their own).
- ``Endpoint`` and its adverbs, ``send``, ``as_endpoint``; ``Collector``, ``Gather`` (how
  replies are gathered, ``collect``); ``Relayer`` (fan-out through a host agent, ``relay``).
- ``Channel``, ``Port``, ``PortReceiver``, ``Accumulator`` (``ports``).
- ``tensor_seam``, public as a module: the one seam the tensor layer above fills
  (``TensorLayer``: ``ProcMesh.activate``, ``ProcMesh.rank``, ``Endpoint.rref``).
"""

from .actor_mesh import ActorMesh, actor_key, new_actor_mesh
from .arguments import message_readers, on_unsent, pickle_arguments
from .collect import Collector, Gather
from .display import value_cell
from .endpoint import Endpoint, as_endpoint, no_values, send
from .one_proc import one_proc_mesh
from .ports import Accumulator, Channel, Port, PortReceiver
from .proc_mesh import (
    ActorSpawn,
    MeshOwner,
    ProcMesh,
    new_proc_mesh,
    proc_table_of,
    subset,
    unrecorded,
)
from .proc_table import ProcTable, live_table, note_move
from .relay import Relayer
from .value_mesh import ValueMesh, new_value_mesh

__all__ = [
    "Accumulator",
    "ActorMesh",
    "ActorSpawn",
    "Channel",
    "Collector",
    "Endpoint",
    "Gather",
    "MeshOwner",
    "Port",
    "PortReceiver",
    "ProcMesh",
    "ProcTable",
    "Relayer",
    "ValueMesh",
    "actor_key",
    "as_endpoint",
    "live_table",
    "message_readers",
    "new_actor_mesh",
    "new_proc_mesh",
    "new_value_mesh",
    "no_values",
    "note_move",
    "on_unsent",
    "one_proc_mesh",
    "pickle_arguments",
    "proc_table_of",
    "send",
    "subset",
    "unrecorded",
    "value_cell",
]

"""The data plane: tensors between processes (``TensorBuffer``), process groups over meshes,
and torchrun-style scripts on a proc mesh.

The face of ``runtime/dataplane``: other layers import these names from here, never from its
modules (``tests/unit/test_faces.py``); ``spmd`` runs as ``python -m`` too, so the face leaves
it out and ``actormesh run`` imports it by name.

- ``TensorBuffer`` (``buffers``; the tensors a process lends: ``buffer_owner``, ``shm``).
- ``init_process_group``, ``destroy_process_group`` (``distributed``).
- ``SPMDActor``, ``setup_torch_elastic_env_async`` (``spmd_actor``), ``setup_torch_elastic_env``
  (``elastic_env``: torchrun's variables in every process of a mesh).
"""

from .buffers import TensorBuffer
from .distributed import destroy_process_group, init_process_group
from .elastic_env import setup_torch_elastic_env
from .spmd_actor import SPMDActor, setup_torch_elastic_env_async

__all__ = [
    "SPMDActor",
    "TensorBuffer",
    "destroy_process_group",
    "init_process_group",
    "setup_torch_elastic_env",
    "setup_torch_elastic_env_async",
]

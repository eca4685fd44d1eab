"""Processes: the controller, host meshes and the proc meshes they spawn, workers and agents.

The face of ``runtime/procs``: other layers import these names from here, never from its
modules (``tests/unit/test_faces.py``). The modules that run as ``python -m`` (``worker``,
``host_agent``, ``zygote``) are left out: importing the package must not import them (runpy
would warn), and whoever needs one imports it by name.

- ``Controller`` (this process's meshes, host agents, output; ``get_controller``,
  ``controller_if_started``, ``on_controller``, ``shutdown_context``).
- ``HostMesh``, ``this_host()``, ``this_proc()``, ``new_host_mesh``; ``AgentHandle`` (the
  controller's handle on a host agent); ``MeshRecord`` (a proc mesh as its controller sees it).
- ``get_or_spawn_controller`` (singletons), ``Sample`` (a rank's CPU and memory),
  ``visible_gpus``.
"""

from .agent_handle import AgentHandle
from .controller import (
    Controller,
    controller_if_started,
    get_controller,
    on_controller,
    shutdown_context,
)
from .host_mesh import HostMesh, new_host_mesh, this_host, this_proc
from .mesh_record import MeshRecord
from .osutil import visible_gpus
from .sampling import Sample
from .singletons import get_or_spawn_controller

__all__ = [
    "AgentHandle",
    "Controller",
    "HostMesh",
    "MeshRecord",
    "Sample",
    "controller_if_started",
    "get_controller",
    "get_or_spawn_controller",
    "new_host_mesh",
    "on_controller",
    "shutdown_context",
    "this_host",
    "this_proc",
    "visible_gpus",
]

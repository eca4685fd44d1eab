"""Monarch's ``monarch.spmd`` under actormesh: ``from actormesh.spmd import SPMDActor``.

``SPMDActor`` runs torchrun-style scripts on a proc mesh; ``setup_torch_elastic_env`` sets
torchrun's variables in every process so that actors can form a process group themselves.
Ranks follow Monarch's rules: the last mesh dimension is the local one.
"""

from __future__ import annotations

from .runtime.dataplane import SPMDActor as SPMDActor
from .runtime.dataplane import setup_torch_elastic_env as setup_torch_elastic_env
from .runtime.dataplane import setup_torch_elastic_env_async as setup_torch_elastic_env_async

__all__ = ["SPMDActor", "setup_torch_elastic_env", "setup_torch_elastic_env_async"]

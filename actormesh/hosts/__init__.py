"""Hosts other than the controller's: host agents started by Slurm or any other scheduler that
dial back to the controller, and the host meshes built from them."""

from __future__ import annotations

from .listener import HostListener as HostListener
from .listener import listen_for_hosts as listen_for_hosts
from .listener import wait_for_hosts as wait_for_hosts
from .listener import write_key_file as write_key_file
from .slurm import SlurmJob as SlurmJob

__all__ = ["HostListener", "SlurmJob", "listen_for_hosts", "wait_for_hosts", "write_key_file"]

"""Monarch's ``monarch.spmd``: ``SPMDActor``, which runs a torchrun-style script in each of
its actors' processes, and ``setup_torch_elastic_env_async``.

Monarch's SPMD-DDP example runs as written with the import line changed
(``from actormesh.spmd import SPMDActor``): spawn ``SPMDActor`` on a proc mesh, ask its first
actor for a rendezvous address (``get_host_port``), then ``main.call(addr, port, [script])``.
Ranks follow Monarch's rules (``rank_layout.monarch_layout``): the last mesh dimension is the
local one. ``actormesh run`` (``spmd.py``) is actormesh's own way: it also binds the store's
port without a race and stops the other ranks when one fails.
"""

from __future__ import annotations

import asyncio
import os
import runpy
import socket
import subprocess
import sys
from typing import Any

from ..actors import Actor, current_rank, endpoint
from ..meshes import ProcMesh
from ..shape import Shape
from .elastic_env import setup_torch_elastic_env
from .rank_layout import monarch_layout
from .script_runner import exit_code, leave_quietly, script_frames


class SPMDActor(Actor):
    """Sets torchrun's variables from this actor's place in its mesh and runs a training
    script (or command) in its process. See the module docs."""

    def __init__(self) -> None:
        point = current_rank()
        shape = Shape.from_extent(point.extent)
        self.layout = monarch_layout(shape)[point.rank]

    def _setup_env(self, master_addr: str, master_port: int) -> None:
        env = self.layout.env(master_addr, master_port)
        env.update(
            ROLE_RANK=str(self.layout.rank),
            ROLE_WORLD_SIZE=str(self.layout.world_size),
            ROLE_NAME="rank",
        )
        os.environ.update(env)

    @endpoint
    def get_host_port(self, use_ipaddr: Any = None) -> tuple[str, int]:
        """An address of this host and a port free now, for the rendezvous: the host's name,
        or with ``use_ipaddr`` (``"ipv4"``, ``"ipv6"``) its address of that family. A host
        name that does not resolve here gives 127.0.0.1 (ranks on one host only)."""
        host = socket.gethostname()
        family = {"ipv4": socket.AF_INET, "ipv6": socket.AF_INET6}.get(
            str(getattr(use_ipaddr, "value", use_ipaddr)).lower()
        )
        try:
            infos = socket.getaddrinfo(host, None, family or socket.AF_UNSPEC)
            if family is not None:
                host = str(infos[0][4][0])
        except OSError:
            host = "127.0.0.1"
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = int(s.getsockname()[1])
        return host, port

    @endpoint
    def setup_env(self, master_addr: str, master_port: int) -> None:
        """Set torchrun's variables in this process."""
        self._setup_env(master_addr, master_port)

    @endpoint
    def main(self, master_addr: str, master_port: int, script_args: list[str]) -> bool:
        """Set torchrun's variables and run ``script_args`` (a script and its arguments, or
        ``["-m", module, ...]``) as ``__main__`` here; True once it ended. ``sys.exit(0)``
        ends it normally; another status is a failure."""
        self._setup_env(master_addr, master_port)
        if not script_args:
            raise ValueError("no script or module to run")
        workspace = os.environ.get("WORKSPACE_DIR")
        if workspace and os.path.isdir(workspace):
            os.chdir(workspace)
        code = 0
        try:
            if script_args[0] == "-m":
                sys.argv = list(script_args[1:])
                runpy.run_module(script_args[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(script_args)
                sys.path.insert(0, os.path.dirname(os.path.abspath(script_args[0])))
                runpy.run_path(script_args[0], run_name="__main__")
        except SystemExit as exc:
            code = exit_code(exc)
        except BaseException as exc:
            raise exc.with_traceback(script_frames(exc.__traceback__)) from None
        if code != 0:
            raise RuntimeError(f"{script_args[0]} exited with status {code}")
        leave_quietly()  # a second script in this process can form its own group
        return True

    @endpoint
    def run_command(self, entrypoint: str, args: list[str], env: dict[str, str]) -> bool:
        """Run ``entrypoint args...`` here with ``env`` added (e.g. a whole torchrun command
        line per host); True when it exits with status 0, else ``CalledProcessError``."""
        os.environ.update(env)
        subprocess.run([entrypoint, *args], check=True)
        return True


async def setup_torch_elastic_env_async(
    proc_mesh: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: Any = None,
) -> None:
    """``setup_torch_elastic_env`` for async code: the wait happens off the event loop."""
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(
        None, setup_torch_elastic_env, proc_mesh, master_addr, master_port, use_ipaddr
    )

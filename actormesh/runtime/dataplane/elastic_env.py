"""Torchrun's environment for the ranks of a proc mesh: what each rank's variables are
(``torchrun_env``, pure), the rendezvous store rank 0's process serves on a port it bound
(``serve_store``), and Monarch's ``setup_torch_elastic_env``, which sets them in every process
so that actors form a process group themselves. ``actormesh run`` (``spmd.py``) and
``SPMDActor`` (``spmd_actor.py``) build on it; it is apart from ``spmd.py``, which runs as
``python -m``, so that the package's face can export it."""

from __future__ import annotations

import os
import uuid
from typing import Any

from ...errors import MeshUsageError
from ..actors import Future
from ..mesh_shape import view_shape
from ..meshes import ActorMesh, ProcMesh
from .distributed import (
    RENDEZVOUS_TIMEOUT,
    _DistSetup,
    helper_mesh,
    mesh_layout,
    rank0,
    single_host,
)
from .rank_layout import RankLayout, monarch_layout


def torchrun_env(
    member: RankLayout,
    master_addr: str,
    master_port: int,
    run_id: str,
    agent_store: bool = True,
    omp_threads: str | None = None,
) -> dict[str, str]:
    """The environment torchrun gives one worker (pure; see the module docstring)."""
    env = member.env(master_addr, master_port)
    env.update(
        {
            "ROLE_RANK": str(member.rank),
            "ROLE_NAME": "default",
            "ROLE_WORLD_SIZE": str(member.world_size),
            "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0",
            "TORCHELASTIC_RUN_ID": run_id,
            "TORCHELASTIC_USE_AGENT_STORE": str(agent_store),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get(
                "TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"
            ),
        }
    )
    if omp_threads is not None:
        env["OMP_NUM_THREADS"] = omp_threads
    return env


def omp_threads(per_host: int) -> str | None:
    if "OMP_NUM_THREADS" in os.environ:
        return os.environ["OMP_NUM_THREADS"]
    return "1" if per_host > 1 else None


def serve_store(
    mesh: ProcMesh, master_addr: str | None
) -> tuple[ActorMesh[Any], Future[tuple[str, int]]]:
    if master_addr is None and single_host(mesh):
        master_addr = "127.0.0.1"
    helpers = helper_mesh(mesh, "_spmd_store", _DistSetup)
    return helpers, rank0(helpers).serve_store.call_one(master_addr)


def torchrun_envs(
    mesh: ProcMesh, addr: str, port: int, run_id: str, omp: str | None
) -> list[dict[str, str]]:
    return [torchrun_env(m, addr, port, run_id, True, omp) for m in mesh_layout(mesh)]


def setup_torch_elastic_env(
    procs: ProcMesh,
    master_addr: str | None = None,
    master_port: int | None = None,
    use_ipaddr: Any = None,
) -> None:
    """Monarch's ``monarch.spmd.setup_torch_elastic_env``: set torchrun's variables in every
    process of ``procs``, so that its actors can call ``dist.init_process_group()`` themselves.
    Ranks follow Monarch's rules (``monarch_layout``: the last mesh dimension is the local one).

    Blocks until every process has them (at most ``RENDEZVOUS_TIMEOUT`` seconds). Without
    ``master_port``, rank 0's process serves the store on a port it bound (no race); with it,
    rank 0's ``init_process_group`` starts the store on that port, as in plain torch.
    ``use_ipaddr`` is accepted for Monarch's signature: the store's address is already one
    every rank can reach (``master_addr`` or rank 0's host).
    """
    if master_port is None:
        helpers, store = serve_store(procs, master_addr)
        addr, port = store.get(timeout=RENDEZVOUS_TIMEOUT)
        agent_store = True
    else:
        if master_addr is None and not single_host(procs):
            raise MeshUsageError("with master_port on several hosts, give master_addr too")
        helpers = helper_mesh(procs, "_spmd_env", _DistSetup)
        addr, port, agent_store = master_addr or "127.0.0.1", master_port, False
    run_id = uuid.uuid4().hex[:12]
    layout = monarch_layout(view_shape(procs))
    envs = [torchrun_env(m, addr, port, run_id, agent_store) for m in layout]
    helpers.set_env.call(envs).get(timeout=RENDEZVOUS_TIMEOUT)

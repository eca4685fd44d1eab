"""``SlurmJob``: hosts from a Slurm allocation. One ``sbatch`` job whose single step runs one
host agent per node (``srun --ntasks-per-node=1``); the agents dial back to this controller.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Sequence

from ..errors import MeshError, MeshUsageError
from ..runtime.procs import HostMesh
from .listener import listen_for_hosts


class SlurmJob:
    """A Slurm job of ``nodes`` nodes running actormesh host agents.

    ``SlurmJob(nodes=3).hosts()`` submits the job with ``sbatch`` (unless submitted already),
    waits until its agents have dialled in, and returns them as a ``HostMesh`` of extent
    ``{hosts: 3}``. The job key reaches the agents through the job's environment
    (``ACTORMESH_KEY``), never its command line. The job ends when the controller exits or
    ``cancel()`` is called (its agents kill their workers when the controller goes away).
    """

    def __init__(
        self,
        nodes: int,
        *,
        partition: str | None = None,
        time_limit: str | None = None,
        job_name: str = "actormesh",
        python: str | None = None,
        listen: str | None = None,
        output: str | None = None,
        sbatch_args: Sequence[str] = (),
        sbatch: str = "sbatch",
    ) -> None:
        if not isinstance(nodes, int) or nodes < 1:
            raise MeshUsageError(f"SlurmJob needs a positive number of nodes, got {nodes!r}")
        self.nodes = nodes
        self.partition = partition
        self.time_limit = time_limit
        self.job_name = job_name
        self.python = python or sys.executable
        self.listen = listen
        self.output = output
        self.sbatch_args = list(sbatch_args)
        self.sbatch = sbatch
        self.job_id: str | None = None

    def __repr__(self) -> str:
        return f"<SlurmJob {self.job_id or '(not submitted)'}: {self.nodes} nodes>"

    def command(self) -> list[str]:
        """The ``sbatch`` command line this job is submitted with."""
        listener = listen_for_hosts(self.listen)
        step = ["srun", "--ntasks-per-node=1", *listener.agent_command(self.python)]
        cmd = [self.sbatch, "--parsable", f"--nodes={self.nodes}", "--ntasks-per-node=1"]
        cmd.append(f"--job-name={self.job_name}")
        if self.partition:
            cmd.append(f"--partition={self.partition}")
        if self.time_limit:
            cmd.append(f"--time={self.time_limit}")
        if self.output:
            cmd.append(f"--output={self.output}")
        return [*cmd, *self.sbatch_args, "--wrap", shlex.join(step)]

    def submit(self) -> str:
        """Submit the job (once); returns its id."""
        if self.job_id is not None:
            return self.job_id
        listener = listen_for_hosts(self.listen)
        env = dict(os.environ, **listener.agent_env())
        try:
            done = subprocess.run(
                self.command(), env=env, capture_output=True, text=True, timeout=60, check=False
            )
        except FileNotFoundError as exc:
            raise MeshError(
                f"{self.sbatch!r} was not found: SlurmJob needs Slurm's client commands on PATH"
            ) from exc
        if done.returncode != 0:
            raise MeshError(f"sbatch failed ({done.returncode}): {done.stderr.strip()}")
        self.job_id = done.stdout.strip().split(";")[0]
        return self.job_id

    def hosts(self, timeout: float | None = None) -> HostMesh:
        """Submit (if needed) and wait for every node's agent; blocks at most ``timeout`` s."""
        job_id = self.submit()
        listener = listen_for_hosts(self.listen)
        return listener.wait_for_hosts(
            self.nodes, timeout, where=lambda info: info.get("slurm_job") == job_id
        )

    def cancel(self) -> None:
        """``scancel`` the job (its agents kill their workers and exit)."""
        if self.job_id is not None:
            subprocess.run(["scancel", self.job_id], capture_output=True, timeout=30, check=False)

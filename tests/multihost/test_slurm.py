"""SlurmJob against a real Slurm cluster (Debian's slurm-wlm) on the fake hosts: slurmctld on
h0, one slurmd on each of h1..h3. The job's srun starts one host agent per node; they dial back,
and a mesh runs on them. Skipped (with the reason) where Slurm is not installed; CI installs it
with scripts/slurm/install.sh."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakehosts import SCRIPTS, FakeNet
from support import wait_until

import actormesh as am

SLURM = SCRIPTS.parent / "slurm"
WAIT = 90


class Where(am.Actor):
    @am.endpoint
    def host(self) -> tuple[str, str | None]:
        import socket

        return socket.gethostname(), os.environ.get("SLURM_JOB_ID")


@pytest.fixture(scope="module")
def slurm_cluster(fake_net: FakeNet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    missing = [b for b in ("slurmctld", "slurmd", "munged", "sbatch") if shutil.which(b) is None]
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)}); run scripts/slurm/install.sh")
    # munged wants every directory above its socket searchable by all (pytest's are 0700).
    d = Path(tempfile.mkdtemp(prefix="am-slurm-"))
    d.chmod(0o711)
    up = subprocess.run(
        ["bash", str(SLURM / "up.sh"), fake_net.prefix, fake_net.subnet, str(d)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    try:
        assert up.returncode == 0, f"Slurm did not start: {up.stdout}{up.stderr}"
        yield str(d / "slurm.conf")
    finally:
        subprocess.run(["bash", str(SLURM / "down.sh"), str(d)], check=False, timeout=60)
        shutil.rmtree(d, ignore_errors=True)


def test_slurm_job_gives_hosts_and_a_mesh_runs_on_them(
    slurm_cluster: str, fake_net: FakeNet, listener: Any, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("SLURM_CONF", slurm_cluster)
    job = am.SlurmJob(nodes=3, output=str(tmp_path / "job-%j.out"), listen=listener.address)
    hosts = job.hosts(timeout=WAIT)
    try:
        assert hosts.extent == am.Extent(["hosts"], [3])
        procs = hosts.spawn_procs(per_host={"gpus": 2})
        where = procs.spawn("where", Where).host.call().get(timeout=WAIT)
        assert [name for name, _ in where.values()] == ["h1", "h1", "h2", "h2", "h3", "h3"]
        assert {job_id for _, job_id in where.values()} == {job.job_id}
        procs.stop().get(timeout=30)
    finally:
        for agent in hosts._agents:
            agent.close()

    # The agents exit, so the job step ends and nothing of ours is left on the nodes (only
    # slurmd, and possibly a slurmstepd finishing up).
    def only_slurmd_left() -> bool:
        for h in (1, 2, 3):
            for pid in fake_net.pids(h):
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"actormesh" in cmd:
                    return False
        return True

    wait_until(only_slurmd_left, 30, "the host agents and workers to exit on the Slurm nodes")
    job.cancel()

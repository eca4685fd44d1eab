"""A process's run directory: the 0700 folder under ``ACTORMESH_RUN_DIR`` that holds its ipc://
sockets. Each names its owner, so a later process removes those of owners that died without
removing theirs."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile

import psutil

from ... import config

_OWNER = "owner"  # in each run dir: host, pid and start time of the process it belongs to


def _identity(pid: int) -> str:
    return f"{socket.gethostname()} {pid} {psutil.Process(pid).create_time():.3f}"


def make_run_dir() -> str:
    """A new directory for this process's sockets (its owner removes it as it exits). First
    removes those of processes that died without removing theirs: a host agent killed outright
    (SIGKILL, the OOM killer) leaves its directory to the next actormesh process on the host."""
    sweep_run_dirs()
    path = tempfile.mkdtemp(prefix="am-", dir=config.RUN_DIR)
    with open(os.path.join(path, _OWNER), "w") as f:
        f.write(_identity(os.getpid()))
    return path


def sweep_run_dirs(root: str | None = None) -> list[str]:
    """Remove the run dirs in ``root`` whose owner is gone; returns them. Only dirs that name
    their owner, on this host (by name: a /tmp shared with other machines' pids is left
    alone), and whose process is not alive with the same start time (pids are reused)."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(root or config.RUN_DIR))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith("am-") or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            with open(os.path.join(entry.path, _OWNER)) as f:
                owner = f.read().split()
            host, pid = owner[0], int(owner[1])
        except (OSError, ValueError, IndexError):
            continue  # not written yet, someone else's, or made before owners were written
        if host != socket.gethostname():
            continue
        try:
            alive = _identity(pid).split() == owner
        except psutil.NoSuchProcess:
            alive = False
        except psutil.Error:  # not ours to judge
            alive = True
        if not alive:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed

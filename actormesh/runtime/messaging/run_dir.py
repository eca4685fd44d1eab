"""A process's run directory: the 0700 folder under ``ACTORMESH_RUN_DIR`` that holds its ipc://
sockets. Each names its owner, so a later process removes those of owners that died without
removing theirs.

Each process that uses the directory also leaves a note there of the prefix its shared-memory
files have (``/dev/shm/actormesh-<mailbox>-<pid>-*``): when the whole tree was killed (the OOM
killer, ``kill -9`` of the process group), nobody was left to remove those files, and the run
that removes the directory removes them too."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import tempfile

import psutil

from ... import config

_OWNER = "owner"  # in each run dir: host, pid and start time of the process it belongs to
_SHM_NOTE = "shm-"  # + "<mailbox hex>-<pid>": a process of the run dir with shared memory


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
            _remove_shared_memory(entry.path)
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed


def note_shared_memory(run_dir: str, mailbox: bytes) -> None:
    """Leave a note in ``run_dir`` of this process's shared-memory files (see the module
    docstring); nothing when the directory is gone or not writable."""
    with contextlib.suppress(OSError), open(_note(run_dir, mailbox.hex(), os.getpid()), "w"):
        pass


def forget_shared_memory(run_dir: str, mailbox_hex: str, pid: int) -> None:
    """Remove a process's note: it ended and its files were removed (by itself as it closed,
    or by its host agent as it reaped it)."""
    with contextlib.suppress(OSError):
        os.unlink(_note(run_dir, mailbox_hex, pid))


def _note(run_dir: str, mailbox_hex: str, pid: int) -> str:
    return os.path.join(run_dir, f"{_SHM_NOTE}{mailbox_hex}-{pid}")


def _remove_shared_memory(path: str) -> None:
    """Remove the shared-memory files the notes in a dead owner's run dir name, of processes
    that are gone (one still alive keeps its own)."""
    try:
        notes = [e.name for e in os.scandir(path) if e.name.startswith(_SHM_NOTE)]
    except OSError:
        return
    for note in notes:
        mailbox, _, pid = note[len(_SHM_NOTE) :].partition("-")
        if not pid.isdigit() or not all(c in "0123456789abcdef" for c in mailbox):
            continue
        if _running(int(pid)):
            continue
        remove_segments(mailbox, int(pid))


def remove_segments(mailbox_hex: str, pid: int | None = None) -> None:
    """The shared-memory files of a process (of every incarnation of its mailbox when ``pid``
    is None): its TensorBuffers' and its message lane's slots (buffer_owner.py and shm_lane.py
    name them)."""
    pattern = f"/dev/shm/actormesh-{mailbox_hex}-{pid if pid is not None else '*'}-*"
    for name in glob.glob(pattern):
        with contextlib.suppress(OSError):
            os.unlink(name)


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that may still use its files (not ended, nor a zombie: a
    tree killed at once leaves zombies until something reaps them)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # not ours to judge
        return True

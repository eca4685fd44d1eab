"""The shared-memory side of ``TensorBuffer`` (buffers.py): room in ``/dev/shm``, and readers'
mappings of owners' files, which must not outlive their use.

A reader maps an owner's file on its first read, and every handle of that buffer in the process
reads through the same mapping (mapping 256 MB costs about as much again as copying it). The
mapping outlives the last handle that used it by ``LINGER_S``, so that a handle which comes anew
with each call (the buffer passed as an argument) finds the file mapped. It goes after that, when
a read finds the file gone (the buffer was dropped), or when the owner dies: a mapping of a
deleted file keeps its memory, for as long as it exists.
"""

from __future__ import annotations

import mmap
import os
import stat
import threading
import time
from typing import Any

from ...errors import SupervisionError
from ..messaging import SHM_DIR, Message, current_node

# How long a mapping outlives the last handle that read through it (seconds).
LINGER_S = 0.5
# path -> the mapping of that file which every handle of its buffer in this process reads
# through (an owner's death unmaps its files: _Janitor)
_shared: dict[str, ShmMapping] = {}
_lock = threading.Lock()  # over _shared and each mapping's count of handles
_janitor_node: Any = None


class NoSpace(Exception):
    """``/dev/shm`` takes no new file for a buffer: no room (``advice`` says what helps), or no
    new name (the socket serves it)."""

    def __init__(self, text: str, advice: str = "") -> None:
        super().__init__(text)
        self.advice = advice


ROOM_ADVICE = "; a larger /dev/shm, e.g. docker run --shm-size, avoids this"


class Dropped(Exception):
    """The owner's file is gone: its buffer was dropped."""


class NotOurs(Exception):
    """The file at a buffer's name is not its owner's (see ``ShmMapping``)."""


def no_space(nbytes: int) -> str:
    try:
        st = os.statvfs(SHM_DIR)
        size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        room = f"{_mib(free)} free of {_mib(size)}"
    except OSError:
        room = "its size unknown"
    return f"{_mib(nbytes)} do not fit in {SHM_DIR} ({room})"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


class ShmMapping:
    """A reader's mapping of an owner's shared-memory file."""

    def __init__(self, path: str, nbytes: int, owner: bytes) -> None:
        import torch

        self.path = path
        # The name is public (``ls /dev/shm``): once the owner dropped the buffer, another local
        # user may make a file, or a link to one, under it. Reads would then return their bytes
        # and writes go into their file (or through the link). So: no link followed, and the
        # file must be this user's and as large as the buffer, as a lane slot's reader checks.
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise NotOurs(f"{path} cannot be opened ({exc.strerror})") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size < nbytes:
                raise NotOurs(
                    f"{path} is not the buffer's file: it belongs to uid {st.st_uid} (this job "
                    f"runs as {os.geteuid()}) and holds {st.st_size} bytes (the buffer "
                    f"{nbytes}); its owner dropped it, and someone made a file of that name"
                )
            self.inode = st.st_ino
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self.mm: mmap.mmap | None = mmap.mmap(fd, nbytes, flags=flags)
        finally:
            os.close(fd)
        self.view: Any = torch.frombuffer(self.mm, dtype=torch.uint8)
        self.owner = owner
        self.lock = threading.Lock()  # held while copying: the memory must stay mapped
        self.stale = False
        self.users = 0  # handles reading through it (under _lock)
        self.idle_since = 0.0  # when the last of them went

    def copy(self, other: Any, into_buffer: bool) -> None:
        with self.lock:
            if self.view is None:
                raise SupervisionError(
                    [], "the shared memory of a TensorBuffer is gone: its owner dropped it or died"
                )
            if into_buffer:
                self.view.copy_(other)
            else:
                other.copy_(self.view)
            if self.stale:  # the owner died while we copied
                self._unmap()

    def release(self, wait: bool = True) -> None:
        """Unmap (any thread); without ``wait``, a copy in progress unmaps when it ends."""
        if not self.lock.acquire(blocking=wait):
            self.stale = True
            return
        try:
            self._unmap()
        finally:
            self.lock.release()

    def _unmap(self) -> None:
        self.view = None  # the tensor's buffer export must go before the mapping can close
        if self.mm is not None:
            self.mm.close()
            self.mm = None


def mapping(path: str, nbytes: int, owner: bytes, held: ShmMapping | None) -> ShmMapping:
    """The mapping to read ``path`` through, for a handle that holds ``held`` (the mapping it
    read through before, or None). A mapping the handle did not hold counts it as a user until
    :func:`let_go`. Raises :class:`Dropped` when the file is gone, after unmapping it, and
    :class:`NotOurs` when another file (or a link) has its name."""
    try:
        inode: int | None = os.lstat(path).st_ino
    except FileNotFoundError:
        inode = None
    with _lock:
        m = _shared.get(path)
        if m is not None and (m.inode != inode or m.mm is None):
            _forget(m)  # dropped (and maybe made again under the same name), or its owner died
            m = None
        if inode is None:
            raise Dropped
        if m is None:
            try:
                m = ShmMapping(path, nbytes, owner)
            except FileNotFoundError:
                raise Dropped from None
            _shared[path] = m
            watch_deaths()
        if m is not held:
            m.users += 1
        return m


def let_go(m: ShmMapping, transport: Any) -> None:
    """A handle that read through ``m`` is garbage, or reads through another mapping now (any
    thread, also in a garbage collection under ``_lock``: the count is kept by the I/O thread)."""
    transport.call_soon(lambda: _let_go(m, transport))


def _let_go(m: ShmMapping, transport: Any) -> None:
    with _lock:
        m.users -= 1
        if m.users > 0:
            return
        m.idle_since = time.monotonic()
    transport.call_later(LINGER_S, lambda: _unmap_if_idle(m))


def _unmap_if_idle(m: ShmMapping) -> None:
    with _lock:
        # Not if a handle took it again meanwhile (a later timer looks once it lets go).
        if m.users <= 0 and time.monotonic() >= m.idle_since + LINGER_S:
            _forget(m)


def _forget(m: ShmMapping) -> None:
    # Under _lock. A copy through it may still run (a handle that looked just before): that
    # copy unmaps it as it ends.
    if _shared.get(m.path) is m:
        del _shared[m.path]
    m.release(wait=False)


class _Janitor:
    """A port that never receives: it is told of every death this process learns of, and
    unmaps the dead owner's files (the owner's host removes them; a mapping would keep their
    memory for as long as a reader holds a handle)."""

    def on_message(self, msg: Message) -> None:
        pass

    def on_death(self, mailbox: bytes, death: Any) -> bool:
        with _lock:
            for m in [m for m in _shared.values() if m.owner == mailbox]:
                _forget(m)  # without waiting for a copy: this is the I/O thread
        return False


def watch_deaths() -> None:
    global _janitor_node
    node = current_node()
    if _janitor_node is not node:  # once per process (per node, for tests that make several)
        _janitor_node = node
        node.open_port(_Janitor())

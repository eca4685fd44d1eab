"""The shared-memory side of ``TensorBuffer`` (buffers.py): room in ``/dev/shm``, and readers'
mappings of owners' files, which must not outlive their use.

A reader maps an owner's file on its first read through a handle and keeps the mapping with the
handle (mapping once per read costs about as much again as the copy). The mapping goes when
the handle is garbage, when a read finds the file gone (the buffer was dropped), or when the
owner dies: a mapping of a deleted file keeps its memory, for as long as it exists.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from typing import Any

from ...errors import SupervisionError
from ..messaging.codec import Message
from ..messaging.node import current_node

SHM_DIR = "/dev/shm"
# Every live reader mapping of this process, so that an owner's death unmaps its files.
mapped: weakref.WeakSet[ShmMapping] = weakref.WeakSet()
_janitor_node: Any = None


class NoSpace(Exception):
    pass


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

        fd = os.open(path, os.O_RDWR)
        try:
            self.inode = os.fstat(fd).st_ino
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self.mm: mmap.mmap | None = mmap.mmap(fd, nbytes, flags=flags)
        finally:
            os.close(fd)
        self.view: Any = torch.frombuffer(self.mm, dtype=torch.uint8)
        self.owner = owner
        self.lock = threading.Lock()  # held while copying: the memory must stay mapped
        self.stale = False

    def copy(self, other: Any, into_buffer: bool) -> None:
        with self.lock:
            if self.view is None:
                raise SupervisionError([], "the owner of a TensorBuffer died")
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


class _Janitor:
    """A port that never receives: it is told of every death this process learns of, and
    unmaps the dead owner's files (the owner's host removes them; a mapping would keep their
    memory for as long as a reader holds a handle)."""

    def on_message(self, msg: Message) -> None:
        pass

    def on_death(self, mailbox: bytes, death: Any) -> bool:
        for m in list(mapped):
            if m.owner == mailbox:
                m.release(wait=False)  # the I/O thread: never wait for a copy
        return False


def watch_deaths() -> None:
    global _janitor_node
    node = current_node()
    if _janitor_node is not node:  # once per process (per node, for tests that make several)
        _janitor_node = node
        node.open_port(_Janitor())

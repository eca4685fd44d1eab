"""Large tensors between processes of one host, through shared memory instead of the socket.

A message with out-of-band buffers (tensors of 64 KiB and more, see ``plain_pickle.py``) of up
to ``LANE_MAX`` in all, sent to one process on the same host, takes the *lane*: the sender
copies the buffers into a *slot*, a file in ``/dev/shm`` that it owns, and the message carries
only the slot's name (signed in its head, ``codec.py``). The receiver maps the slot once, copies
the buffers out into memory of its own and marks the slot free again, so the tensor it gets
is its own, as one read off the socket is. Two memory copies cost less than the socket's
(bench/RESULTS.md: a 1 MB argument or result then costs what raw pyzmq's zero-copy frame
does, against ~140 µs more before; 80 to 120 KiB ~50 µs less than as a frame).

A slot's first bytes say which of its readers have not read it yet, one byte each: the sender
sets them as it fills the slot, and each receiver clears its own once it has copied out (the
receiver of a cast knows its byte by its place among the message's destinations). A cast to
up to ``MAX_READERS`` processes of the host thus copies its tensors once. A sender keeps at
most ``POOL_BYTES`` of slots; when every one is still unread (a receiver that is busy with the
messages before), or ``/dev/shm`` has no room, the message goes over the socket as before.

A receiver that dies never reads: its sender clears its bytes when it learns of the death
(``forget_receiver``), as a receiver that drops a message unread clears its own (``discard``).
A healed rank reuses the dead one's mailbox, so a message for it may have its byte cleared by a
sender that learnt of the death late: each filling of a slot has a number, written in the slot
and carried by the message, and a reader that finds another number before or after copying
refuses the message (``LaneError``) rather than take another message's bytes.

Slot files are named like TensorBuffers' (``actormesh-<mailbox>-<pid>-lane<n>``), so what
removes a dead process's shared memory removes them too; their owner removes them as its
transport closes.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import struct
import threading
import time
from collections.abc import Collection, Sequence
from typing import Any

from .plain_pickle import OOB_THRESHOLD

logger = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
LANE_MIN = OOB_THRESHOLD  # bytes of buffers from which a message takes the lane: every buffer
# And up to which: at 16 MiB the copies gained nothing measurable over the socket
# (bench/RESULTS.md), and a pool of such slots would be large.
LANE_MAX = 8 << 20
POOL_BYTES = 64 << 20  # of slots per sending process
MAX_READERS = 64
# The slot's head: its unread bytes, one per reader, then the number of its current filling;
# then the buffers, each at a multiple of _ALIGN.
_FILLING = struct.Struct("<Q")
_FILLING_AT = MAX_READERS
_HEADER = 128
_ALIGN = 64
_ALL_READ = b"\0" * MAX_READERS  # the unread bytes of a free slot
_MIN_SLOT = 1 << 20
# The slot a message's buffers are in: its owner's process mailbox and pid, its number and size,
# and the number of the filling that holds them.
DESCRIPTOR = struct.Struct("<8sIIQQ")
_MAX_MAPPED = 64 << 20  # receiver: bytes of other processes' slots kept mapped
_RETRY_AFTER = 10.0  # seconds before asking a full /dev/shm for a slot again


class LaneError(Exception):
    """A lane message whose slot cannot be read (its sender died and its slots were removed)."""


class NoRoom(Exception):
    """``/dev/shm`` cannot hold a new file."""


def map_reserved(fd: int, path: str, nbytes: int) -> mmap.mmap:
    """The new shared-memory file ``path`` (open as ``fd``, which the caller closes), its
    ``nbytes`` reserved, then mapped: lane slots and TensorBuffers (``buffer_owner.py``) are
    made this way. Raises ``NoRoom`` when ``/dev/shm`` cannot hold it, any other ``OSError`` as
    it is; either way the file is removed."""
    try:
        # ftruncate alone reserves nothing: a page that tmpfs cannot supply later is a SIGBUS,
        # in the owner or in a reader.
        os.posix_fallocate(fd, 0, nbytes)
        return mmap.mmap(fd, nbytes)
    except OSError as exc:
        os.unlink(path)
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM):
            raise NoRoom from None
        raise


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) & ~(_ALIGN - 1)


def slot_path(mailbox: bytes, pid: int, slot: int) -> str:
    return f"{SHM_DIR}/actormesh-{mailbox.hex()}-{pid}-lane{slot}"


class _Slot:
    __slots__ = ("capacity", "filling", "index", "mm", "path", "readers")

    def __init__(self, index: int, path: str, capacity: int, mm: mmap.mmap) -> None:
        self.index = index
        self.path = path
        self.capacity = capacity
        self.mm = mm
        self.filling = 0
        self.readers: Sequence[bytes] = ()  # their mailboxes, by place


class SendLane:
    """The slots of one sending process (its transport's): ``put`` buffers in, get a descriptor."""

    def __init__(self, mailbox: bytes) -> None:
        self.mailbox = mailbox
        self.pid = os.getpid()
        self._slots: list[_Slot] = []
        self._next_index = 0
        self._bytes = 0
        self._lock = threading.Lock()
        self._refused_until = 0.0  # /dev/shm had no room: the socket until then
        self._closed = False

    def put(self, buffers: Sequence[Any], to: Sequence[bytes] = (b"",)) -> bytes | None:
        """Copy ``buffers`` into a free slot for the receivers whose mailboxes are ``to`` (in
        their places among the message's destinations) and return its descriptor, or ``None``
        when the message should go over the socket (too small or too large, too many readers,
        no free slot, a forked child: the slots are its parent's)."""
        try:
            views = [memoryview(b).cast("B") for b in buffers]
        except (TypeError, ValueError):  # not one contiguous run of bytes: ZeroMQ copes
            return None
        need = _HEADER
        for v in views:
            need += _aligned(v.nbytes)
        if not LANE_MIN <= need - _HEADER <= LANE_MAX or os.getpid() != self.pid:
            return None
        if len(to) > MAX_READERS:
            return None
        taken = self._take(need, to)
        if taken is None:
            return None
        slot, filling = taken
        mm = slot.mm
        at = _HEADER
        for v in views:
            n = v.nbytes
            mm[at : at + n] = v
            at += _aligned(n)
        return DESCRIPTOR.pack(self.mailbox, self.pid, slot.index, slot.capacity, filling)

    def _take(self, need: int, to: Sequence[bytes]) -> tuple[_Slot, int] | None:
        with self._lock:
            if self._closed:
                return None
            best: _Slot | None = None
            for slot in self._slots:  # the smallest free one that fits
                fits = need <= slot.capacity and slot.mm[:MAX_READERS] == _ALL_READ
                if fits and (best is None or slot.capacity < best.capacity):
                    best = slot
            if best is None:
                # Buffers of a power of two (the usual tensor) fill their slot's room exactly.
                capacity = _HEADER + max(_MIN_SLOT, 1 << (need - _HEADER - 1).bit_length())
                if self._bytes + capacity > POOL_BYTES or time.monotonic() < self._refused_until:
                    return None
                best = self._new_slot(self._next_index, capacity)
                if best is None:
                    self._refused_until = time.monotonic() + _RETRY_AFTER
                    return None
                self._next_index += 1
                self._slots.append(best)
                self._bytes += capacity
            # The number first: a reader of the slot's last filling that copies still will
            # find it changed, and refuse what it copied.
            best.filling += 1
            _FILLING.pack_into(best.mm, _FILLING_AT, best.filling)
            best.readers = to
            best.mm[: len(to)] = b"\1" * len(to)
            return best, best.filling

    def _new_slot(self, index: int, capacity: int) -> _Slot | None:
        path = slot_path(self.mailbox, self.pid, index)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        except OSError as exc:
            logger.debug("no shared-memory lane (%s): tensors go over the socket", exc)
            return None
        try:
            mm = map_reserved(fd, path, capacity)
        except NoRoom:
            return None
        except OSError as exc:
            logger.warning("no shared-memory lane: %s", exc)
            return None
        finally:
            os.close(fd)
        return _Slot(index, path, capacity, mm)

    def release(self, descriptor: bytes, first: int = 0) -> None:
        """Free the slot of a message that was not sent to its receivers from place ``first``
        on (a send that failed part of the way: those before it read the slot)."""
        _, _, index, _, filling = DESCRIPTOR.unpack(descriptor)
        with self._lock:
            for slot in self._slots:
                if slot.index == index and slot.filling == filling:
                    slot.mm[first:MAX_READERS] = _ALL_READ[first:]

    def forget_receiver(self, mailboxes: Collection[bytes]) -> None:
        """A receiver died (its inboxes' ``mailboxes``): what it has not read, it never will;
        its places are free."""
        with self._lock:
            for slot in self._slots:
                mm = slot.mm
                for place, reader in enumerate(slot.readers):
                    if reader in mailboxes and mm[place]:
                        mm[place] = 0

    def unread(self) -> int:
        """How many slots hold a message not read yet."""
        with self._lock:
            return sum(1 for s in self._slots if s.mm[:MAX_READERS] != _ALL_READ)

    def close(self, linger: float = 1.0) -> None:
        """Remove the slots, after giving receivers up to ``linger`` seconds to read what is
        still unread in them (a reply sent just before the process ends)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            slots, self._slots = self._slots, []
        if os.getpid() != self.pid:
            return  # a forked child's copy: the slots are its parent's
        deadline = time.monotonic() + linger
        while any(s.mm[:MAX_READERS] != _ALL_READ for s in slots) and time.monotonic() < deadline:
            time.sleep(0.001)  # a reader copies out within microseconds once it gets there
        for s in slots:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(s.path)
            s.mm.close()


# -- the receiving side (any thread that decodes a message) --------------------------------------


class _Mapping:
    __slots__ = ("mm", "owner")

    def __init__(self, mm: mmap.mmap, owner: bytes) -> None:
        self.mm = mm
        self.owner = owner


_mapped: dict[tuple[bytes, int, int], _Mapping] = {}
_mapped_bytes = [0]
_mapped_lock = threading.Lock()


def read(descriptor: bytes | memoryview, sizes: Sequence[int], reader: int = 0) -> list[Any]:
    """The buffers of a lane message, copied out of its slot into memory of this process, as
    its reader number ``reader``; once every reader has, the slot is free for its sender again.
    Raises ``LaneError`` when the slot is gone."""
    import numpy

    mailbox, pid, index, capacity, filling = DESCRIPTOR.unpack(descriptor)
    need = _HEADER + sum(_aligned(n) for n in sizes)
    if need > capacity:
        raise LaneError(f"buffers of {need} bytes do not fit their slot of {capacity}")
    if not 0 <= reader < MAX_READERS:
        raise LaneError(f"a slot has {MAX_READERS} readers at most, not reader {reader}")
    mm = _slot(mailbox, pid, index, capacity)
    _check_filling(mm, filling)
    out = []
    at = _HEADER
    for n in sizes:
        out.append(numpy.frombuffer(mm, dtype=numpy.uint8, count=n, offset=at).copy())
        at += _aligned(n)
    _check_filling(mm, filling)  # not filled again while this copied (see the docstring)
    # Read: the sender may fill the slot again. Python has no fence to put before this store;
    # on x86 stores never pass earlier loads, and elsewhere the copies' loads completed
    # long before (a copy of 64 KiB or more returned in between).
    mm[reader] = 0
    return out


def discard(descriptor: bytes | memoryview, reader: int) -> None:
    """Mark a lane message read without copying it out: its receiver drops it (it failed a
    check after its signature was found good). Quietly nothing when the slot is gone or was
    filled again."""
    mailbox, pid, index, capacity, filling = DESCRIPTOR.unpack(descriptor)
    if not 0 <= reader < MAX_READERS:
        return
    try:
        mm = _slot(mailbox, pid, index, capacity)
    except LaneError:
        return
    if _FILLING.unpack_from(mm, _FILLING_AT)[0] == filling:
        mm[reader] = 0


def _slot(mailbox: bytes, pid: int, index: int, capacity: int) -> mmap.mmap:
    """The mapping of a slot; held by the caller, so that a death forgetting the slot
    meanwhile does not unmap it under a copy."""
    key = (mailbox, pid, index)
    mapping = _mapped.get(key)
    if mapping is None or len(mapping.mm) != capacity:
        mapping = _map(key, capacity)
    return mapping.mm


def _check_filling(mm: mmap.mmap, filling: int) -> None:
    if _FILLING.unpack_from(mm, _FILLING_AT)[0] != filling:
        raise LaneError(
            "the shared memory of the message holds another message now: its sender took this "
            "one for lost (it learnt that its receiver died, and this process reuses the dead "
            "one's mailbox)"
        )


def _map(key: tuple[bytes, int, int], capacity: int) -> _Mapping:
    mailbox, pid, index = key
    path = slot_path(mailbox, pid, index)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError as exc:
        raise LaneError(f"the shared memory of the message is gone ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or st.st_size < capacity:
            raise LaneError(f"{path} is not a slot of this job's processes")
        mm = mmap.mmap(fd, capacity)
    finally:
        os.close(fd)
    mapping = _Mapping(mm, mailbox)
    with _mapped_lock:
        old = _mapped.pop(key, None)
        if old is not None:
            _mapped_bytes[0] -= len(old.mm)
        # Oldest first out: slots of processes long gone would otherwise keep their memory.
        while _mapped and _mapped_bytes[0] + capacity > _MAX_MAPPED:
            _mapped_bytes[0] -= len(_mapped.pop(next(iter(_mapped))).mm)
        _mapped[key] = mapping
        _mapped_bytes[0] += capacity
    return mapping


def forget_sender(mailbox: bytes) -> None:
    """Unmap the slots of a process that died (its host removes their files; a mapping would
    keep their memory). A copy in progress keeps its mapping until it ends."""
    with _mapped_lock:
        for key in [k for k, m in _mapped.items() if m.owner == mailbox]:
            _mapped_bytes[0] -= len(_mapped.pop(key).mm)

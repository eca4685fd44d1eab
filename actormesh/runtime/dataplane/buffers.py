"""``TensorBuffer``: a one-sided, picklable handle to a tensor owned by one process.

Whoever holds the handle can ``read_into(dst)`` and ``write_from(src)``; the data goes directly
between the owner and the holder, never through the controller.

- Same host: the owner's tensor is moved (once, when the buffer is made) into a shared-memory
  file under ``/dev/shm``, and the tensor object keeps working on that memory (its storage is
  swapped in place). The file's space is reserved first: a buffer that does not fit in
  ``/dev/shm`` is served over the socket instead (with a warning), never a SIGBUS later. A
  reader maps the file on its first read and copies with ``memcpy``; every handle of the
  buffer in that process shares the mapping, which outlives the last of them by half a second
  (a handle passed anew into each call finds it mapped) and goes then, when a read finds the
  buffer dropped, or when the owner dies (a mapping would otherwise keep the memory of a
  deleted file). See ``shm.py``.
- Other hosts (or ``transport="socket"`` to force it on one host): the reader asks the owner over
  the direct worker-to-worker ZeroMQ connection; the bytes travel as one zero-copy frame.
- CUDA tensors: a reader on the owner's GPU copies device to device through CUDA IPC; other
  readers go through the socket, staged through host memory (``cuda_buffers.py``). Either side
  of a copy may be a CPU or a CUDA tensor.

The owner's side (the tensors a process lends, its answers to holders) is ``buffer_owner.py``.
The owner keeps the buffer alive until ``drop()`` (or its process ends). A read of a dropped
buffer, from a dead owner, or into a destination of the wrong size or dtype is a clear error.
"""

from __future__ import annotations

import itertools
import os
import warnings
import weakref
from typing import TYPE_CHECKING, Any

from ...errors import MeshError, MeshUsageError, SupervisionError
from ..actors import Future, completed_future, set_exception, set_result
from ..messaging import Address, Message, current_node
from ..messaging.envelopes import BufDoneEnvelope
from ..messaging.protocol import BUF_CUDA, BUF_READ, BUF_WRITE
from . import cuda_buffers, shm
from .buffer_owner import (
    Owned,
    bytes_of,
    cleanup_owned,
    lend,
    move_to_shm,
    on_cuda,
    on_read,
    on_write,
    take_back,
)
from .shm import NoSpace, ShmMapping

if TYPE_CHECKING:
    import torch

_ids = itertools.count(1)


def _lendable(data: Any, transport: str) -> torch.Tensor:
    """``data`` as a tensor a ``TensorBuffer`` can lend over ``transport``, or the error that
    says why not."""
    if transport not in ("auto", "shm", "socket"):
        raise MeshUsageError(f"transport must be 'auto', 'shm' or 'socket', not {transport!r}")
    tensor = _as_tensor(data)
    if tensor.device.type not in ("cpu", "cuda"):
        raise MeshUsageError(
            f"TensorBuffer holds CPU or CUDA tensors; this one is on {tensor.device}"
        )
    if tensor.is_cuda and transport == "shm":
        raise MeshUsageError(
            "transport='shm' is for CPU tensors; a CUDA tensor's readers on its GPU use "
            "CUDA IPC ('auto'), others the socket"
        )
    if not tensor.is_contiguous():
        raise MeshUsageError("TensorBuffer needs a contiguous tensor; call .contiguous()")
    return tensor


def _as_tensor(data: Any) -> torch.Tensor:
    import torch

    if isinstance(data, torch.Tensor):
        return data
    if isinstance(data, memoryview):
        return torch.frombuffer(data.cast("B"), dtype=torch.uint8)
    raise MeshUsageError(f"TensorBuffer needs a tensor or a memoryview, got {type(data).__name__}")


class TensorBuffer:
    """A handle to a contiguous tensor (CPU or CUDA) or writable memoryview of this process.

    ``TensorBuffer(t)`` registers ``t`` (same-host readers of a CPU tensor will see it through
    shared memory: ``t`` keeps its values and stays usable, now backed by a shared-memory file;
    a CUDA tensor stays where it is). Pickle the handle into a call or a port; the holder calls
    ``read_into(dst)`` / ``write_from(src)``, which return futures (a CPU buffer on the same
    host: already complete when returned, the copy is done).
    """

    def __init__(self, data: Any, transport: str = "auto") -> None:
        tensor = _lendable(data, transport)
        node = current_node()
        self.buffer_id = next(_ids)
        self.owner: Address = node.address
        self.nbytes = tensor.numel() * tensor.element_size()
        self.dtype = str(tensor.dtype).removeprefix("torch.")
        self.shape = tuple(tensor.shape)
        self.transport = transport
        self.path: str | None = None
        # The owner's GPU, by the name every process of the host shares; None for CPU tensors.
        self.gpu = cuda_buffers.gpu_name(tensor) if tensor.is_cuda else None
        mapping = None
        whole = tensor.storage_offset() == 0 and tensor.untyped_storage().nbytes() == self.nbytes
        if transport == "shm" and not whole:
            raise MeshUsageError(
                "a view of a larger tensor cannot move to shared memory without breaking its "
                "aliasing; pass the whole tensor, or transport='auto' to serve it over the socket"
            )
        if tensor.is_cuda:
            pass  # nothing moves: readers on its GPU open its memory, others are staged
        elif not whole:
            self.transport = "socket"  # reads then see the live view, through its owner
        elif transport != "socket" and self.nbytes > 0:
            try:
                self.path, mapping = move_to_shm(
                    tensor, node.address.mailbox.hex(), self.buffer_id, self.nbytes
                )
            except NoSpace as exc:
                if transport == "shm":
                    raise MeshError(f"TensorBuffer(transport='shm'): {exc}") from None
                warnings.warn(
                    f"TensorBuffer: {exc}; serving it over the socket instead (slower on one "
                    f"host{exc.advice})",
                    ResourceWarning,
                    stacklevel=2,
                )
                self.transport = "socket"
        self._map: ShmMapping | None = None  # the mapping this handle last read through
        self._let_go: weakref.finalize[Any, Any] | None = None  # counts it out of its users
        self.opened: torch.Tensor | None = None  # a holder's view of the owner's CUDA memory
        lend(self.buffer_id, Owned(tensor, self.path, mapping))
        if BUF_READ not in node.handlers:  # this process's first buffer
            node.register(BUF_READ, on_read)
            node.register(BUF_WRITE, on_write)
            node.register(BUF_CUDA, on_cuda)
            # The node closes last in both a worker and the controller: the files go with it.
            node.on_close(cleanup_owned)

    def __reduce__(self) -> tuple[Any, ...]:
        state = (self.buffer_id, self.owner, self.nbytes, self.dtype, self.shape, self.path)
        return (_restore, (state, self.transport, self.gpu))

    def __repr__(self) -> str:
        where = "" if self.gpu is None else f" on GPU {self.gpu}"
        return f"<TensorBuffer {self.dtype}{list(self.shape)} {self.nbytes} B{where}>"

    # -- the holder's side ------------------------------------------------------------------------

    def _check(self, other: torch.Tensor, verb: str) -> torch.Tensor:
        other = _as_tensor(other)
        if other.device.type not in ("cpu", "cuda") or not other.is_contiguous():
            raise MeshUsageError(f"{verb} needs a contiguous CPU or CUDA tensor")
        size = other.numel() * other.element_size()
        if size != self.nbytes or str(other.dtype).removeprefix("torch.") != self.dtype:
            raise MeshUsageError(
                f"{verb}: the buffer holds {self.dtype}{list(self.shape)} ({self.nbytes} bytes), "
                f"the tensor given is {other.dtype}{list(other.shape)} ({size} bytes)"
            )
        death = current_node().dead.get(self.owner.mailbox)
        if death is not None:
            raise SupervisionError([death], f"the owner of {self!r} is dead")
        return other

    def _local(self) -> bool:
        return (
            self.transport != "socket"
            and self.path is not None
            and self.owner.host == current_node().address.host
        )

    def _through_ipc(self) -> bool:
        """A CUDA buffer whose GPU this process sees, on the owner's host: device to device."""
        here = current_node().address
        return (
            self.gpu is not None
            and self.transport != "socket"
            and self.owner.host == here.host
            and self.owner != here  # the owner itself copies through the socket path's staging
            and cuda_buffers.device_index(self.gpu) is not None
        )

    def _cuda_copy(self, tensor: torch.Tensor, read: bool) -> Future[None]:
        """Ask the owner to finish its work on the device (and, the first time, for a handle),
        then copy between ``tensor`` and the owner's memory."""
        want_handle = self.opened is None
        return self._ask(_IpcCopy(self, tensor, read), BUF_CUDA, (want_handle,))

    def _ask(
        self, answer: _OwnerAnswer, kind: str, fields: tuple[Any, ...], frames: Any = ()
    ) -> Future[None]:
        """Send ``kind`` to the owner with a port for its BUF_DONE, which ``answer`` handles."""
        node = current_node()
        port = node.open_port(answer)
        answer.close = lambda: node.close_port(port)
        reply = (tuple(port.address), port.port_id)
        node.send(self.owner, (kind, self.buffer_id, reply, *fields), b"", list(frames))
        return answer.done

    def read_into(self, dst: Any) -> Future[None]:
        """Copy the buffer's bytes into ``dst`` (same size and dtype)."""
        dst = self._check(dst, "read_into")
        if self.nbytes == 0:
            return completed_future(None)
        if self._through_ipc():
            return self._cuda_copy(dst, read=True)
        if self._local():
            self._mapping().copy(bytes_of(dst), into_buffer=False)
            return completed_future(None)
        return self._remote(BUF_READ, dst)

    def write_from(self, src: Any) -> Future[None]:
        """Copy ``src`` (same size and dtype) into the buffer: the owner's tensor changes."""
        src = self._check(src, "write_from")
        if self.nbytes == 0:
            return completed_future(None)
        if self._through_ipc():
            return self._cuda_copy(src, read=False)
        if self._local():
            self._mapping().copy(bytes_of(src), into_buffer=True)
            return completed_future(None)
        return self._remote(BUF_WRITE, src)

    def drop(self) -> None:
        """Owner only: forget the buffer and free its shared memory (readers then fail)."""
        owned = take_back(self.buffer_id)
        if owned is None:
            raise MeshUsageError("drop() is for the process that made the buffer (once)")
        if owned.path is not None:
            os.unlink(owned.path)

    def _mapping(self) -> ShmMapping:
        """The mapping of the owner's file to read through (shared by the buffer's handles in
        this process); a dropped buffer (its file gone) is an error."""
        assert self.path is not None
        held = self._map
        try:
            m = shm.mapping(self.path, self.nbytes, self.owner.mailbox, held)
        except shm.Dropped:
            raise MeshError(f"{self!r} was dropped by its owner") from None
        except shm.NotOurs as exc:
            raise MeshError(
                f"{self!r} was dropped by its owner, and its shared-memory name now holds "
                f"something else, which is neither read nor written: {exc}"
            ) from None
        if m is not held:
            if self._let_go is not None:
                self._let_go()  # the mapping it held before
            self._map = m
            self._let_go = weakref.finalize(self, shm.let_go, m, current_node().transport)
        return m

    def _remote(self, kind: str, tensor: torch.Tensor) -> Future[None]:
        answer = _RemoteCopy(self, tensor)
        if kind == BUF_READ:
            return self._ask(answer, BUF_READ, ())
        staged = bytes_of(tensor).cpu()  # a no-op for a CPU tensor
        return self._ask(answer, BUF_WRITE, (), [staged.numpy()])


class _OwnerAnswer:
    """Waits for the owner's BUF_DONE on a port of its own; the owner's death fails it."""

    def __init__(self, buf: TensorBuffer, tensor: Any) -> None:
        self.buf = buf
        self.tensor = tensor
        self.done: Future[None] = Future(lambda: f"the owner of {buf!r} to answer")
        self.close: Any = None

    def on_message(self, msg: Message) -> None:
        self.close()
        done = BufDoneEnvelope.of(msg)
        if not done.ok:
            set_exception(self.done, MeshError(done.error))
            return
        self.answered(msg)

    def answered(self, msg: Message) -> None:
        raise NotImplementedError

    def on_death(self, mailbox: bytes, death: Any) -> bool:
        if mailbox != self.buf.owner.mailbox:
            return False
        self.close()
        set_exception(self.done, SupervisionError([death], "the owner of a TensorBuffer died"))
        return True


class _RemoteCopy(_OwnerAnswer):
    def answered(self, msg: Message) -> None:
        if msg.buffers:  # a read: the bytes came as one frame
            import torch

            bytes_of(self.tensor).copy_(torch.frombuffer(msg.buffers[0], dtype=torch.uint8))
        set_result(self.done, None)


class _IpcCopy(_OwnerAnswer):
    """The owner's go-ahead (with a handle, the first time) arrives: the copy runs, here."""

    def __init__(self, buf: TensorBuffer, tensor: Any, read: bool) -> None:
        super().__init__(buf, tensor)
        self.read = read

    def answered(self, msg: Message) -> None:
        try:
            if msg.buffers:
                assert self.buf.gpu is not None
                index = cuda_buffers.device_index(self.buf.gpu)
                assert index is not None
                self.buf.opened = cuda_buffers.open_handle(bytes(msg.buffers[0]), index)
            remote = self.buf.opened
            assert remote is not None
            if self.read:
                cuda_buffers.copy_and_wait(bytes_of(self.tensor), bytes_of(remote))
            else:
                cuda_buffers.copy_and_wait(bytes_of(remote), bytes_of(self.tensor))
        except Exception as exc:
            set_exception(self.done, MeshError(f"a CUDA IPC copy of {self.buf!r} failed: {exc}"))
            return
        set_result(self.done, None)


def _restore(state: tuple[Any, ...], transport: str, gpu: str | None = None) -> TensorBuffer:
    buf = object.__new__(TensorBuffer)
    buf.buffer_id, buf.owner, buf.nbytes, buf.dtype, buf.shape, buf.path = state
    buf.transport = transport
    buf.gpu = gpu
    buf._map = None
    buf._let_go = None
    buf.opened = None
    return buf

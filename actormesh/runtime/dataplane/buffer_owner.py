"""The owner's side of ``TensorBuffer``: the tensors this process lends, by buffer id, moved into
shared-memory files when same-host readers can map them, and the answers to holders' reads,
writes and CUDA fences. Handlers run on the I/O thread (a read's frame is sent zero-copy from
the tensor's memory); CUDA work runs off it. The files go when a buffer is dropped or the node
closes; the host agent removes those of a process that died (same name pattern).
"""

from __future__ import annotations

import mmap
import os
import secrets
import threading
from typing import TYPE_CHECKING, Any

from ..messaging import SHM_DIR, Address, Message, NoRoom, current_node, map_reserved
from ..messaging.envelopes import BufCudaEnvelope, BufReadEnvelope
from ..messaging.protocol import BUF_DONE, ReplyTo
from . import cuda_buffers
from .shm import ROOM_ADVICE, NoSpace, no_space

if TYPE_CHECKING:
    import torch

_owned: dict[int, Owned] = {}
_owned_lock = threading.Lock()


class Owned:
    """The owner's side of a buffer: the tensor and its shared-memory file."""

    def __init__(self, tensor: torch.Tensor, path: str | None, mapping: mmap.mmap | None):
        self.tensor = tensor
        self.path = path
        self.mapping = mapping


def lend(buffer_id: int, owned: Owned) -> None:
    with _owned_lock:
        _owned[buffer_id] = owned


def take_back(buffer_id: int) -> Owned | None:
    """Forget a buffer (its ``drop()``); None if this process does not own it (any more)."""
    with _owned_lock:
        return _owned.pop(buffer_id, None)


def bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).view(__import__("torch").uint8)


def move_to_shm(
    tensor: torch.Tensor, owner: str, buffer_id: int, nbytes: int
) -> tuple[str, mmap.mmap]:
    """Move ``tensor``'s bytes into a new shared-memory file; the tensor keeps working, on that
    memory. Raises ``NoSpace`` (nothing left behind) when ``/dev/shm`` cannot hold it, or no
    file of a new name could be made there."""
    import torch

    fd, path = _new_file(owner, buffer_id)
    try:
        mapping = map_reserved(fd, path, nbytes)
    except NoRoom:
        raise NoSpace(no_space(nbytes), ROOM_ADVICE) from None
    finally:
        os.close(fd)
    shared = torch.frombuffer(mapping, dtype=torch.uint8)
    shared.copy_(bytes_of(tensor))
    with torch.no_grad():  # swap the storage in place: the owner's tensor now lives in shm
        typed = shared.view(tensor.dtype).view(tensor.shape)
        tensor.set_(typed.untyped_storage(), 0, tensor.shape, tensor.stride())
    return path, mapping


def _new_file(owner: str, buffer_id: int) -> tuple[int, str]:
    """A new file of this process in ``/dev/shm``, open, and its path. The name starts as every
    file of the process does (``actormesh-<mailbox>-<pid>-``: what removes a dead process's
    files finds it) and ends in a random part: names that another local user could guess
    (``ls /dev/shm`` shows the rest) and make first would refuse the buffer."""
    for _ in range(_TRIES):
        path = os.path.join(
            SHM_DIR, f"actormesh-{owner}-{os.getpid()}-{buffer_id}.{secrets.token_hex(6)}"
        )
        try:
            return os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW, 0o600), path
        except FileExistsError:
            continue
        except OSError as exc:
            raise NoSpace(f"no file can be made in {SHM_DIR} ({exc.strerror})") from None
    raise NoSpace(f"{_TRIES} new names in {SHM_DIR} were all taken")


_TRIES = 3


def _reply(reply: tuple[Any, ...], ok: bool, text: str, buffers: list[Any]) -> None:
    to = ReplyTo.read(reply)
    current_node().send(Address(*to.address), (BUF_DONE, to.port_id, ok, text), b"", buffers)


def _requested(msg: Message) -> tuple[Owned | None, tuple[Any, ...]]:
    """The buffer a read, write or CUDA fence asks for; a dropped one is refused here, for all."""
    asked = BufReadEnvelope.of(msg)  # BUF_WRITE and BUF_CUDA start with the same two fields
    buffer_id, reply = asked.buffer_id, asked.reply
    with _owned_lock:
        owned = _owned.get(buffer_id)
    if owned is None:
        _reply(reply, False, "the TensorBuffer was dropped by its owner", [])
    return owned, reply


def on_read(msg: Message) -> None:
    # On the owner's I/O thread: the frame is sent zero-copy from the tensor's memory.
    owned, reply = _requested(msg)
    if owned is None:
        return
    tensor = owned.tensor
    if tensor.is_cuda:
        _on_cuda_thread(reply, lambda: [bytes_of(tensor).cpu().numpy()])
    else:
        _reply(reply, True, "", [bytes_of(tensor).numpy()])


def on_write(msg: Message) -> None:
    import torch

    owned, reply = _requested(msg)
    if owned is None:
        return
    dst, src = bytes_of(owned.tensor), torch.frombuffer(msg.buffers[0], dtype=torch.uint8)
    if dst.is_cuda:

        def copy() -> list[Any]:
            cuda_buffers.copy_and_wait(dst, src)
            return []

        _on_cuda_thread(reply, copy)
    else:
        dst.copy_(src)
        _reply(reply, True, "", [])


def on_cuda(msg: Message) -> None:
    owned, reply = _requested(msg)
    if owned is None:
        return
    want_handle = BufCudaEnvelope.of(msg).want_handle
    tensor = owned.tensor

    def ready() -> list[Any]:
        cuda_buffers.settle(tensor)
        return [cuda_buffers.ipc_handle(tensor)] if want_handle else []

    _on_cuda_thread(reply, ready)


def _on_cuda_thread(reply: tuple[Any, ...], work: Any) -> None:
    """Run ``work`` (it returns the reply's buffers) off the I/O thread, then answer."""

    def run() -> None:
        try:
            buffers = work()
        except Exception as exc:
            _reply(reply, False, f"the owner's CUDA copy failed: {type(exc).__name__}: {exc}", [])
            return
        _reply(reply, True, "", buffers)

    cuda_buffers.off_io(run)


def cleanup_owned() -> None:
    """Unlink this process's shared-memory files (when its node closes)."""
    with _owned_lock:
        owned = list(_owned.values())
        _owned.clear()
    for o in owned:
        if o.path is not None:
            try:
                os.unlink(o.path)
            except FileNotFoundError:
                pass

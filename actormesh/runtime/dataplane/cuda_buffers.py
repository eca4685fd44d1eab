"""The CUDA side of ``TensorBuffer``: torch's own IPC handles on one GPU, staging elsewhere.

A reader in another process on the same host that sees the owner's GPU copies device to device
through CUDA IPC: on its first copy it asks the owner for a handle (``reduce_tensor``, torch's
multiprocessing reduction, made fresh for each reader so torch's reference counting of shared
CUDA memory stays exact) and keeps the opened tensor for later copies. Before every copy the
owner finishes the work it issued on the device (``BUF_CUDA``), so a reader sees what the owner
computed, as a CPU buffer's reader does; the reader's copy is complete when its future is.

A reader on another host, or on a GPU the owner's cannot be opened from, goes through the
socket: the owner stages the bytes through host memory. GPU-to-GPU copies between different
GPUs of one host take that path too (one GPU per rank is what pinning gives; NCCL is the way to
move data between them at device speed).

The owner's CUDA work for readers (finishing the device's work, staging copies) runs on one
thread of its own, in arrival order, never on the I/O thread: a long kernel must not stall the
process's messages. The reader's copy runs on its I/O thread when the owner's answer arrives:
a device-to-device copy, about 0.7 ms per GiB on an H100.
"""

from __future__ import annotations

import functools
import pickle
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..procs import visible_gpus

if TYPE_CHECKING:
    import torch

_STORAGE_DEVICE = 6  # where rebuild_cuda_tensor's arguments name the device
_worker: ThreadPoolExecutor | None = None
_worker_lock = threading.Lock()


@functools.cache
def _visible() -> tuple[str, ...]:
    # Fixed for the life of the process once CUDA has started: read once, not per copy.
    return tuple(visible_gpus())


def gpu_name(tensor: torch.Tensor) -> str:
    """The GPU of ``tensor`` as ``CUDA_VISIBLE_DEVICES`` names it (the same on every process
    of the host, unlike the device index)."""
    index = tensor.device.index or 0
    gpus = _visible()
    return gpus[index] if index < len(gpus) else str(index)


def device_index(gpu: str) -> int | None:
    """This process's device index for the GPU named ``gpu``, or None if it cannot see it."""
    import torch

    gpus = _visible()
    if gpu not in gpus or not torch.cuda.is_available():
        return None
    return gpus.index(gpu)


def ipc_handle(tensor: torch.Tensor) -> bytes:
    """A fresh handle to ``tensor``'s memory for one reader process."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

    rebuild, args = reduce_tensor(tensor)  # type: ignore[no-untyped-call]  # torch's, untyped
    if rebuild is not rebuild_cuda_tensor:
        raise RuntimeError(f"torch shared a CUDA tensor through {rebuild.__name__}")
    return pickle.dumps(args)


def open_handle(blob: bytes, index: int) -> torch.Tensor:
    """The owner's tensor, opened in this process on its device ``index``."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    args = list(pickle.loads(blob))
    args[_STORAGE_DEVICE] = index  # the owner's index may name another GPU here
    tensor: torch.Tensor = rebuild_cuda_tensor(*args)  # type: ignore[no-untyped-call]
    return tensor


def copy_and_wait(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)``, returning when the copy is done (on whichever side is on a GPU)."""
    import torch

    dst.copy_(src)
    device = dst.device if dst.is_cuda else src.device
    torch.cuda.current_stream(device).synchronize()


def settle(tensor: torch.Tensor) -> None:
    """Wait for the work issued on ``tensor``'s GPU by this process."""
    import torch

    torch.cuda.synchronize(tensor.device)


def off_io(work: Callable[[], Any]) -> None:
    """Run ``work`` on this process's CUDA thread, after the work submitted before it."""
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = ThreadPoolExecutor(1, thread_name_prefix="actormesh-cuda-buffers")
        _worker.submit(work)

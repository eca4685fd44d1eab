"""A meshed model's gradients brought to its parameters' placements after each backward: one
``grad_sync`` op per model and backward (the data-parallel sum, bucketed on the ranks; a
reduce-scatter for sharded parameters: ``worker/module.py``), so that ``optimizer.step()`` runs
without collectives. ``grad_syncs_put_off`` holds them back over several backwards (a
pipeline's microbatches), as DDP's ``no_sync`` does.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from functools import partial
from typing import Any

import torch

from ..wire.ops import Ref, issue_site
from .mesh import TensorMesh
from .tensor import MeshTensor


def sync_after_backward(tm: TensorMesh, params: list[Any]) -> GradSync:
    """After each backward that reached ``params`` (a model's, on ``tm``), one ``grad_sync``
    op brings their gradients to the parameters' placements (``worker/module.py``). A
    post-accumulate hook per parameter queues it once per backward, to run as the backward
    ends (autograd's ``queue_callback``, as torch's DDP does): by then every gradient has
    accumulated. The model keeps what this returns; the hooks only refer to it weakly."""
    sync = GradSync(tm, params)
    ref = weakref.ref(sync)
    for p in sync.params():
        p.register_post_accumulate_grad_hook(partial(_queue_sync, ref))
    return sync


def _queue_sync(ref: weakref.ref[GradSync], _: Any) -> None:
    sync = ref()
    if sync is None or getattr(sync.queued, "value", False):
        return
    put_off = getattr(_put_off, "syncs", None)
    if put_off is not None:  # inside grad_syncs_put_off(): once, as the block ends
        put_off[id(sync)] = sync
        return
    sync.queued.value = True
    # torch's way to run code when the current backward pass ends (DDP and FSDP use it).
    torch.autograd.Variable._execution_engine.queue_callback(sync.record)  # noqa: SLF001


_put_off = threading.local()  # .syncs: the models whose grad_sync waits for the block's end


@contextlib.contextmanager
def grad_syncs_put_off() -> Iterator[None]:
    """Within the block, the ``grad_sync`` a backward queues for a model waits until the block
    ends, where each such model's runs once (as DDP's ``no_sync`` then a last backward): the
    backwards of several microbatches accumulate partial sums on each rank, and the gradients
    are summed over the data dimension once, not once per microbatch. The values are the same.
    Per thread, as a backward runs on the caller's thread; nested blocks end at the
    outermost."""
    outer = getattr(_put_off, "syncs", None)
    if outer is not None:
        yield
        return
    syncs: dict[int, GradSync] = {}
    _put_off.syncs = syncs
    try:
        yield
    finally:
        _put_off.syncs = None
        for sync in syncs.values():
            sync.record()


class GradSync:
    """The ``grad_sync`` op of one model. Holds its parameters weakly: a hook a tensor holds
    (in C++, where the garbage collector cannot see it) must not keep that tensor alive."""

    def __init__(self, tm: TensorMesh, params: list[Any]) -> None:
        self.tm = tm
        self.refs = [weakref.ref(p) for p in params]
        self.queued = threading.local()  # per thread: a backward runs on the caller's thread

    def params(self) -> list[Any]:
        return [p for p in (r() for r in self.refs) if p is not None]

    def record(self) -> None:
        self.queued.value = False
        pairs = [(p.grad, p) for p in self.params() if type(p.grad) is MeshTensor]
        if not pairs:
            return
        grads = tuple(g.value_id for g, _ in pairs)
        ins = (*grads, *(p.value_id for _, p in pairs))
        payload = (tuple((Ref(g.value_id), Ref(p.value_id)) for g, p in pairs),)
        meta = tuple((tuple(g.shape), g.dtype, False) for g, _ in pairs)
        self.tm.stream.record(("grad_sync", grads, ins, meta, payload, issue_site()))

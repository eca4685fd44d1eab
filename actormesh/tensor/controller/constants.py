"""Controller tensors as arguments of ops: each is sent to the workers once (a ``constant`` op)
and named by reference after that, until it changes in place; its copy is dropped when the
tensor is collected. A training loop's inputs and targets are sent once, not with every op.
A stream keeps what it uploaded in ``Stream.consts``.

A small tensor read by an op that writes none of its arguments is also found by its contents
(``Stream.pool``): a model's forward makes the same small tensors every step (Hugging Face's
GPT-2: positions, a mask, the fill values of a mask, 13 tensors of at most 64 elements), each a
new object, so each step sent them again, and each ``constant`` op cut the step's program in
two. A pooled copy stays on the workers while the pool keeps it (its ``POOL_SIZE`` most recently
used), whatever happens to the tensors that had its contents. Contents enter the pool the second
time they are seen (``Stream.pool_seen``): the first tensor with them gets a copy of its own,
dropped with it, so that contents that never come back (a training loop's random targets) are
not kept on the workers.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from ...errors import MeshUsageError
from ..wire.ops import Ref, issue_site
from .tensor import MeshTensor

if TYPE_CHECKING:
    from .stream import Stream


POOL_BYTES = 1024  # a tensor this small may be found by its contents
POOL_SIZE = 256  # copies a stream's pool keeps on the workers
SEEN_SIZE = 4 * POOL_SIZE  # contents seen once that the controller remembers (not the workers)


class Pool:
    """A stream's copies of small tensors' contents on the workers (``_pooled``)."""

    __slots__ = ("copies", "ids", "seen")

    def __init__(self) -> None:
        self.copies: OrderedDict[Any, int] = OrderedDict()  # least recently used first
        self.ids: set[int] = set()  # the copies' ids
        self.seen: OrderedDict[Any, None] = OrderedDict()  # contents seen once, not pooled


def _pool(stream: Stream) -> Pool:
    pool = stream.pool
    if pool is None:  # (made here: stream.py cannot import this module)
        pool = stream.pool = Pool()
    return pool


def upload(stream: Stream, x: Any, read_only: bool = False) -> int:
    """The id of the workers' copy of controller tensor ``x`` (an op's argument) on
    ``stream``'s mesh, uploaded with the first op that uses it and again only after ``x``
    changed in place. ``read_only``: the op writes none of its arguments, so a small ``x``
    may share the copy of another tensor with the same contents."""
    if x.is_meta:
        raise MeshUsageError(
            f"a tensor on the meta device {tuple(x.shape)} met a MeshTensor: it has no "
            "values to send. A module built by a factory is built on the meta device on "
            "the controller: register such a tensor as a buffer (it is then built on the "
            "ranks), or create it in forward"
        )
    key = id(x)
    entry = stream.consts.get(key)
    # Inference tensors have no version counter: those are sent with each op.
    version = None if x.is_inference() else x._version  # noqa: SLF001
    if entry is not None and entry[0]() is x:
        pooled = entry[2] in _pool(stream).ids
        # (an op that may write its arguments gets a copy of its own, never the pool's: the
        # pool's copy is read by every tensor with those contents)
        if entry[1] == version and (read_only or not pooled):
            return entry[2]
        if not pooled:
            stream.died(entry[2])  # dropped after the ops already buffered that read it
    small = read_only and x.layout is torch.strided and x.nbytes <= POOL_BYTES
    cid = _pooled(stream, x) if small else _sent(stream, x)
    if version is None:
        if cid not in _pool(stream).ids:
            stream.died(cid)
    else:  # (a pooled copy is not dropped with x: _gone)
        gone = partial(_gone, weakref.ref(stream), key, cid)
        stream.consts[key] = (weakref.ref(x, gone), version, cid)
    return cid


def as_refs(x: Any, stream: Stream, ins: list[int], read_only: bool) -> Any:
    """An op's argument ``x`` with each controller tensor in it as the ``Ref`` of its copy on
    the workers (appended to ``ins``); ``read_only``: the op writes none of its arguments."""
    if type(x) is list or type(x) is tuple:
        return type(x)(as_refs(e, stream, ins, read_only) for e in x)
    if isinstance(x, torch.Tensor) and type(x) is not MeshTensor:
        cid = upload(stream, x, read_only)
        ins.append(cid)
        return Ref(cid)
    return x


def snapshot(x: Any) -> Any:
    """``x`` as an op sends it: a controller tensor copied now (the op is pickled when its
    batch goes, and the caller may change the tensor in place before that, as an optimizer
    steps the model a mesh copy was made from); anything else as it is."""
    if isinstance(x, torch.Tensor) and type(x) is not MeshTensor:
        return x.detach().clone()
    return x


def _sent(stream: Stream, x: Any) -> int:
    """A new copy of ``x`` on the workers (a ``constant`` op): its id."""
    cid = stream.new_id()
    data = snapshot(x)
    meta = ((tuple(x.shape), x.dtype, True),)
    stream.record(("constant", (cid,), (), meta, (data,), issue_site()))
    return cid


def _pooled(stream: Stream, x: Any) -> int:
    """The pool's copy of ``x``'s contents (its bytes, dtype, shape and strides), sent now if
    the pool has none; the least recently used copy is dropped past ``POOL_SIZE``. Contents
    seen for the first time get a copy of their tensor's own (not the pool's)."""
    flat = x.detach().resolve_conj().resolve_neg().contiguous().view(-1)
    # (its bytes on the CPU: a tensor of a GPU mesh's device has no numpy view)
    data = flat.view(torch.uint8).cpu().numpy().tobytes()
    key = (x.dtype, tuple(x.shape), x.stride(), data)
    state = _pool(stream)
    pool = state.copies
    cid = pool.get(key)
    if cid is not None:
        pool.move_to_end(key)
        return cid
    seen = state.seen
    if key not in seen:
        seen[key] = None
        if len(seen) > SEEN_SIZE:
            seen.popitem(last=False)
        return _sent(stream, x)
    del seen[key]
    cid = pool[key] = _sent(stream, x)
    state.ids.add(cid)
    while len(pool) > POOL_SIZE:
        _, old = pool.popitem(last=False)
        state.ids.discard(old)
        for tensor_id, entry in list(stream.consts.items()):
            if entry[2] == old:  # (a tensor uploaded whole before, since found in the pool)
                del stream.consts[tensor_id]
        stream.died(old)
    return cid


def _gone(ref: weakref.ref[Stream], key: int, cid: int, _: Any) -> None:
    stream = ref()
    if stream is None:
        return
    entry = stream.consts.get(key)
    if entry is not None and entry[2] == cid:
        del stream.consts[key]
    if cid not in _pool(stream).ids:
        stream.died(cid)

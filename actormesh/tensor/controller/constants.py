"""Controller tensors as arguments of ops: each is sent to the workers once (a ``constant`` op)
and named by reference after that, until it changes in place; its copy is dropped when the
tensor is collected. A training loop's inputs and targets are sent once, not with every op.
A stream keeps what it uploaded in ``Stream.consts``.
"""

from __future__ import annotations

import weakref
from functools import partial
from typing import TYPE_CHECKING, Any

from ...errors import MeshUsageError
from ..wire.ops import issue_site

if TYPE_CHECKING:
    from .stream import Stream


def upload(stream: Stream, x: Any) -> int:
    """The id of the workers' copy of controller tensor ``x`` (an op's argument) on
    ``stream``'s mesh, uploaded with the first op that uses it and again only after ``x``
    changed in place."""
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
        if entry[1] == version:
            return entry[2]
        stream.died(entry[2])  # dropped after the ops already buffered that read it
    cid = stream.new_id()
    # A snapshot: the op is pickled later, and x may change in place before that.
    data = x.detach().clone()
    meta = ((tuple(x.shape), x.dtype, True),)
    stream.record(("constant", (cid,), (), meta, (data,), issue_site()))
    if version is None:
        stream.died(cid)
    else:
        gone = partial(_gone, weakref.ref(stream), key, cid)
        stream.consts[key] = (weakref.ref(x, gone), version, cid)
    return cid


def _gone(ref: weakref.ref[Stream], key: int, cid: int, _: Any) -> None:
    stream = ref()
    if stream is None:
        return
    entry = stream.consts.get(key)
    if entry is not None and entry[2] == cid:
        del stream.consts[key]
    stream.died(cid)

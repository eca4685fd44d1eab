"""PyTorch Monarch's streams and borrows (``Stream``, ``get_active_stream``, ``borrow``), as a
program written for them runs here.

Monarch runs each stream of a device on its own CUDA stream, so that a collective on a
``comms`` stream overlaps compute on ``main``; a *borrow* hands a tensor to another stream and
keeps the lender from touching it until ``borrow.drop()``, which rules out races. Each rank here
runs its tensor ops on one thread, one after the other, in the order the controller issued them
(gloo collectives block that thread anyway). So every stream is the one stream of its rank: a
program that uses streams computes what it computes under Monarch, in issue order, without the
overlap; a borrow cannot race, and hands out the tensor itself.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from .. import compat
from .tensor import MeshTensor

_local = threading.local()


class Stream:
    """A named stream of tensor ops (Monarch's ``monarch.Stream("comms")``); see the module's
    docstring for what it means here. ``with stream.activate():`` makes it the active one."""

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise compat.MeshUsageError(f"a Stream needs a non-empty name, got {name!r}")
        self.name = name

    @contextlib.contextmanager
    def activate(self) -> Iterator[Stream]:
        stack = _stack()
        stack.append(self)
        try:
            yield self
        finally:
            stack.pop()

    def borrow(self, t: Any, mutable: bool = False) -> tuple[Any, Borrow]:
        """``(tensor for this stream, borrow)``: here the tensor itself (one stream per rank,
        so nothing can race); ``borrow.drop()`` ends the borrow."""
        if not isinstance(t, MeshTensor):
            raise compat.MeshUsageError(
                f"{self!r}.borrow takes a MeshTensor, got {type(t).__name__}"
            )
        return t, Borrow(self, mutable)

    def __repr__(self) -> str:
        return f"Stream({self.name!r})"


class Borrow:
    """What ``Stream.borrow`` returns beside the tensor; ``drop()`` ends it (again: no effect)."""

    def __init__(self, stream: Stream, mutable: bool) -> None:
        self.stream = stream
        self.mutable = mutable
        self.dropped = False

    def drop(self) -> None:
        self.dropped = True

    def __repr__(self) -> str:
        state = "dropped" if self.dropped else "held"
        return f"<borrow to {self.stream!r}, mutable={self.mutable}, {state}>"


_MAIN = Stream("main")


def _stack() -> list[Stream]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def get_active_stream() -> Stream:
    """The stream of the innermost ``stream.activate()`` on this thread, else ``main``."""
    stack = _stack()
    return stack[-1] if stack else _MAIN

"""Ctrl-C held back while a message goes to every rank of a mesh (``held``).

An interrupt (Ctrl-C in a script, the kernel's interrupt button) raises ``KeyboardInterrupt`` in
the main thread between any two bytecodes: also after a batch of ops was taken out of the
stream's buffer and before it went, or between the per-process sends of one broadcast. The batch
would then reach no rank, or only some, and the ranks' values would differ without anyone being
told (issue 40: ``n=975014, values on ranks [973741, 974253]``).

So while a ``held()`` block runs on the main thread, SIGINT's handler only notes the interrupt;
the handler that was installed before runs as the block ends, and raises there: the user's
``KeyboardInterrupt`` comes once the message went to every rank (microseconds later, the time of
a send). A second interrupt inside the block (a send that blocks: ZeroMQ's queue for a rank is
full) goes through at once, so a stuck program can still be stopped; the block's caller then
treats what it was sending as lost (``Stream`` says the mesh's values are unusable).

Only SIGINT, only the main thread (no other thread gets it), and only when its handler was set
from Python (``signal.getsignal`` can give it back): otherwise the block runs as it is.
"""

from __future__ import annotations

import _signal  # signal's functions without its enum wrappers: 1 µs a block, not 20
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

_MAIN = threading.main_thread().ident
_SIGINT = int(_signal.SIGINT)


class _State:
    active = False  # a held() block runs (blocks nest: the outermost one holds)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Run the block with SIGINT held back (see the module docstring); any thread may use it,
    only the main thread's block holds anything."""
    if _State.active or threading.get_ident() != _MAIN:
        yield
        return
    previous = _signal.getsignal(_SIGINT)
    if not callable(previous):  # ignored, the default, or a handler set outside Python
        yield
        return
    caught: list[tuple[int, Any]] = []

    def hold(signum: int, frame: Any) -> None:
        if caught:  # the second one: the block is stuck, let this one through now
            caught.clear()
            previous(signum, frame)
        else:
            caught.append((signum, frame))

    _signal.signal(_SIGINT, hold)
    _State.active = True
    try:
        yield
    finally:
        _State.active = False
        _signal.signal(_SIGINT, previous)
        if caught:
            previous(*caught[0])  # usually raises KeyboardInterrupt, here, after the block

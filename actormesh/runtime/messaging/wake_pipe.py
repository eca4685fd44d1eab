"""``WakePipe``: how one thread wakes another that sleeps in ``poll()`` on sockets.

ZeroMQ sockets cannot be woken from another thread, so a thread that sleeps in ``poll()`` on
several of them (the I/O thread) also polls the read end of a pipe; a byte written to it ends
the sleep. Only wake-ups matter, not how many: a drain reads whatever accumulated at once. (A
thread that sleeps on one socket, an actor's or a waiting thread's reply inbox, sleeps in a
blocking receive instead, and is woken by an empty frame sent to that socket: see
``actor_inbox.py`` and ``reply_inbox.py``.)
"""

from __future__ import annotations

import os


class WakePipe:
    """A non-blocking pipe: ``wake()`` from any thread, ``drain()`` by the sleeper once woken.

    ``r`` is the file descriptor to poll. Callers on a hot path keep ``r`` (and the bound
    ``wake``) in attributes of their own, so a wake-up costs what the inline code cost.
    """

    __slots__ = ("r", "w")

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)

    def wake(self) -> None:
        try:
            os.write(self.w, b"x")
        except OSError:
            pass  # closed: the sleeper is gone

    def drain(self) -> None:
        try:
            os.read(self.r, 4096)
        except OSError:
            pass  # nothing left (another drain took it), or closed under a last wake-up

    def close(self) -> None:
        for fd in (self.r, self.w):
            try:
                os.close(fd)
            except OSError:
                pass

"""Where other engines' ``send`` ops deliver to this one: an engine's ``Inbox`` (worker side of
``MeshTensor.to_mesh``; transfer.py sends and assembles).

An inbox is a port of its process (``compat.open_port``): the I/O thread files each message by
its transfer key as it arrives, so a busy engine never holds them up, and a ``recv`` op takes
them when it runs. A sender in the same process puts its message here directly (``inboxes``).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..compat import open_port

inboxes: dict[int, Inbox] = {}  # this process's, by port id


class Inbox:
    """One engine's messages from other engines' ``send`` ops, by transfer key (a port handler:
    ``on_message`` runs on the I/O thread and only files the message)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.messages: dict[int, list[Any]] = {}
        self.dead: set[bytes] = set()
        self.port = open_port(self)
        inboxes[self.port.port_id] = self

    def on_message(self, msg: Any) -> None:
        self.put(msg.value())

    def put(self, message: tuple[Any, ...]) -> None:
        with self.cond:
            self.messages.setdefault(message[0], []).append(message)
            self.cond.notify_all()

    def on_death(self, mailbox: bytes, death: Any) -> bool:
        with self.cond:
            self.dead.add(mailbox)
            self.cond.notify_all()
        return False  # others waiting on that process hear of it too

    def take(self, key: int, count: int, senders: set[bytes], timeout: float) -> list[Any]:
        """The ``count`` messages of transfer ``key``; raise if one of ``senders`` (mailboxes)
        died first, or after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.messages.get(key, ())) < count:
                gone = senders & self.dead
                if gone:
                    raise RuntimeError(
                        f"a process of the sending mesh died before its part of this to_mesh "
                        f"came ({len(self.messages.get(key, ()))} of {count} messages arrived)"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"to_mesh waited {timeout:g} s for the sending mesh and got "
                        f"{len(self.messages.get(key, ()))} of {count} messages; is that mesh "
                        "blocked, or did its op stream stop?"
                    )
                self.cond.wait(left)
            return self.messages.pop(key)

"""Why a call timed out, when the ranks wait for each other: following "who waits on whom".

A rank whose actor is blocked in ``Future.get`` says on which ranks (``WAITS``, answered by its
I/O thread, so a blocked actor does not delay it). A call that times out asks the first rank it
still waits for, then the rank that one waits for, and so on for a few hops; a rank seen twice
is a cycle of blocking calls (A calls B, which calls A while A's actor is busy in the first
call): nothing will ever answer, and the timeout says so.
"""

from __future__ import annotations

import threading
from typing import Any

from ..messaging import Message, current_node
from ..messaging.protocol import WAITS
from .proc_table import live_table

HOPS = 4
ASK_TIMEOUT = 0.5  # per hop; a rank that cannot answer ends the walk


def describe_wait_chain(pending: list[tuple[str, int]]) -> str:
    """`` (rank {gpus=0} (a.first) waits for rank {gpus=1}, ...)``, or ``""`` when the first
    pending rank waits for nothing known."""
    if not pending:
        return ""
    current = pending[0]
    seen = [current]
    links: list[str] = []
    for _ in range(HOPS):
        waits = _ask(current)
        if not waits:
            break
        actor, endpoint, on = waits[0]
        if not on:
            break
        nxt = (str(on[0][0]), int(on[0][1]))
        links.append(f"rank {_label(current)} ({actor}.{endpoint}) waits for rank {_label(nxt)}")
        if nxt in seen:
            return (
                f" ({'; '.join(links)}: a cycle of blocking calls, each waiting for the other; "
                "none will answer until one is interrupted)"
            )
        seen.append(nxt)
        current = nxt
    return f" ({'; '.join(links)})" if links else ""


def _label(rank: tuple[str, int]) -> str:
    table = live_table(rank[0])
    if table is None or not 0 <= rank[1] < len(table.labels):
        return f"{rank[1]} of {rank[0]}"
    return f"{{{table.labels[rank[1]]}}}"


class _Answer:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None

    def on_message(self, msg: Message) -> None:
        try:
            self.value = msg.value()
        finally:
            self.done.set()

    def on_death(self, mailbox: bytes, death: Any) -> bool:
        return False


def _ask(rank: tuple[str, int]) -> list[Any]:
    table = live_table(rank[0])
    if table is None or not 0 <= rank[1] < len(table.addresses):
        return []
    node = current_node()
    address = table.addresses[rank[1]]
    if address.mailbox in node.dead:
        return []
    answer = _Answer()
    port = node.open_port(answer)
    try:
        node.send(address, (WAITS, (tuple(port.address), port.port_id)))
        answer.done.wait(ASK_TIMEOUT)
    finally:
        node.close_port(port)
    return list(answer.value or [])

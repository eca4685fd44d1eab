"""The reply inbox of the process's main thread (the one that makes calls and waits in scripts
and notebooks; other threads use the process inbox): made on its first call
(``thread_reply_inbox``), found by a wait (``waiting_inbox``), and watched by the I/O thread
again when a reply is to be awaited rather than waited for (``hand_back_replies``).
"""

from __future__ import annotations

import logging
import threading

from ..faults import add_main_waiter, remove_main_waiter
from .address import MAX_IPC_PATH
from .node import Node
from .reply_inbox import ReplyInbox

logger = logging.getLogger(__name__)

_main_inbox: ReplyInbox | None = None  # only the process's main thread has one


def thread_reply_inbox(node: Node) -> ReplyInbox | None:
    """The calling thread's reply inbox, if it gets one: the process's main thread does (it is
    the one that makes calls and waits in scripts and notebooks); other threads use the
    process inbox."""
    global _main_inbox
    inbox = _main_inbox
    if (
        inbox is not None
        and inbox.owner_ident == threading.get_ident()
        and inbox.node is node
        and not inbox.closed
    ):
        return inbox  # every call after the first: no Thread objects looked up
    current = threading.current_thread()
    ipc = node.address.ipc
    if current is not threading.main_thread() or ipc is None or len(ipc) > MAX_IPC_PATH:
        return None
    inbox = _main_inbox
    if inbox is None or inbox.node is not node or inbox.closed:
        try:
            inbox = _main_inbox = ReplyInbox(node, current)
        except ConnectionError:
            # The node is closing (its calls fail as they are sent), or its ipc:// path leaves
            # no room for the inbox's suffix: replies come to the process inbox.
            return None
        except OSError as exc:  # its socket did not bind: replies come to the process inbox
            logger.warning("no reply inbox for this thread: %s", exc)
            return None
        node.on_close(inbox.close)
        # In a script, an unhandled failure elsewhere wakes the wait (fail fast). Registered
        # for good rather than for each wait: a wake-up with nobody waiting is read, and acted
        # on, by the next wait.
        if add_main_waiter(inbox):
            node.on_close(lambda: remove_main_waiter(inbox))
    return inbox


def hand_back_replies() -> None:
    """See :meth:`ReplyInbox.hand_back` (the main thread's inbox, if there is one)."""
    inbox = _main_inbox
    if inbox is not None and not inbox.closed:
        inbox.hand_back()


def waiting_inbox() -> ReplyInbox | None:
    """The calling thread's reply inbox if it has one and is not already waiting on it."""
    inbox = _main_inbox
    if inbox is None or inbox.closed or inbox.waiting:
        return None
    if inbox.owner_ident != threading.get_ident():
        return None
    return inbox

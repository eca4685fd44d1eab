"""How an actor answers a call: ``send_reply``, and the port an
``@endpoint(explicit_response_port=True)`` method answers its call through."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from ...errors import MeshUsageError, RemoteFailure
from ..messaging import dumps, flush_output
from ..messaging.protocol import FAILED, OK, REPLY
from .failures import render_failure
from .runner_parts import Runner

if TYPE_CHECKING:
    from ..messaging import Port

logger = logging.getLogger(__name__)


class ResponsePort:
    """The port an ``@endpoint(explicit_response_port=True)`` method gets first: it answers
    the call once, with ``send(value)`` or ``exception(exc)``, from any thread of the actor's
    process (its answer reaches the caller as a returned value or a raised exception would)."""

    def __init__(self, runner: Runner, reply: Port | None, index: int | None, caller: Any):
        self._runner = runner
        self._reply = reply
        self._index = index
        self._caller = caller
        self._answered = False
        self._lock = threading.Lock()

    def send(self, value: Any) -> None:
        if not self.answer(OK, value):
            raise MeshUsageError("this response port already answered its call")

    def exception(self, exc: BaseException) -> None:
        failure = self._runner.failure_of(exc, "<response port>")
        if not self.answer(FAILED, failure):
            raise MeshUsageError("this response port already answered its call")

    def answer(self, status: int, value: Any) -> bool:
        """Send the answer unless one was sent; whether this one was. A failure sent where
        nobody waits (a broadcast) goes to the actor's owner."""
        if not self._claim():
            return False
        if not self._send(status, value) and status == FAILED:
            self._runner.report_unhandled(value)  # a broadcast: nobody waits
        return True

    def deliver(self, status: int, value: Any) -> bool:
        """Send the answer to the caller unless one was sent; whether a caller got it (a
        broadcast has none)."""
        return self._claim() and self._send(status, value)

    def _claim(self) -> bool:
        with self._lock:
            if self._answered:
                return False
            self._answered = True
            return True

    def _send(self, status: int, value: Any) -> bool:
        if self._reply is None or self._index is None:
            return False
        self._runner.reply(self._reply, self._index, status, value, self._caller)
        return True

    def __reduce__(self) -> Any:
        raise TypeError(
            "a response port answers from the actor's own process; send the value back to it "
            "instead of passing the port on"
        )


def send_reply(
    runner: Runner, port: Port, index: int, status: int, value: Any, caller: Any = None
) -> None:
    """Answer a call of ``runner``'s actor: ``value`` (or a rendered failure, ``status``) to
    ``port`` as the answer of point ``index``; ``caller``: see ``Node.in_order``."""
    flush_output()  # what the endpoint printed arrives before its reply
    try:
        payload, buffers = dumps(value)
    except BaseException as exc:
        # Even a KeyboardInterrupt raised by a __reduce__: the caller must get a reply.
        if isinstance(exc, SystemExit):
            raise
        failure = render_failure(exc, runner.rank, runner.name, "<reply>")
        failure = RemoteFailure(
            failure.rank,
            runner.name,
            failure.endpoint,
            failure.exc_type,
            f"the result ({type(value).__name__}) could not be pickled: "
            f"{failure.exc_type}: {failure.message}",
            failure.traceback,
        )
        status, (payload, buffers) = FAILED, dumps(failure)
    node = runner.node
    try:
        after = 0 if caller is None else node.transport.last_seq_to(caller)
        envelope: tuple[Any, ...] = (
            (REPLY, port.port_id, index, status, after)
            if after
            else (REPLY, port.port_id, index, status)
        )
        node.transport.send(port.address, envelope, payload, buffers, caller=caller)
    except Exception:
        logger.exception("could not send the reply of %s", runner.name)

"""The port an ``@endpoint(explicit_response_port=True)`` method answers its call through."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ...errors import MeshUsageError
from ..messaging.protocol import FAILED, OK

if TYPE_CHECKING:
    from ..messaging.node import Port
    from .runner import ActorRunner


class ResponsePort:
    """The port an ``@endpoint(explicit_response_port=True)`` method gets first: it answers
    the call once, with ``send(value)`` or ``exception(exc)``, from any thread of the actor's
    process (its answer reaches the caller as a returned value or a raised exception would)."""

    def __init__(self, runner: ActorRunner, reply: Port | None, index: int | None, caller: Any):
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
        """Send the answer unless one was sent; whether this one was."""
        with self._lock:
            if self._answered:
                return False
            self._answered = True
        if self._reply is not None and self._index is not None:
            self._runner._reply(self._reply, self._index, status, value, self._caller)  # noqa: SLF001  the actor's reply
        elif status == FAILED:
            self._runner._report_unhandled(value)  # noqa: SLF001  a broadcast: nobody waits
        return True

    def __reduce__(self) -> Any:
        raise TypeError(
            "a response port answers from the actor's own process; send the value back to it "
            "instead of passing the port on"
        )

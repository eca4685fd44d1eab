"""What the parts of an actor's runner see of it: ``Runner``, the ``ActorRunner`` (``runner.py``)
as ``lifecycle``, ``reentry``, ``ownership`` and ``response_port`` use it.

``stand_in`` (who reads its inbox while a long ``__init__`` runs) sees it so too.

``runner.py`` imports those parts, so they type their runner against this protocol rather than
the class: no import cycle, not even one for types only. mypy checks that ``ActorRunner`` is a
``Runner`` where the runner hands itself to its parts. The parts reach each other through the
runner, as the small protocols below.
"""

from __future__ import annotations

import asyncio
import threading
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Protocol

from ...errors import RemoteFailure
from ..extent import Point
from ..messaging import ActorInbox, Message, Node, Port


class LifecycleSteps(Protocol):
    """What the other parts ask of ``lifecycle.Lifecycle``."""

    def end(self, exc: BaseException) -> None: ...


class ReentrySteps(Protocol):
    """What the other parts ask of ``reentry.Reentry``."""

    def end_later(self, exc: BaseException, report: RemoteFailure | None) -> None: ...

    def cancel_all(self) -> None: ...


class OwnershipSteps(Protocol):
    """What the other parts ask of ``ownership.Ownership``."""

    def escalate(self, failure: Any) -> None: ...

    async def handle_at_await(self, failure: Any) -> None: ...

    def stop_children(self, timeout: float) -> None: ...


class Answer(Protocol):
    """An explicit response port (``response_port.ResponsePort``), as the runner answers it."""

    def answer(self, status: int, value: Any) -> bool: ...

    def deliver(self, status: int, value: Any) -> bool: ...


class Caller(NamedTuple):
    """Who waits for a call's answer and where it goes, kept while the call runs (a concurrent
    call's for as long as it awaits): ``ActorRunner.finish`` answers it."""

    endpoint: str  # the endpoint called
    reply: Port | None  # where the answer goes; None for a broadcast, or when ``answer`` does
    position: int | None  # this rank's index in the call's view
    after: bytes | None  # the reply field's ``after`` (protocol.ReplyTo)
    answer: Answer | None  # the explicit response port, for such an endpoint


class Runner(Protocol):
    """One actor's runner (``runner.ActorRunner``), as its parts see it."""

    # Who it is and where: set once, read by the parts.
    @property
    def node(self) -> Node: ...
    @property
    def key(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def rank(self) -> Point: ...
    @property
    def proc_rank(self) -> int: ...
    @property
    def pid(self) -> int: ...
    @property
    def forks_seen(self) -> int: ...
    @property
    def after(self) -> Runner | None: ...
    @property
    def constructed(self) -> threading.Event: ...
    @property
    def thread(self) -> threading.Thread: ...
    @property
    def inbox(self) -> ActorInbox: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def lifecycle(self) -> LifecycleSteps: ...
    @property
    def reentry(self) -> ReentrySteps: ...
    @property
    def ownership(self) -> OwnershipSteps: ...

    # What the parts change: the actor, and whether it serves calls (and why not).
    instance: Any
    init_failure: RemoteFailure | None
    stopped: bool
    end_reason: RemoteFailure | None
    explicit_ports: frozenset[str]
    concurrent: frozenset[str]

    def acting(self) -> AbstractContextManager[None]: ...

    def handle_call(self, msg: Message) -> None: ...

    def run_coroutine(self, coro: Any, watch: bool = False) -> Any: ...

    def failure_of(self, exc: BaseException, endpoint: str) -> RemoteFailure: ...

    def finish(
        self,
        caller: Caller,
        status: int,
        value: Any,
        fatal: BaseException | None,
        *,
        end: bool = True,
    ) -> None: ...

    def reply(
        self, port: Port, index: int, status: int, value: Any, caller: bytes | None = None
    ) -> None: ...

    def report_unhandled(self, failure: RemoteFailure) -> None: ...

    def fail(self, exc: BaseException, report: RemoteFailure) -> None: ...

    def handle_supervise(self, failure: Any) -> None: ...

    def supervise(self, failure: Any) -> None: ...

"""What an actor does while one of its endpoints awaits.

An actor handles one message at a time. Two things run at an ``await`` all the same, as in
Monarch:

- ``@concurrent_endpoint`` calls. Each is a task on the actor's event loop; while any is
  outstanding, the actor's thread waits for its next message inside that loop
  (``next_item``) instead of sleeping on its inbox, so the tasks progress and later messages
  still come in. Two actors whose concurrent endpoints call each other back therefore cannot
  deadlock.
- ``__supervise__``: a failure of a mesh the actor owns is handled at the next await of the
  endpoint that runs (``watch``), not after it: an endpoint awaiting a mesh that died would
  otherwise wait for a report queued behind itself. Other messages that arrive meanwhile keep
  their turn.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable
from typing import Any

from ...errors import RemoteFailure
from ..messaging import NOTHING, SUPERVISE_ITEM
from ..messaging.protocol import FAILED, OK
from . import actor_context as ctxmod
from .failures import ends_the_actor, render_failure, stopped
from .runner_parts import Caller, Runner

logger = logging.getLogger(__name__)

# The actor a concurrent call belongs to, as ``current_runner()`` sees it in that call's task
# (the thread-local one is only set while the actor's thread handles a message).
task_runner: contextvars.ContextVar[Runner | None] = contextvars.ContextVar(
    "actormesh_task_runner", default=None
)

# A local item: end the actor once its thread is back at the top (a concurrent call or a
# __supervise__ failed it while its loop ran, where __cleanup__ cannot run to its end).
END_ITEM = "end"

# What watch() gives: the watching task, the items kept for after the endpoint, and the
# __supervise__ calls it started.
Watcher = tuple["asyncio.Task[None]", list[Any], list["asyncio.Task[None]"]]


class Reentry:
    """One actor's concurrent calls and what it takes in at an await (see the module docs)."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.tasks: set[asyncio.Task[None]] = set()

    # -- concurrent calls ------------------------------------------------------------------------

    def start(self, coro: Awaitable[Any], ctx: ctxmod.Context, caller: Caller) -> None:
        """Start a concurrent call (actor's thread, outside its loop). It runs up to its first
        await now, so calls start in the order they arrived."""
        loop = self.runner.loop
        task = loop.create_task(self._run_call(coro, ctx, caller))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        loop.run_until_complete(asyncio.sleep(0))

    async def _run_call(self, coro: Awaitable[Any], ctx: ctxmod.Context, caller: Caller) -> None:
        runner = self.runner
        ctxmod.set_task_context(ctx)  # this task's own: others on the loop keep theirs
        task_runner.set(runner)
        status, value, fatal = OK, None, None
        try:
            value = await coro
        except asyncio.CancelledError as exc:
            # A stop or an interrupt: its caller learns so (and why the actor ended, if it did).
            status = FAILED
            if runner.end_reason is not None:
                value = stopped(runner.rank, runner.name, caller.endpoint, runner.end_reason)
            else:
                value = render_failure(exc, runner.rank, runner.name, caller.endpoint, 1)
        except BaseException as exc:
            status = FAILED
            value = render_failure(exc, runner.rank, runner.name, caller.endpoint, 1)
            if ends_the_actor(exc, caller.answer is not None):
                fatal = exc  # the actor ends (below)
                runner.stopped = True
        # Inside the actor's loop, where __cleanup__ cannot run to its end: it ends at the top.
        runner.finish(caller, status, value, fatal, end=False)
        if fatal is not None:
            self.end_later(fatal, None)

    def next_item(self) -> Any:
        """The actor's next message, running its loop (and so its concurrent calls) until one
        comes (actor's thread)."""
        return self.runner.loop.run_until_complete(self._inbox_item())

    def cancel_all(self) -> None:
        """Cancel the outstanding concurrent calls and wait for them to answer (actor's thread,
        before ``__cleanup__``)."""
        tasks = list(self.tasks)
        if not tasks:
            return
        for task in tasks:
            task.cancel()
        loop = self.runner.loop
        if not loop.is_running():
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))

    def interrupt(self) -> bool:
        """``ProcMesh.interrupt()``: cancel the concurrent calls (I/O thread); whether any was
        outstanding."""
        tasks = list(self.tasks)
        loop = self.runner.loop if tasks else None
        if loop is None or loop.is_closed():
            return False
        for task in tasks:
            loop.call_soon_threadsafe(task.cancel)
        return True

    # -- ending the actor from inside its loop ---------------------------------------------------

    def end_later(self, exc: BaseException, report: RemoteFailure | None) -> None:
        """End the actor with ``__cleanup__(exc)`` once its thread is back at the top, then tell
        its owner ``report`` (any thread)."""
        self.runner.stopped = True
        if report is not None and self.runner.end_reason is None:
            self.runner.end_reason = report
        self.runner.inbox.put((END_ITEM, (exc, report)))

    def handle_local(self, kind: str, item: Any) -> None:
        if kind != END_ITEM:
            logger.warning("actor %s got an unknown item %r; dropped", self.runner.name, kind)
            return
        exc, report = item
        self.runner.lifecycle.end(exc)  # the runner's own end, deferred to its top
        if report is not None:
            self.runner.ownership.escalate(report)  # to the actor's owner (ownership.py)

    # -- __supervise__ at an await ----------------------------------------------------------------

    def watch(self) -> Watcher | None:
        """While an endpoint awaits, hand supervision events to ``__supervise__``; keep the rest
        for after it (actor's thread, before running the endpoint). Only for actors that have
        a ``__supervise__``: the others pay nothing."""
        if getattr(type(self.runner.instance), "__supervise__", None) is None:
            return None
        deferred: list[Any] = []
        handling: list[asyncio.Task[None]] = []
        return self.runner.loop.create_task(self._watch(deferred, handling)), deferred, handling

    def unwatch(self, watcher: Watcher) -> None:
        """The endpoint ended: stop watching, but let an (async) ``__supervise__`` under way run
        to its end: cancelled, the failure it handles would be lost."""
        task, deferred, handling = watcher
        task.cancel()
        loop = self.runner.loop
        loop.run_until_complete(asyncio.gather(task, *handling, return_exceptions=True))
        self.runner.inbox.put_back(deferred)

    async def _watch(self, deferred: list[Any], handling: list[asyncio.Task[None]]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            item = await self._inbox_item()
            if item is not None and item[0] == SUPERVISE_ITEM:
                handler = loop.create_task(self.runner.ownership.handle_at_await(item[1]))
                handling.append(handler)
                await asyncio.shield(handler)  # one at a time, in order
            else:
                deferred.append(item)

    async def _inbox_item(self) -> Any:
        inbox = self.runner.inbox
        loop = asyncio.get_running_loop()
        while True:
            item = inbox.try_get()
            if item is not NOTHING:
                return item
            ready: asyncio.Future[None] = loop.create_future()

            def wake(ready: asyncio.Future[None] = ready) -> None:
                if not ready.done():
                    ready.set_result(None)

            fds = inbox.fds()
            for fd in fds:
                loop.add_reader(fd, wake)
            try:
                item = inbox.try_get()  # what came before the readers were in place
                if item is not NOTHING:
                    return item
                await ready
            finally:
                for fd in fds:
                    loop.remove_reader(fd)

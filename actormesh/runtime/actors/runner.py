"""How an actor runs: its own thread (``ActorRunner``) takes one message at a time from its inbox,
calls the endpoint, and sends the reply or the rendered failure. How it starts and ends (its
construction, ``ActorMesh.stop``, ``__cleanup__``) is ``lifecycle.py``."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

from ...errors import RemoteFailure
from ..faults import raise_in_thread
from ..messaging import (
    CALL_ITEM,
    SIMPLE_TYPES,
    SPAWN_ITEM,
    STOP_ITEM,
    SUPERVISE_ITEM,
    TASK_ITEM,
    ActorInbox,
    Message,
    actor_address,
    flush_output,
    port_of,
    reply_port,
)
from ..messaging.envelopes import CallEnvelope
from ..messaging.protocol import FAILED, OK, ReplyTo, shape_from_state
from . import actor_context as ctxmod
from .failures import ended, ends_the_actor, label, render_failure, stopped, unconstructed
from .lifecycle import Lifecycle, exit_if_forked, forks_made
from .ownership import Ownership, local
from .reentry import Reentry, task_runner
from .response_port import ResponsePort, send_reply
from .runner_parts import Caller

if TYPE_CHECKING:
    from ..extent import Point
    from ..messaging import Node, Port
    from ..shape import Shape

logger = logging.getLogger(__name__)


class ActorRunner:
    """Runs one actor: its constructor, then its messages, one at a time, on its own thread."""

    def __init__(self, node: Node, key: str, name: str, rank: Point, proc_rank: int) -> None:
        self.node = node
        self.key = key
        self.name = name
        self.rank = rank
        self.proc_rank = proc_rank
        self.instance: Any = None
        self.init_failure: RemoteFailure | None = None
        self.explicit_ports: frozenset[str] = frozenset()
        self.concurrent: frozenset[str] = frozenset()  # its @concurrent_endpoint names
        # The proc mesh's bootstrap actor, when it has one: this actor is built after it.
        self.after: ActorRunner | None = None
        self.constructed = threading.Event()
        self.stopped = False  # by ActorMesh.stop: it answers every later call with a failure
        # Why it ended, when a failure ended it: what its later calls fail with.
        self.end_reason: RemoteFailure | None = None
        # The task of the async endpoint that awaits now (run_coroutine): the one that fails
        # when __supervise__ fails this actor at one of its awaits (``failing``).
        self._awaiting: asyncio.Task[Any] | None = None
        self.failing: tuple[BaseException, RemoteFailure] | None = None
        self.inbox = ActorInbox(node.key, actor_address(node.address, key))
        self._loop: asyncio.AbstractEventLoop | None = None
        self.lifecycle = Lifecycle(self)  # its construction, stop, cleanup and end
        self.reentry = Reentry(self)  # what runs at an await: concurrent calls, __supervise__
        self.ownership = Ownership(self)  # its owner, and the actor meshes it spawned
        local[key] = self
        self.actor_instance = ctxmod.ActorInstance(name, rank, key, self)
        self.busy: tuple[str, float] | None = None  # (endpoint, since) while handling
        # Guards `busy` against interrupts: an interrupt may only land inside an endpoint.
        self._busy_lock = threading.Lock()
        self._interrupted = False
        # sender -> sequence number of its last interrupt: its calls sent before it are cancelled
        self._cancel_before: dict[bytes, int] = {}
        self.thread = threading.Thread(target=self._run, name=f"actor-{name}", daemon=True)
        self.pid = os.getpid()  # a child forked by an endpoint sees its parent's
        self.forks_seen = forks_made[0]  # forks of this process so far (see exit_if_forked)
        # shape_state of a call -> (its Shape, this rank's index in it): a mesh's calls repeat
        # a handful of shapes, and building the index costs microseconds per call.
        self._views: dict[tuple[Any, ...], tuple[Shape, int | None, ctxmod.Context]] = {}

    def start(self, spawn_msg: Message) -> None:
        self.inbox.put((SPAWN_ITEM, spawn_msg))
        self.thread.start()

    def post(self, msg: Message) -> None:
        """Hand over a call that came through the process inbox (any thread)."""
        self.inbox.put((CALL_ITEM, msg))

    def failure_of(self, exc: BaseException, endpoint: str) -> RemoteFailure:
        """``exc`` rendered as a failure of this actor (for its response ports)."""
        return render_failure(exc, self.rank, self.name, endpoint)

    def run_task(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on this actor's thread, after the messages already in its inbox (any
        thread): how the tensor engine runs an endpoint's ``rref`` where the actor's own calls
        run. ``fn`` reports its own outcome; what it raises is logged."""
        self.inbox.put((TASK_ITEM, fn))

    def post_stop(self, msg: Message) -> None:
        """ActorMesh.stop reached this actor (any thread)."""
        self.inbox.put((STOP_ITEM, msg))

    def stop(self) -> None:
        self.inbox.put(None)

    # -- the actor's thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.inbox.open()
        except Exception:
            # Callers on this host send to that socket: without it the actor is unreachable.
            logger.exception("actor %s could not open its inbox; the process exits", self.name)
            self.lifecycle.exit_process(SystemExit(1))
        get = self.inbox.get
        reentry = self.reentry
        cancel_before = self._cancel_before
        while True:
            try:
                # While concurrent calls await, the actor's loop runs as it waits for messages.
                item = reentry.next_item() if reentry.tasks else get()
                if item is None:
                    if not self.stopped:  # the proc mesh stops gracefully: clean up first
                        self.stopped = True
                        self.lifecycle.cleanup(None)
                    break
                kind, msg = item
                if kind == STOP_ITEM:
                    self.lifecycle.stop(msg)
                elif kind == CALL_ITEM:
                    if cancel_before and msg.seq < cancel_before.get(msg.sender, 0):
                        self._cancel(msg)
                    else:
                        self.handle_call(msg)
                elif kind == SPAWN_ITEM:
                    self.lifecycle.construct(msg)
                elif kind == TASK_ITEM:
                    self._run_task(msg)
                elif kind == SUPERVISE_ITEM:
                    self.handle_supervise(msg)
                else:
                    reentry.handle_local(kind, msg)
                # Not held while waiting for the next one: a call's buffers (a tensor argument's
                # frame) are freed as soon as it is done.
                item = msg = None
            except KeyboardInterrupt:
                continue  # an interrupt that arrived as the endpoint ended: nothing to stop
            except SystemExit as exc:
                self.lifecycle.exit_process(exc)
            except Exception:
                # A bug in reporting must not end the actor's thread: every later call would
                # hang while the process looks alive.
                logger.exception("actor %s could not handle a message", self.name)
        self.inbox.close()
        if self._loop is not None:
            self._loop.close()

    def _run_task(self, fn: Callable[[], None]) -> None:
        with self.acting():
            self.busy = ("task", time.monotonic())
            try:
                fn()
            finally:
                self._set_idle()

    def interrupt(self, request: Message) -> bool:
        """Raise KeyboardInterrupt in the running endpoint, if any, and cancel the calls that
        the interrupt's sender sent before it and that have not started (I/O thread)."""
        self._cancel_before[request.sender] = request.seq
        cancelled = self.reentry.interrupt()  # concurrent calls are cancelled instead
        with self._busy_lock:
            if self.busy is None or self.thread.ident is None:
                return cancelled
            if not self._interrupted:  # a second one could land in the first one's handling
                raise_in_thread(self.thread.ident, KeyboardInterrupt)
                self._interrupted = True
            return True

    def _set_idle(self) -> None:
        with self._busy_lock:
            self.busy = None
            if self._interrupted and self.thread.ident is not None:
                raise_in_thread(self.thread.ident, None)  # drop an interrupt not yet delivered
            self._interrupted = False

    def _cancel(self, msg: Message) -> None:
        """A call that an interrupt caught before it started: it fails without running."""
        call = CallEnvelope.of(msg)
        endpoint_name, reply = call.endpoint, call.reply
        shape = shape_from_state(call.shape)
        index = shape.local_index(self.proc_rank)
        failure = RemoteFailure(
            label(self.rank),
            self.name,
            endpoint_name,
            "KeyboardInterrupt",
            "interrupted before it started",
            "KeyboardInterrupt: interrupted before it started\n",
        )
        port = reply_port(reply)
        if port is not None and index is not None:
            self.reply(port, index, FAILED, failure, _caller(reply))

    def handle_call(self, msg: Message) -> None:
        call = CallEnvelope.of(msg)
        endpoint_name, state, reply_state = call.endpoint, call.shape, call.reply
        view = self._views.get(state)
        if view is None:
            if len(self._views) > 256:
                self._views.clear()
            shape = shape_from_state(state)
            index = shape.local_index(self.proc_rank)
            # One Context per view rather than per call: it holds nothing of the call itself.
            context = ctxmod.Context(self.actor_instance, None, shape, index)
            view = self._views[state] = (shape, index, context)
        shape, index, context = view
        to = None if reply_state is None else ReplyTo.read(reply_state)
        reply: Port | None = None if to is None else port_of(to)
        caller = None if to is None else to.after
        ctxmod.set_current(context)
        _tls.runner = self
        status, value = OK, None
        answer: ResponsePort | None = None
        fatal: BaseException | None = None
        try:
            if self.stopped:
                why = self.end_reason
                status, value = FAILED, stopped(self.rank, self.name, endpoint_name, why)
            elif self.init_failure is not None:
                status, value = FAILED, unconstructed(self.init_failure, self.name, endpoint_name)
            else:
                self.busy = (endpoint_name, time.monotonic())
                try:
                    args, kwargs = msg.value()
                    if endpoint_name in self.explicit_ports:
                        answer = ResponsePort(self, reply, index, caller)
                        args = (answer, *args)
                        reply = None  # the endpoint answers through its port, or fails below
                    value = getattr(self.instance, endpoint_name)(*args, **kwargs)
                    if type(value) not in _PLAIN and inspect.isawaitable(value):
                        if endpoint_name in self.concurrent:
                            waiting = Caller(endpoint_name, reply, index, caller, answer)
                            self.reentry.start(value, context, waiting)
                            return  # it answers when it ends (Reentry.run_call)
                        value = self.run_coroutine(value, watch=True)
                finally:
                    self._set_idle()  # from here on no interrupt lands in this call
        except BaseException as exc:
            # Also an interrupt that landed as the endpoint returned: the reply still goes out.
            status, value = FAILED, render_failure(exc, self.rank, self.name, endpoint_name, 1)
            if ends_the_actor(exc, answer is not None):
                fatal = exc  # this actor ends (below)
        finally:
            ctxmod.set_current(None)
            _tls.runner = None
        if self.failing is not None:  # __supervise__ failed this actor at one of its awaits
            (fatal, value), status, self.failing = self.failing, FAILED, None
        if forks_made[0] != self.forks_seen:
            exit_if_forked(self.pid, status == FAILED)
        if fatal is None and answer is None and reply is not None and index is not None:
            send_reply(self, reply, index, status, value, caller)  # what finish does, here
        else:
            self.finish(Caller(endpoint_name, reply, index, caller, answer), status, value, fatal)

    def finish(
        self,
        caller: Caller,
        status: int,
        value: Any,
        fatal: BaseException | None,
        *,
        end: bool = True,
    ) -> None:
        """Answer a call that ended. ``fatal``: what ends the actor (its failure, ``value``, is
        what its caller and its owner are told); ``end``: end it here (false: the caller ends it
        later, from outside its event loop). A failure goes to the owner when it ended the actor
        or no caller got it."""
        if fatal is not None:
            value = ended(value)
            self.end_reason = value
            if end:
                # Before the reply: whoever hears of the failure sees it ended.
                self.lifecycle.end(fatal)
        reply, index, answer = caller.reply, caller.position, caller.answer
        delivered = status != FAILED
        if answer is not None:
            if status == FAILED:
                delivered = answer.deliver(status, value)  # not when it answered already
        elif reply is not None and index is not None:
            self.reply(reply, index, status, value, caller.after)
            delivered = True
        if status == FAILED and (fatal is not None or not delivered):
            self.report_unhandled(value)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The actor's event loop (made on first use, on the actor's thread)."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
        return self._loop

    def run_coroutine(self, coro: Any, watch: bool = False) -> Any:
        """Run ``coro`` to its end on the actor's loop. ``watch``: an endpoint's, during which
        ``__supervise__`` runs at an await, as in Monarch (``Reentry.watch``)."""
        loop = self.loop
        task = loop.create_task(coro)
        watcher = None
        if watch:
            watcher = self.reentry.watch()
            self._awaiting = task
        try:
            return loop.run_until_complete(task)
        except BaseException:
            if not task.done():  # interrupted from outside: don't leave the task half-run
                task.cancel()
                loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
            raise
        finally:
            if watcher is not None:
                self._awaiting = None
                self.reentry.unwatch(watcher)

    def reply(
        self, port: Port, index: int, status: int, value: Any, caller: bytes | None = None
    ) -> None:
        send_reply(self, port, index, status, value, caller)

    def report_unhandled(self, failure: RemoteFailure) -> None:
        flush_output()
        self._escalate(failure)

    def _escalate(self, failure: Any) -> None:
        """Hand a failure nobody handled here to this actor's owner (ownership.py)."""
        self.ownership.escalate(failure)

    def abort(self, reason: str | None) -> None:
        """``context().actor_instance.abort(reason)`` (ownership.py)."""
        self.ownership.abort(reason)

    def fail(self, exc: BaseException, report: RemoteFailure) -> None:
        """End this actor with ``__cleanup__(exc)``, its owner told ``report`` (its
        ``__supervise__`` raised or left a failure unhandled). An endpoint that awaits now fails
        with ``report`` (as in Monarch, the message being handled fails); otherwise it ends
        once its thread is back at the top."""
        self.stopped = True
        self.end_reason = report
        task = self._awaiting
        if task is not None and not task.done():
            self.failing = (exc, report)
            task.cancel()
        else:
            self.reentry.end_later(exc, report)

    def supervise(self, failure: Any) -> None:
        """Deliver a failure of a mesh this actor owns to its ``__supervise__`` (any thread)."""
        self.inbox.put((SUPERVISE_ITEM, failure))

    def handle_supervise(self, failure: Any) -> None:
        self.ownership.handle(failure)

    @contextlib.contextmanager
    def acting(self) -> Iterator[None]:
        """Run code as this actor outside any call (``__init__``, ``__supervise__``,
        ``__cleanup__``): ``context()`` and ``current_runner()`` name it, and what they named
        before comes back after (``__supervise__`` may run at an await of an endpoint)."""
        outer, outer_runner = ctxmod.current(), getattr(_tls, "runner", None)
        ctxmod.set_current(ctxmod.Context(self.actor_instance, self.rank))
        _tls.runner = self
        try:
            yield
        finally:
            ctxmod.set_current(outer)
            _tls.runner = outer_runner


def _caller(reply: tuple[Any, ...] | None) -> bytes | None:
    """The caller's process mailbox when a reply travels by another route than what this process
    sends that process directly (to a thread's own reply inbox, or through a host agent that
    gathers replies): the reply then says where to wait up to (Node.in_order)."""
    return None if reply is None else ReplyTo.read(reply).after


_tls = threading.local()
# Results that are never awaitable (inspect.isawaitable ends in a slow ABC check).
_PLAIN = SIMPLE_TYPES | {tuple, list, dict}


def current_runner() -> ActorRunner | None:
    """The actor whose endpoint is running on this thread (or task), if any."""
    runner = getattr(_tls, "runner", None) or task_runner.get()
    return cast("ActorRunner | None", runner)  # the one Runner there is

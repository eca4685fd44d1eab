"""An actor's life outside its calls: its construction, ``ActorMesh.stop``, its ``__cleanup__``,
the end that a fatal ``BaseException`` brings, and the exits of the worker process (a
``sys.exit()`` outside an endpoint, a child that an endpoint forked)."""

from __future__ import annotations

import inspect
import logging
import os
import sys
from typing import TYPE_CHECKING

from ... import config
from ...errors import RemoteFailure
from ..messaging import CALL_ITEM, flush_output, reply_port
from ..messaging.envelopes import SpawnActorEnvelope, StopActorEnvelope
from ..messaging.protocol import ACTOR_STOPPED, FAILED, OK, shape_from_state
from .actor import concurrent_endpoints, explicit_port_endpoints
from .failures import bootstrap_failed, render_failure, stopped
from .response_port import send_reply
from .runner_parts import Runner
from .stand_in import StandIn, StoppedInInit

if TYPE_CHECKING:
    from ..messaging import Message

logger = logging.getLogger(__name__)


class Lifecycle:
    """How one actor starts and ends; it runs on the actor's thread, between its calls."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self._cleaned = False  # __cleanup__ runs once, however many ways the actor ends

    def construct(self, msg: Message) -> None:
        runner = self.runner
        stand_in = StandIn(runner)  # reads the inbox if this takes long (stand_in.py)
        stand_in.arm()
        try:
            self._build(msg, stand_in)
        finally:
            stopped_meanwhile = stand_in.give_back()
            runner.constructed.set()
        if stopped_meanwhile:  # its stop was answered while __init__ ran: clean up now
            self.cleanup(None)
            runner.instance = None

    def _build(self, msg: Message, stand_in: StandIn) -> None:
        runner = self.runner
        spawn = SpawnActorEnvelope.of(msg)
        shape, reply = spawn.shape, spawn.reply
        if runner.after is not None:
            runner.after.constructed.wait()
            failed = runner.after.init_failure
            if failed is not None:
                runner.init_failure = bootstrap_failed(failed, runner.name)
                index = shape.local_index(runner.proc_rank)
                if reply is not None and index is not None:
                    send_reply(runner, reply, index, FAILED, runner.init_failure)
                return
        stopped_in_init = False
        with runner.acting():
            try:
                (cls, *args), kwargs = msg.value()
                runner.explicit_ports = explicit_port_endpoints(cls)
                runner.concurrent = concurrent_endpoints(cls)
                instance = cls.__new__(cls)
                runner.instance = instance
                stand_in.enter_init()
                try:
                    result = instance.__init__(*args, **kwargs)
                    if inspect.isawaitable(result):
                        runner.run_coroutine(result)
                finally:
                    stand_in.leave_init()
            except StoppedInInit:
                # ActorMesh.stop() interrupted it: a stop, not a failure its owner must hear of.
                runner.init_failure = stopped(runner.rank, runner.name, "__init__")
                runner.instance = None
                stopped_in_init = True
            except BaseException as exc:
                runner.init_failure = render_failure(exc, runner.rank, runner.name, "__init__", 1)
                logger.debug("actor %s failed to start", runner.name, exc_info=True)
        if forks_made[0] != runner.forks_seen:
            exit_if_forked(runner.pid, runner.init_failure is not None)
        index = shape.local_index(runner.proc_rank)
        if reply is not None and index is not None:
            status = FAILED if runner.init_failure else OK
            send_reply(runner, reply, index, status, runner.init_failure)
        if runner.init_failure is not None and not stopped_in_init:
            # A supervision event too, as in Monarch: a spawn nobody calls must not fail unseen.
            runner.ownership.escalate(runner.init_failure)

    def end(self, exc: BaseException) -> None:
        """A failure ends the actor (a ``BaseException`` that is not an ``Exception``, ...), as
        in Monarch: it cleans up with ``__cleanup__(exc)``, then refuses every call."""
        self.runner.stopped = True
        self.cleanup(exc)
        self.runner.instance = None

    def stop(self, msg: Message) -> None:
        """ActorMesh.stop: handle the calls sent before the stop, clean up, then refuse calls."""
        runner = self.runner
        stop = StopActorEnvelope.of(msg)
        if not runner.stopped:
            stops = []  # another ActorMesh.stop that came meanwhile: answered once this one is
            for kind, item in runner.inbox.pending_calls():
                if kind == CALL_ITEM:
                    runner.handle_call(item)
                else:
                    stops.append((kind, item))
            runner.inbox.put_back(stops)
            runner.stopped = True
            node = runner.node
            if node.mesh_id is not None and node.controller not in (None, node.address):
                # The stop may come from any process: the one that heals this rank must know.
                node.send(
                    node.controller, (ACTOR_STOPPED, node.mesh_id, runner.proc_rank, runner.key)
                )
        failure = self.cleanup(None)
        runner.instance = None  # what the actor held is released; its thread stays to refuse calls
        index = shape_from_state(stop.shape).local_index(runner.proc_rank)
        port = reply_port(stop.reply)
        if port is not None and index is not None:
            send_reply(runner, port, index, FAILED if failure else OK, failure)

    def cleanup(self, exc: BaseException | None) -> RemoteFailure | None:
        """Run the actor's ``__cleanup__(exc)`` once (sync or async), if it has one and was
        built; its failure, if it raised."""
        runner = self.runner
        instance = runner.instance
        cleanup = getattr(instance, "__cleanup__", None) if instance is not None else None
        runner.reentry.cancel_all()  # before __cleanup__, as Monarch does
        runner.ownership.stop_children(config.STOP_GRACE / 4)
        if cleanup is None or runner.init_failure is not None or self._cleaned:
            return None
        self._cleaned = True
        with runner.acting():
            try:
                result = cleanup(exc)
                if inspect.isawaitable(result):
                    runner.run_coroutine(result)
            except BaseException as failure:
                logger.warning("__cleanup__ of %s raised %r", runner.name, failure)
                return render_failure(failure, runner.rank, runner.name, "__cleanup__", 1)
        return None

    def exit_process(self, exc: SystemExit) -> None:
        """End the worker: the actor's inbox could not open, or ``sys.exit()`` ran outside an
        endpoint (in ``__supervise__``). In an endpoint it ends only the actor (``end``)."""
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)
        flush_output()
        sys.stderr.flush()
        self.runner.node.transport.close(linger=1.0)  # deliver what is queued (output, replies)
        os._exit(code)


# Counts the forks this process made (os.register_at_fork): a runner compares it with the count
# when it was made, a list index rather than a getpid() system call after every call.
forks_made = [0]
os.register_at_fork(after_in_child=lambda: forks_made.__setitem__(0, forks_made[0] + 1))


def exit_if_forked(parent: int, failed: bool) -> None:
    """A child that ``os.fork()`` made inside an endpoint and that returned into the runtime
    ends here: it shares its parent's sockets and inboxes, and running the actor loop on them
    would spin and answer for its parent (it has no other thread to stop it)."""
    if os.getpid() != parent:
        os._exit(1 if failed else 0)

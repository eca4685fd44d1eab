"""Who reads an actor's inbox while its ``__init__`` runs long: a stand-in thread.

An actor's thread reads its inbox between messages only, and its construction is its first
message: an ``__init__`` that loops forever (or waits on something that never comes) would keep
``ActorMesh.stop()`` unread, and the stop would never complete. Monarch stops such an actor, so
an ``__init__`` that runs past ``START_AFTER`` gets a stand-in: a thread that reads the inbox in
its place until the ``__init__`` returns, and hands back what it read, in order.

A stop that the stand-in reads interrupts the ``__init__`` (``StoppedInInit`` is raised in it,
which lands in Python code, not in a wait in C), and the actor thread then handles the stop as
usual. If the ``__init__`` has not ended ``GRACE`` seconds later, the stand-in stops the actor
itself: it stops the meshes the actor spawned, answers the stop, and from then on refuses the
calls that come, for as long as the ``__init__`` goes on (it holds no lock the process needs:
the process still stops gracefully, and the thread is left behind as a daemon).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from ... import config
from ..faults import raise_in_thread
from ..messaging import CALL_ITEM, STOP_ITEM, SUPERVISE_ITEM, reply_port
from ..messaging.envelopes import CallEnvelope, StopActorEnvelope
from ..messaging.protocol import ACTOR_STOPPED, FAILED, OK, ReplyTo, shape_from_state
from .failures import stopped
from .response_port import send_reply
from .runner_parts import Runner

if TYPE_CHECKING:
    from ..messaging import Message

logger = logging.getLogger(__name__)

START_AFTER = 0.2  # seconds of __init__ before a stand-in starts reading its inbox
GRACE = config.STOP_GRACE / 4  # how long a stopped __init__ gets to end by itself

_GIVE_BACK = ("give back", None)  # the item that ends the stand-in's reading (a local tag)


class StoppedInInit(BaseException):
    """``ActorMesh.stop()`` reached this actor while its ``__init__`` ran; raised in it."""


class StandIn:
    """The stand-in of one actor's construction (see the module docstring)."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.took_over = False  # it answered a stop: the actor is stopped
        self._lock = threading.Lock()
        self._in_init = False  # the actor's thread runs user code of its construction
        self._interrupted = False
        self._done = threading.Event()  # the construction ended
        self._held: list[Any] = []  # read for the actor, to be handed back in order
        self._thread: threading.Thread | None = None

    # -- the actor's thread ----------------------------------------------------------------------

    def arm(self) -> None:
        """Start a stand-in if the construction still runs ``START_AFTER`` from now."""
        transport = self.runner.node.transport
        try:
            transport.call_soon(lambda: transport.call_later(START_AFTER, self._start))
        except Exception:  # the process is closing: nobody will stop this actor any more
            logger.debug("no stand-in for %s", self.runner.name, exc_info=True)

    def enter_init(self) -> None:
        with self._lock:
            self._in_init = True

    def leave_init(self) -> None:
        """User code of the construction is over: no interrupt may land after this."""
        with self._lock:
            self._in_init = False
            if self._interrupted and self.runner.thread.ident is not None:
                raise_in_thread(self.runner.thread.ident, None)  # one not delivered yet

    def give_back(self) -> bool:
        """The construction ended: end the stand-in and take back what it read; whether it
        stopped the actor meanwhile."""
        with self._lock:
            self._done.set()
            thread = self._thread
        if thread is not None:
            self.runner.inbox.put(_GIVE_BACK)
            thread.join()
            self.runner.inbox.put_back(self._held)
        return self.took_over

    # -- the stand-in's thread -------------------------------------------------------------------

    def _start(self) -> None:
        # On the I/O thread: a thread of its own, started only for a long construction.
        with self._lock:
            if self._done.is_set():
                return
            self._thread = threading.Thread(
                target=self._run, name=f"stand-in-{self.runner.name}", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        inbox = self.runner.inbox
        while True:
            try:
                item = inbox.get()
            except Exception:
                logger.exception("the stand-in of %s could not read its inbox", self.runner.name)
                return
            if item is _GIVE_BACK:
                return
            if item is None:  # the process stops: that is for the actor's thread to see
                self._held.append(item)
                continue
            kind, msg = item
            try:
                if kind == STOP_ITEM:
                    self._stop(msg)
                elif self.took_over and kind == CALL_ITEM:
                    self._refuse(msg)
                elif self.took_over and kind == SUPERVISE_ITEM:
                    self.runner.ownership.escalate(msg)  # it handles nothing any more
                else:
                    self._held.append(item)
            except Exception:
                logger.exception("the stand-in of %s could not handle a message", self.runner.name)

    def _stop(self, msg: Message) -> None:
        if self.took_over:
            self._answer_stop(msg)
            return
        runner = self.runner
        with self._lock:
            if self._in_init and not self._interrupted and runner.thread.ident is not None:
                raise_in_thread(runner.thread.ident, StoppedInInit)
                self._interrupted = True
        if self._done.wait(GRACE):
            self._held.append((STOP_ITEM, msg))  # the actor's thread stops it, as any stop
            return
        logger.warning(
            "actor %s did not leave its __init__ within %g s of ActorMesh.stop(); it is "
            "stopped without it (its thread is left running)",
            runner.name,
            GRACE,
        )
        self.took_over = True
        runner.stopped = True
        runner.ownership.stop_children(config.STOP_GRACE / 4)
        node = runner.node
        if node.mesh_id is not None and node.controller not in (None, node.address):
            node.send(node.controller, (ACTOR_STOPPED, node.mesh_id, runner.proc_rank, runner.key))
        kept = []
        for item in self._held:
            if item is not None and item[0] == CALL_ITEM:
                self._refuse(item[1])  # sent before the stop: they will never run either
            else:
                kept.append(item)
        self._held = kept
        self._answer_stop(msg)

    def _answer_stop(self, msg: Message) -> None:
        stop = StopActorEnvelope.of(msg)
        index = shape_from_state(stop.shape).local_index(self.runner.proc_rank)
        port = reply_port(stop.reply)
        if port is not None and index is not None:
            send_reply(self.runner, port, index, OK, None)

    def _refuse(self, msg: Message) -> None:
        runner = self.runner
        call = CallEnvelope.of(msg)
        index = shape_from_state(call.shape).local_index(runner.proc_rank)
        port = reply_port(call.reply)
        if port is not None and index is not None:
            failure = stopped(runner.rank, runner.name, call.endpoint)
            send_reply(runner, port, index, FAILED, failure, ReplyTo.read(call.reply).after)

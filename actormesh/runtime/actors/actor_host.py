"""Hosting actors in this process: the ``spawn`` and ``call`` handlers of a node.

Both workers and the controller (``this_proc()``) host actors. Messages from different senders
are not ordered with respect to each other, so a call can overtake the spawn of its actor (an
actor that got a mesh reference calls it before the controller's spawn message arrived): such
calls wait here until the spawn arrives.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from ..faults import TOOL_ACTOR_PREFIX
from ..messaging import Message, Node, dumps, reply_port
from ..messaging.envelopes import (
    CallEnvelope,
    SpawnActorEnvelope,
    StopActorEnvelope,
    SuperviseEnvelope,
)
from ..messaging.protocol import (
    CALL,
    OK,
    OWNED,
    REPLY,
    SPAWN_ACTOR,
    STOP_ACTOR,
    SUPERVISE,
    shape_from_state,
)
from ..shape import Shape
from . import ownership
from .actor import Actor
from .runner import ActorRunner

# The actor a proc mesh's ``bootstrap`` runs in, first on every process (see Bootstrap).
BOOTSTRAP_NAME = f"{TOOL_ACTOR_PREFIX}bootstrap"


class Bootstrap(Actor):
    """Runs ``spawn_procs(bootstrap=fn)``'s ``fn`` (sync or async) in its ``__init__``. The
    actors spawned on the process after it are built once it is done, and fail with its
    failure if it raised (Lifecycle.construct); those that ``fn`` spawns itself (and those they
    spawn) are built at once, since ``fn`` may wait for them."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        result = fn()
        if inspect.isawaitable(result):
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(result)
            finally:
                loop.close()


logger = logging.getLogger(__name__)


class ActorHost:
    """The actors living in one process, keyed by actor-mesh key."""

    def __init__(self, node: Node, proc_rank: int) -> None:
        self.node = node
        self.proc_rank = proc_rank
        self.actors: dict[str, ActorRunner] = {}
        self._spawned = threading.Condition()  # notified as each actor starts (wait_for_actor)
        self._early: defaultdict[str, list[Message]] = defaultdict(list)
        node.register(SPAWN_ACTOR, self._on_spawn)
        node.register(CALL, self._on_call)
        node.register(STOP_ACTOR, self._on_stop_actor)
        node.register(SUPERVISE, self._on_supervise)
        self.bootstrap: ActorRunner | None = None
        global _process_host
        _process_host = self

    def _on_spawn(self, msg: Message) -> None:
        spawn = SpawnActorEnvelope.of(msg)
        key, name, shape = spawn.key, spawn.name, spawn.shape
        assert isinstance(shape, Shape)
        point = shape.point_of_global(self.proc_rank)
        if point is None or key in self.actors:
            logger.warning("ignored a spawn of %s not meant for this process", name)
            return
        runner = ActorRunner(self.node, key, name, point, self.proc_rank)
        owner = spawn.owner
        if owner is not None:
            runner.ownership.owner = owner
            node = self.node
            if node.mesh_id is not None and node.controller not in (None, node.address):
                # Whoever watches this process tells the owner if it is lost.
                node.send(node.controller, (OWNED, node.mesh_id, self.proc_rank, owner))
        if name == BOOTSTRAP_NAME:
            self.bootstrap = runner
        elif not self._spawned_by_bootstrap(owner):
            runner.after = self.bootstrap
        self.actors[key] = runner
        runner.start(msg)
        for early in self._early.pop(key, ()):
            runner.post(early)
        with self._spawned:
            self._spawned.notify_all()

    def _spawned_by_bootstrap(self, owner: ownership.Owner | None) -> bool:
        """Whether the bootstrap spawned this actor (or an actor it spawned did): it is built
        at once, not after the bootstrap, which may well be waiting for it."""
        bootstrap = self.bootstrap
        if owner is None or bootstrap is None:
            return False
        if owner.key == bootstrap.key:  # this process's bootstrap, or another rank's
            return True
        spawner = self.actors.get(owner.key)
        here = owner.address.mailbox == self.node.address.mailbox
        return here and spawner is not None and spawner.after is None

    def wait_for_actor(self, key: str, timeout: float) -> ActorRunner | None:
        """The runner of actor mesh ``key`` here, once its spawn arrived (it may trail a message
        that names it, sent by another route); ``None`` after ``timeout`` seconds."""
        with self._spawned:
            self._spawned.wait_for(lambda: key in self.actors, timeout)
        return self.actors.get(key)

    def _on_call(self, msg: Message) -> None:
        key = CallEnvelope.of(msg).key
        runner = self.actors.get(key)
        if runner is None:
            self._early[key].append(msg)
            return
        runner.post(msg)

    def _on_stop_actor(self, msg: Message) -> None:
        stop = StopActorEnvelope.of(msg)
        runner = self.actors.get(stop.key)
        if runner is not None:
            runner.post_stop(msg)
            return
        # Never spawned here (or not yet: a stop overtook its spawn): nothing to clean up.
        index = shape_from_state(stop.shape).local_index(self.proc_rank)
        port = reply_port(stop.reply)
        if port is not None and index is not None:
            self.node.send(port.address, (REPLY, port.port_id, index, OK), *dumps(None))

    def _on_supervise(self, msg: Message) -> None:
        ownership.deliver(self.node, SuperviseEnvelope.of(msg).owner, msg.value())

    def stop_all(self, timeout: float) -> None:
        for runner in self.actors.values():
            runner.stop()
        for runner in self.actors.values():
            runner.thread.join(timeout)


_process_host: ActorHost | None = None  # one per process: the worker's, or this_proc()'s


def local_actor_host() -> ActorHost | None:
    """The actors living in this process (``None`` before its node hosts any): how tools on a
    worker (the kernel's executor, the debugger) find the actors next to them."""
    return _process_host

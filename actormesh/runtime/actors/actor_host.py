"""Hosting actors in this process: the ``spawn`` and ``call`` handlers of a node.

Both workers and the controller (``this_proc()``) host actors. Messages from different senders
are not ordered with respect to each other, so a call can overtake the spawn of its actor (an
actor that got a mesh reference calls it before the controller's spawn message arrived): such
calls wait here until the spawn arrives.
"""

from __future__ import annotations

import logging
from collections import defaultdict

from ..messaging.codec import Message
from ..messaging.node import Node
from ..messaging.protocol import CALL, SPAWN_ACTOR
from ..shape import Shape
from .runner import ActorRunner

logger = logging.getLogger(__name__)


class ActorHost:
    """The actors living in one process, keyed by actor-mesh key."""

    def __init__(self, node: Node, proc_rank: int) -> None:
        self.node = node
        self.proc_rank = proc_rank
        self.actors: dict[str, ActorRunner] = {}
        self._early: defaultdict[str, list[Message]] = defaultdict(list)
        node.register(SPAWN_ACTOR, self._on_spawn)
        node.register(CALL, self._on_call)
        global _process_host
        _process_host = self

    def _on_spawn(self, msg: Message) -> None:
        _, key, name, shape, _reply = msg.envelope
        assert isinstance(shape, Shape)
        point = shape.point_of_global(self.proc_rank)
        if point is None or key in self.actors:
            logger.warning("ignored a spawn of %s not meant for this process", name)
            return
        runner = ActorRunner(self.node, key, name, point, self.proc_rank)
        self.actors[key] = runner
        runner.start(msg)
        for early in self._early.pop(key, ()):
            runner.post(early)

    def _on_call(self, msg: Message) -> None:
        key = msg.envelope[1]  # (CALL, key, endpoint, shape, reply)
        runner = self.actors.get(key)
        if runner is None:
            self._early[key].append(msg)
            return
        runner.post(msg)

    def stop_all(self, timeout: float) -> None:
        for runner in self.actors.values():
            runner.stop()
        for runner in self.actors.values():
            runner.thread.join(timeout)


_process_host: ActorHost | None = None  # one per process: the worker's, or this_proc()'s


def actor_host() -> ActorHost | None:
    """The actors living in this process (``None`` before its node hosts any): how tools on a
    worker (the kernel's executor, the debugger) find the actors next to them."""
    return _process_host

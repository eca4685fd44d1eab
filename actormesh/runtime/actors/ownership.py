"""The ownership tree: who hears of an actor's failures, and what stops with an actor.

As in Monarch, an actor mesh belongs to the actor that spawned it, whoever made the proc mesh
under it: a failure nobody waited for (a broadcast that raised, an ``__init__`` that raised, an
actor that ended) goes straight to that actor's ``__supervise__`` (``SUPERVISE``), which handles
it (returns true), passes it up to its own owner, or raises, and so fails in turn. A mesh
spawned outside any actor (by the script) has no owner actor: its failures go to the process
that spawned its proc mesh, as before (``UNHANDLED``: that mesh's owner, or the fault hook).

An actor that stops (``ActorMesh.stop``, the end of its process, a fatal failure) stops the
actor meshes it spawned first.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from ...errors import ActorError, MeshError
from ..faults import failure_of_broadcast, unhandled_fault_hook
from ..messaging import Address, dumps
from ..messaging.protocol import SUPERVISE, UNHANDLED
from .failures import render_failure
from .runner_parts import Runner

if TYPE_CHECKING:
    from ..messaging import Node
    from .actor_context import ActorInstance

logger = logging.getLogger(__name__)


class Owner(NamedTuple):
    """The actor that spawned an actor mesh, as its spawn message carries it."""

    address: Address  # its process
    key: str  # its actor mesh's key: how its process finds it
    instance: ActorInstance  # context().actor_instance.creator


# The actors of this process by key (ActorRunner registers itself): where a SUPERVISE goes.
local: dict[str, Runner] = {}


def as_failure(failure: Any) -> MeshError:
    """What ``__supervise__`` receives: a ``MeshFailure`` naming the actor mesh that failed."""
    error = failure_of_broadcast(failure)
    if isinstance(error, ActorError) and getattr(error, "mesh_name", None) is None:
        error.mesh_name = error.failures[0].actor
    return error


class Ownership:
    """One actor's place in the tree: its owner and the actor meshes it spawned."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.owner: Owner | None = None
        self.children: list[Any] = []  # ActorMesh handles (opaque at this layer)

    def escalate(self, failure: Any) -> None:
        """Hand a failure nobody handled here to this actor's owner (any thread)."""
        node = self.runner.node
        if self.owner is None:
            to_controller(node, failure)
        else:
            send_to_owner(node, self.owner, failure)

    def handle(self, failure: Any) -> None:
        """A failure of a mesh this actor owns, on the actor's thread: its ``__supervise__``
        handles it (returns true), or it goes up to this actor's owner. One that raises fails
        the actor in turn, as in Monarch: it ends, and its owner hears why."""
        runner = self.runner
        handler = getattr(runner.instance, "__supervise__", None)
        if handler is None or runner.stopped:
            self.escalate(failure)
            return
        with runner.acting():
            try:
                handled = bool(handler(failure))
            except Exception as exc:
                logger.exception("__supervise__ of %s raised", runner.name)
                raised = render_failure(exc, runner.rank, runner.name, "__supervise__", 1)
                runner.stopped = True  # from now on it refuses calls
                runner.reentry.end_later(exc, raised)
                return
        if not handled:
            self.escalate(failure)

    def abort(self, reason: str) -> None:
        """``context().actor_instance.abort(reason)``: the actor ends once the message it
        handles is done (``__cleanup__`` gets the error), and its owner hears why."""
        runner = self.runner
        exc = RuntimeError(f"the actor aborted: {reason}")
        runner.reentry.end_later(exc, render_failure(exc, runner.rank, runner.name, "abort"))

    def stop_children(self, timeout: float) -> None:
        """Stop the actor meshes this actor spawned, waiting up to ``timeout`` seconds (actor's
        thread, before its ``__cleanup__``)."""
        children, self.children = self.children, []
        stops = []
        for mesh in children:
            try:
                stops.append(mesh.stop())
            except MeshError:
                pass  # its proc mesh was stopped: nothing is left to stop
        deadline = time.monotonic() + timeout
        for stop in stops:
            try:
                stop.get(timeout=max(0.0, deadline - time.monotonic()))
            except MeshError as exc:  # a child's __cleanup__ raised, or it died: stopping anyway
                logger.info("stopping an actor mesh owned by %s: %s", self.runner.name, exc)


def send_to_owner(node: Node, owner: Owner, failure: Any) -> None:
    """``failure`` to the ``__supervise__`` of the actor ``owner`` (any thread)."""
    if owner.address.mailbox == node.address.mailbox:
        deliver(node, owner.key, failure)
    else:
        payload, buffers = dumps(failure)
        node.send(owner.address, (SUPERVISE, owner.key), payload, buffers)


def deliver(node: Node, owner_key: str, failure: Any) -> None:
    """A failure of a mesh owned by the actor ``owner_key`` of this process (any thread)."""
    owner = local.get(owner_key)
    if owner is None or owner.stopped:
        # Gone: its own owner hears of it instead.
        if owner is not None:
            owner.ownership.escalate(failure)
        else:
            to_controller(node, failure)
        return
    owner.supervise(as_failure(failure))


def to_controller(node: Node, failure: Any) -> None:
    """To whoever spawned this process's proc mesh (the fault hook in the root)."""
    controller = node.controller
    if controller is None or controller == node.address:
        unhandled_fault_hook(failure_of_broadcast(failure))
        return
    payload, buffers = dumps(failure)
    node.send(controller, (UNHANDLED, node.mesh_id), payload, buffers)

"""The ownership tree: who hears of an actor's failures, and what stops with an actor.

As in Monarch, an actor mesh belongs to the actor that spawned it, whoever made the proc mesh
under it: a failure nobody waited for (a broadcast that raised, an ``__init__`` that raised, an
actor that ended) goes straight to that actor's ``__supervise__`` (``SUPERVISE``), which handles
it (returns true), or returns false or raises, and so fails in turn: the endpoint awaiting then
fails, the actor ends and its owner hears why. An actor without ``__supervise__`` passes the
failure up to its own owner and goes on. A mesh
spawned outside any actor (by the script) has no owner actor: its failures go to the process
that spawned its proc mesh, as before (``UNHANDLED``: that mesh's owner, or the fault hook).

An actor that stops (``ActorMesh.stop``, the end of its process, a fatal failure) stops the
actor meshes it spawned first.
"""

from __future__ import annotations

import inspect
import logging
import time
from typing import TYPE_CHECKING, Any, NamedTuple

from ...errors import ActorError, MeshError, RemoteFailure
from ..faults import failure_of_broadcast, unhandled_fault_hook
from ..messaging import Address, dumps
from ..messaging.protocol import SUPERVISE, UNHANDLED
from .failures import ended, label, render_failure
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
        """A failure of a mesh this actor owns, on the actor's thread between its messages: its
        ``__supervise__`` (sync, or async on the actor's loop) handles it (returns a true
        value), or this actor fails, as in Monarch: it ends, and its owner hears why (the
        failure it did not handle, or what ``__supervise__`` raised while handling it). An
        actor without ``__supervise__`` passes the failure up to its owner and goes on."""
        handler = self._handler(failure)
        if handler is None:
            return
        result = self._run(failure, handler, failure)
        if inspect.isawaitable(result):  # an async __supervise__, on the actor's loop
            result = self._run(failure, self.runner.run_coroutine, result)
        self._settle(result, failure)

    async def handle_at_await(self, failure: Any) -> None:
        """``handle``, at an await of an endpoint that runs (on the actor's loop): an async
        ``__supervise__`` is awaited there."""
        handler = self._handler(failure)
        if handler is None:
            return
        result = self._run(failure, handler, failure)
        if inspect.isawaitable(result):
            with self.runner.acting():
                try:
                    result = await result
                except Exception as exc:
                    result = self._raised(exc, failure)
        self._settle(result, failure)

    def _run(self, failure: Any, fn: Any, arg: Any) -> Any:
        """``fn(arg)`` as this actor; what ``_raised`` gives if it raises."""
        with self.runner.acting():
            try:
                return fn(arg)
            except Exception as exc:
                return self._raised(exc, failure)

    def _handler(self, failure: Any) -> Any:
        """The actor's ``__supervise__``; ``None`` when there is none to run (the failure then
        went up to its owner)."""
        handler = getattr(self.runner.instance, "__supervise__", None)
        if handler is None or self.runner.stopped:
            self.escalate(failure)
            return None
        return handler

    def _settle(self, result: object, failure: Any) -> None:
        if result:  # handled (or it raised: _raised failed the actor already)
            return
        runner = self.runner
        mesh = getattr(failure, "mesh_name", None)
        what = str(failure).strip().splitlines()[0] if str(failure).strip() else repr(failure)
        message = (
            f"__supervise__ left a failure of mesh {mesh!r} unhandled (it returned "
            f"{_short(result)}), so the actor that owns it fails: {what}"
        )
        report = RemoteFailure(
            label(runner.rank),
            runner.name,
            "__supervise__",
            "SupervisionError",
            message,
            f"SupervisionError: {message}\n\n{_report_of(failure)}\n",
            actor_ended=True,
        )
        runner.fail(
            failure if isinstance(failure, BaseException) else RuntimeError(message), report
        )

    def _raised(self, exc: Exception, failure: Any) -> object:
        runner = self.runner
        logger.info("__supervise__ of %s raised %r", runner.name, exc)
        raised = render_failure(exc, runner.rank, runner.name, "__supervise__", 1)
        mesh = getattr(failure, "mesh_name", None)
        report = RemoteFailure(
            raised.rank,
            raised.actor,
            raised.endpoint,
            raised.exc_type,
            f"{raised.message} (raised by __supervise__ while it handled a failure of mesh "
            f"{mesh!r}, so the actor that owns it fails)",
            f"{raised.traceback.rstrip()}\n\nThe failure it was handling:\n{_report_of(failure)}\n",
            actor_ended=True,
        )
        runner.fail(exc, report)
        return _FAILED

    def abort(self, reason: str | None) -> None:
        """``context().actor_instance.abort(reason)``: the actor ends once the message it
        handles is done (``__cleanup__`` gets the error), and its owner hears why."""
        runner = self.runner
        cls = type(runner.instance).__name__
        exc = RuntimeError(
            f"actor {runner.name!r} ({cls}) aborted: {reason or 'no reason provided'}"
        )
        report = ended(render_failure(exc, runner.rank, runner.name, "abort"))
        runner.reentry.end_later(exc, report)

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


_FAILED = object()  # what a __supervise__ that raised gives: true, since nothing is left to do


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _report_of(failure: Any) -> str:
    report = getattr(failure, "report", None)
    return report() if callable(report) else str(failure)


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

"""``get_or_spawn_controller(name, Cls, *args)``: one actor per name, in the root controller.

Monarch's way for actors to find a shared service (a metrics aggregator, a parameter server)
by name instead of passing its mesh around. The first caller spawns the actor in the process
that runs the script (the root controller, on a thread of its own as ``this_proc()``'s actors
are); every later caller, from any process, gets the same actor mesh, whatever arguments it
passed.

A worker asks the process that spawned its proc mesh (``SINGLETON``); a worker that is itself
a controller (it spawned meshes) passes the question on to its own, so it reaches the root,
whose answer goes straight back to the asker.
"""

from __future__ import annotations

import threading
from functools import partial
from typing import Any, Generic, TypeVar

from ...errors import ProcDeath, SupervisionError, actor_error
from ..actors import (
    Actor,
    Future,
    completed_future,
    failed_future,
    render_failure,
    set_exception,
    set_result,
)
from ..meshes import ActorMesh, pickle_arguments
from ..messaging import Message, Node, current_node, dumps, node_if_started, reply_port
from ..messaging.envelopes import ReplyEnvelope, SingletonEnvelope
from ..messaging.protocol import FAILED, OK, REPLY, SINGLETON
from .controller import Controller, on_controller
from .host_mesh import this_proc

A = TypeVar("A", bound=Actor)

_lock = threading.Lock()
_singletons: dict[str, ActorMesh[Any]] = {}


def get_or_spawn_controller(
    name: str, cls: type[A], *args: Any, **kwargs: Any
) -> Future[ActorMesh[A]]:
    """The actor mesh named ``name`` in the root controller, spawned there as
    ``cls(*args, **kwargs)`` by the first caller (from any process); a future, as in Monarch.
    The mesh has one actor and no dimensions: call it with ``call_one``."""
    node = node_if_started()
    if node is None or _is_root(node):
        try:
            return completed_future(_get_or_spawn(name, cls, args, kwargs))
        except Exception as exc:
            return failed_future(exc)
    payload, buffers = pickle_arguments((cls, *args), kwargs, f"get_or_spawn_controller({name!r})")
    answer: _Answer[ActorMesh[A]] = _Answer(node, name)
    port = answer.port = node.open_port(answer)
    assert node.controller is not None
    node.send(
        node.controller, (SINGLETON, name, (tuple(port.address), port.port_id)), payload, buffers
    )
    return answer.future


def _is_root(node: Node) -> bool:
    return node.controller is None or node.controller == node.address


def _get_or_spawn(
    name: str, cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> ActorMesh[Any]:
    with _lock:
        mesh = _singletons.get(name)
        if mesh is None:
            mesh = _singletons[name] = this_proc().spawn(name, cls, *args, **kwargs)
        return mesh


def _install(ctl: Controller) -> None:
    """Every process that is a controller answers (or passes on) ``SINGLETON``."""
    ctl.node.register(SINGLETON, partial(on_singleton, ctl.node))


def on_singleton(node: Node, msg: Message) -> None:
    """A ``SINGLETON`` question (I/O thread): pass it on towards the root, or answer it."""
    asked = SingletonEnvelope.of(msg)
    name = asked.name
    if not _is_root(node):
        assert node.controller is not None
        node.send(node.controller, msg.envelope, msg.payload, msg.buffers)
        return
    value: Any
    try:
        (cls, *args), kwargs = msg.value()
        status, value = OK, _get_or_spawn(name, cls, tuple(args), kwargs)
    except Exception as exc:
        status, value = FAILED, render_failure(exc, "controller", name, "get_or_spawn_controller")
    port = reply_port(asked.reply)
    current_node().send(port.address, (REPLY, port.port_id, 0, status), *dumps(value))


T = TypeVar("T")


class _Answer(Generic[T]):
    """The port the root's answer comes to."""

    def __init__(self, node: Node, name: str) -> None:
        self.node = node
        self.future: Future[T] = Future(lambda: f"the controller actor {name!r}")
        self.port: Any = None

    def on_message(self, msg: Message) -> None:
        self.node.close_port(self.port)
        status, value = ReplyEnvelope.of(msg).status, msg.value()
        if status == OK:
            set_result(self.future, value)
        else:
            set_exception(self.future, actor_error([value]))

    def on_death(self, mailbox: bytes, death: ProcDeath) -> bool | None:
        controller = self.node.controller
        if controller is None or mailbox != controller.mailbox:
            return None
        self.node.close_port(self.port)
        set_exception(
            self.future, SupervisionError([death], "the controller died before it answered")
        )
        return True


on_controller(_install)

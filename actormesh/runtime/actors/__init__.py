"""Actors: the class users derive from, how one runs on its own thread, and futures.

The face of ``runtime/actors``: other layers import these names from here, never from its
modules (``tests/unit/test_faces.py``).

- ``Actor``, ``@endpoint``, ``@concurrent_endpoint`` (``actor``).
- ``ActorRunner``: one actor's thread and its messages (``runner``, with its parts
  ``lifecycle``, ``reentry``, ``ownership``, ``response_port``); ``ActorHost``: the actors of
  one process (``actor_host``); ``Owner``: who supervises an actor mesh.
- ``context()``, ``current_rank()``...: which actor, rank and process code runs as
  (``actor_context``).
- ``Future`` and its completion by the runtime (``set_result``, ``set_exception``,
  ``completed_future``...), what a pending one waits for (``waiting_for``) (``future``);
  ``then``, ``when_all``, ``settle`` (``combinators``).
"""

from .actor import Actor, concurrent_endpoint, endpoint, endpoint_names, plain_method_names
from .actor_context import (
    ActorInstance,
    Context,
    context,
    current_actor_name,
    current_rank,
    current_size,
    proc_factory,
    process_context,
    set_process_context,
)
from .actor_host import BOOTSTRAP_NAME, ActorHost, Bootstrap, local_actor_host
from .combinators import settle, then, when_all
from .failures import render_failure
from .future import (
    Future,
    blocked_on,
    completed_future,
    failed_future,
    set_exception,
    set_result,
    wait_hooks,
    waiting_for,
)
from .ownership import Owner, send_to_owner
from .runner import ActorRunner, current_runner

__all__ = [
    "BOOTSTRAP_NAME",
    "Actor",
    "ActorHost",
    "ActorInstance",
    "ActorRunner",
    "Bootstrap",
    "Context",
    "Future",
    "Owner",
    "blocked_on",
    "completed_future",
    "concurrent_endpoint",
    "context",
    "current_actor_name",
    "current_rank",
    "current_runner",
    "current_size",
    "endpoint",
    "endpoint_names",
    "failed_future",
    "local_actor_host",
    "plain_method_names",
    "proc_factory",
    "process_context",
    "render_failure",
    "send_to_owner",
    "set_exception",
    "set_process_context",
    "set_result",
    "settle",
    "then",
    "wait_hooks",
    "waiting_for",
    "when_all",
]

"""What an actor's failures say: exceptions rendered as text on the worker (they never travel
as pickled objects), and the failures of calls that an actor can no longer run."""

from __future__ import annotations

import traceback
from typing import Any

from ...errors import RemoteFailure
from ..extent import Point, point_label


def render_failure(
    exc: BaseException, rank: Point | str, actor: str, endpoint: str, skip: int = 0
) -> RemoteFailure:
    """Turn an exception into text on the worker, dropping the runtime's own frames.

    Never raises: an exception whose ``__str__`` (or whose type's name) raises still becomes a
    failure with what could be rendered, since a failure here would lose the reply."""
    tb = exc.__traceback__
    for _ in range(skip):
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
    etype = type(exc)
    name = _safe(lambda: etype.__qualname__, "<unnamed exception type>")
    module = _safe(lambda: etype.__module__, "")
    if module not in ("builtins", "__main__", ""):
        name = f"{module}.{name}"
    message = _safe(lambda: str(exc), f"<the __str__ of this {name} raised>")
    text = _safe(
        lambda: "".join(traceback.format_exception(etype, exc, tb)),
        f"{name}: {message}\n(its traceback could not be formatted)\n",
    )
    return RemoteFailure(label(rank), actor, endpoint, name, message, text)


def label(rank: Point | str) -> str:
    """``{hosts=0, gpus=3}``: a rank as failures name it."""
    return point_label(rank) if isinstance(rank, Point) else rank


def _safe(render: Any, fallback: Any) -> Any:
    try:
        return render()
    except BaseException:  # a KeyboardInterrupt from a user's __str__ included
        return fallback


def ends_the_actor(exc: BaseException, explicit_port: bool) -> bool:
    """Whether ``exc``, raised by an endpoint, ends its actor, as in Monarch: a
    ``BaseException`` that is not an ``Exception`` (``SystemExit``, ...), or any exception out
    of an ``@endpoint(explicit_response_port=True)`` method (its caller waits on the port, not on
    the method's return). ``KeyboardInterrupt`` does not: it is how ``interrupt()`` stops one."""
    if isinstance(exc, KeyboardInterrupt):
        return False
    return explicit_port or not isinstance(exc, Exception)


def unconstructed(failure: RemoteFailure | None, actor: str, endpoint: str) -> RemoteFailure:
    """A call to an actor whose ``__init__`` raised ``failure``: it never ran, which is a
    supervision event (``actor_ended``)."""
    assert failure is not None
    return RemoteFailure(
        failure.rank,
        failure.actor,
        endpoint,
        failure.exc_type,
        f"actor {actor!r} failed in __init__, so it cannot run {endpoint!r}: {failure.message}",
        failure.traceback,
        actor_ended=True,
    )


def stopped(
    rank: Point, actor: str, endpoint: str, why: RemoteFailure | None = None
) -> RemoteFailure:
    """A call to an actor that ``ActorMesh.stop`` ended, or ``why`` (a ``BaseException``,
    ``abort()``, its ``__supervise__``)."""
    text = f"actor {actor!r} was stopped, so it cannot run {endpoint!r}"
    if why is None:
        return RemoteFailure(
            label(rank), actor, endpoint, "ActorStopped", text, text + "\n", actor_ended=True
        )
    text = (
        f"actor {actor!r} was stopped by a failure ({why.headline()}), so it cannot run "
        f"{endpoint!r}"
    )
    return RemoteFailure(
        label(rank), actor, endpoint, "ActorStopped", text, why.traceback, actor_ended=True
    )


def ended(failure: RemoteFailure) -> RemoteFailure:
    """``failure`` as what ended the actor: what its caller and its owner are told."""
    if failure.actor_ended:
        return failure
    return RemoteFailure(
        failure.rank,
        failure.actor,
        failure.endpoint,
        failure.exc_type,
        f"the actor stopped: {failure.message or failure.exc_type}",
        failure.traceback,
        actor_ended=True,
    )


def bootstrap_failed(failed: RemoteFailure, actor: str) -> RemoteFailure:
    """The ``__init__`` of an actor built after its proc mesh's bootstrap raised ``failed``."""
    return RemoteFailure(
        failed.rank,
        actor,
        "__init__",
        failed.exc_type,
        f"the bootstrap of this proc mesh failed, so no actor runs on it: {failed.message}",
        failed.traceback,
        actor_ended=True,
    )

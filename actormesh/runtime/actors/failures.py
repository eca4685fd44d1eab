"""What an actor's failures say: exceptions rendered as text on the worker (they never travel
as pickled objects), and the failures of calls that an actor can no longer run."""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING, Any

from ...errors import RemoteFailure

if TYPE_CHECKING:
    from ..extent import Point


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
    return RemoteFailure(str(rank), actor, endpoint, name, message, text)


def _safe(render: Any, fallback: Any) -> Any:
    try:
        return render()
    except BaseException:  # a KeyboardInterrupt from a user's __str__ included
        return fallback


def unconstructed(failure: RemoteFailure | None, actor: str, endpoint: str) -> RemoteFailure:
    """A call to an actor whose ``__init__`` raised ``failure``."""
    assert failure is not None
    return RemoteFailure(
        failure.rank,
        failure.actor,
        endpoint,
        failure.exc_type,
        f"actor {actor!r} failed in __init__, so it cannot run {endpoint!r}: {failure.message}",
        failure.traceback,
    )


def stopped(rank: Point, actor: str, endpoint: str) -> RemoteFailure:
    """A call to an actor that ``ActorMesh.stop`` (or a ``BaseException``) ended."""
    text = f"actor {actor!r} was stopped, so it cannot run {endpoint!r}"
    return RemoteFailure(str(rank), actor, endpoint, "ActorStopped", text, text + "\n")


def ended(failure: RemoteFailure) -> RemoteFailure:
    """What the owner hears when ``failure`` (a ``SystemExit``, ...) ended the actor."""
    return RemoteFailure(
        failure.rank,
        failure.actor,
        failure.endpoint,
        failure.exc_type,
        f"the actor stopped: {failure.message or failure.exc_type}",
        failure.traceback,
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
    )

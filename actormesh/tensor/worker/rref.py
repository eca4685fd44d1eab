"""The worker side of ``endpoint.rref(...)`` (see ``rref.py``): the engine runs the endpoint on
the actor's own thread and keeps what it returns."""

from __future__ import annotations

import threading
from typing import Any

from torch.utils._pytree import tree_map

from .. import compat

# How long a rank waits for the actor to run the endpoint (it may be busy with other calls),
# and for the actor's spawn (sent by another route than the op stream, so it may come later).
ACTOR_WAIT = 300.0
SPAWN_WAIT = 60.0


def _local(v: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return v.to_local() if isinstance(v, DTensor) else v


def run_rref(engine: Any, payload: Any, out: tuple[int, ...]) -> list[Any]:
    key, name, args, kwargs = payload
    runner = compat.local_actor(key, SPAWN_WAIT)
    if runner is None:
        raise RuntimeError(
            f"{name}.rref: no actor of that mesh lives in this process; spawn the actors on "
            "the processes of the tensor mesh"
        )
    args = tree_map(_local, engine.resolve(args))
    kwargs = tree_map(_local, engine.resolve(kwargs))
    from torch import enable_grad

    done = threading.Event()
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            # User code: torch's default grad mode, as in any endpoint call.
            with enable_grad():
                box["value"] = getattr(runner.instance, name)(*args, **kwargs)
        except BaseException as exc:  # reported as this op's failure, on the engine's thread
            box["error"] = exc
        finally:
            done.set()

    runner.run_task(call)
    if not done.wait(ACTOR_WAIT):
        raise TimeoutError(f"{name}.rref: the actor did not run it within {ACTOR_WAIT:g} s")
    if "error" in box:
        raise box["error"]
    return [box["value"]]

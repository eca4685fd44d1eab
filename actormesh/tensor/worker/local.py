"""This process's tensor engines, for code that runs beside them on other threads (worker side).

- ``local_value``: an actor handed a MeshTensor gets this rank's value, once the engine ran the
  ops issued before the call; ``run_pin`` keeps that value for the message until it was read.
- ``CellTurn``: a ``%%mesh`` cell that touches engine values runs *between* the engine's
  batches. Collectives must run in the same order on every rank, and a cell's collectives (a
  ``full_tensor()`` on a pushed DTensor) share this process's group with the engine's. So the
  cell first waits until the engine ran every batch sent before the cell (the kernel says how
  many), then holds the lock the engine holds while it runs a batch: later batches wait for the
  cell, on every rank alike.
- ``wait_for_cell``: that "later" is decided on the controller, not by which thread of a rank
  wins the lock. The kernel numbers each cell and tells every tensor stream it launched it; the
  stream's next message to the engine names the cell, and before it takes the lock the engine
  waits until that cell *took its turn* in this process (``release_cell``: it holds the lock,
  touches no engine value, or ended, however it ended). So ops issued while a ``--noblock``
  cell still runs, sync points included, run after the cell on every rank. A cell that does
  not take its turn within ``LOCAL_VALUE_WAIT`` (it never came, or waits behind an earlier cell
  still running there) fails that message with a ``TimeoutError`` naming the cell.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .state import EngineState

# How long an actor or a cell waits for the engine to run the ops issued before it, and the
# engine for a cell launched before its message to take its turn.
LOCAL_VALUE_WAIT = 300.0

# This process's engines by key (each registers itself as it starts).
REGISTRY: dict[str, EngineState] = {}


# The newest %%mesh cell (the kernel's number) that took its turn in this process. One number
# suffices: a process runs its cells one at a time, in the order the kernel launched them.
_released = 0
_released_cond = threading.Condition()


def release_cell(cell: int) -> None:
    """Cell ``cell`` took its turn here: it holds its engines' locks, needs none, or ended."""
    global _released
    with _released_cond:
        if cell > _released:
            _released = cell
            _released_cond.notify_all()


def wait_for_cell(engine: EngineState, cell: int, name: str) -> None:
    """On the engine's thread, before it takes its lock for a message sent after cell ``cell``
    (called ``name``) was launched: wait until that cell took its turn in this process."""
    with _released_cond:
        if not _released_cond.wait_for(lambda: _released >= cell, timeout=LOCAL_VALUE_WAIT):
            raise TimeoutError(
                f"the tensor engine on {engine.rank_str} waited {LOCAL_VALUE_WAIT:g} s for the "
                f"%%mesh cell {name} to start there (the ops issued after it run after it); is "
                "an earlier cell still running on this rank, or paused in the debugger?"
            )


def _wait_for_batch(engine: EngineState, seq: int) -> None:
    with engine.cond:
        if not engine.cond.wait_for(lambda: engine.done >= seq, timeout=LOCAL_VALUE_WAIT):
            raise TimeoutError(
                f"the tensor engine on {engine.rank_str} did not reach batch {seq} in "
                f"{LOCAL_VALUE_WAIT:g} s (it ran {engine.done}); is it blocked in a collective?"
            )


def run_pin(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    """A MeshTensor went into a message for the actors of ``ranks`` (MeshTensor.__reduce_ex__):
    those ranks keep its value under the pin's own id until their actor read it (local_value),
    however soon the MeshTensor itself is dropped; the others drop the pin at once."""
    ref, ranks = payload
    if engine.index in ranks:
        return [engine.resolve(ref)]
    engine.read_pins.append(out[0])  # no actor of this process reads it
    return [None]


def local_value(key: str, id: int, seq: int, dtensor: bool = False, pinned: bool = False) -> Any:
    """On a worker: the local value of a MeshTensor that was passed to an endpoint (with
    ``dtensor``, a global one stays this rank's DTensor, as ``%mesh push`` hands it over).

    Waits until this process's engine has run the batch the MeshTensor's op was in (actors run
    on their own threads, so the engine may still be behind), then returns the local tensor.
    ``pinned``: ``id`` is a pin the engine keeps for this one read (``run_pin``), let go here.
    """

    engine = REGISTRY.get(key)
    if engine is None:
        raise RuntimeError(
            "a MeshTensor was sent to a process that does not hold its mesh; pass MeshTensors "
            "only to actors on the same processes as the tensor's mesh"
        )
    _wait_for_batch(engine, seq)
    try:
        return _read(engine, id, dtensor)
    finally:
        if pinned:
            engine.read_pins.append(id)  # the engine drops it between batches


def _read(engine: EngineState, id: int, dtensor: bool) -> Any:
    from torch.distributed.tensor import DTensor

    root = engine.poison.get(id)
    if root is not None:
        engine.surfaced.add(root.serial)  # the actor's caller hears of it: no orphan report
        raise RuntimeError(
            f"this MeshTensor failed on {root.rank}: {root.exc_type}: {root.message} "
            f"(op {root.op} issued at {root.site})"
        )
    v = engine.value(id)
    return v.to_local() if isinstance(v, DTensor) and not dtensor else v


def _engine_value(engine: EngineState, v: Any) -> bool:
    """Whether a cell using ``v`` may run collectives of this process's group, or change what
    the engine holds: any DTensor (whichever DeviceMesh: they share the process group), a module
    with DTensor parameters, or a value the engine holds itself."""
    import torch
    from torch.distributed.tensor import DTensor

    if isinstance(v, DTensor):
        return True
    if isinstance(v, torch.nn.Module):
        return any(isinstance(p, DTensor) for p in v.parameters())
    return isinstance(v, torch.Tensor) and any(v is held for held in engine.env.values())


class CellTurn:
    """Around ``%%mesh`` cell number ``cell`` that reads ``names`` from ``namespace``: if any of
    them is an engine value, wait for the engine(s) to run the ``after[key]`` batches sent
    before the cell, and hold their locks while the cell runs. A cell that touches none runs at
    once. Either way it then releases the engine messages sent after it (``release_cell``), and
    does on its way out whatever happened. (A class, not a generator: a rank's stack,
    ``procs.stacks()``, then shows a waiting cell in here.)"""

    def __init__(
        self, cell: int, namespace: dict[str, Any], names: Iterable[str], after: dict[str, int]
    ):
        self.cell = cell
        self.values = [namespace[n] for n in set(names) if n in namespace]
        self.after = after
        self.held: list[EngineState] = []

    def __enter__(self) -> None:
        try:
            for key in sorted(self.after):  # one order everywhere: two engines cannot deadlock
                engine = REGISTRY.get(key)
                if engine is None or not any(_engine_value(engine, v) for v in self.values):
                    continue
                _wait_for_batch(engine, self.after[key])
                if not engine.lock.acquire(timeout=LOCAL_VALUE_WAIT):
                    raise TimeoutError(
                        f"the tensor engine on {engine.rank_str} kept running a batch for "
                        f"{LOCAL_VALUE_WAIT:g} s; is it blocked in a collective?"
                    )
                self.held.append(engine)
        except BaseException:
            self.__exit__()
            raise
        release_cell(self.cell)  # after the locks: the engines' next messages wait on them

    def __exit__(self, *exc: object) -> None:
        while self.held:
            self.held.pop().lock.release()
        release_cell(self.cell)

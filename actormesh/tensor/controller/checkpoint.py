"""``actormesh.checkpoint``: ``torch.distributed.checkpoint`` (DCP) from the controller.

The same calls as DCP's, on a single controller's state::

    am.checkpoint.save({"model": model, "optim": optimizer, "step": step}, checkpoint_id=path)
    am.checkpoint.load(state, checkpoint_id=path)          # in place, like dcp.load
    future = am.checkpoint.async_save(state, checkpoint_id=path)   # training goes on

Each is one op in the mesh's stream (``checkpoint_save`` / ``checkpoint_load``), so it sees the
values as the ops issued before it left them, and every rank runs DCP on its own DTensors:
each rank writes its own shards, and DCP reshards on load (another mesh shape, FSDP <-> tensor
parallel). The state's layout is DCP's (checkpoint_state.py), so a checkpoint written by an SPMD
program with ``dcp.save`` loads into a meshed model, and the other way round. The ranks' side,
and why a failed write never costs the previous checkpoint, is worker/checkpoint.py.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any

import torch

from ...errors import SupervisionError
from .. import compat
from ..wire.ops import issue_site
from ..worker.checkpoint import _CheckpointWatch, _NotLoaded, staging_path
from ..worker.local import LOCAL_VALUE_WAIT
from . import checkpoint_state
from .fetch import fetch_value
from .mesh import TensorMesh
from .tensor import OpaqueRef

_watchers: dict[str, Any] = {}  # engine key -> its _CheckpointWatch actor mesh
_watchers_lock = threading.Lock()


def _path(checkpoint_id: Any, what: str) -> str:
    if not isinstance(checkpoint_id, (str, os.PathLike)):
        raise compat.MeshUsageError(
            f"{what} needs checkpoint_id=, a directory path (str or os.PathLike), got "
            f"{type(checkpoint_id).__name__}"
        )
    return os.path.abspath(os.fspath(checkpoint_id))


def _record_save(state: Any, checkpoint_id: Any, background: bool, what: str) -> Any:
    path = _path(checkpoint_id, what)
    spec = checkpoint_state.build(state, what)
    tm = spec.mesh
    assert tm is not None
    token = uuid.uuid4().hex[:12]
    out = OpaqueRef(tm, tm.stream.new_id(), per_rank=True)
    payload = (spec.tree, path, token, background)
    meta = (None,)
    tm.stream.record(
        ("checkpoint_save", (out.value_id,), tuple(spec.ids), meta, payload, issue_site())
    )
    return tm, out, path, token, spec.nbytes


def save(state: dict[str, Any], *, checkpoint_id: Any, timeout: float | None = None) -> Any:
    """Write ``state`` as a DCP checkpoint at directory ``checkpoint_id``; blocks until every
    rank wrote its shards, and returns DCP's ``Metadata``.

    ``state`` is what ``dcp.save`` takes: ``{"model": model, "optim": optimizer, ...}`` with a
    meshed model (``module_to_mesh``, any mode), its optimizer, MeshTensors, controller tensors,
    plain Python values, and objects with ``state_dict()``/``load_state_dict()``. The checkpoint
    replaces ``checkpoint_id`` only once complete: a write that fails (a full disk) raises
    ``RemoteTensorError`` naming the ranks and their error, and leaves the previous checkpoint
    there as it was. A value that failed on a rank is never written (the save raises instead).
    A rank that dies fails it with ``SupervisionError``.
    """
    tm, out, _, _, _ = _record_save(state, checkpoint_id, False, "checkpoint.save")
    return fetch_value(out, tm, 0).get(timeout=timeout)


def async_save(state: dict[str, Any], *, checkpoint_id: Any) -> compat.Future[Any]:
    """``save`` in the background: returns a Future at once (of DCP's ``Metadata``).

    The ranks copy the state to CPU memory at this point of the op stream (later ops, the next
    training steps, do not change what is written) and write it from a thread of their own while
    the engine runs the next steps. In a notebook a line under the cell shows the progress. A
    later checkpoint call (save, async_save, load) waits on the ranks until this one is written.
    The Future fails as ``save`` raises: an ``ActorError`` naming the ranks and their error
    (the previous checkpoint at ``checkpoint_id`` stays), or ``SupervisionError``.
    """
    tm, out, path, token, nbytes = _record_save(state, checkpoint_id, True, "checkpoint.async_save")
    tm.stream.flush()  # the ranks start now, not at the next sync point
    reply = _watcher(tm).wait.call(tm.key, token, LOCAL_VALUE_WAIT)
    _keep(out, reply)
    result = compat.on_failure(
        compat.then(reply, lambda values: compat.completed(values.values()[0])), _rank_lost
    )
    show_progress(result, staging_path(path, token), nbytes)
    return result


def _rank_lost(exc: BaseException) -> BaseException:
    """A rank died while a background save wrote: said in the user's words (the runtime's
    names the watcher's endpoint, which the user never called)."""
    if isinstance(exc, SupervisionError) and exc.deaths:
        return SupervisionError(
            list(exc.deaths),
            "the background checkpoint was not completed (a rank died; the previous checkpoint "
            "at its checkpoint_id stays whole)",
        )
    return exc


def _keep(out: OpaqueRef, reply: Any) -> None:
    """The op's output (the save's token on each rank) stays until the save finished."""
    reply.add_done_callback(lambda _: out)


def _watcher(tm: TensorMesh) -> Any:
    with _watchers_lock:
        watch = _watchers.get(tm.key)
        if watch is None:
            watch = compat.helper_mesh_with_args(tm.procs, "_checkpoint_watch", _CheckpointWatch)
            _watchers[tm.key] = watch
    return watch


def load(state: dict[str, Any], *, checkpoint_id: Any, timeout: float | None = None) -> None:
    """Load the DCP checkpoint at ``checkpoint_id`` into ``state``, in place (``dcp.load``'s
    semantics): the ranks read into the MeshTensors' values (resharding from whatever mesh
    shape and parallelism wrote it), controller tensors are copied into, and plain values
    replace the state's entries (objects with ``load_state_dict`` get it called). Blocks.

    A fresh optimizer gets its state first (one step with zero gradients at learning rate 0).
    A load that fails before writing anything (no checkpoint there, a key the checkpoint lacks)
    raises ``RuntimeError`` and changes nothing; one that fails while reading poisons the values
    it was writing (the next sync point on them raises).
    """
    path = _path(checkpoint_id, "checkpoint.load")
    if not os.path.exists(os.path.join(path, ".metadata")):
        raise FileNotFoundError(f"checkpoint.load: no DCP checkpoint at {path} (no .metadata)")
    if isinstance(state, dict):
        for value in state.values():
            if isinstance(value, torch.optim.Optimizer):
                checkpoint_state.init_optimizer_state(value)
    spec = checkpoint_state.build(state, "checkpoint.load")
    tm = spec.mesh
    assert tm is not None
    out = OpaqueRef(tm, tm.stream.new_id(), per_rank=True)
    ins = tuple(spec.ids)
    tm.stream.record(("checkpoint_load", (out.value_id,), ins, (None,), (spec.tree, path),
                      issue_site()))  # fmt: skip
    loaded = fetch_value(out, tm, 0).get(timeout=timeout)
    if isinstance(loaded, _NotLoaded):
        raise RuntimeError(f"checkpoint.load from {path} failed, nothing was changed: {loaded}")
    checkpoint_state.write_back(state, loaded)


# -- progress in a notebook ----------------------------------------------------------------------


def show_progress(future: compat.Future[Any], staging: str, nbytes: int) -> None:
    """Under the running notebook cell, a line that follows a background save: the bytes in
    its directory so far against what the ranks write, then how it ended. Nothing outside
    IPython."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return
    if get_ipython() is None:
        return
    start = time.monotonic()
    handle = display(_progress_text(staging, nbytes, start), display_id=True)
    if handle is None:
        return

    finished = threading.Event()
    future.add_done_callback(lambda _: finished.set())

    def follow() -> None:
        while not finished.wait(0.25):  # a refresh period, not synchronisation
            handle.update(_progress_text(staging, nbytes, start))
        handle.update(_final_text(future, nbytes, start))

    threading.Thread(target=follow, name="checkpoint-progress", daemon=True).start()


class _Text:
    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _written(staging: str) -> int:
    try:
        return sum(e.stat().st_size for e in os.scandir(staging) if e.is_file())
    except OSError:
        return 0


def _progress_text(staging: str, nbytes: int, start: float) -> _Text:
    done = _written(staging)
    share = f" ({100 * done / nbytes:.0f} %)" if nbytes else ""
    return _Text(
        f"checkpoint: {_size(done)} of ~{_size(nbytes)} written{share}, "
        f"{time.monotonic() - start:.1f} s"
    )


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 100_000 else f"{nbytes / 1e3:.1f} kB"


def _final_text(future: compat.Future[Any], nbytes: int, start: float) -> _Text:
    took = time.monotonic() - start
    exc = future.exception()
    if exc is not None:
        return _Text(f"checkpoint failed after {took:.1f} s: {str(exc).splitlines()[0]}")
    return _Text(f"checkpoint saved: ~{_size(nbytes)} in {took:.1f} s")


__all__ = ["async_save", "load", "save"]

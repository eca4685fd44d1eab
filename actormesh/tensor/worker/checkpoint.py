"""The ranks' side of ``actormesh.checkpoint``: ``torch.distributed.checkpoint`` run SPMD by the
engines, in stream order (controller/checkpoint.py records the ops).

A checkpoint op carries a *spec*: the state as ``dcp.save`` takes it (nested dicts and lists),
where each global MeshTensor is a ``Ref`` to this rank's DTensor and everything else (controller
tensors, Python values) travels by value. Each rank hands DCP its own DTensors, so each writes
its own shards, and a load reads into them in place: DCP matches chunks by global offsets, so a
checkpoint written on another mesh shape or parallelism loads here (resharding is DCP's).

Three rules keep a checkpoint trustworthy:

- **Nothing poisoned is written.** A rank whose value failed refuses in DCP's local planning
  step; DCP gathers that refusal, and every rank raises the same error (no rank waits).
- **A failed write loses nothing.** Ranks write into ``<path>.partial-<token>`` beside the
  target; only when DCP finished (every rank wrote, rank 0 wrote the metadata) does rank 0 put
  it in place of ``path``, so a disk that fills up, or a rank that dies, leaves the previous
  checkpoint at ``path`` whole.
- **One checkpoint at a time, on its own process group.** DCP's background save runs its
  collectives on a thread, while the engine's thread runs the training's: it gets a gloo group of
  its own (made in stream order, so every rank makes it at the same point), and a later
  checkpoint op first waits for the previous background save, on every rank alike.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ..compat import Actor, endpoint
from ..wire.ops import Ref

if TYPE_CHECKING:
    from .state import EngineState

# (engine key, token) -> the background save's future on this rank (the watcher waits on it).
SAVES: dict[tuple[str, str], Future[Any]] = {}
_saves_changed = threading.Condition()
# engine key -> its checkpoint process group; engine key -> its save still writing
_groups: dict[str, Any] = {}
_in_flight: dict[str, Future[Any]] = {}


def staging_path(path: str, token: str) -> str:
    """Where the ranks write before the checkpoint replaces ``path`` (a sibling: one rename)."""
    return f"{path.rstrip(os.sep)}.partial-{token}"


def _group(engine: EngineState) -> Any:
    group = _groups.get(engine.key)
    if group is None:
        import torch.distributed as dist

        group = _groups[engine.key] = dist.new_group(backend="gloo")
    return group


def _wait_for_previous(engine: EngineState) -> None:
    """A background save still writing finishes first (its outcome is reported to whoever
    waits on it; this op does not inherit its failure)."""
    previous = _in_flight.pop(engine.key, None)
    if previous is not None:
        previous.exception()  # waits; never raises


def _poisoned(engine: EngineState, spec: Any) -> list[int]:
    from torch.utils._pytree import tree_flatten

    leaves = tree_flatten(spec, is_leaf=lambda x: type(x) is Ref)[0]
    return [x.id for x in leaves if type(x) is Ref and x.id in engine.poison]


def _refusal(engine: EngineState, ids: list[int]) -> RuntimeError:
    root = engine.poison[ids[0]]
    return RuntimeError(
        f"not saved: {len(ids)} value(s) of this state failed on {engine.rank_str} "
        f"({root.exc_type}: {root.message}, op {root.op} issued at {root.site}); a checkpoint "
        "never holds a failed value"
    )


def _save_planner(engine: EngineState, spec: Any) -> Any:
    from torch.distributed.checkpoint import DefaultSavePlanner

    class Planner(DefaultSavePlanner):
        def create_local_plan(self) -> Any:
            # Inside DCP's gathered step: a refusal here reaches every rank as one error.
            bad = _poisoned(engine, spec)
            if bad:
                raise _refusal(engine, bad)
            return super().create_local_plan()

    return Planner()


def run_save(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    import torch.distributed.checkpoint as dcp

    spec, path, token, background = payload
    _wait_for_previous(engine)
    group = _group(engine)
    state = engine.resolve(spec)
    staging = staging_path(path, token)
    planner = _save_planner(engine, spec)
    if not background:
        try:
            metadata = dcp.save(state, checkpoint_id=staging, process_group=group, planner=planner)
        except BaseException as exc:
            _discard(engine, staging)
            raise _failed("written", path, exc) from None
        _publish(engine, staging, path, token)
        return [metadata if engine.index == 0 else None]
    # DCP copies the state to CPU memory here, on the engine's thread (so the checkpoint is the
    # state at this point of the stream), then writes from a thread of its own.
    response = dcp.async_save(state, checkpoint_id=staging, process_group=group, planner=planner)
    # A Future, or (with a stager that stages in the background) a pair of them.
    upload: Future[Any] = getattr(response, "upload_completion", response)  # type: ignore[arg-type]
    done: Future[Any] = Future()

    def finished(f: Future[Any]) -> None:
        exc = f.exception()
        if exc is not None:
            _discard(engine, staging)
            done.set_exception(_failed("written", path, exc))
            return
        try:
            _publish(engine, staging, path, token)
        except BaseException as publish_exc:
            done.set_exception(publish_exc)
            return
        done.set_result(f.result() if engine.index == 0 else None)

    upload.add_done_callback(finished)
    _in_flight[engine.key] = done
    with _saves_changed:
        SAVES[(engine.key, token)] = done
        _saves_changed.notify_all()
    return [token]


class CheckpointFailed(RuntimeError):
    """A checkpoint that could not be written or read, on every rank alike (DCP gathers each
    rank's error). DCP's own ``CheckpointException`` is a ``BaseException``, which would end
    the engine's actor; this one is an op's failure like any other."""


def _failed(done: str, path: str, exc: BaseException) -> CheckpointFailed:
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        raise exc
    where = os.path.dirname(path.rstrip(os.sep)) or os.sep
    try:
        st = os.statvfs(where)
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = None
    # A full disk shows in DCP's error as torch.save's "unexpected pos": say it plainly.
    full = (
        f"No space left on device ({free} bytes free in {where}); "
        if free is not None and (free < 1 << 20)
        else ""
    )
    return CheckpointFailed(f"{full}the checkpoint at {path} could not be {done}: {exc}")


def _publish(engine: EngineState, staging: str, path: str, token: str) -> None:
    """Rank 0 puts the finished checkpoint at ``path`` (the previous one, if any, moves aside
    first and is removed last: a crash between the two renames leaves it whole beside)."""
    if engine.index != 0:
        return
    if os.path.lexists(path):
        aside = f"{path.rstrip(os.sep)}.previous-{token}"
        os.rename(path, aside)
        os.rename(staging, path)
        if os.path.isdir(aside):
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.unlink(aside)
    else:
        os.rename(staging, path)


def _discard(engine: EngineState, staging: str) -> None:
    if engine.index == 0:
        shutil.rmtree(staging, ignore_errors=True)


def wait_for_save(key: str, token: str, start_timeout: float) -> Any:
    """The outcome of background save ``token`` on this rank (rank 0: DCP's metadata), waiting
    up to ``start_timeout`` s for the engine to start it (ops queued before it run first), then
    for as long as the write takes: the controller's ``get(timeout=)`` bounds that, and a
    rank that dies fails the wait."""
    with _saves_changed:
        if not _saves_changed.wait_for(lambda: (key, token) in SAVES, timeout=start_timeout):
            raise TimeoutError(
                f"the background checkpoint save {token} did not start within {start_timeout:g} s "
                "on this rank (the engine is still running the ops issued before it)"
            )
        future = SAVES[(key, token)]
    try:
        return future.result()
    finally:
        with _saves_changed:
            SAVES.pop((key, token), None)


class _NotLoaded(Exception):
    """A load that failed before writing into any value: the values stay as they were."""


def run_load(engine: EngineState, payload: Any, out: tuple[int, ...]) -> Sequence[Any]:
    """Load in place; rank 0 answers the loaded non-``Ref`` leaves (the spec's shape, ``None``
    where a Ref was) for the controller to write back into its own objects. A failure before
    any value was written is the output's (nothing is poisoned); one after poisons every value
    the load was writing into (side_effects.py)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner

    spec, path = payload
    _wait_for_previous(engine)
    group = _group(engine)
    state = engine.resolve(spec)
    wrote = []

    class Planner(DefaultLoadPlanner):
        def commit_tensor(self, read_item: Any, tensor: Any) -> None:
            wrote.append(True)
            super().commit_tensor(read_item, tensor)

        def load_bytes(self, read_item: Any, value: Any) -> None:
            wrote.append(True)
            super().load_bytes(read_item, value)

    try:
        dcp.load(state, checkpoint_id=path, process_group=group, planner=Planner())
    except BaseException as exc:
        if wrote:
            raise _failed("read", path, exc) from None
        return [_NotLoaded(f"{type(exc).__name__}: {exc}")]
    return [_plain_leaves(spec, state) if engine.index == 0 else None]


def _plain_leaves(spec: Any, loaded: Any) -> Any:
    if type(spec) is Ref:
        return None
    if type(spec) is dict:
        return {k: _plain_leaves(v, loaded[k]) for k, v in spec.items()}
    if type(spec) is list:
        return [_plain_leaves(v, w) for v, w in zip(spec, loaded, strict=True)]
    return loaded


class _CheckpointWatch(Actor):
    """Answers when a background save finished on this rank. An actor of its own (a thread of
    its own), so that waiting here never holds up the engine's thread, which keeps training;
    a rank that dies fails the wait at once (the runtime's supervision)."""

    @endpoint
    def wait(self, key: str, token: str, timeout: float) -> Any:
        return wait_for_save(key, token, timeout)

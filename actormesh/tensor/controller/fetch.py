"""Sync points: bring values from the workers to the controller.

A fetch calls ``engine.fetch`` on *every* rank of the mesh, in the same message as the ops still
buffered (``Stream.fetch_after_batch``): each rank says whether the value failed there (so a
failure on rank 3 surfaces even when fetching rank 0's shard), and only the ranks holding a
wanted piece send data. A global value arrives as local shards with their global offsets and is
assembled here; a small partial sum (a loss) arrives as every rank's term and is added up here,
so that reading it runs no collective on the workers. Failures that no fetch ever touched
(their values were dropped) ride on the replies and go to the fault hook.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ... import config
from ...errors import MeshTimeoutError, SupervisionError
from .. import compat
from ..wire.errors import RemoteTensorError
from ..wire.ops import FailureInfo
from . import known
from .activate import no_mesh
from .mesh import TensorMesh, tensor_mesh
from .tensor import MeshTensor, OpaqueRef


def fetch(obj: Any, **coords: int) -> compat.Future[Any]:
    """A Future of ``obj`` (a pytree: tensor, list, dict, ... of MeshTensors) on the controller.

    Without ``coords``, each global MeshTensor becomes its full tensor; with ``coords``
    (``fetch(dt, dp=1)``) that rank's local shard. A per-rank MeshTensor (from ``activate()``)
    gives the value of the rank at ``coords``, where omitted dimensions mean 0. Other leaves are
    returned as they are.

    Sends the buffered ops first; does not block (``.get(timeout=)`` does). The future fails with
    ``RemoteTensorError`` (an ``ActorError``) naming the failed ranks, the op, its remote
    traceback and the line that issued it, if a value failed on any rank; with
    ``SupervisionError`` if a rank died.
    """
    leaves, spec = tree_flatten(obj)
    by_mesh = _requests(leaves, coords)
    if not by_mesh:
        return compat.completed(obj)
    parts = []
    for tm, requests in by_mesh.items():
        reply = _watch(tm, tm.stream.fetch_after_batch(requests))
        parts.append(compat.then(reply, partial(_completed_assembly, tm, requests)))

    def combine(results: list[dict[tuple[int, int], Any]]) -> Any:
        values = {}
        for r in results:
            values.update(r)
        return compat.completed(_put_back(leaves, spec, values))

    return compat.then(compat.when_all(parts), combine)


def inspect(obj: Any, *, timeout: float | None = None, **coords: int) -> Any:
    """``fetch(obj, **coords).get(timeout)``: blocks until the value is on the controller, up
    to ``timeout`` s (None: ``ACTORMESH_TENSOR_TIMEOUT``, 300 s unless set), then raises
    ``MeshTimeoutError`` naming the ranks that have not answered."""
    return get(obj, timeout, **coords)


def show(obj: Any, **coords: int) -> None:
    """Monarch's ``show``: ``inspect(obj, **coords)`` displayed (in a notebook as its output,
    else printed). Blocks as ``inspect`` does."""
    import sys

    value = inspect(obj, **coords)
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    with no_mesh.activate():  # showing a tensor makes tensors: controller ones
        if shell is not None:
            from IPython.display import display

            display(value)
        else:
            print(value)


def get(obj: Any, timeout: float | None, **coords: int) -> Any:
    """``fetch(obj, **coords).get(timeout)``, for a sync point that blocks anyway (``inspect``,
    ``t.item()``), with the default deadline of tensor sync points. Values of one mesh are
    awaited on their own reply future, with no callbacks chained to it. Each callback added to
    a pending reply wakes the I/O thread to watch the main thread's reply socket, which the
    wait then takes back: in a training loop's ``loss.item()``, that was two threads taking
    turns for the GIL every step."""
    if timeout is None and config.TENSOR_TIMEOUT > 0:
        timeout = config.TENSOR_TIMEOUT
    leaves, spec = tree_flatten(obj)
    if not coords:
        values = known.read(leaves)
        if values is not None:  # known here: nothing to ask the ranks (known.py)
            return tree_unflatten(values, spec)
    by_mesh = _requests(leaves, coords)
    if len(by_mesh) != 1:
        return fetch(obj, **coords).get(timeout=timeout)
    ((tm, requests),) = by_mesh.items()
    reply = tm.stream.fetch_after_batch(requests)
    try:
        vm = reply.get(timeout=timeout)
    except SupervisionError as exc:
        raise tm.stream.translate(exc) from exc  # as _watch does
    except MeshTimeoutError as exc:
        raise MeshTimeoutError(_late(tm, reply, exc)) from None
    return _put_back(leaves, spec, _by_stream(tm, _assemble(tm, requests, vm)))


def _late(tm: TensorMesh, reply: Any, exc: MeshTimeoutError) -> str:
    """What a sync point that timed out says: which ranks did not answer, and why they may not."""
    ranks = compat.mesh_id(tm.procs)[1]
    late = [tm.coords_of(ranks.index(r)) for _, r in reply.pending_ranks() if r in ranks]
    said = str(exc).split(" waiting for ", 1)[0]  # "timed out after 2 s"
    return (
        f"{said} waiting for a tensor value from the ranks of {tm!r}; rank "
        f"{', '.join(late) or '(none known)'} ({len(late)} of {len(ranks)}) did not answer. A "
        "rank answers once it ran every op issued before this sync point: a long step, or a "
        "collective that not every rank entered (a remote function that runs one on some "
        "ranks only), which never ends (procs.stacks() shows where each rank is). Give a "
        "longer timeout (t.item(timeout=...), t.get(timeout=...), inspect(..., timeout=...)) "
        "or set ACTORMESH_TENSOR_TIMEOUT (seconds, 0 for none)."
    )


def _requests(
    leaves: list[Any], coords: dict[str, int]
) -> dict[TensorMesh, list[tuple[int, int | None]]]:
    """Per mesh, the ``(value id, wanted rank or None)`` to ask its engines for."""
    by_mesh: dict[TensorMesh, list[tuple[int, int | None]]] = defaultdict(list)
    for leaf in leaves:
        if isinstance(leaf, (MeshTensor, OpaqueRef)):
            tm = leaf.mesh
            index = tm.index_of(coords, "fetch") if coords else None
            want = index if index is not None else (0 if leaf.per_rank else None)
            by_mesh[tm].append((leaf.value_id, want))
    return by_mesh


def _by_stream(tm: TensorMesh, values: dict[int, Any]) -> dict[tuple[int, int], Any]:
    """``values`` keyed by (stream, id): ids are per stream, and a tree may hold the values of
    several meshes (the parameters of a pipeline's stages) under the same ids."""
    stream = id(tm.stream)
    return {(stream, i): v for i, v in values.items()}


def _put_back(leaves: list[Any], spec: Any, values: dict[tuple[int, int], Any]) -> Any:
    out = list(leaves)
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, (MeshTensor, OpaqueRef)):
            out[i] = values[id(leaf.mesh.stream), leaf.value_id]
    return tree_unflatten(out, spec)


def _watch(tm: TensorMesh, reply: Any) -> Any:
    """A rank death seen by a fetch closes the mesh's values (see Stream.translate), and the
    future fails saying so."""
    return compat.on_failure(reply, tm.stream.translate)


def _completed_assembly(tm: TensorMesh, requests: Any, vm: Any) -> Any:
    return compat.completed(_by_stream(tm, _assemble(tm, requests, vm)))


def fetch_value(ref: OpaqueRef, tm: TensorMesh, index: int) -> compat.Future[Any]:
    requests: list[tuple[int, int | None]] = [(ref.value_id, index)]
    reply = _watch(tm, tm.stream.fetch_after_batch(requests))
    return compat.then(
        reply, lambda vm: compat.completed(_assemble(tm, requests, vm)[ref.value_id])
    )


def _assemble(
    tm: TensorMesh, requests: Sequence[tuple[int, int | None]], vm: Any
) -> dict[int, Any]:
    replies = vm.values()
    orphans: dict[tuple[int, int], FailureInfo] = {}
    for index, reply in enumerate(replies):
        for info in reply["orphans"]:
            orphans[(index, info.serial)] = info
    if orphans:
        for group in _group(list(orphans.values())):
            compat.report_unhandled(_error(group))
    out: dict[int, Any] = {}
    for id, want in requests:
        failed = [r["poison"][id] for r in replies if id in r["poison"]]
        if failed:
            raise _error(failed)
        pieces = [r["data"][id] for r in replies if id in r["data"]]
        if not pieces:
            raise RuntimeError(f"no rank sent value {id} (want={want}); this is a bug")
        if pieces[0][0] == "value":
            out[id] = pieces[0][1]
            continue
        _, first, _, shape, divisor = pieces[0]
        # Under no_mesh: a fetch inside `with procs.activate():` builds a controller tensor.
        with no_mesh.activate():
            if divisor is None:  # disjoint blocks
                full = torch.empty(shape, dtype=first.dtype)
            else:  # each rank's term of a partial sum (worker/fetch.combinable)
                full = torch.zeros(shape, dtype=first.dtype)
        for _, local, offset, _, _ in pieces:
            local = local.cpu()
            if local.shape == full.shape and not any(offset):  # all of it (a loss's term)
                if divisor is None:
                    full.copy_(local)
                else:
                    full.add_(local)
                continue
            where = tuple(slice(o, o + n) for o, n in zip(offset, local.shape, strict=True))
            if divisor is None:
                full[where] = local
            else:
                full[where] += local
        if divisor is not None and divisor != 1:
            full /= divisor
        out[id] = full
    return out


def _group(infos: list[FailureInfo]) -> list[list[FailureInfo]]:
    groups: dict[tuple[str, str], list[FailureInfo]] = defaultdict(list)
    for info in infos:
        groups[(info.op, info.site)].append(info)
    return list(groups.values())


def _error(infos: list[FailureInfo]) -> RemoteTensorError:
    failures = [
        compat.RemoteFailure(i.rank, "tensor engine", i.op, i.exc_type, i.message, i.traceback)
        for i in sorted(infos, key=lambda i: i.rank)
    ]
    return RemoteTensorError(failures, infos[0].op, infos[0].site)


def busy_spans(mesh: Any, timeout: float | None = None) -> list[list[tuple[float, float]]]:
    """When the ranks of ``mesh``'s tensor engine ran ops: per rank (row-major), its recent
    ``(start, end)`` wall-clock times (``time.time()``), not counting waits for what other
    meshes send it (``to_mesh``). Blocks until the engine ran what was sent to it (a sync
    point). For seeing whether two meshes (a pipeline's stages, a generator and a trainer)
    were busy at the same time; the clocks of one host agree, other hosts' may not."""
    tm = tensor_mesh(mesh)
    tm.stream.flush()
    spans: list[list[tuple[float, float]]] = (
        tm.engine.busy_spans.call().get(timeout=timeout).values()
    )
    return spans


def overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Seconds during which both sets of spans were busy (each set's spans merged first)."""
    xs, ys = _merged(a), _merged(b)
    total, i, j = 0.0, 0, 0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def live(mesh: Any) -> compat.ValueMesh:
    """How many remote values each rank holds (after sending the buffered ops and drops)."""
    from .mesh import tensor_mesh

    tm = tensor_mesh(mesh, "live")
    tm.stream.flush()
    return tm.engine.live.call().get(timeout=60)

"""Remote functions: user code run on every rank, as one op in the stream.

``@remote(propagate=...)`` follows PyTorch Monarch's meanings of ``propagate``:

- a callable: run on the controller on meta tensors of the inputs' shapes; its outputs give the
  result's shapes and dtypes (nothing is run on the workers to learn them);
- ``None`` (the default) or ``"cached"``: the output metadata is learnt once per input
  signature and cached. First the function itself is tried on meta tensors on the controller;
  if it cannot run there (data-dependent code), the op runs on the workers and rank 0
  describes its result (one round trip, then cached);
- ``"inspect"``: the function has no tensor output; its per-rank values are only fetched
  (``actormesh.fetch(result, **coords)``).

A global MeshTensor argument arrives as the rank's DTensor, a per-rank one as its tensor.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten, treespec_loads

from .. import compat
from ..wire.ops import Ref, issue_site
from .constants import snapshot
from .mesh import TensorMesh
from .tensor import MeshTensor, OpaqueRef, new_mesh_tensor

_fn_ids = itertools.count(1)


class RemoteFunction:
    """A function run on every rank of a mesh (made by ``actormesh.remote``)."""

    def __init__(self, fn: Callable[..., Any], propagate: Any) -> None:
        if not callable(fn):
            raise compat.MeshUsageError(f"remote() needs a function, got {fn!r}")
        if not (propagate is None or callable(propagate) or propagate in ("cached", "inspect")):
            raise compat.MeshUsageError(
                f"propagate must be a callable, None, 'cached' or 'inspect', got {propagate!r}"
            )
        self.fn = fn
        self.propagate = propagate
        self.name = getattr(fn, "__qualname__", repr(fn))
        self._defined: dict[str, int] = {}  # engine key -> this function's id there
        self._cache: dict[Any, Any] = {}
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<remote function {self.name}>"

    def mesh_of(self, args: Any, kwargs: Any) -> tuple[TensorMesh, bool]:
        from .activate import active_mesh

        for leaf in tree_flatten((args, kwargs))[0]:
            if isinstance(leaf, MeshTensor):
                return leaf.mesh, leaf.per_rank
        tm = active_mesh()
        if tm is None:
            raise compat.MeshUsageError(
                f"{self.name}: a remote function needs a MeshTensor argument or an active mesh "
                "(`with procs.activate():`) to know where to run"
            )
        return tm, True

    def _fn_id(self, tm: TensorMesh) -> int:
        fid = self._defined.get(tm.key)
        if fid is None:
            fid = next(_fn_ids)
            tm.stream.record(("define", (), (), (), (fid, self.fn), issue_site()))
            # Only once recorded: Ctrl-C in between leaves it to define again, not undefined.
            self._defined[tm.key] = fid
        return fid

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tm, per_rank = self.mesh_of(args, kwargs)
        fid = self._fn_id(tm)
        ins = tuple(
            x.value_id for x in tree_flatten((args, kwargs))[0] if isinstance(x, MeshTensor)
        )
        eargs, ekwargs = _encode(args), _encode(kwargs)
        site = issue_site()
        if self.propagate == "inspect":
            out = OpaqueRef(tm, tm.stream.new_id(), per_rank=True)
            tm.stream.record(
                (
                    "remote_call",
                    (out.value_id,),
                    ins,
                    (None,),
                    (fid, self.name, eargs, ekwargs, False),
                    site,
                )
            )
            return out
        shape_of = _signature(args, kwargs)
        described = self._cache.get(shape_of)
        if described is None:
            described = self._describe(args, kwargs)
            if described is None:
                return self._call_and_describe(
                    tm, fid, ins, eargs, ekwargs, per_rank, shape_of, site
                )
            self._cache[shape_of] = described
        spec, entries = described
        leaves, out_ids, meta = _outputs(tm, entries, per_rank)
        tm.stream.record(
            (
                "remote_call",
                tuple(out_ids),
                ins,
                tuple(meta),
                (fid, self.name, eargs, ekwargs, True),
                site,
            )
        )
        return tree_unflatten(leaves, spec)

    def _describe(self, args: Any, kwargs: Any) -> Any:
        """(spec, entries) of the result, from propagate or the function run on meta tensors."""
        fn = self.propagate if callable(self.propagate) else self.fn
        margs, mkwargs = tree_map(_meta, (args, kwargs))
        try:
            result = fn(*margs, **mkwargs)
        except Exception:
            if callable(self.propagate):
                raise  # the user's own propagate failed: that is their error, at their line
            return None
        leaves, spec = tree_flatten(result)
        entries = [
            ("new", tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else ("value", x)
            for x in leaves
        ]
        return spec, entries

    def _call_and_describe(
        self, tm: TensorMesh, fid: int, ins: Any, eargs: Any, ekwargs: Any, per_rank: bool,
        shape_of: Any, site: str,
    ) -> Any:  # fmt: skip
        whole = tm.stream.new_id()
        tm.stream.record(
            ("remote_call", (whole,), ins, (None,), (fid, self.name, eargs, ekwargs, False), site)
        )
        try:
            tm.stream.flush()
            first = tm.engine.slice(**dict.fromkeys(tm.labels, 0))
            text, entries = first.describe.call_one(whole).get(timeout=300)
            spec = treespec_loads(text)
            self._cache[shape_of] = (spec, entries)
            leaves, out_ids, meta = _outputs(tm, entries, per_rank)
            tm.stream.record(("unpack", tuple(out_ids), (whole,), tuple(meta), (Ref(whole),), site))
        finally:
            tm.stream.died(whole)  # the whole result is not needed once unpacked
        return tree_unflatten(leaves, spec)

    def call(self, *args: Any, **kwargs: Any) -> compat.Future[Any]:
        """Run on every rank now; a Future of a ``ValueMesh`` of the results (tensors come back
        as each rank's local tensor). Runs after the ops issued before it."""
        tm, _ = self.mesh_of(args, kwargs)
        fid = self._fn_id(tm)
        eargs, ekwargs = _encode(args), _encode(kwargs)
        result: compat.Future[Any] = tm.stream.call_after_batch(
            lambda cells: tm.engine.call_fn.call(fid, eargs, ekwargs, cells)
        )
        return result


def _encode(x: Any) -> Any:
    """The arguments as sent: MeshTensors by id, controller tensors as snapshots."""
    return tree_map(lambda v: Ref(v.value_id) if isinstance(v, MeshTensor) else snapshot(v), x)


def _meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return torch.empty(x.shape, dtype=x.dtype, device="meta")
    return x


def _signature(args: Any, kwargs: Any) -> Any:
    leaves = tree_flatten((args, kwargs))[0]
    sig: list[Any] = []
    for x in leaves:
        if isinstance(x, torch.Tensor):
            sig.append((tuple(x.shape), x.dtype))
        elif isinstance(x, (int, bool, str, type(None))):
            sig.append(x)
        else:
            sig.append(type(x))
    return tuple(sig)


def _outputs(
    tm: TensorMesh, entries: Any, per_rank: bool
) -> tuple[list[Any], list[int], list[Any]]:
    leaves, out_ids, meta = [], [], []
    for e in entries:
        if e[0] == "new":
            t = new_mesh_tensor(tm, e[1], e[2], per_rank=per_rank)
            leaves.append(t)
            out_ids.append(t.value_id)
            meta.append((tuple(e[1]), e[2], per_rank))
        else:
            leaves.append(e[1])
    return leaves, out_ids, meta


def remote(fn: Callable[..., Any] | None = None, *, propagate: Any = None) -> Any:
    """Make ``fn`` a remote function: ``fn(*args)`` records one op that runs ``fn`` on every
    rank and returns MeshTensors at once (see the module docs for ``propagate``). A global
    MeshTensor argument arrives as the rank's DTensor (``t.to_local()`` is its shard), a
    per-rank one as the rank's tensor. ``fn.call(*args)`` runs it now and gives a
    ``Future[ValueMesh]``.

    Usable as ``@remote``, ``@remote(propagate=...)`` or ``remote(fn, propagate=...)``. If the
    function raises on some ranks, its results there are poisoned (stand-ins of the propagated
    shape keep later collectives whole) and the next sync point that reads them raises
    ``RemoteTensorError``.
    """
    if fn is None:
        return lambda f: RemoteFunction(f, propagate)
    return RemoteFunction(fn, propagate)


def call_on_shard_and_fetch(fn: Any, *args: Any, **coords: int) -> compat.Future[Any]:
    """Run ``fn`` (a remote function or a plain one) on the mesh and fetch the result of the
    rank at ``coords`` (omitted dimensions mean 0). Every rank runs it, so functions that use
    collectives do not hang; only the chosen rank's value is returned."""
    rf = fn if isinstance(fn, RemoteFunction) else RemoteFunction(fn, "inspect")
    tm, _ = rf.mesh_of(args, {})
    index = tm.index_of(coords, "call_on_shard_and_fetch")
    return compat.then(rf.call(*args), lambda vm: compat.completed(vm.values()[index]))

"""``endpoint.rref(...)``: an actor endpoint as a step of the tensor op stream (Monarch's rref).

The controller records one ``rref`` op. Each rank's engine, on reaching it (so after the ops
issued before it), hands the call to the actor's own thread (``run_task``: after the calls
already in its inbox, never beside one) with every MeshTensor argument as that rank's local
value, waits for it, and keeps the whole result as a value of its own (``worker/rref.py``); an
``unpack`` op then names the result's tensors with ids the controller allocated, so later ops
read them where they are. The results are per-rank MeshTensors (each actor returns its own).

Shapes: an endpoint has no shape propagation of its own, so the first call with a given input
signature asks rank 0 to describe its result (one round trip), and later calls use that, as a
remote function whose ``propagate`` cannot run on meta tensors does.
"""

from __future__ import annotations

from typing import Any

from torch.utils._pytree import tree_flatten, tree_unflatten, treespec_loads

from .. import compat
from ..wire.ops import Ref, issue_site
from ..worker.rref import ACTOR_WAIT
from . import lifetime
from .mesh import TensorMesh
from .tensor import MeshTensor

_described: dict[Any, Any] = {}  # (actor key, endpoint, input signature) -> (spec, entries)


def rref(key: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    from .activate import active_mesh
    from .remote import _outputs, _signature

    leaves = tree_flatten((args, kwargs))[0]
    meshes = [x for x in leaves if isinstance(x, MeshTensor)]
    tm: TensorMesh | None = meshes[0].mesh if meshes else active_mesh()
    if tm is None:
        raise compat.MeshUsageError(
            f"{name}.rref needs a MeshTensor argument or an active mesh "
            "(`with procs.activate():`) to know which tensor stream it is a step of"
        )
    other = next((x.mesh for x in meshes if x.mesh is not tm), None)
    if other is not None:
        raise compat.MeshUsageError(
            f"{name}.rref: MeshTensors of two different meshes ({tm.describe()} and "
            f"{other.describe()}); move one to the other's mesh first: "
            f"{lifetime.move_hint()}"
        )
    ins = tuple(x.value_id for x in meshes)
    payload = (key, name, _refs(args), _refs(kwargs))
    site = issue_site(3)  # the user's line: above this and the runtime's Endpoint.rref
    whole = tm.stream.new_id()
    tm.stream.record(("rref", (whole,), ins, (None,), payload, site))
    try:
        signature = (key, name, _signature(args, kwargs))
        described = _described.get(signature)
        if described is None:
            tm.stream.flush()
            first = tm.engine.slice(**dict.fromkeys(tm.labels, 0))
            text, entries = first.describe.call_one(whole).get(timeout=ACTOR_WAIT)
            described = _described[signature] = (treespec_loads(text), entries)
        spec, entries = described
        outs, out_ids, meta = _outputs(tm, entries, True)
        tm.stream.record(("unpack", tuple(out_ids), (whole,), tuple(meta), (Ref(whole),), site))
    finally:
        tm.stream.died(whole)  # the whole result is not needed once unpacked
    return tree_unflatten(outs, spec)


def _refs(x: Any) -> Any:
    from .remote import _encode  # MeshTensors by id, controller tensors as snapshots

    return _encode(x)

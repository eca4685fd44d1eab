"""The op kinds of the tensor stream, written down once: each kind's payload fields, which
controller modules record it and which worker function runs it.

An op is the tuple of ``ops.py``: ``(kind, out, ins, meta, payload, site)``. Its ``payload`` is
a plain tuple of the fields listed here, in this order (tuples pickle several times faster than
small classes, and a batch holds hundreds of ops): a handler unpacks it by name in one statement
(``name, args, kwargs, seed, inputs = payload``), and this table is what gives those positions
their names. One kind has one payload shape, whichever code path records it.

A field is ``name: type`` (``|`` between alternatives): ``Ref`` a remote value by id (ops.py),
``IN``-or-``Ref`` args are explained per kind, ``tensor`` a controller ``torch.Tensor`` sent by
value, ``any`` a value the check does not constrain (a user's module or function).

``plain`` kinds carry only tensors, Refs, scalars, dtypes and placements: a batch of only those
goes through the C pickler (``packing.pack``), several times faster than the runtime's
cloudpickle; the others carry user functions, modules or arguments that may need pickling by
value (defined in a notebook).

With ``ACTORMESH_CHECK_PROTOCOL=1`` (the test suite sets it) the controller checks every op it
records against this table, and the module that recorded it against ``emitted_by``
(``stream.py``); ``tests/tensor/test_op_kinds.py`` checks the worker's ``handlers.HANDLERS``
against ``handler`` and records programs that emit every kind.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from .ops import Op, Ref

# The recording modules and handlers, as ``module`` or ``module:function`` under actormesh.tensor.
_REC, _DIST, _ACT = "controller.recording", "controller.distribute", "controller.activate"
_REMOTE, _MOD, _RREF = "controller.remote", "controller.module", "controller.rref"
_TENSOR, _CONSTANTS = "controller.tensor", "controller.constants"
_REDUCE, _MESH = "controller.reduce", "controller.mesh"
_PLANS, _INPUTS = "controller.plans", "controller.inputs"
_MOVE = "controller.transfer"
_CKPT, _RECOVERY = "controller.checkpoint", "controller.recovery"
_RESTORE = "controller.restore"
_PROGRAMS = "controller.programs"
_GRADS = "controller.grad_sync"


class Kind(NamedTuple):
    """One op kind. ``outputs``: how many ids ``out`` names (``None``: as many as the op has
    results, which the controller knows from shape propagation)."""

    name: str
    fields: tuple[str, ...]
    outputs: int | None
    emitted_by: tuple[str, ...]
    handler: str
    plain: bool
    doc: str

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(f.partition(":")[0] for f in self.fields)


_TABLE = [
    # -- torch ops (recording.py: every aten op that reaches MeshTensor.__torch_dispatch__) -----
    Kind("aten", ("name: str", "args: tuple", "kwargs: dict", "seed: int|None",
                  "inputs: tuple|None"), None, (_REC,), "worker.aten:run_aten", True,
         "One aten op (``name``: ``aten.mm.default``). ``inputs`` not None: the fast path's "
         "op, whose tensor arguments are ``IN`` placeholders standing for these ids in order "
         "(args, then kwargs) and which has no controller tensors. ``None``: the general path's, "
         "whose arguments hold ``Ref``s (controller tensors uploaded as ``constant`` ops). "
         "``seed``: one draw of the controller's generator for a random op."),
    Kind("constant", ("tensor: tensor",), 1, (_CONSTANTS,), "worker.aten:run_constant", True,
         "A controller tensor that later ops read by id (``Stream.constant``): an op's "
         "argument, a module's input batch; uploaded once per version."),
    # -- global tensors from the controller (distribute.py, MeshTensor's methods) ---------------
    Kind("distribute", ("tensor: tensor|Ref", "placements: tuple", "view: int"), 1,
         (_DIST, _INPUTS), "worker.distribute:run_distribute", True,
         "A controller tensor placed on the mesh: each rank keeps its slice of the whole. "
         "``Ref``: a ``constant`` (a meshed model's input batch, uploaded once per version)."),
    Kind("distribute_staged", ("staged_id: int", "placements: tuple", "shape: tuple",
                               "view: int"), 1,
         (_DIST,), "worker.distribute:run_distribute_staged", False,
         "A large tensor whose blocks went to each rank ahead of the op (``engine.stage``)."),
    Kind("random", ("fn: str", "shape: tuple", "dtype: dtype", "seed: int",
                    "placements: tuple", "view: int"), 1, (_DIST,),
         "worker.distribute:run_random", True,
         "``actormesh.tensor.rand``/``randn``: one global tensor from one seed."),
    Kind("redistribute", ("value: Ref", "placements: tuple"), 1, (_TENSOR,),
         "worker.distribute:run_redistribute", True,
         "``MeshTensor.redistribute``: the same global tensor with other placements."),
    Kind("placements", ("value: Ref",), 1, (_TENSOR,), "worker.distribute:run_placements", True,
         "``MeshTensor.placements()``: the value's DTensor placements, as a value to fetch."),
    # -- per-rank tensors (activate.py) ---------------------------------------------------------
    Kind("factory", ("name: str", "args: tuple", "kwargs: dict"), 1, (_ACT,),
         "worker.activate:run_factory", True,
         "``torch.<name>(*args, **kwargs)`` under ``activate()``, run by each rank itself."),
    Kind("rank", ("dims: tuple", "view: int"), 1, (_ACT,), "worker.activate:run_rank", True,
         "``rank(procs, dims)``: each rank's coordinate along ``dims`` of mesh ``view`` (0: the "
         "engine's own), an int64 scalar."),
    Kind("reduce", ("value: Ref", "dims: tuple", "reduction: str", "scatter: bool", "view: int",
                    "inplace: bool", "into: Ref|None"), 1, (_REDUCE,),
         "worker.reduce:run_reduce", True,
         "``MeshTensor.reduce``/``reduce_``: a per-rank tensor combined over dimensions of mesh "
         "``view`` (Monarch's kinds); ``inplace``: into ``value``; ``into``: into ``out=``."),
    # -- shapes of an engine's processes (mesh.py), values handed to actors (tensor.py) ---------
    Kind("mesh_view", ("view: int", "labels: tuple", "sizes: tuple"), 0, (_MESH,),
         "worker.views:run_mesh_view", True,
         "A rename/flatten/split of the engine's mesh, numbered ``view`` (0 is the engine's "
         "own): every rank builds its ``DeviceMesh`` here, before any op that names it."),
    Kind("pin", ("value: Ref", "ranks: tuple"), 1, (_TENSOR,), "worker.local:run_pin", True,
         "A MeshTensor pickled into a message for the actors of ``ranks`` (engine indices): "
         "they keep its value under this id until their actor read it; the others drop it."),
    # -- values moving between engines (transfer.py: MeshTensor.to_mesh) ------------------------
    Kind("link", ("peer: str", "ports: tuple"), 0, (_MOVE,), "worker.transfer:run_link", False,
         "The inboxes (ports, by engine index) of engine ``peer``, for the ``send`` ops to it; "
         "sent once per pair of engines, on the sending one's stream."),
    Kind("send", ("value: Ref", "peer: str", "key: int", "placements: tuple|None",
                  "labels: tuple", "sizes: tuple", "targets: tuple|None"), 0, (_MOVE,),
         "worker.transfer:run_send", True,
         "Send ``value`` to engine ``peer`` as transfer ``key``, to a mesh of ``labels`` and "
         "``sizes``. Global: every rank sends every destination rank the pieces it needs of "
         "the value placed as ``placements`` (None: the source's, by dimension name). Per-rank: "
         "``targets[i]`` lists the destination ranks of source rank i."),
    Kind("recv", ("key: int", "sender: str", "count: int", "view: int", "shape: tuple",
                  "dtype: dtype", "timeout: float"), 1, (_MOVE,), "worker.transfer:run_recv",
         True,
         "Transfer ``key`` from engine ``sender``: wait for its ``count`` messages (at most "
         "``timeout`` s) and assemble them, a global value on mesh ``view`` of ``shape``, or a "
         "per-rank one (the sum of its messages)."),
    # -- remote functions (remote.py) and endpoints as steps (rref.py) --------------------------
    Kind("define", ("fn_id: int", "fn: any"), 0, (_REMOTE,), "worker.remote:run_define", False,
         "A remote function's code, sent once per engine under ``fn_id``."),
    Kind("remote_call", ("fn_id: int", "name: str", "args: tuple", "kwargs: dict",
                         "structured: bool"), None, (_REMOTE,), "worker.remote:run_call", False,
         "A call of remote function ``fn_id`` on every rank; ``structured`` False: its whole "
         "result is one opaque value (``propagate='inspect'``, or a result still to describe)."),
    Kind("unpack", ("whole: Ref",), None, (_REMOTE, _RREF), "worker.remote:run_unpack", True,
         "The tensors of a result rank 0 described (a remote call's, an rref's) under new ids."),
    Kind("rref", ("actor_key: str", "endpoint: str", "args: tuple", "kwargs: dict"), 1, (_RREF,),
         "worker.rref:run_rref", False,
         "``endpoint.rref(...)``: the actor's endpoint run on its own thread; its result kept."),
    # -- module_to_mesh (module.py) -------------------------------------------------------------
    Kind("module_build", ("source: any", "is_factory: bool", "seed: int", "names: tuple",
                          "data_dim: str|None", "fsdp: bool", "tp_plan: dict", "tp_dim: str|None"),
         None, (_MOD,), "worker.module:run_build", False,
         "A module (or a factory run under ``seed``) built on every rank, its parameters placed "
         "(``tp_plan``, ``fsdp``): out names its distinct parameters, then buffers (``names``: "
         "theirs on the controller, checked), then a report of their placements."),
    Kind("grad_sync", ("pairs: tuple",), None, (_GRADS,), "worker.module:run_grad_sync", True,
         "After a backward: each (gradient, parameter) pair's gradient moved to the "
         "parameter's placements under its own id (partial sums summed, bucketed)."),
    Kind("relayout", ("value: Ref", "axis: int", "placement: any"), 1, (_PLANS,),
         "worker.module:run_relayout", True,
         "A tensor-parallel style's layout: ``value`` placed as ``placement`` over mesh "
         "dimension ``axis``, the others as they are (the same global value)."),
    # -- checkpoints (checkpoint.py): torch.distributed.checkpoint run by every rank -----------
    Kind("checkpoint_save", ("spec: any", "path: str", "token: str", "background: bool"), 1,
         (_CKPT,), "worker.checkpoint:run_save", False,
         "``dcp.save`` (``background``: ``dcp.async_save``) of ``spec``, the state in DCP's "
         "layout with ``Ref``s for MeshTensors, written beside ``path`` and put in its place "
         "when complete; out names rank 0's DCP metadata (``background``: the save's token)."),
    Kind("checkpoint_load", ("spec: any", "path: str"), 1, (_CKPT,),
         "worker.checkpoint:run_load", False,
         "``dcp.load`` into the values ``spec`` names, in place (every input is written); out "
         "names what rank 0 read for the spec's other leaves."),
    # -- live recovery (recovery.py) -------------------------------------------------------
    Kind("snapshot", ("lineage: str", "gen: int", "ids: tuple", "gather: str|None",
                      "anchor: int"), None,
         (_RECOVERY,), "worker.recovery:run_snapshot", True,
         "A committed step: each rank copies its shards of the training state's values (``ids``) "
         "as generation ``gen`` of ``lineage``, replacing the previous copy whole; ``gather``: "
         "each copied whole along that mesh dimension (before it changes size), and out names "
         "a receipt; ``anchor``: the id whose drop frees the copy (worker/snapshots.py)."),
    Kind("restore", ("lineage: str", "gen: int", "metas: dict", "transfers: tuple"), None,
         (_RESTORE,), "worker.recovery:run_restore", False,
         "On a restarted engine: the values of snapshot ``gen`` under their ids (out), each rank "
         "from its own copy or from a rank holding its shard (``transfers``: id, dst, src); the "
         "last output is a receipt the controller fetches."),
    Kind("allocate", ("metas: dict",), None, (_RESTORE,), "worker.recovery:run_allocate", False,
         "On a restarted engine: zeros under the ids of ``out`` placed as ``metas`` says (the "
         "survivors' snapshots), for a checkpoint load to fill."),
    # -- a repeated step sent by reference (controller/programs.py, wire/programs.py) ----------
    Kind("program", ("index: int", "ops: tuple|None", "ids: tuple", "values: tuple"), 0,
         (_PROGRAMS,), "worker.programs:run_program", True,
         "A run of ops with the structure of program ``index``: each op's out and ins ``ids``, "
         "op after op, and its floats (``values``). ``ops``: the run that defines it, sent once "
         "(the ranks keep its decoded steps under ``index``), else None."),
]  # fmt: skip

KINDS: dict[str, Kind] = {k.name: k for k in _TABLE}

# Op kinds whose batches the C pickler may pickle (packing.pack).
PLAIN_KINDS = frozenset(k.name for k in _TABLE if k.plain)

CHECK = os.environ.get("ACTORMESH_CHECK_PROTOCOL") == "1"


class OpKindError(AssertionError):
    """An op that does not match its kind's entry (raised only with the check on)."""


_TYPES: dict[str, Any] = {
    "str": str, "int": int, "float": float, "bool": bool, "tuple": tuple, "dict": dict,
    "None": type(None), "Ref": Ref, "tensor": torch.Tensor, "dtype": torch.dtype, "any": object,
}  # fmt: skip


def _types(field: str) -> tuple[type, ...]:
    return tuple(_TYPES[t.strip()] for t in field.partition(":")[2].split("|"))


def check_op(op: Op, emitter: str | None = None) -> None:
    """Raise :class:`OpKindError` unless ``op`` has its kind's shape (and, given the module that
    recorded it, ``actormesh.tensor.<emitter>``, that module is one of the kind's)."""
    if type(op) is not tuple or len(op) != 6:
        raise OpKindError(f"an op is (kind, out, ins, meta, payload, site), got {op!r:.200}")
    kind, out, ins, meta, payload, site = op
    entry = KINDS.get(kind)
    if entry is None:
        raise OpKindError(f"unknown op kind {kind!r}: add it to tensor/wire/kinds.py")
    where = f"an op of kind {kind!r}"
    for name, ids in (("out", out), ("ins", ins)):
        if type(ids) is not tuple or not all(type(i) is int for i in ids):
            raise OpKindError(f"{where}: {name} must be a tuple of ids, got {ids!r:.200}")
    if entry.outputs is not None and len(out) != entry.outputs:
        raise OpKindError(f"{where} names {entry.outputs} output(s), got out={out!r}")
    if not isinstance(meta, tuple) or len(meta) != len(out):
        raise OpKindError(f"{where}: meta needs one entry per output id, got {meta!r:.200}")
    for m in meta:
        if m is not None and not (type(m) is tuple and 3 <= len(m) <= 4):
            raise OpKindError(f"{where}: a meta entry is (shape, dtype, per_rank[, split]) or "
                              f"None, got {m!r:.200}")  # fmt: skip
    if type(site) is not str:
        raise OpKindError(f"{where}: site must be the issuing line as text, got {site!r:.200}")
    if type(payload) is not tuple or len(payload) != len(entry.fields):
        raise OpKindError(
            f"{where}: the payload is ({', '.join(entry.field_names)}), got {payload!r:.300}"
        )
    for field, value in zip(entry.fields, payload, strict=True):
        if not isinstance(value, _types(field)):
            raise OpKindError(
                f"{where}: payload field {field!r} got a {type(value).__name__}: {value!r:.200}"
            )
    if emitter is not None and emitter not in entry.emitted_by:
        raise OpKindError(f"{where} was recorded by {emitter}; the table says {entry.emitted_by}")


# Ops checked so far, by kind (test_op_kinds.py asserts that its programs recorded every kind).
seen: Counter[str] = Counter()


def checked(record: Callable[[Any, Op], None]) -> Callable[[Any, Op], None]:
    """``Stream.record`` that first checks the op against its kind, and the module that
    recorded it against the kind's ``emitted_by`` (``stream.py`` uses it with CHECK on)."""

    def checked_record(stream: Any, op: Op) -> None:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        check_op(op, caller.removeprefix("actormesh.tensor."))
        seen[op[0]] += 1
        record(stream, op)

    return checked_record

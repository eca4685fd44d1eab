"""Recording: every aten op that reaches ``MeshTensor.__torch_dispatch__`` becomes an op in its
mesh's stream, and returns new MeshTensors at once (``tensor.py`` is the tensor itself).

The general path (``_record``) takes any arguments: nested lists of tensors, controller tensors
(uploaded once as constants, ``Stream.constant``), and finds the outputs' shapes on meta tensors
(``shapes.propagate``, cached); a shape error raises here, at the user's line, and nothing is
recorded. It leaves a *plan* for its (op, input signatures, scalars), and the fast path
(``dispatch``) records the next such op from the plan: its cost is that of every recorded op
(bench T2), so it is written out rather than factored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_unflatten

from .. import compat
from ..wire.ops import IN, NoOutputs, Ref, issue_site
from ..wire.shapes import plans, propagate, remember, signature
from . import known, lifetime
from .constants import as_refs
from .fetch import get
from .mesh import TensorMesh
from .tensor import (
    NO_KWARGS,
    STRIDED,
    MeshTensor,
    check_fits,
    make_wrapper,
    new_mesh_tensor,
    reshape_in_place,
)

_names: dict[Any, str] = {}  # op -> "aten.mm.default" (str() of an op costs microseconds)

# Ops the controller handles before recording: those whose value it needs (each a sync point),
# and resize_, which only a per-rank tensor takes. Looked up by id first, so they cost nothing.
_SYNC: dict[Any, Callable[..., Any]] = {}

_RANDOM = {"aten.rand_like.default", "aten.randn_like.default", "aten.uniform_.default",
           "aten.normal_.default", "aten.bernoulli_.float"}  # fmt: skip
_GENERAL: Any = object()  # an argument the fast path does not take
# Scalars keyed by value (an int may be a size or a dim, and so change the output's shape).
_BY_VALUE = frozenset(
    {int, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout}
)
_BOOL_KEYS = {True: ("bool", True), False: ("bool", False)}  # True == 1 as a dict key
_NEW, _ALIAS, _VALUE = 0, 1, 2
# id(op) -> whether it is a _foreach_ op or one of ours (wire/optim_ops.py): its Scalar[] and
# float[] arguments (one per tensor: step sizes, step counts) are keyed by length on the fast
# path, never by value. (Ops live as long as torch.ops.)
_SCALAR_LISTS: dict[int, bool] = {}


def _fast_arg(a: Any, key: list[Any], ins: list[int], func: Any) -> Any:
    """Append ``a``'s part of the plan key; return it as sent, or ``_GENERAL``."""
    t = type(a)
    if t is MeshTensor:
        key.append(a.shape_sig)
        ins.append(a.value_id)
        return IN
    if t is float:
        key.append(float)  # by type only, as in shapes.propagate
        return a
    if t in _BY_VALUE:
        key.append(a)
        return a
    if t is bool:
        key.append(_BOOL_KEYS[a])
        return a
    if t is list or t is tuple:
        bools = False
        for e in a:
            if type(e) is not int:
                if type(e) is bool:  # a bool[] (which of a backward's gradients to make)
                    bools = True
                    continue
                if type(e) is float and _takes_scalar_lists(func):
                    return _float_list(a, t, key)
                return _GENERAL
        key.append((t, *[_BOOL_KEYS[e] if type(e) is bool else e for e in a]) if bools else (t, *a))
        return a
    return _GENERAL


def _takes_scalar_lists(func: Any) -> bool:
    known = _SCALAR_LISTS.get(id(func))
    if known is None:
        known = _SCALAR_LISTS[id(func)] = func.name().startswith(("aten::_foreach_", "actormesh::"))
    return known


def _float_list(a: Any, t: type, key: list[Any]) -> Any:
    """A _foreach_ op's Scalar[] (an optimizer's per-parameter step sizes): keyed by length,
    as a float is by type (it changes with every step and never changes a shape)."""
    for e in a:
        if type(e) is not float:
            return _GENERAL
    key.append((t, float, len(a)))
    return a


def _fast_tensor_list(a: list[Any], key: list[Any], ins: list[int]) -> TensorMesh | None:
    """Append a Tensor[] of MeshTensors to the plan key and its ids to ``ins``; return their one
    mesh, or None when the general path must take it (mixed meshes or kinds, other elements)."""
    tm = a[0].mesh
    per_rank = a[0].per_rank
    sigs: list[Any] = [list]
    for x in a:
        if type(x) is not MeshTensor or x.mesh is not tm or x.per_rank is not per_rank:
            return None
        sigs.append(x.shape_sig)
        ins.append(x.value_id)
    key.append(tuple(sigs))
    return tm


def dispatch(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    fid = id(func)  # ops live as long as torch.ops: their ids are stable, and hash at C speed
    if fid in _SYNC_IDS:
        return _SYNC[func](*args, **kwargs)
    # The fast path: MeshTensors and scalars as arguments (most ops, every op of an optimizer
    # step), and a plan from an earlier op of the same signature. Written out, not factored:
    # this is the cost of every recorded op (bench T2).
    key: list[Any] = [fid]
    ins: list[int] = []
    eargs: list[Any] = []
    tm = None
    for a in args:
        ta = type(a)
        if ta is MeshTensor:
            if tm is None:
                tm = a.mesh
            elif a.mesh is not tm:
                return _record(func, args, kwargs, None)  # raises the mixed-mesh error
            key.append(a.shape_sig)
            ins.append(a.value_id)
            eargs.append(IN)
            continue
        if ta is list and a and type(a[0]) is MeshTensor:  # a Tensor[] (a _foreach_ op's)
            m = _fast_tensor_list(a, key, ins)
            if m is None or (tm is not None and m is not tm):
                return _record(func, args, kwargs, None)
            tm = m
            eargs.append([IN] * len(a))
            continue
        e = _fast_arg(a, key, ins, func)
        if e is _GENERAL:
            return _record(func, args, kwargs, None)
        eargs.append(e)
    ekwargs = NO_KWARGS
    if kwargs:
        ekwargs = {}
        for k, a in kwargs.items():
            key.append(k)
            e = _fast_arg(a, key, ins, func)
            if e is _GENERAL:
                return _record(func, args, kwargs, None)
            if e is IN:
                if tm is None:
                    tm = a.mesh
                elif a.mesh is not tm:
                    return _record(func, args, kwargs, None)
            ekwargs[k] = e
    if tm is None:
        return _record(func, args, kwargs, None)
    pkey = tuple(key)
    plan = plans.get(pkey)
    if plan is None:
        return _record(func, args, kwargs, pkey)
    name, outs, meta, single, spec, random = plan
    stream = tm.stream
    out_ids = []
    leaves: list[Any] = []
    for o in outs:
        kind = o[0]
        if kind == _NEW:
            # new_mesh_tensor, inlined (positional: keyword parsing costs a microsecond)
            t = make_wrapper(
                MeshTensor, o[1], o[4], None, None, o[2], STRIDED, tm.device, False, False
            )
            t.value_id = vid = stream.new_id()
            t.mesh = tm
            t.per_rank = o[3]
            t.shape_sig = o[5]
            out_ids.append(vid)
            leaves.append(t)
        elif kind == _ALIAS:
            t = _meshes(_flat((*args, *kwargs.values())))[o[1]]  # an in-place op's target
            out_ids.append(t.value_id)
            leaves.append(t)
        else:
            leaves.append(o[1])
    if stream.known:
        known.after(func, args, kwargs, ins, stream.known, leaves[0] if single else leaves)
    # The inputs travel as IN and ``ins`` (one tuple object, pickled once for both places).
    ins_t = tuple(ins)
    stream.record(
        ("aten", tuple(out_ids), ins_t, meta,
         (name, tuple(eargs), ekwargs, _seed() if random else None, ins_t), issue_site(3))
    )  # fmt: skip
    return leaves[0] if single else tree_unflatten(leaves, spec)


def _seed() -> int:
    # One seed from the controller's generator: every rank draws the same global tensor.
    return int(torch.randint(0, 2**62, ()).item())


def _encode(x: Any, found: list[Any], sig: list[Any], ins: list[int], nested: bool = False) -> Any:
    t = type(x)
    if t is MeshTensor:
        found.append(x)
        ins.append(x.value_id)
        sig.append((0, x.shape, x.stride(), x.dtype))
        return Ref(x.value_id)
    if isinstance(x, torch.Tensor):
        found.append(x)  # a controller tensor: uploaded once (Stream.constant), then by id
        sig.append((1, x.shape, x.stride(), x.dtype))
        return x
    if t is list or t is tuple:
        sig.append((t, len(x)))
        return t(_encode(e, found, sig, ins, True) for e in x)
    if t is float and not nested:
        # A scalar float (a learning rate, an eps) never changes an output's shape, and keying
        # on it would miss the cache on every optimizer step. A list of floats could (a list of
        # scale factors), so those keep their values: a cache miss costs microseconds, a wrong
        # cached shape a wrong program.
        sig.append(float)
        return x
    sig.append(_BOOL_KEYS[x] if t is bool else x)
    return x


def _meshes(found: Sequence[Any]) -> list[MeshTensor]:
    return [x for x in found if type(x) is MeshTensor]


def _flat(args: Sequence[Any]) -> list[Any]:
    """The arguments with Tensor[] ones spread out, in the order ``_encode`` finds tensors."""
    out: list[Any] = []
    for a in args:
        if type(a) is list or type(a) is tuple:
            out.extend(a)
        else:
            out.append(a)
    return out


def _record(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], pkey: Any) -> Any:
    """Record any op (nested lists of tensors, controller tensors); with ``pkey``, also keep
    the plan that lets the fast path record the next op of this signature."""
    found: list[Any] = []
    sig: list[Any] = []
    ins: list[int] = []
    eargs = tuple(_encode(a, found, sig, ins) for a in args)
    ekwargs = {k: _encode(v, found, sig, ins) for k, v in kwargs.items()}
    tm, per_rank, constants = _the_mesh(func, found)
    if tm.stream.lost is not None:
        tm.stream.check()
    # Raises here, at the user's line: nothing is sent.
    spec, entries, single = propagate(func, (func, tuple(sig), tuple(kwargs)), args, kwargs)
    outs, meta, reshaped = _outputs(func, entries, found, per_rank)
    name = _names.get(func)
    if name is None:
        name = _names[func] = str(func)
    plan = (name, tuple(outs), tuple(meta) or NoOutputs(), single, spec, name in _RANDOM)
    if pkey is not None and not reshaped:  # the fast path does not change metadata
        remember(plans, pkey, plan)
    mesh_ins = tuple(ins)  # (as_refs appends the constants' ids: never known, known.py)
    if constants:
        read_only = not func._schema.is_mutable  # noqa: SLF001
        eargs = as_refs(eargs, tm.stream, ins, read_only)
        ekwargs = {k: as_refs(v, tm.stream, ins, read_only) for k, v in ekwargs.items()}
    out_ids = []
    leaves: list[Any] = []
    meshes = _meshes(found)
    for o in outs:
        if o[0] == _NEW:
            t = new_mesh_tensor(tm, o[1], o[2], per_rank=o[3], stride=o[4], sig=o[5])
            out_ids.append(t.value_id)
            leaves.append(t)
        elif o[0] == _ALIAS:
            t = meshes[o[1]]
            out_ids.append(t.value_id)
            leaves.append(t)
        else:
            leaves.append(o[1])
    if tm.stream.known:
        known.after(func, args, kwargs, mesh_ins, tm.stream.known, leaves[0] if single else leaves)
    seed = _seed() if plan[5] else None
    tm.stream.record(
        ("aten", tuple(out_ids), tuple(ins), tuple(meta), (name, eargs, ekwargs, seed, None),
         issue_site())
    )  # fmt: skip
    for position, shape, stride in reshaped:
        reshape_in_place(meshes[position], shape, stride)
    return leaves[0] if single else tree_unflatten(leaves, spec)


def _the_mesh(func: Any, found: list[Any]) -> tuple[TensorMesh, bool, bool]:
    """The one mesh of an op's MeshTensors, whether they are per-rank, and whether the op has
    controller tensors too; raises, at the user's line, for MeshTensors that do not mix."""
    tm = None
    per_rank = False
    constants = False
    for x in found:
        if type(x) is MeshTensor:
            if tm is None:
                tm, per_rank = x.mesh, x.per_rank
            elif x.mesh is not tm:
                raise compat.MeshUsageError(
                    f"{func}: MeshTensors of two different meshes ({tm.describe()} and "
                    f"{x.mesh.describe()}) in one op; move one to the other's mesh first: "
                    f"{lifetime.move_hint()}"
                )
            elif x.per_rank != per_rank:
                raise compat.MeshUsageError(
                    f"{func}: mixes a per-rank MeshTensor (from `activate()`) with a global one; "
                    "make the global one per-rank or combine the per-rank one with reduce()"
                )
        else:
            constants = True
    assert tm is not None
    return tm, per_rank, constants


def _outputs(
    func: Any, entries: Any, found: list[Any], per_rank: bool
) -> tuple[list[Any], list[Any], list[Any]]:
    """From ``propagate``'s entries: the plan's outputs (new, alias of an input, or a plain
    value), their ``meta`` for the op, and the in-place ops' new shapes and strides."""
    outs: list[Any] = []
    meta = []
    reshaped: list[Any] = []
    for e in entries:
        if e[0] == "new":
            s = signature(e[1], e[2], e[3], per_rank)
            outs.append((_NEW, e[1], e[3], per_rank, e[2], s))
            meta.append((e[4], e[3], per_rank))
        elif e[0] == "alias":
            t = found[e[1]]
            if type(t) is not MeshTensor:
                raise compat.MeshUsageError(
                    f"{func} would write into a controller tensor from a MeshTensor; fetch the "
                    "MeshTensor first (actormesh.inspect) or make the target a MeshTensor"
                )
            # By identity: == on tensors is an op.
            position = next(i for i, m in enumerate(_meshes(found)) if m is t)
            if len(e) > 2:  # an in-place op that changed t's shape or strides (resize_, t_)
                check_fits(t, e[2], e[3], func)
                reshaped.append((position, e[2], e[3]))
                meta.append((e[2], t.dtype, per_rank))
            else:
                meta.append((tuple(t.shape), t.dtype, per_rank))
            outs.append((_ALIAS, position))
        else:
            outs.append((_VALUE, e[1]))
    return outs, meta, reshaped


def _sync_scalar(t: Any, *rest: Any, **kw: Any) -> Any:
    return t.get().item()


def _sync_bool(t: Any) -> bool:
    return bool(t.get())


def _sync_equal(a: Any, b: Any) -> bool:
    return bool(torch.equal(*get((a, b), None)))  # the default deadline of sync points


def _per_rank_only(func: Any) -> Callable[..., Any]:
    """``func`` (a resize) recorded for a per-rank tensor, refused for a global one: DTensor has
    no sharding rule for it, so sent it would fail on every worker and surface at the next sync
    point, far from the user's line."""

    def record_or_refuse(t: Any, *rest: Any, **kwargs: Any) -> Any:
        if type(t) is MeshTensor and not t.per_rank:
            raise compat.MeshUsageError(
                f"{func.overloadpacket.__name__}: a global MeshTensor cannot be resized in place "
                "(DTensor has no rule for how its shards would change); make a new tensor "
                "instead (t.reshape(...), t.new_empty(size) or distribute), or resize a per-rank "
                "tensor (one made under activate())"
            )
        return _record(func, (t, *rest), kwargs, None)

    return record_or_refuse


_SYNC[torch.ops.aten._local_scalar_dense.default] = _sync_scalar  # noqa: SLF001  (an op's name)
_SYNC[torch.ops.aten.is_nonzero.default] = _sync_bool
_SYNC[torch.ops.aten.equal.default] = _sync_equal
for _resize in (torch.ops.aten.resize_.default, torch.ops.aten.resize_as_.default):
    _SYNC[_resize] = _per_rank_only(_resize)
_SYNC_IDS = frozenset(id(op) for op in _SYNC)

"""``MeshTensor``: one object on the controller for a tensor that lives on a mesh.

A ``torch.Tensor`` wrapper subclass (no storage here): shape, dtype and strides are answered
locally, and every aten op that reaches ``__torch_dispatch__`` is recorded into the mesh's op
stream and returns new MeshTensors at once. Autograd runs on the controller, above dispatch, so
``loss.backward()`` and ``torch.optim`` record ordinary aten ops too.

Shapes without a round trip: the op runs on meta tensors of the global shapes (DTensor has
single-device semantics, so placements do not change the global shape), and the result is
cached by the op and its inputs' shapes, strides, dtypes and non-float scalars. A shape error
therefore raises here, at the user's line, and nothing is recorded.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_unflatten

from . import compat
from .mesh import TensorMesh
from .records import IN, Ref, issue_site
from .shapes import plans, propagate, remember, signature

_names: dict[Any, str] = {}  # op -> "aten.mm.default" (str() of an op costs microseconds)

# Ops whose value is needed on the controller: each is a sync point.
_SYNC: dict[Any, Callable[..., Any]] = {}

# Set by fetch.py and activate.py as they are imported (the package imports both): they build on
# MeshTensor, so MeshTensor's methods reach them through here rather than importing them.
hooks: dict[str, Callable[..., Any]] = {}

_RANDOM = {"aten.rand_like.default", "aten.randn_like.default", "aten.uniform_.default",
           "aten.normal_.default", "aten.bernoulli_.float"}  # fmt: skip


class MeshTensor(torch.Tensor):
    """A tensor on a mesh: a DTensor over the mesh (from ``distribute``, ``module_to_mesh``) or
    one tensor per rank (from factories under ``ProcMesh.activate()``).

    Not constructed directly: use ``actormesh.distribute(...)`` and friends. Metadata is local;
    ops are recorded and sent in batches, so they return at once. Sync points (they block until
    the workers ran everything before them): ``get()``, ``item()``, ``tolist()``, ``numpy()``,
    ``bool(t)``, ``float(t)``, ``int(t)``, ``actormesh.fetch``/``inspect``. A failure on a rank
    raises ``RemoteTensorError`` at the first sync point that touches the value. ``repr`` never
    fetches.
    """

    value_id: int
    mesh: TensorMesh
    per_rank: bool
    shape_sig: int  # shapes.signature(): what a recorded op's cache key holds for this input

    # Straight to __torch_dispatch__: below autograd, so the controller's autograd records.
    # (torch's documented way for a __torch_dispatch__ subclass to skip __torch_function__)
    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]  # noqa: SLF001

    def __new__(cls, *args: Any, **kwargs: Any) -> MeshTensor:
        raise TypeError(
            "MeshTensor is not constructed directly; use actormesh.distribute(tensor, mesh, "
            "sharding_spec=...), or factories inside `with procs.activate():`"
        )

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]  # torch types it as the disabled impl
        cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        return dispatch(func, args, kwargs or _NO_KWARGS)

    def __del__(self) -> None:
        # Not weakref.finalize: that costs a third of a recorded op. The worker's value is
        # dropped after the batch that may still read it (stream.py).
        try:
            self.mesh.stream.dead.append(self.value_id)
        except AttributeError:  # never fully built
            pass

    # -- never fetches -------------------------------------------------------------------------

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        kind = ", per_rank=True" if self.per_rank else ""
        grad = ", requires_grad=True" if self.requires_grad else ""
        dtype = str(self.dtype).replace("torch.", "")
        return (
            f"MeshTensor(shape={tuple(self.shape)}, dtype={dtype}{grad}{kind}, mesh={self.mesh!r})"
        )

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return self.__repr__() if not spec else format(self.item(), spec)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Passed to an endpoint: the worker's actor gets this rank's local value, after the
        # ops issued before the call (it waits for the engine to run batch ``seq``).
        from .engine import local_value

        stream = self.mesh.stream
        stream.flush()
        return (local_value, (self.mesh.key, self.value_id, stream.batches))

    def __deepcopy__(self, memo: Any) -> MeshTensor:
        out = torch.ops.aten.clone.default(self)
        out.requires_grad_(self.requires_grad)
        return out

    # -- sync points -------------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> torch.Tensor:
        """The full tensor on the controller (a sync point; blocks up to ``timeout`` s)."""
        return hooks["fetch"](self).get(timeout=timeout)

    def item(self) -> Any:
        return self.get().item()

    def tolist(self) -> Any:
        return self.get().tolist()

    def numpy(self, *, force: bool = False) -> Any:
        return self.get().numpy()

    def __bool__(self) -> bool:
        return bool(self.get())

    def __float__(self) -> float:
        return float(self.get())

    def __int__(self) -> int:
        return int(self.get())

    def __index__(self) -> int:
        return int(self.get())

    # -- mesh operations -----------------------------------------------------------------------

    def placements(self) -> compat.Future[Any]:
        """A Future of the DTensor placements this tensor has on the workers."""
        out = record(
            self.mesh,
            "placements",
            Ref(self.value_id),
            (self.value_id,),
            per_rank=False,
            meta=(None,),
        )
        return hooks["fetch_value"](out, self.mesh, 0)

    def redistribute(self, sharding_spec: Any = None, *, placements: Any = None) -> MeshTensor:
        """The same global tensor with other placements (DTensor's redistribute)."""
        if self.per_rank:
            raise compat.MeshUsageError(
                "redistribute applies to global MeshTensors; a per-rank one combines its ranks "
                "with reduce(dims, ...)"
            )
        new = self.mesh.placements(self.dim(), sharding_spec, placements)
        out = new_mesh_tensor(self.mesh, self.shape, self.dtype, per_rank=False)
        meta = ((tuple(self.shape), self.dtype, False),)
        payload = (Ref(self.value_id), new)
        self.mesh.stream.record(
            ("redistribute", (out.value_id,), (self.value_id,), meta, payload, issue_site())
        )
        return out

    def reduce(
        self, dims: str | tuple[str, ...], reduction: str = "sum", scatter: bool = False
    ) -> MeshTensor:
        """Combine a per-rank tensor over mesh dimension(s): ``"sum"``, ``"avg"``, ``"max"``,
        ``"min"``, ``"product"`` or ``"stack"`` (a new leading dim); ``scatter=True`` leaves
        each rank one chunk of dim 0. Every rank gets the result (Monarch's ``reduce``)."""
        return hooks["reduce"](self, dims, reduction, scatter)


def new_mesh_tensor(
    tm: TensorMesh,
    shape: Any,
    dtype: torch.dtype,
    *,
    per_rank: bool,
    stride: Any = None,
    requires_grad: bool = False,
    sig: int | None = None,
) -> MeshTensor:
    if stride is None:
        stride = _contiguous(shape)
    # The wrapper-subclass constructor DTensor and Monarch use: metadata without storage.
    t = _wrap(MeshTensor, shape, stride, None, None, dtype, _STRIDED, tm.device, False,
              requires_grad)  # fmt: skip
    t.value_id = tm.stream.new_id()
    t.mesh = tm
    t.per_rank = per_rank
    t.shape_sig = signature(shape, stride, dtype, per_rank) if sig is None else sig
    return t


def record(
    tm: TensorMesh,
    kind: str,
    payload: Any,
    ins: tuple[int, ...],
    *,
    per_rank: bool,
    meta: tuple[Any, ...],
) -> Any:
    """Record an op with one output id and no tensor metadata (placements, opaque values)."""
    out_id = tm.stream.new_id()
    tm.stream.record((kind, (out_id,), ins, meta, payload, issue_site()))
    return OpaqueRef(tm, out_id, per_rank)


class OpaqueRef:
    """A non-tensor value on the workers (a remote function's ``"inspect"`` result); fetch it
    with ``actormesh.fetch(value, **coords)``."""

    def __init__(self, tm: TensorMesh, id: int, per_rank: bool = True) -> None:
        self.mesh = tm
        self.value_id = id
        self.per_rank = per_rank
        weakref.finalize(self, tm.stream.died, id)

    def __repr__(self) -> str:
        return f"<remote value on {self.mesh!r}>"


def _contiguous(shape: Any) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(tuple(shape)):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


# -- dispatch ----------------------------------------------------------------------------------

_NO_KWARGS: dict[str, Any] = {}
_GENERAL: Any = object()  # an argument the fast path does not take
# Scalars keyed by value (an int may be a size or a dim, and so change the output's shape).
_BY_VALUE = frozenset(
    {int, str, type(None), torch.dtype, torch.device, torch.memory_format, torch.layout}
)
_BOOL_KEYS = {True: ("bool", True), False: ("bool", False)}  # True == 1 as a dict key
_NEW, _ALIAS, _VALUE = 0, 1, 2
_wrap = torch.Tensor._make_wrapper_subclass  # noqa: SLF001
_STRIDED = torch.strided


def _fast_arg(a: Any, key: list[Any], ins: list[int]) -> Any:
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
        for e in a:
            if type(e) is not int:
                return _GENERAL
        key.append((t, *a))
        return a
    return _GENERAL


def dispatch(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    fid = id(func)  # ops live as long as torch.ops: their ids are stable, and hash at C speed
    if fid in _SYNC_IDS:
        return _SYNC[func](*args, **kwargs)
    # The fast path: MeshTensors and scalars as arguments (most ops, every op of an optimizer
    # step), and a plan from an earlier op of the same signature. Written out, not factored:
    # this is the cost of every recorded op (bench T2).
    key: list[Any] = [fid]
    ins: list[int] = []
    eargs = []
    tm = None
    for a in args:
        if type(a) is MeshTensor:
            if tm is None:
                tm = a.mesh
            elif a.mesh is not tm:
                return _record(func, args, kwargs, None)  # raises the mixed-mesh error
            key.append(a.shape_sig)
            ins.append(a.value_id)
            eargs.append(IN)
            continue
        e = _fast_arg(a, key, ins)
        if e is _GENERAL:
            return _record(func, args, kwargs, None)
        eargs.append(e)
    ekwargs = _NO_KWARGS
    if kwargs:
        ekwargs = {}
        for k, a in kwargs.items():
            key.append(k)
            e = _fast_arg(a, key, ins)
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
            t = _wrap(MeshTensor, o[1], o[4], None, None, o[2], _STRIDED, tm.device, False, False)
            t.value_id = vid = stream.new_id()
            t.mesh = tm
            t.per_rank = o[3]
            t.shape_sig = o[5]
            out_ids.append(vid)
            leaves.append(t)
        elif kind == _ALIAS:
            t = _meshes((*args, *kwargs.values()))[o[1]]  # an in-place op's target
            out_ids.append(t.value_id)
            leaves.append(t)
        else:
            leaves.append(o[1])
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


def _constants(x: Any, tm: TensorMesh, ins: list[int]) -> Any:
    """``x`` with each controller tensor replaced by its copy on the workers."""
    if type(x) is list or type(x) is tuple:
        return type(x)(_constants(e, tm, ins) for e in x)
    if isinstance(x, torch.Tensor) and type(x) is not MeshTensor:
        cid = tm.stream.constant(x)
        ins.append(cid)
        return Ref(cid)
    return x


def _meshes(found: Sequence[Any]) -> list[MeshTensor]:
    return [x for x in found if type(x) is MeshTensor]


def _record(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], pkey: Any) -> Any:
    """Record any op (nested lists of tensors, controller tensors); with ``pkey``, also keep
    the plan that lets the fast path record the next op of this signature."""
    found: list[Any] = []
    sig: list[Any] = []
    ins: list[int] = []
    eargs = tuple(_encode(a, found, sig, ins) for a in args)
    ekwargs = {k: _encode(v, found, sig, ins) for k, v in kwargs.items()}
    tm = None
    per_rank = False
    constants = False
    for x in found:
        if type(x) is MeshTensor:
            if tm is None:
                tm, per_rank = x.mesh, x.per_rank
            elif x.mesh is not tm:
                raise compat.MeshUsageError(
                    f"{func}: MeshTensors of two different meshes ({tm!r} and {x.mesh!r}) in one "
                    "op; move one to the other's mesh first"
                )
            elif x.per_rank != per_rank:
                raise compat.MeshUsageError(
                    f"{func}: mixes a per-rank MeshTensor (from `activate()`) with a global one; "
                    "make the global one per-rank or combine the per-rank one with reduce()"
                )
        else:
            constants = True
    assert tm is not None
    if tm.stream.lost is not None:
        tm.stream.check()
    # Raises here, at the user's line: nothing is sent.
    spec, entries, single = propagate(func, (func, tuple(sig), tuple(kwargs)), args, kwargs)
    outs: list[Any] = []
    meta = []
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
            outs.append((_ALIAS, position))
            meta.append((tuple(t.shape), t.dtype, per_rank))
        else:
            outs.append((_VALUE, e[1]))
    name = _names.get(func)
    if name is None:
        name = _names[func] = str(func)
    plan = (name, tuple(outs), tuple(meta), single, spec, name in _RANDOM)
    if pkey is not None:
        remember(plans, pkey, plan)
    if constants:
        eargs = _constants(eargs, tm, ins)
        ekwargs = {k: _constants(v, tm, ins) for k, v in ekwargs.items()}
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
    seed = _seed() if plan[5] else None
    tm.stream.record(
        ("aten", tuple(out_ids), tuple(ins), tuple(meta), (name, eargs, ekwargs, seed),
         issue_site())
    )  # fmt: skip
    return leaves[0] if single else tree_unflatten(leaves, spec)


def _sync_scalar(t: Any, *rest: Any, **kw: Any) -> Any:
    return t.get().item()


def _sync_bool(t: Any) -> bool:
    return bool(t.get())


def _sync_equal(a: Any, b: Any) -> bool:
    return bool(torch.equal(*hooks["fetch"]((a, b)).get()))


_SYNC[torch.ops.aten._local_scalar_dense.default] = _sync_scalar  # noqa: SLF001  (an op's name)
_SYNC[torch.ops.aten.is_nonzero.default] = _sync_bool
_SYNC[torch.ops.aten.equal.default] = _sync_equal
_SYNC_IDS = frozenset(id(op) for op in _SYNC)

"""``MeshTensor``: one object on the controller for a tensor that lives on a mesh.

A ``torch.Tensor`` wrapper subclass (no storage here): shape, dtype and strides are answered
locally, and every aten op that reaches ``__torch_dispatch__`` is recorded into the mesh's op
stream (``recording.py``) and returns new MeshTensors at once. Autograd runs on the controller,
above dispatch, so ``loss.backward()`` and ``torch.optim`` record ordinary aten ops too.

Shapes without a round trip: the op runs on meta tensors of the global shapes (DTensor has
single-device semantics, so placements do not change the global shape), and the result is
cached (``shapes.py``). A shape error therefore raises at the user's line, and nothing is
recorded.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from .. import compat
from ..wire.ops import Ref, issue_site
from ..wire.shapes import contiguous_strides, signature
from .mesh import TensorMesh

NO_KWARGS: dict[str, Any] = {}
make_wrapper = torch.Tensor._make_wrapper_subclass  # noqa: SLF001
STRIDED = torch.strided


class MeshTensor(torch.Tensor):
    """A tensor on a mesh: a DTensor over the mesh (from ``distribute``, ``module_to_mesh``) or
    one tensor per rank (from factories under ``ProcMesh.activate()``).

    Not constructed directly: use ``actormesh.distribute(...)`` and friends. Metadata is local;
    ops are recorded and sent in batches, so they return at once. Sync points (they block until
    the workers ran everything before them): ``get()``, ``item()``, ``tolist()``, ``numpy()``,
    ``bool(t)``, ``float(t)``, ``int(t)``, ``actormesh.fetch``/``inspect`` (all but ``fetch``
    answer at once for a value the controller knows: ``known.py``). A failure on a rank
    raises ``RemoteTensorError`` at the first sync point that touches the value. ``repr`` never
    fetches.
    """

    # Slots: set on every recorded op's outputs and read on its inputs, a few µs faster than
    # the instance dict (which a tensor still has, for other attributes).
    __slots__ = ("mesh", "per_rank", "shape_sig", "value_id")
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
        return methods.dispatch(func, args, kwargs or NO_KWARGS)

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
        # Passed to an endpoint or to spawn: the worker's actor gets this rank's local value,
        # after the ops issued before the call (it waits for the engine to run batch ``seq``).
        # The message may be read long after this MeshTensor is gone (a temporary, as in
        # ``counter.incr.call(torch.ones(()))``): the ranks that will read it keep the value
        # under a pin of its own, which each drops once its actor read it.
        from ..worker.local import local_value

        tm = self.mesh
        stream = tm.stream
        stream.handed_out()  # the actor gets the rank's value itself, and may write it
        readers = compat.message_readers()
        ranks = () if readers is None else tuple(
            i for i, mailbox in enumerate(tm.mailboxes) if mailbox in readers
        )  # fmt: skip
        if not ranks:  # no reader holds the mesh (local_value says so), or none is known
            stream.flush()
            return (local_value, (tm.key, self.value_id, stream.batches))
        pin = stream.new_id()
        meta = ((tuple(self.shape), self.dtype, self.per_rank),)
        stream.record(("pin", (pin,), (self.value_id,), meta, (Ref(self.value_id), ranks),
                       issue_site()))  # fmt: skip
        compat.on_unsent(partial(stream.died, pin))  # not sent after all: no rank will read it
        stream.flush()
        return (local_value, (tm.key, pin, stream.batches, False, True))

    def __deepcopy__(self, memo: Any) -> MeshTensor:
        out = torch.ops.aten.clone.default(self)
        out.requires_grad_(self.requires_grad)
        return out

    # -- sync points -------------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> torch.Tensor:
        """The full tensor on the controller (a sync point). Blocks up to ``timeout`` s (None:
        ``ACTORMESH_TENSOR_TIMEOUT``, 300 s unless set), then raises ``MeshTimeoutError``
        naming the ranks that have not answered."""
        return methods.get(self, timeout)

    def item(self, timeout: float | None = None) -> Any:
        """The value of a one-element tensor (a sync point; ``timeout`` as for ``get``)."""
        return self.get(timeout).item()

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
            (Ref(self.value_id),),
            (self.value_id,),
            per_rank=False,
            meta=(None,),
        )
        return methods.fetch_value(out, self.mesh, 0)

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
        self,
        dims: str | Sequence[str] = (),
        reduction: str = "sum",
        scatter: bool = False,
        mesh: Any = None,
        _inplace: bool = False,
        out: MeshTensor | None = None,
    ) -> MeshTensor:
        """Combine a per-rank tensor over mesh dimension(s) (all of them when none are given),
        as Monarch's ``reduce``: ``"sum"``, ``"avg"``, ``"product"``, ``"min"``, ``"max"``,
        ``"band"``, ``"bor"``, ``"bxor"`` (every rank gets the result), or ``"stack"`` (a new
        leading dim of the ranks' values). ``scatter=True``: the tensor's leading dim has one
        row per rank, and rank i keeps row i of the result (a reduce-scatter, or for
        ``"stack"`` an all-to-all). ``mesh``: a rename/flatten/split of this tensor's mesh to
        put the result on; ``out``: a per-rank MeshTensor to write the result into. Returns at
        once; bad arguments raise ``ValueError`` here."""
        return methods.reduce(self, dims, reduction, scatter, mesh, _inplace, out)

    def to_mesh(
        self, mesh: Any, sharding_spec: Any = None, *, placements: Any = None
    ) -> MeshTensor:
        """This tensor on another tensor mesh (Monarch's ``to_mesh``): rank to rank over the
        data plane, never through the controller; returns at once. A global tensor arrives
        placed as ``sharding_spec``/``placements`` say on ``mesh`` (by default as here,
        dimension by dimension by name); a per-rank one goes from each rank to the rank of
        ``mesh`` at the same coordinates (every dimension here must be one of ``mesh``'s, of
        the same size; ``mesh``'s others get copies). Gradients flow back through it. See
        ``actormesh.tensor.controller.transfer``."""
        return methods.to_mesh(self, mesh, sharding_spec, placements)

    def reduce_(
        self,
        dims: str | Sequence[str] = (),
        reduction: str = "sum",
        scatter: bool = False,
        mesh: Any = None,
    ) -> MeshTensor:
        """``reduce`` written into this tensor (kinds whose result has its shape: the
        elementwise ones without ``scatter``, and ``"stack"`` with it); returns it."""
        return methods.reduce(self, dims, reduction, scatter, mesh, True, None)


def new_mesh_tensor(
    tm: TensorMesh,
    shape: Any,
    dtype: torch.dtype,
    *,
    per_rank: bool,
    stride: Any = None,
    requires_grad: bool = False,
    sig: int | None = None,
    value_id: int | None = None,
) -> MeshTensor:
    if stride is None:
        stride = contiguous_strides(shape)
    # The wrapper-subclass constructor DTensor and Monarch use: metadata without storage.
    t = make_wrapper(MeshTensor, shape, stride, None, None, dtype, STRIDED, tm.device, False,
              requires_grad)  # fmt: skip
    t.value_id = tm.stream.new_id() if value_id is None else value_id
    t.mesh = tm
    t.per_rank = per_rank
    t.shape_sig = signature(shape, stride, dtype, per_rank) if sig is None else sig
    return t


def check_fits(t: MeshTensor, shape: Any, stride: Any, op: Any) -> None:
    """Raise, at the user's line, if ``t`` cannot take ``shape``/``stride`` in place
    (``reshape_in_place``): a wrapper has no data, but its size is fixed when it is made."""
    needed = 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) if all(shape) else 0
    if needed * t.element_size() > t.untyped_storage().nbytes():
        raise compat.MeshUsageError(
            f"{op}: a MeshTensor cannot grow in place (from {tuple(t.shape)} to {tuple(shape)}); "
            "make a new one of that size instead (t.new_empty(size), torch.empty under "
            "activate(), or distribute)"
        )


def reshape_in_place(t: MeshTensor, shape: Any, stride: Any) -> None:
    """Give ``t`` the shape and strides an in-place op gave its value on the workers
    (``unsqueeze_``, ``t_``, ``resize_``...), as the op did locally. Below dispatch: on the
    wrapper itself, which has no data to move."""
    from torch.utils._mode_utils import no_dispatch

    with no_dispatch():
        torch.Tensor.as_strided_(t, shape, stride)
    t.shape_sig = signature(shape, stride, t.dtype, t.per_rank)


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


@dataclass(frozen=True, slots=True)
class Methods:
    """What MeshTensor's methods call in the modules built on MeshTensor: those import this
    module (they make and read MeshTensors), so this one cannot import them. One instance,
    made by ``seams.install`` (which names each function), is ``methods``."""

    dispatch: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]  # recording.dispatch
    get: Callable[[MeshTensor, float | None], torch.Tensor]  # fetch.get
    fetch_value: Callable[[OpaqueRef, TensorMesh, int], compat.Future[Any]]  # fetch.fetch_value
    # reduce.reduce(t, dims, reduction, scatter, mesh, _inplace, out)
    reduce: Callable[[MeshTensor, Any, str, bool, Any, bool, Any], MeshTensor]
    # transfer.to_mesh(t, mesh, sharding_spec, placements=)
    to_mesh: Callable[..., MeshTensor]


def _not_installed(*args: Any) -> Any:
    raise RuntimeError(
        "MeshTensor's methods are not installed: import actormesh.tensor (its __init__ calls "
        "controller.seams.install)"
    )


methods = Methods(_not_installed, _not_installed, _not_installed, _not_installed, _not_installed)


def install_methods(installed: Methods) -> None:
    global methods
    methods = installed

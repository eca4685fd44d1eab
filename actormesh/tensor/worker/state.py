"""What a tensor engine holds, as its op handlers see it: ``EngineState`` (worker side).

Its place (the ``DeviceMesh`` it runs on, this rank's coordinates and label, the shapes of its
processes the controller named: ``MeshView``), its values (``env``: id -> value), the failures
they carry (``poison``, and who holds each failure until a fetch reports it) and what it runs
now. ``engine.py``'s ``_TensorEngine`` is an ``EngineState`` that is also the actor running the
stream; every handler (``handlers.py`` names them) takes the engine as an ``EngineState``, so
none of them imports the engine that calls it.

Failures. An op that raises turns its outputs into *poisoned* values: ``poison[id]`` holds the
:class:`~actormesh.tensor.wire.ops.FailureInfo` of the op that originally failed, and ``env[id]``
a *stand-in* with the shape the controller computed (and the placements of an input of that
shape), so that later ops on this rank still run, for real, on the stand-ins. That is what keeps
healthy ranks from hanging in a collective that a failed rank would otherwise skip. Ops that read
a poisoned value inherit its original failure instead of reporting their own secondary one. A
failure that no fetch reported by the time its last holder is dropped is an *orphan*: it rides
on the next fetch reply so that the controller hands it to the fault hook.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from collections import deque
from collections.abc import Sequence
from typing import Any

from ..compat import Extent, Point, point_label
from ..wire.ops import FailureInfo, Op, Ref, op_name
from .inbox import Inbox
from .snapshots import ANCHORS, forget_anchor

logger = logging.getLogger(__name__)

_MISSING: Any = object()

SPANS_KEPT = 4096  # busy spans an engine remembers (busy_spans)


class MeshView:
    """One shape of the engine's processes (views.py): its ``DeviceMesh``, labels, sizes and
    this rank's coordinates in it."""

    __slots__ = ("coords", "labels", "mesh", "sizes")

    def __init__(self, mesh: Any, labels: tuple[str, ...], sizes: tuple[int, ...], index: int):
        self.mesh = mesh
        self.labels = labels
        self.sizes = sizes
        self.coords: dict[str, int] = dict(Point(index, Extent(list(labels), list(sizes))))

    def size(self, dims: Sequence[str]) -> int:
        n = 1
        for d in dims:
            n *= self.sizes[self.labels.index(d)]
        return n

    def index(self, dims: Sequence[str]) -> int:
        """This rank's position among the ranks along ``dims``, row-major in the given order."""
        value = 0
        for d in dims:
            value = value * self.sizes[self.labels.index(d)] + self.coords[d]
        return value


class EngineState:
    """A tensor engine's place, values and failures; ``_TensorEngine`` (engine.py) runs ops on
    it. Built on the engine's process, in the actor's ``__init__``."""

    def __init__(
        self,
        key: str,
        labels: tuple[str, ...],
        sizes: tuple[int, ...],
        seed: int,
        device: str,
        ranks: tuple[int, ...] | None,
        places: tuple[str, ...] | None,
    ) -> None:
        self.key = key
        self.labels = tuple(labels)
        self.sizes = tuple(sizes)
        self.device = device  # "cuda" or "cpu", as the controller chose (mesh.engine_device)
        self.ranks = ranks  # None: the engine runs over its whole process group
        self._place(seed, places)
        self._values()
        self._stores()

    def _place(self, seed: int, places: tuple[str, ...] | None) -> None:
        """The engine's ``DeviceMesh``, this rank's index, coordinates, label and generator."""
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        from .groups import sub_device_mesh

        if self.ranks is None:
            self.mesh = init_device_mesh(self.device, self.sizes, mesh_dim_names=self.labels)
            self.index = dist.get_rank()
        else:  # a part of its group's processes: groups of its own (groups.py)
            self.mesh = sub_device_mesh(self.device, self.key, self.ranks, self.sizes, self.labels)
            self.index = self.ranks.index(dist.get_rank())
        point = Point(self.index, Extent(list(self.labels), list(self.sizes)))
        self.coords: dict[str, int] = dict(point)
        # Every process starts torch's generator from the same default seed (and forked ones
        # from the same state): per-rank factories under activate() must draw differently. They
        # draw from the engine's own generator: a process may run several engines (slices).
        self.generator = torch.Generator(self.device).manual_seed(seed + self.index)
        if self.ranks is None:  # and code beside it (remote functions) from the process's one
            torch.manual_seed(seed + self.index)
        self.rank_str = places[self.index] if places else point_label(point)
        # What the sidebar says this engine is: where its mesh sits in its proc mesh (a
        # slice's fixed coordinates, "pp=1"), and what the controller said it is for ("stage
        # 1 of 2"; set_role).
        fixed = self.rank_str.strip("{}").split(", ") if places else []
        self.where = ", ".join(c for c in fixed if c.partition("=")[0] not in self.labels)
        self.role = ""
        # Shapes of these processes by the controller's number (views.py); 0 is the one above.
        self.views: dict[int, MeshView] = {
            0: MeshView(self.mesh, self.labels, self.sizes, self.index)
        }

    def _values(self) -> None:
        """The values, their failures, and the turn-taking of the threads that read them."""
        self.abandoned = False  # recovery replaced this engine: skip what is still queued
        # The process group failed under an op (a peer died in a collective): no later op runs,
        # each fails as that one did (see _TensorEngine._execute).
        self.broken: FailureInfo | None = None
        self.env: dict[int, Any] = {}
        self.poison: dict[int, FailureInfo] = {}
        self.holders: dict[int, int] = {}  # failure serial -> how many ids carry it
        self.surfaced: set[int] = set()
        self.orphans: list[FailureInfo] = []
        self.siblings: dict[int, tuple[int, ...]] = {}  # id -> all outputs of its op (if > 1)
        self.serial = 0
        self.done = 0  # batches run; an actor handed a MeshTensor waits for its batch
        self.cond = threading.Condition()
        self.lock = threading.Lock()  # held while a batch runs, or a %%mesh cell (local.py)
        self.current: Op | None = None  # the op running now (what a status poll shows)
        # Pins (run_pin) an actor has read, or that no actor here will read: appended from any
        # thread, dropped by the engine's thread between batches.
        self.read_pins: list[int] = []

    def _stores(self) -> None:
        """What single kinds of op keep between ops, and what the engine counts."""
        self.counts = {"run": 0, "fetch": 0, "staged_bytes": 0}
        self.staged: dict[int, Any] = {}  # id -> this rank's block of a large distribute()
        self.fns: dict[int, Any] = {}
        self.programs: dict[int, Any] = {}  # index -> a program's decoded steps (programs.py)
        # the running batch's ops, and the ids it drops after them (programs.py)
        self.batch_ops: Any = ()
        self.batch_drops: Any = ()
        # to_mesh (transfer.py): where other engines' sends arrive, and where ours go.
        self.inbox = Inbox()
        self.peers: dict[str, tuple[Any, ...]] = {}
        # When this engine ran ops (wall clock, seconds since the epoch), not counting its
        # waits for what other meshes send it (transfer.py closes a span while it waits).
        self.spans: deque[tuple[float, float]] = deque(maxlen=SPANS_KEPT)
        self.opened: float | None = None

    # -- running ops: the engine's (engine.py) ------------------------------------------------

    def _execute(self, op: Op) -> None:
        """Run ``op`` as the stream does, failures and all: a program runs its steps here."""
        raise NotImplementedError("_TensorEngine._execute (engine.py)")

    def failed(self, op: Op, exc: Exception, root: FailureInfo | None = None) -> None:
        """``op`` raised ``exc``: poison its outputs (``_TensorEngine.failed``)."""
        raise NotImplementedError("_TensorEngine.failed (engine.py)")

    # -- values --------------------------------------------------------------------------------

    def view(self, view_id: int) -> MeshView:
        """The shape ``view_id`` of this engine's processes (views.py)."""
        view = self.views.get(view_id)
        if view is None:
            raise RuntimeError(
                f"mesh view {view_id} is not known on rank {self.rank_str}: its mesh_view op "
                "failed here or never came"
            )
        return view

    def value(self, id: int) -> Any:
        v = self.env.get(id, _MISSING)
        if v is _MISSING:
            raise RuntimeError(
                f"tensor value {id} is not on rank {self.rank_str}: it was freed (its "
                "MeshTensor was garbage-collected) or belongs to another mesh"
            )
        return v

    def resolve(self, x: Any) -> Any:
        """``x`` with every :class:`Ref` replaced by its value (lists, tuples, dicts too)."""
        t = type(x)
        if t is Ref:
            return self.value(x.id)
        if t is tuple or t is list:
            return t(self.resolve(e) for e in x)
        if t is dict:
            return {k: self.resolve(v) for k, v in x.items()}
        return x

    # -- poison bookkeeping ----------------------------------------------------------------------

    def new_failure(self, exc: BaseException) -> FailureInfo:
        """A failure of the op running now, for a handler that reports it beyond its outputs
        (a ``send`` tells its receivers)."""
        assert self.current is not None
        return self._new_failure(self.current, exc)

    def _new_failure(self, op: Op, exc: BaseException) -> FailureInfo:
        self.serial += 1
        text = "".join(traceback.format_exception(type(exc), exc, _past_the_engine(exc)))
        etype = type(exc)
        name = etype.__qualname__
        if etype.__module__ not in ("builtins", "__main__"):
            name = f"{etype.__module__}.{name}"
        info = FailureInfo(self.rank_str, op_name(op), op[5], name, str(exc), text, self.serial)
        logger.debug("op %s failed on %s: %s", info.op, self.rank_str, info.message)
        return info

    def _set_poison(self, id: int, root: FailureInfo) -> None:
        old = self.poison.get(id)
        if old is root:
            return
        if old is not None:
            self._hold(old, -1)
        self.poison[id] = root
        self._hold(root, +1)

    def _hold(self, root: FailureInfo, delta: int) -> None:
        left = self.holders.get(root.serial, 0) + delta
        if left > 0:
            self.holders[root.serial] = left
            return
        self.holders.pop(root.serial, None)
        if root.serial not in self.surfaced:
            self.orphans.append(root)

    def _drop_read_pins(self) -> None:
        if self.read_pins:
            read, self.read_pins = self.read_pins, []
            for i in read:
                self._drop(i)

    def _cleanse(self, id: int) -> None:
        """Value ``id`` was overwritten whole (a checkpoint loaded into it): not poisoned now."""
        root = self.poison.pop(id, None)
        if root is not None:
            self._hold(root, -1)

    def _drop(self, id: int) -> None:
        self.env.pop(id, None)
        if id in ANCHORS:  # a FaultTolerant collected on the controller: its snapshot goes
            forget_anchor(id)
        if self.siblings:
            self.siblings.pop(id, None)
        root = self.poison.pop(id, None)
        if root is not None:
            self._hold(root, -1)

    # -- what the sidebar shows ------------------------------------------------------------------

    def serves(self) -> str:
        """ "pp=1, stage 1 of 2": where this engine's mesh sits and what it is for (may be "")."""
        return ", ".join(p for p in (self.where, self.role) if p)

    def doing(self) -> str | None:
        """What this engine runs now, for a status poll from another thread: "op 12 aten.mm"."""
        op = self.current
        if op is None:
            return None
        return f"op {op[1][0]} {op_name(op)}" if op[1] else op_name(op)

    def span_open(self) -> None:
        self.opened = time.time()

    def span_close(self) -> None:
        if self.opened is not None:
            self.spans.append((self.opened, time.time()))
            self.opened = None


_TENSOR_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _past_the_engine(exc: BaseException) -> Any:
    """``exc``'s traceback from the first frame that is not this package's: the user's function
    (or torch's op) is where the failure is; the engine's dispatch above it is not news."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_TENSOR_PACKAGE):
            break
        tb = tb.tb_next
    return tb

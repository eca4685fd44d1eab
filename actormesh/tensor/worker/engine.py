"""The worker side: ``_TensorEngine``, one hidden actor per process of a tensor mesh.

It keeps ``env``: id -> value (a DTensor for a global MeshTensor, a plain tensor for a per-rank
one, modules, remote functions' results) and runs the op batches the controller streams to it,
in order, on its own thread (so every rank runs the same collectives in the same order).

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

import contextlib
import logging
import os
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator
from typing import Any

from ..compat import Actor, Extent, Point, endpoint, loads, point_label
from ..wire.ops import FailureInfo, Op, Ref, op_name
from .adopt import Adopted, adopt_value
from .fetch import answer_fetch
from .handlers import HANDLERS
from .local import REGISTRY, wait_for_cell
from .side_effects import OVERWRITES_INPUTS, written
from .snapshots import ANCHORS, forget_anchor
from .stand_ins import StoodIn, stand_in
from .transfer import Inbox, Inherited

logger = logging.getLogger(__name__)

_MISSING: Any = object()


SPANS_KEPT = 4096  # busy spans an engine remembers (busy_spans)

# What a message of the stream carries about the %%mesh cells launched since the stream's last
# message: engine index -> (the newest such cell running in that rank's process, its name).
CellsBefore = dict[int, tuple[int, str]]


class _TensorEngine(Actor):
    """Runs a mesh's tensor ops in one process. Spawned by the controller, never by users."""

    def __init__(
        self,
        key: str,
        labels: tuple[str, ...],
        sizes: tuple[int, ...],
        seed: int,
        device: str,
        ranks: tuple[int, ...] | None = None,
        places: tuple[str, ...] | None = None,
    ) -> None:
        """``ranks``: this engine's processes as ranks of their process group, row-major (None:
        the whole group, in its order); ``places``: per engine index, where that rank sits in
        its proc mesh (``{pp=1, dp=0}`` for a slice), what failures name (None: its coordinates
        here)."""
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        from .groups import sub_device_mesh
        from .views import MeshView

        self.abandoned = False  # recovery replaced this engine: skip what is still queued
        # The process group failed under an op (a peer died in a collective): no later op runs,
        # each fails as that one did (see _execute).
        self.broken: FailureInfo | None = None
        # Fetching a value that is Partial over several dims logs a warning per fetch on every
        # rank; the sequential reduction it warns about is what a fetch wants.
        logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
        self.key = key
        self.labels = tuple(labels)
        self.sizes = tuple(sizes)
        self.device = device  # "cuda" or "cpu", as the controller chose (mesh.engine_device)
        self.ranks = ranks  # None: the engine runs over its whole process group
        if ranks is None:
            self.mesh = init_device_mesh(self.device, self.sizes, mesh_dim_names=self.labels)
            self.index = dist.get_rank()
        else:  # a part of its group's processes: groups of its own (groups.py)
            self.mesh = sub_device_mesh(self.device, key, ranks, self.sizes, self.labels)
            self.index = ranks.index(dist.get_rank())
        point = Point(self.index, Extent(list(self.labels), list(self.sizes)))
        self.coords: dict[str, int] = dict(point)
        # Every process starts torch's generator from the same default seed (and forked ones
        # from the same state): per-rank factories under activate() must draw differently. They
        # draw from the engine's own generator: a process may run several engines (slices).
        self.generator = torch.Generator(device).manual_seed(seed + self.index)
        if ranks is None:  # and code beside it (remote functions) from the process's one
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
        self.counts = {"run": 0, "fetch": 0, "staged_bytes": 0}
        self.staged: dict[int, Any] = {}  # id -> this rank's block of a large distribute()
        self.fns: dict[int, Any] = {}
        self.programs: dict[int, Any] = {}  # index -> a program's decoded steps (programs.py)
        # Pins (run_pin) an actor has read, or that no actor here will read: appended from any
        # thread, dropped by the engine's thread between batches.
        self.read_pins: list[int] = []
        self.threads_set = False
        # to_mesh (transfer.py): where other engines' sends arrive, and where ours go.
        self.inbox = Inbox()
        self.peers: dict[str, tuple[Any, ...]] = {}
        # When this engine ran ops (wall clock, seconds since the epoch), not counting its
        # waits for what other meshes send it (transfer.py closes a span while it waits).
        self.spans: deque[tuple[float, float]] = deque(maxlen=SPANS_KEPT)
        self.opened: float | None = None
        REGISTRY[key] = self

    # -- the stream --------------------------------------------------------------------------

    @contextlib.contextmanager
    def _turn(self, cells: CellsBefore | None) -> Iterator[None]:
        """Hold the engine's lock for a message that may run collectives: a ``%%mesh`` cell
        that touches engine values takes it too (local.py), so the collectives of a cell and of
        the engine never interleave. First, for a message sent after a cell was launched, wait
        for that cell to take its turn in this process (it then holds the lock, or needs none):
        the controller decided the order, and every rank keeps it."""
        cell = cells.get(self.index) if cells else None
        if cell is not None:
            wait_for_cell(self, *cell)
        with self.lock:
            yield

    @endpoint
    def run(
        self, ops: list[Op] | bytes, drops: list[int], cells: CellsBefore | None = None
    ) -> None:
        with self._turn(cells):
            self._run_batch(ops, drops)

    @endpoint
    def run_and_fetch(
        self,
        ops: list[Op] | bytes,
        drops: list[int],
        requests: list[tuple[int, int | None]],
        cells: CellsBefore | None = None,
    ) -> dict[str, Any]:
        """A batch and the fetch that ends it, in one message (what a sync point sends): one
        message fewer per process and step than ``run`` then ``fetch``."""
        with self._turn(cells):
            self._run_batch(ops, drops)
            return self._fetch(requests)

    def _run_batch(self, ops: list[Op] | bytes, drops: list[int]) -> None:
        import torch

        self.counts["run"] += 1
        self.span_open()
        if not self.threads_set:
            self.threads_set = True
            _intra_op_threads()
        # A batch the controller pickled itself (stream._pack) arrived inside a signed message;
        # the runtime's codec unpickles it, as it does every payload.
        batch: list[Op] = loads(ops) if isinstance(ops, bytes) else ops
        try:
            with torch.no_grad():
                for op in batch:
                    if self.abandoned:
                        return
                    self._execute(op)
            for i in drops:
                self._drop(i)
            self._drop_read_pins()
        finally:
            self.current = None
            self.span_close()
            with self.cond:
                self.done += 1
                self.cond.notify_all()

    @endpoint
    def stage(self, id: int, block: Any) -> None:
        """This rank's block of a large tensor, sent to it alone ahead of the ``distribute``
        op that places it (controller/distribute.py); per-sender FIFO keeps it ahead of that op."""
        self.staged[id] = block
        self.counts["staged_bytes"] += block.nbytes

    def _execute(self, op: Op) -> None:
        kind, out, ins, _meta, payload, _site = op
        root = None
        if self.poison and kind not in OVERWRITES_INPUTS:
            for i in ins:
                root = self.poison.get(i)
                if root is not None:
                    break
        self.current = op
        try:
            if self.broken is not None:
                root = self.broken
                raise RuntimeError("not run: this rank's process group failed")
            values = HANDLERS[kind](self, payload, out)
            if len(values) != len(out):
                raise RuntimeError(
                    f"{op_name(op)} gave {len(values)} results where the controller expected "
                    f"{len(out)}; the controller's shape propagation and this rank disagree"
                )
        except Exception as exc:
            self.failed(op, exc, root)
            return
        env = self.env
        for o, v in zip(out, values, strict=True):
            env[o] = v
        if kind in OVERWRITES_INPUTS:
            for i in ins:
                self._cleanse(i)
        if len(out) > 1:
            for o in out:
                self.siblings[o] = out
        if root is not None:
            for o in out:
                self._set_poison(o, root)
            self._poison_written(op, root)

    def failed(self, op: Op, exc: Exception, root: FailureInfo | None = None) -> None:
        """``op`` raised ``exc`` (``root``: the failure one of its inputs carried): its outputs
        become stand-ins, poisoned with the original failure, as is what it wrote."""
        _kind, out, ins, meta, _payload, _site = op
        computed = None
        if isinstance(exc, StoodIn):  # the handler made its own stand-ins
            computed, exc = exc.values, exc.cause
        elif isinstance(exc, Inherited):  # failed on the mesh it came from (to_mesh)
            computed, root = exc.values or None, exc.root
        if root is None:
            root = self._new_failure(op, exc)
            if _group_failed(exc):
                # Its collectives cannot run any more, and the other ranks may be in any of
                # them: one that went on to the next op's collective would meet a peer still
                # in this one (gloo aborts the process on the mismatch).
                self.broken = root
        else:
            logger.debug("%s failed on a poisoned input", op_name(op), exc_info=True)
        for k, o in enumerate(out):
            if computed is not None:
                self.env[o] = computed[k]
            elif o not in ins:  # an in-place op keeps its (stand-in) value
                self.env[o] = stand_in(self, meta[k] if k < len(meta) else None, ins)
            self._set_poison(o, root)
        self._poison_written(op, root)
        if root.serial not in self.holders:  # nothing holds it: report it at once
            self._hold(root, 0)

    def _poison_written(self, op: Op, root: FailureInfo) -> None:
        """A failed (or poisoned) op also poisons what it changed besides its outputs: the
        arguments it writes, or for a check with no outputs what it checked (side_effects.py)."""
        for i in written(op, self.siblings):
            if i in self.env:
                self._set_poison(i, root)

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

    @endpoint
    def set_role(self, role: str) -> None:
        """What this engine's mesh is for, as the sidebar shows it ("stage 1 of 2")."""
        self.role = role

    def serves(self) -> str:
        """ "pp=1, stage 1 of 2": where this engine's mesh sits and what it is for (may be "")."""
        return ", ".join(p for p in (self.where, self.role) if p)

    def doing(self) -> str | None:
        """What this engine runs now, for a status poll from another thread: "op 12 aten.mm"."""
        op = self.current
        if op is None:
            return None
        return f"op {op[1][0]} {op_name(op)}" if op[1] else op_name(op)

    # -- values --------------------------------------------------------------------------------

    def view(self, view_id: int) -> Any:
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

    # -- sync points -------------------------------------------------------------------------

    @endpoint
    def fetch(
        self, requests: list[tuple[int, int | None]], cells: CellsBefore | None = None
    ) -> dict[str, Any]:
        with self._turn(cells):
            return self._fetch(requests)

    def _fetch(self, requests: list[tuple[int, int | None]]) -> dict[str, Any]:
        self.counts["fetch"] += 1
        reply = answer_fetch(self, requests)
        reply["orphans"], self.orphans = self.orphans, []
        return reply

    @endpoint
    def describe(self, id: int) -> tuple[Any, list[Any]]:
        """The structure and tensor metadata (global shapes) of a remote function's result."""
        root = self.poison.get(id)
        if root is not None:
            raise RuntimeError(
                f"the remote function failed on {root.rank}: {root.exc_type}: {root.message} "
                f"(issued at {root.site})\n{root.traceback}"
            )
        return _describe_value(self.value(id))

    @endpoint
    def call_fn(self, fn_id: int, args: Any, kwargs: Any, cells: CellsBefore | None = None) -> Any:
        """Run a remote function now (``fn.call``); tensors go back as local tensors."""
        with self._turn(cells):
            return self._call_fn(fn_id, args, kwargs)

    def _call_fn(self, fn_id: int, args: Any, kwargs: Any) -> Any:
        import torch
        from torch.distributed.tensor import DTensor
        from torch.utils._pytree import tree_flatten, tree_map

        for leaf in tree_flatten((args, kwargs))[0]:
            root = self.poison.get(leaf.id) if type(leaf) is Ref else None
            if root is not None:
                raise RuntimeError(
                    f"an argument failed on {root.rank}: {root.exc_type}: {root.message} "
                    f"(op {root.op} issued at {root.site})"
                )
        # User code: torch's default grad mode, as in a local call (a remote function may train).
        with torch.enable_grad():
            result = self.fns[fn_id](*self.resolve(args), **self.resolve(kwargs))
        return tree_map(lambda v: v.to_local() if isinstance(v, DTensor) else v, result)

    @endpoint
    def adopt(self, id: int, name: str) -> Adopted:
        """Take ``name`` from this process's ``%%mesh`` namespace as value ``id`` (adopt.py)."""
        return adopt_value(self, id, name)

    @endpoint
    def inbox_port(self) -> Any:
        """Where other engines send this rank the values they move here (transfer.py)."""
        return self.inbox.port

    @endpoint
    def live(self) -> int:
        """How many remote values this rank holds (tests check it goes back to a baseline)."""
        self._drop_read_pins()  # on the thread that runs the batches, as they are dropped there
        return len(self.env)

    @endpoint
    def stats(self) -> dict[str, int]:
        """Messages this engine handled, by endpoint (tests count them)."""
        return {**self.counts, "done": self.done}

    def span_open(self) -> None:
        self.opened = time.time()

    def span_close(self) -> None:
        if self.opened is not None:
            self.spans.append((self.opened, time.time()))
            self.opened = None

    @endpoint
    def busy_spans(self) -> list[tuple[float, float]]:
        """When this engine ran ops: ``(start, end)`` wall-clock times, the last
        ``SPANS_KEPT`` (answered between batches, so it waits for the running one)."""
        return list(self.spans)


def _intra_op_threads() -> None:
    """torchrun's default, which ``actormesh run`` applies too: one intra-op thread per rank when
    several ranks share a host, unless ``OMP_NUM_THREADS`` says otherwise. Set on the engine's
    own thread (OpenMP's count is per thread). Without it, 4 ranks on 2 cores each woke a
    2-thread pool per op, and a 16x32 linear took 8 ms instead of 50 µs."""
    import os

    import torch

    wanted = os.environ.get("OMP_NUM_THREADS")
    if wanted is None and int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > 1:
        wanted = "1"
    if wanted is not None and wanted.isdigit():
        torch.set_num_threads(max(1, int(wanted)))


def _describe_value(v: Any) -> tuple[Any, list[Any]]:
    import torch
    from torch.utils._pytree import tree_flatten, treespec_dumps

    leaves, spec = tree_flatten(v)
    entries = [
        ("new", tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else ("value", x)
        for x in leaves
    ]
    # As text: unpickling a TreeSpec object warns (a deprecated isinstance check in torch).
    return treespec_dumps(spec), entries


_TENSOR_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _group_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is the process group's own failure (a peer's connection lost), not the
    op's: torch's DistBackendError, or gloo's transport error (a RuntimeError naming it)."""
    import torch.distributed as dist

    backend_error = getattr(dist, "DistBackendError", ())
    return isinstance(exc, backend_error) or "gloo/transport/" in str(exc)


def _past_the_engine(exc: BaseException) -> Any:
    """``exc``'s traceback from the first frame that is not this package's: the user's function
    (or torch's op) is where the failure is; the engine's dispatch above it is not news."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_TENSOR_PACKAGE):
            break
        tb = tb.tb_next
    return tb

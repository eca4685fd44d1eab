"""The worker side: ``_TensorEngine``, one hidden actor per process of a tensor mesh.

It is an :class:`~actormesh.tensor.worker.state.EngineState` (``env``: id -> value, a DTensor for
a global MeshTensor, a plain tensor for a per-rank one, modules, remote functions' results; the
failures they carry) that runs the op batches the controller streams to it, in order, on its own
thread (so every rank runs the same collectives in the same order): each op with the handler
``handlers.py`` names for its kind. An op that raises poisons its outputs (state.py says how).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from ..compat import Actor, endpoint, loads
from ..wire.ops import FailureInfo, Op, Ref, op_name
from .adopt import Adopted, adopt_value
from .fetch import answer_fetch
from .handlers import HANDLERS
from .local import REGISTRY, wait_for_cell
from .side_effects import OVERWRITES_INPUTS, written
from .stand_ins import StoodIn, stand_in
from .state import EngineState
from .transfer import Inherited

logger = logging.getLogger(__name__)

# What a message of the stream carries about the %%mesh cells launched since the stream's last
# message: engine index -> (the newest such cell running in that rank's process, its name).
CellsBefore = dict[int, tuple[int, str]]


class _TensorEngine(EngineState, Actor):
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
        # Fetching a value that is Partial over several dims logs a warning per fetch on every
        # rank; the sequential reduction it warns about is what a fetch wants.
        logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
        super().__init__(key, labels, sizes, seed, device, ranks, places)
        self.threads_set = False  # _intra_op_threads ran on the engine's thread
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
        # A batch the controller pickled itself (packing.pack) arrived inside a signed message;
        # the runtime's codec unpickles it, as it does every payload.
        batch: list[Op] = loads(ops) if isinstance(ops, bytes) else ops
        self.batch_ops, self.batch_drops = batch, drops  # (programs.py: what outlives a program)
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
            self.batch_ops, self.batch_drops = (), ()
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

    @endpoint
    def set_role(self, role: str) -> None:
        """What this engine's mesh is for, as the sidebar shows it ("stage 1 of 2")."""
        self.role = role

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


def _group_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is the process group's own failure (a peer's connection lost), not the
    op's: torch's DistBackendError, or gloo's transport error (a RuntimeError naming it)."""
    import torch.distributed as dist

    backend_error = getattr(dist, "DistBackendError", ())
    return isinstance(exc, backend_error) or "gloo/transport/" in str(exc)

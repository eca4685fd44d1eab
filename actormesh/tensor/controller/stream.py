"""The controller's op stream for one mesh: ids, the buffer, and when it is sent.

Ids are allocated here and never reused, so naming a result never waits for a worker. Ops are
appended to a buffer that goes out as *one* ``engine.run.broadcast(ops, drops)``: one pickle,
one message per process, and per-sender FIFO keeps the order. The buffer is sent at a sync
point, at ``BATCH_OPS`` ops, at the end of a notebook cell, once the controller recorded
nothing for a whole ``IDLE_FLUSH`` window (``idle_flush.py``: the workers start on the ops while
the controller computes the next step), and, where the ranks have cores to spare, as a training
step begins after one that read nothing (``step_sends.py``). Ids of garbage-collected
MeshTensors are sent as ``drops`` in the same message, *after* its ops: an op already buffered
may still read them. Controller tensors used as arguments are uploaded once (``constants.py``).

The kernel tells a stream when it launches a ``%%mesh`` cell (``cell_launched``); the stream's
next message to the engine names that cell, and each rank's engine runs it only once the cell
took its turn there (``local.wait_for_cell``). So a cell and the ops issued while it runs keep
the controller's order on every rank.

Every recorded op reaches every rank exactly once, or the mesh's values are declared unusable:
never a silent divergence. A batch is taken out of the buffer, packed and sent with Ctrl-C held
back (``interrupts.held``), so an interrupt lands before or after it, never inside; anything else
that stops a batch once taken (an op that does not pickle, a second Ctrl-C at a stuck send) loses
the stream (``_unsent``), and every later use says so.
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from ...errors import MeshClosedError, SupervisionError
from .. import compat
from ..wire.kinds import CHECK, checked
from ..wire.ops import Op
from . import lifetime
from .idle_flush import native_id, start_timer
from .interrupts import held
from .packing import pack
from .programs import Programs
from .step_sends import StepSends

logger = logging.getLogger(__name__)

BATCH_OPS = 256
# Op kinds that write no value an earlier id names; any other forgets the known values (known.py)
_WRITE_NOTHING = frozenset({"aten", "constant", "distribute", "pin"})
# Op kinds that run user code on the ranks, or load values there: they may write a value in
# place with no in-place op recorded here (no version counter moves): see ``foreign``
_FOREIGN = frozenset({"remote_call", "rref", "restore", "checkpoint_load"})

_streams: weakref.WeakSet[Stream] = weakref.WeakSet()


class Stream:
    """One mesh's op buffer. Any thread may record or flush; batches keep their order."""

    def __init__(self, engine: Any, procs: compat.ProcMesh) -> None:
        self.engine = engine  # the ActorMesh of _TensorEngine
        self.procs = procs
        self.name = compat.mesh_name(procs)
        # Its ``closed`` turns True when the processes are stopped: read on every recorded op,
        # so an attribute rather than a call.
        self.procs_state = compat.proc_state(procs)
        # by engine index: its process (the kernel names processes; a healed one has a new one)
        self.mailboxes = compat.mailboxes(procs)
        self.ops: list[Op] = []
        self.marks: list[int] = []  # where in ``ops`` an optimizer step ended (programs.py)
        self.steps = StepSends(compat.processes_here(procs))
        self.programs = Programs()
        self.dead: list[int] = []  # ids whose MeshTensor was collected (appended from any thread)
        self.known: dict[int, Any] = {}  # id -> its value, known here too (known.py)
        # Writes on the ranks no in-place op here stands for (user code there: a remote call,
        # an actor handed a MeshTensor, a %%mesh cell): a model's input is not reused past one
        self.foreign = 0
        self.lock = threading.Lock()
        self._ids = itertools.count(1)
        self.batches = 0  # messages sent; an actor handed a MeshTensor waits for this many
        # %%mesh cells launched since the last message, for the next one (engine.CellsBefore)
        self.cells: dict[int, tuple[int, str]] = {}
        self.error: BaseException | None = None  # a failed send from the timer thread
        self.closed = False
        # A rank died, or a batch did not reach every rank: every value of this mesh is gone.
        self.lost: BaseException | None = None
        self.lost_why = ""  # what check() says about it, unless a rank died (lifetime's words)
        self.recorded = 0  # ops recorded so far (the idle timer compares it across a window)
        self.armed = False
        self.wake_event = threading.Event()
        self._timer: threading.Thread | None = None
        self.recorder_tid = 0  # native id of the thread that recorded the first buffered op
        # id(controller tensor) -> (weakref to it, its version when uploaded, the copy's id)
        self.consts: dict[int, tuple[weakref.ref[Any], int, int]] = {}
        self.pool: Any = None  # small read-only tensors' copies by contents (constants.Pool)
        # to_mesh: the engines this one's ranks know the inboxes of (by key), and the streams
        # that send what this one's ranks wait for (sent before this one is).
        self.links: set[str] = set()
        self.upstream: weakref.WeakSet[Stream] = weakref.WeakSet()
        # After a recovery: ids below ``floor`` are gone unless ``kept`` (recovery restored them)
        self.floor = 0
        self.kept: frozenset[int] = frozenset()
        _streams.add(self)

    def restart(self, engine: Any, mailboxes: list[bytes]) -> None:
        """The engine was replaced (recovery), on the processes with ``mailboxes`` (a healed
        rank is a new process; a shrunk mesh has fewer): nothing buffered or uploaded
        survives, and the ids allocated so far are gone until ``keep`` names those restored."""
        with self.lock:
            self.engine = engine
            self.mailboxes = mailboxes
            self.ops, self.dead, self.cells, self.consts, self.known = [], [], {}, {}, {}
            self.pool = None
            self.marks, self.programs = [], Programs()  # the new engine keeps no program
            self.steps.reset()
            self.lost = self.error = None
            self.lost_why = ""
            self.closed = False
            self.batches = 0  # the new engine's count (cells and actors wait on it by its key)
            self.floor = next(self._ids)
            self.kept = frozenset()

    def keep(self, ids: Any) -> None:
        self.kept = self.kept | frozenset(ids)

    def check_ids(self, ids: Any) -> None:
        """Raise at the user's line for a value the mesh lost in a recovery."""
        for i in ids:
            if i < self.floor and i not in self.kept:
                raise MeshClosedError(
                    "this MeshTensor was lost when the mesh recovered from a rank's death: "
                    "recovery restores the training state it was given (model, optimizer, "
                    "their tensors); make other values again"
                )

    def died(self, id: int) -> None:
        """A MeshTensor was collected (any thread, any time: a finalizer). Looks the list up on
        each call: a bound ``self.dead.append`` would keep appending to a list already sent."""
        self.dead.append(id)

    def new_id(self) -> int:
        return next(self._ids)  # itertools.count is atomic under the GIL

    def check(self) -> None:
        """Raise what makes this mesh's values unusable: stopped, or a rank lost (since healed
        or not), each saying what to do."""
        if self.procs_state.closed:
            raise lifetime.stopped(self.name) from self.lost
        if self.lost is not None and self.lost_why:
            raise MeshClosedError(f"{self.lost_why}: {self.lost}") from self.lost
        if self.lost is not None:
            healed = compat.mailboxes(self.procs) != self.mailboxes
            raise lifetime.lost(self.name, self.lost, healed) from self.lost

    def record(self, op: Op) -> None:
        if self.lost is not None or self.procs_state.closed:
            self.check()
        if self.steps.over and self.steps.begins():
            self.flush()  # the step that ended, while this one is recorded (step_sends.py)
        if self.floor:
            self.check_ids(op[2])
        if op[0] not in _WRITE_NOTHING:
            self.known.clear()  # it may write a value (a remote call, a gradient sync, ...)
            if op[0] in _FOREIGN:
                self.foreign += 1
        with self.lock:
            ops = self.ops
            ops.append(op)
            self.recorded += 1  # the idle timer's clock: no time call per op
            full = len(ops) >= BATCH_OPS
            if not self.armed and not full:
                self.armed = True
                self.recorder_tid = native_id()
                if self._timer is None:
                    with held():  # a thread half started would never flush
                        self._start_timer()
                self.wake_event.set()
        if full:
            self.flush()

    def mark(self) -> None:
        """An optimizer step over this mesh's tensors ended here: a repeated step between two
        marks is sent by reference (programs.py), and it may go as the next begins
        (step_sends.py)."""
        with self.lock:
            n = len(self.ops)
            if n and (not self.marks or self.marks[-1] != n):
                self.marks.append(n)
            self.steps.ended(n)

    def _take(self) -> list[Op]:
        """The buffered ops, as the batch to send (under ``self.lock``)."""
        ops, self.ops = self.ops, []
        marks, self.marks = self.marks, []
        self.steps.send_next = False
        return self.programs.encode(ops, marks)

    def flush(self) -> None:
        """Send what is buffered (and the drops) now; raise what a background send hit."""
        self._send_upstream()
        self._sending(self.send_now)

    def wait_for(self, other: Stream) -> None:
        """This stream's ranks wait for something ``other`` sends (a ``to_mesh``)."""
        if other not in self.upstream:
            self.upstream.add(other)

    def _send_upstream(self) -> None:
        """Send, first, what the streams this one waits for have buffered, and theirs in turn:
        otherwise this stream's ranks would wait for their idle flush. No lock held: two
        streams may wait for each other (a pipeline's forward and backward)."""
        if not self.upstream:
            return
        seen: set[int] = {id(self)}
        todo = list(self.upstream)
        while todo:
            other = todo.pop()
            if id(other) in seen:
                continue
            seen.add(id(other))
            todo.extend(other.upstream)
            if other.ops and not other.closed and other.lost is None:
                try:
                    other.send_now()
                except BaseException as exc:  # that stream's own sync point reports it
                    other.error = exc

    def fetch_after_batch(self, requests: list[tuple[int, int | None]]) -> Any:
        """``engine.fetch.call(requests)`` after what is buffered: the batch and the fetch go in
        one message per process (``run_and_fetch``). Returns the call's future; raises as
        ``flush`` does."""

        self._send_upstream()
        if self.floor:
            self.check_ids([i for i, _ in requests])

        def send() -> Any:
            with self.lock:
                self.steps.read = True
                ops = self._take()
                dead, self.dead = self.dead, []
                cells, self.cells = self.cells, {}
                try:
                    if (not ops and not dead) or self.closed:
                        return self.engine.fetch.call(requests, cells)
                    # Under the lock: a batch sent by another thread must not overtake it.
                    reply = self.engine.run_and_fetch.call(pack(ops), dead, requests, cells)
                except BaseException as exc:
                    self._unsent(exc, ops)
                    raise
                self.batches += 1
                return reply

        return self._sending(send)

    def call_after_batch(self, call: Callable[[dict[int, tuple[int, str]]], Any]) -> Any:
        """Send what is buffered, then ``call(cells)``, an engine call that carries the cells
        launched since (a remote function's ``call``: it may run collectives too)."""

        def send() -> Any:
            with self.lock:
                self._send_locked()
                cells, self.cells = self.cells, {}
                try:
                    return call(cells)
                except BaseException as exc:
                    # Pickled before any send: it failed for every rank, unless an interrupt
                    # (the second, see interrupts.py) stopped it halfway through its sends.
                    if isinstance(exc, KeyboardInterrupt):
                        self._unsent(exc, True)
                    else:
                        self.cells = {**cells, **self.cells}  # for the next message, then
                    raise

        return self._sending(send)

    def handed_out(self) -> None:
        """User code on the ranks gets engine values (an actor's endpoint, a %%mesh cell) and
        may write them in place: nothing known stays, no model input is reused."""
        self.known.clear()
        self.foreign += 1

    def cell_launched(self, cell: int, name: str, processes: set[bytes]) -> int:
        """The kernel launches ``%%mesh`` cell number ``cell`` (``name``) on the processes with
        these mailboxes: send what is buffered, so that the engine's next message names the
        cell, and return how many batches the engines were sent before it (a cell that touches
        engine values runs after those). Raises what sending raises."""
        self.handed_out()
        with held(), self.lock:
            self._send_locked()
            for index, mailbox in enumerate(self.mailboxes):
                if mailbox in processes:
                    self.cells[index] = (cell, name)  # a process runs its cells in order
            return self.batches

    def _sending(self, send: Callable[[], Any]) -> Any:
        """Run ``send`` with Ctrl-C held back (raised once it is done); a rank's death loses the
        stream, and an error a background send hit since the last sync point is raised here."""
        self.check()
        with held():
            try:
                result = send()
            except SupervisionError as exc:
                raise self.translate(exc) from exc
            error, self.error = self.error, None
            if error is not None:
                raise self.translate(error) from error
            return result

    def translate(self, exc: BaseException) -> BaseException:
        """What a sync point raises for ``exc``: a rank's death (or the mesh's stop) loses the
        stream, and is said in the user's words (the runtime's error names the engine's
        endpoint, which the user never called)."""
        if not isinstance(exc, SupervisionError):
            return exc
        self.lose(exc)
        if self.procs_state.closed or isinstance(exc, MeshClosedError):
            return lifetime.stopped(self.name)
        return lifetime.rank_died(self.name, exc)

    def lose(self, error: BaseException) -> None:
        """A rank of the mesh died: its values (and the group's collectives) are gone."""
        self._lose(error, "")  # check() says it in lifetime's words

    def _lose(self, error: BaseException, why: str) -> None:
        if self.lost is None:
            self.lost_why = why
            self.lost = error
            self.ops.clear()
            self.marks.clear()

    def _unsent(self, error: BaseException, ops: Any) -> None:
        """A message of ops (``ops`` truthy) was taken out of the buffer and did not go, or went
        to some ranks only: the ranks' values may differ, so none is usable any more. (A rank's
        death is ``lose``, by the caller.)"""
        if ops and not isinstance(error, SupervisionError):
            self._lose(
                error,
                "the tensor values of this MeshTensor's mesh are unusable: a batch of ops "
                "could not be sent to every rank, so the ranks may hold different values; "
                "distribute (or module_to_mesh) again, which starts a new engine on the mesh "
                "(or stop the mesh and spawn a new one). What stopped the batch",
            )

    def send_now(self) -> None:
        with self.lock:
            self._send_locked()

    def _send_locked(self) -> None:
        """Send what is buffered (under ``self.lock``: two threads flushing must not reorder
        their batches). The cells launched since the last message go with it."""
        ops = self._take()
        dead = self.dead
        self.dead = []
        if not ops and not dead:
            return
        if self.closed:
            return
        cells, self.cells = self.cells, {}
        try:
            self.engine.run.broadcast(pack(ops), dead, cells)
        except BaseException as exc:
            if not ops:
                return  # only drops: the values died with their processes
            self._unsent(exc, ops)
            raise
        self.batches += 1

    # -- the idle timer ------------------------------------------------------------------------

    def _start_timer(self) -> None:
        if self._timer is None:
            self._timer = start_timer(self)

    def timer_ends_if_idle(self) -> bool:
        """Called by the idle timer after a second with nothing recorded: it ends (the next
        recorded op starts another), so no thread outlives a mesh's use, in a test or a
        notebook that stopped its mesh. Under the lock that ``record`` arms it under."""
        with self.lock:
            if self.wake_event.is_set() or self.ops:
                return False
            self._timer = None
            return True

    def close(self) -> None:
        self.closed = True
        self.wake_event.set()


if CHECK:  # the test suite: every op recorded is checked against the table of kinds
    Stream.record = checked(Stream.record)  # type: ignore[method-assign,assignment]


def flush_all(*_: Any) -> None:
    """Send every mesh's buffered ops (the kernel calls this after each cell)."""
    for stream in list(_streams):
        try:
            stream.flush()
        except Exception:
            logger.exception("flushing the tensor op stream failed")

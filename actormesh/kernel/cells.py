"""Running a ``%%mesh`` cell: the cast to its ranks, waiting, results (the mesh behind its
TARGET is found by targets.py).

A cell is one cast of ``MeshExecutor.run`` to the selected ranks, collected rank by rank (so
the status strip and the interrupt report know every rank's state, and one dead rank does not
hide the others' outcomes). While a blocking cell runs, its thread installs an
:class:`OutputGrouper` as the runtime's log writer and flushes it every few tens of
milliseconds; the writer is restored before the cell returns, whatever happens.

The cell is sent with ``Endpoint.cast`` and gathered by a ``Collector`` of the kernel's own.
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import MeshTimeoutError, ProcDeath, RemoteFailure
from ..runtime.mesh_shape import with_shape
from ..runtime.meshes import Collector, ProcTable, ValueMesh
from ..runtime.messaging import Message, ReplyInbox, thread_reply_inbox
from ..runtime.procs import get_controller
from ..runtime.shape import Shape
from . import debugger_seam
from .cell_errors import CellInterrupted, CellTimeout, cell_error, interruption_report
from .display import OutputGrouper, StatusStrip, make_strip, output_prefix, prefix
from .executor import CellFailure
from .selection import Selection, values_of
from .targets import Target

logger = logging.getLogger(__name__)

STRIP_AFTER = 1.0  # a cell running longer than this shows the per-rank status strip
INTERRUPT_GRACE = 5.0  # how long an interrupted cell waits for its ranks to stop
GROUP_WINDOW = 0.1  # how long a line waits for identical lines from other ranks
GROUP_MAX_HOLD = 1.0  # ... and at most this long while its peer ranks are still silent

# -- one cell --------------------------------------------------------------------------------------


def _write(stream: str, text: str) -> None:
    out = sys.stderr if stream == "stderr" else sys.stdout
    out.write(text)
    out.flush()


def _show(data: dict[str, Any], metadata: dict[str, Any]) -> None:
    from IPython.core.display_functions import publish_display_data

    publish_display_data(data=data, metadata=metadata)


@dataclass
class CellOptions:
    filename: str
    source: str
    selection: Selection
    dedup: bool = True
    timeout: float | None = None
    strip: bool = True  # show the status strip when the cell runs long (needs a kernel)


Outcome = CellFailure | str | None  # None: success; str: how the rank's process died


class _CellCollector(Collector[Any]):
    """Hands each rank's reply to the cell as it arrives (the runtime's gather would drop the
    other ranks' replies once one rank dies). Runs on the I/O thread."""

    def __init__(self, run: CellRun, what: str, procs: ProcTable, shape: Shape) -> None:
        super().__init__(what, procs, shape)
        self.run = run
        self.read_by_waiter = run.inbox is not None

    def deliver(self, index: int, failed: bool, value: Any) -> None:
        if self.record(index, value) is None:
            return
        self.run.deliver(self.shape.global_rank(index), failed, value)


class CellRun:
    """One cell on its ranks.

    The cell is one cast to the selected ranks (one per rank when they are not evenly spaced),
    gathered by a :class:`_CellCollector` that hands over each rank's reply as it arrives, so a
    rank that dies fails only itself: the others' outcomes still arrive. Rich output comes
    through a port of this kernel. Both are handled on the I/O thread; the cell's thread waits
    on ``_wake``.
    """

    def __init__(self, target: Target, options: CellOptions) -> None:
        self.target = target
        self.options = options
        self.ranks = options.selection.ranks
        self.states: dict[int, str] = dict.fromkeys(self.ranks, "running")
        self.outcomes: dict[int, Outcome] = {}
        self.values: dict[int, Any] = {}
        self.grouper: OutputGrouper | None = None
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._port: Any = None
        self._strip: StatusStrip | None = None
        self._started = 0.0
        # A blocking cell's thread reads the replies itself as it waits (one thread hand-off
        # less per cell), when it has a reply inbox (the main thread does: see reply_inbox.py).
        self.inbox: ReplyInbox | None = None

    # -- I/O thread --------------------------------------------------------------------------

    def on_message(self, msg: Message) -> None:
        """Rich output from a rank (the display port)."""
        try:
            kind, rank, data, metadata = msg.value()
        except Exception:
            logger.exception("a message from a rank of %s could not be read", self.options.filename)
            return
        if kind != "display":
            return
        if self.grouper is not None:
            self.grouper.display(rank, data, metadata)
        else:  # --noblock: nowhere to group it; show its text
            names = {r: label for label, r in self.target.tools.labels.items()}
            print(f"{output_prefix([rank], names)} {data.get('text/plain', '')}")

    def on_death(self, mailbox: bytes, death: ProcDeath) -> bool:
        return False  # the cell's collector reports deaths

    def deliver(self, rank: int, failed: bool, value: Any) -> None:
        """A rank's reply (``(value, failure)``), its death, or a failure of the call itself."""
        if not failed:
            result, failure = value
            self._finish(rank, failure, result)
        elif isinstance(value, ProcDeath):
            self._finish(rank, value.describe(), None)
        elif isinstance(value, RemoteFailure):
            self._finish(
                rank, CellFailure(value.exc_type, value.message, value.traceback, None), None
            )
        else:
            self._finish(rank, CellFailure("MeshError", repr(value), repr(value), None), None)

    def _finish(self, rank: int, outcome: Outcome, value: Any) -> None:
        with self._lock:
            if rank in self.outcomes:
                return
            self.outcomes[rank] = outcome
            self.values[rank] = value
            last = len(self.outcomes) == len(self.ranks)
        if isinstance(outcome, str):
            state = "dead"
        elif outcome is None:
            state = "done"
        else:
            state = "interrupted" if outcome.interrupted else "error"
        self.states[rank] = state
        if self.grouper is not None:
            self.grouper.finished(rank)
        if last and self._port is not None:
            get_controller().node.close_port(self._port)
        if not last:
            return  # the cell's thread polls the states; only the end must wake it
        self._wake.set()
        if self.inbox is not None:
            self.inbox.set()  # the end came through the I/O thread (a death): wake the reader

    # -- any thread --------------------------------------------------------------------------

    def start(self) -> None:
        tools = self.target.tools
        node = get_controller().node
        self._started = time.monotonic()
        port = self._port = node.open_port(self)
        executor = tools.executor_mesh()
        opts = self.options
        shape = opts.selection.shape
        views = [shape] if shape is not None else [tools.rank_shape(r) for r in self.ranks]
        processes = {tools.table.addresses[r].mailbox for r in self.ranks}
        # One lock from numbering the cell to its cast: each process then gets its cells in
        # the order of their numbers (a tensor engine waits on the newest it was told of).
        with _LAUNCH_LOCK:
            turn = _engine_turn(opts.filename, processes)
            args = (opts.filename, opts.source, port, self.target.actor_key, turn)
            for view in views:
                collector = _CellCollector(self, f"%%mesh {opts.filename}", tools.table, view)
                with_shape(executor, view).run.cast(view, args, {}, collector)

    def done(self) -> bool:
        return len(self.outcomes) == len(self.ranks)

    def running(self) -> list[int]:
        return [r for r in self.ranks if r not in self.outcomes]

    def result(self) -> ValueMesh[Any]:
        """The values of a finished cell, or its grouped error."""
        failures = {r: f for r, f in self.outcomes.items() if f is not None}
        if failures:
            raise cell_error(self.options.filename, failures)
        values = [self.values[r] for r in self.ranks]
        return values_of(self.target.tools.shape, self.options.selection, values)

    def wait(self, timeout: float | None) -> None:
        """Block until every rank has its outcome (interruptible; ``MeshTimeoutError``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            left = 0.25 if deadline is None else min(0.25, deadline - time.monotonic())
            if left <= 0:
                raise MeshTimeoutError(
                    f"timed out after {timeout:g} s waiting for {self.options.filename} on "
                    f"{prefix(self.running())[1:-1]}"
                )
            self._wake.wait(left)
            self._wake.clear()
            debugger = debugger_seam.installed()
            if debugger is not None and not self.done():
                debugger.raise_if_paused(self.target.tools.table.mesh_id, self.running())

    # -- blocking --------------------------------------------------------------------------------

    def run_blocking(self) -> ValueMesh[Any] | None:
        """Run the cell with live grouped output; returns its values or raises its error.

        ``None`` when the ranks still running are all paused in the debugger: the cell ends
        without them (their outcome arrives later, see ``PendingCell``)."""
        logs = get_controller().logs
        grouper = self.grouper = OutputGrouper(
            self.target.tools.labels,
            _write,
            _show,
            dedup=self.options.dedup,
            window=GROUP_WINDOW,
            max_hold=GROUP_MAX_HOLD,
            ranks=self.ranks,
        )
        previous = logs.writer
        logs.writer = grouper.writer
        paused: dict[int, str] = {}
        self.inbox = thread_reply_inbox(get_controller().node)
        try:
            self.start()
            self._wait(grouper)
        except _Paused as stop:
            paused = stop.args[0]
        except KeyboardInterrupt:
            self._stop_ranks(grouper, None)
        except _Deadline:
            self._stop_ranks(grouper, self.options.timeout)
        finally:
            if logs.writer == grouper.writer:
                logs.writer = previous
            grouper.flush(final=True)
            if self._strip is not None:
                shown = self._shown_states(self._paused_ranks())
                self._strip.update(shown, time.monotonic() - self._started, final=True)
        if paused:
            self.grouper = None  # their later displays print as text: the cell has ended
            labels = self.target.tools.table.labels
            for rank, where in sorted(paused.items()):
                print(f"rank {rank} {{{labels[rank]}}} {where}")
            debugger = debugger_seam.installed()
            if debugger is not None:
                debugger.cell_paused()
            return None
        return self.result()

    def _wait(self, grouper: OutputGrouper, until: float | None = None) -> None:
        start = self._started
        deadline = None if self.options.timeout is None else start + self.options.timeout
        title = f"%%mesh {self.target.text} ({self.options.filename.strip('<>')})"
        while not self.done():
            step = 0.03 if grouper.pending else 0.25
            if self.inbox is not None and not self.inbox.closed:
                self.inbox.wait(self, time.monotonic() + step, _nothing, step)
            else:
                self._wake.wait(step)
            self._wake.clear()
            grouper.flush()
            now = time.monotonic()
            if self._strip is None and self.options.strip and now - start > STRIP_AFTER:
                self.options.strip = False  # one try
                self._strip = make_strip(title)
            paused = self._paused_ranks()
            if self._strip is not None:
                self._strip.update(self._shown_states(paused), now - start)
            if until is not None and now > until:
                return
            if until is None and debugger_seam.installed() is not None:
                running = self.running()
                if running and all(r in paused for r in running):
                    raise _Paused({r: paused[r] for r in running})
            if deadline is not None and until is None and now > deadline:
                raise _Deadline

    def _paused_ranks(self) -> Mapping[int, str]:
        """The ranks of this cell's mesh paused in the debugger (none without it)."""
        debugger = debugger_seam.installed()
        if debugger is None:
            return {}
        return debugger.paused(self.target.tools.table.mesh_id)

    def _shown_states(self, paused: Mapping[int, str]) -> dict[int, str]:
        """The strip's states: a rank paused in the debugger says so, not "running" (as the
        sidebar and the debugger's widget do)."""
        return {
            r: "paused" if r in paused and s == "running" else s for r, s in self.states.items()
        }

    def _stop_ranks(self, grouper: OutputGrouper, timeout: float | None) -> None:
        running = self.running()
        self.target.tools.interrupt(running)
        try:
            self._wait(grouper, until=time.monotonic() + INTERRUPT_GRACE)
        except KeyboardInterrupt:
            pass  # a second interrupt: stop waiting for the ranks
        grouper.flush(final=True)
        still = self.running()
        outcomes = {r: o for r, o in self.outcomes.items() if r in running}
        if timeout is not None:
            head = f"%%mesh cell timed out after {timeout:g} s on {prefix(running)[1:-1]}"
            raise CellTimeout(interruption_report(head, outcomes, still))
        head = f"KeyboardInterrupt: %%mesh cell interrupted on {prefix(running)[1:-1]}"
        raise CellInterrupted(interruption_report(head, outcomes, still))


_LAUNCH_LOCK = threading.Lock()
_cell_numbers = itertools.count(1)


def _engine_turn(name: str, processes: set[bytes]) -> tuple[int, dict[str, int]] | None:
    """``(this cell's number, the tensor engines' batches sent before it)``, having told each
    tensor mesh's stream that the cell was launched on these processes: a cell that touches an
    engine's values runs after those batches, and the engine's later messages run after the
    cell, on each rank (``actormesh.tensor.worker.local``). ``None`` when there is no tensor
    mesh."""
    if "actormesh.tensor" not in sys.modules:  # no tensor was made here: no engine anywhere
        return None
    from ..tensor.tools import cell_launched

    cell = next(_cell_numbers)
    batches = cell_launched(cell, name, processes)
    return (cell, batches) if batches else None


def _nothing() -> None:
    pass


class _Deadline(Exception):
    pass


class _Paused(Exception):
    """Every rank still running is paused in the debugger."""


class PendingCell:
    """A ``%%mesh --noblock`` cell: ``get()`` waits for its values (or raises its error)."""

    def __init__(self, run: CellRun) -> None:
        self._run = run

    def done(self) -> bool:
        return self._run.done()

    def get(self, timeout: float | None = None) -> ValueMesh[Any]:
        """Block until every rank finished (at most ``timeout`` s); its values or its error."""
        self._run.wait(timeout)
        return self._run.result()

    def interrupt(self) -> None:
        self._run.target.tools.interrupt(self._run.running())

    @property
    def ranks(self) -> tuple[int, ...]:
        return self._run.ranks

    def __repr__(self) -> str:
        states: dict[str, list[int]] = {}
        for r, s in sorted(self._run.states.items()):
            states.setdefault(s, []).append(r)
        desc = ", ".join(f"{s} {prefix(rs)[1:-1]}" for s, rs in states.items())
        return f"<%%mesh {self._run.options.filename.strip('<>')}: {desc}>"

"""Training metrics: ``am.log_metrics({"loss": loss}, step=i)`` on a rank or the controller.

A training loop calls this every step, so it must cost next to nothing there: a call checks its
values and appends one tuple, ``(step, time, names, values)``, to this process's outbox with a
single ``list.append`` (atomic, so no lock: a flush takes what is there as a prefix of the list
and deletes that prefix, and calls that append meanwhile stay behind it). Nothing is sent per
call. The outbox travels to the controller as one METRICS message (``protocol.py``) when:

- the rank's output is flushed (``logs.flush_output``): before every endpoint reply, so the
  metrics an endpoint logged are at the controller when its caller has the reply;
- a short timer fires (``FLUSH_AFTER`` seconds after the first value of a batch): a long
  endpoint that trains for minutes still shows its curve live;
- the outbox holds ``FLUSH_AT`` calls.

In the controller itself (``log_metrics`` in a notebook cell) the values go straight to a log
of its own, which ``this_proc().metrics()`` reads.
"""

from __future__ import annotations

import numbers
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...errors import MeshUsageError
from .protocol import METRICS

if TYPE_CHECKING:
    from ..shape import Shape
    from .node import Node

# One recorded value: (name, value, step or None, time.time()).
Record = tuple[str, float, int | None, float]
# One call on a rank, as it travels: (step, time.time(), names, values).
Call = tuple[int | None, float, tuple[str, ...], tuple[float, ...]]

FLUSH_AFTER = 0.5  # seconds: how stale a live chart may be while an endpoint keeps training
FLUSH_AT = 1024  # calls: a bound on one message (and on what a crash can lose)


class _Outbox:
    def __init__(self) -> None:
        self.calls: list[Call] = []  # appended by any thread; see the module docstring
        self.flush_lock = threading.Lock()  # one flush at a time: each takes its own prefix
        self.timer_armed = False
        self.node: Node | None = None
        self.rank = 0


_outbox = _Outbox()


def in_worker() -> bool:
    return _outbox.node is not None


def start_outbox(node: Node, rank: int) -> None:
    """Send this worker's metrics, as rank ``rank`` of its proc mesh, through ``node`` (called
    once at worker start)."""
    _outbox.node = node
    _outbox.rank = rank


def log_metrics(values: Mapping[str, Any], step: int | None = None) -> None:
    """Record training metrics for the live charts and ``procs.metrics()``.

    Args:
        values: metric name to value: a Python number, a numpy scalar, or a 0-d tensor (turned
            into a float here, on the rank). Anything else raises ``MeshUsageError``.
        step: the training step these values belong to (an ``int``), or None.

    Callable from an endpoint, a ``%%mesh`` cell or the controller, on any thread. Never
    blocks and sends nothing by itself: values leave the rank in batches (see the module
    docstring), at the latest with the reply of the endpoint that logged them.
    """
    # Exact-type checks first: the ABC checks (Mapping, numbers.Real) cost more than the rest
    # of a call together, and a training loop passes dicts of floats.
    if type(values) is not dict and not isinstance(values, Mapping):
        raise MeshUsageError(
            f"log_metrics takes a mapping of name to number, got {type(values).__name__}: "
            'write am.log_metrics({"loss": loss}, step=i)'
        )
    if step is not None and type(step) is not int:
        if isinstance(step, bool) or not isinstance(step, numbers.Integral):
            raise MeshUsageError(f"log_metrics: step must be an int or None, got {step!r}")
        step = int(step)
    names = tuple(values)
    floats = tuple(values.values())
    for name in names:
        if type(name) is not str or not name:
            _check_name(name)
    for value in floats:
        if type(value) is not float:
            floats = _as_floats(names, floats)
            break
    now = time.time()
    node = _outbox.node
    if node is None or node.controller is None:
        _local.add(0, call_records([(step, now, names, floats)]))  # this_proc().metrics()
        return
    box = _outbox
    box.calls.append((step, now, names, floats))
    if len(box.calls) >= FLUSH_AT:
        flush_metrics()
    elif not box.timer_armed:
        # Two threads may both arm a timer here: the second flush finds little or nothing.
        box.timer_armed = True
        transport = node.transport
        transport.call_soon(lambda: transport.call_later(FLUSH_AFTER, flush_metrics))


def flush_metrics() -> None:
    """Send what this process logged and has not sent yet (any thread; cheap when empty)."""
    box = _outbox
    if not box.calls:
        return
    node = box.node
    with box.flush_lock:
        # Disarmed first: a call appended after the prefix is taken then arms a timer anew.
        box.timer_armed = False
        calls = box.calls
        taken = calls[: len(calls)]
        del calls[: len(taken)]
    if node is None or node.controller is None or not taken:
        return
    node.send(node.controller, (METRICS, node.mesh_id, box.rank, taken))


def call_records(calls: list[Call]) -> list[Record]:
    """One ``(name, value, step, time)`` per value of ``calls`` (the controller's side)."""
    return [
        (name, value, step, t)
        for step, t, names, floats in calls
        for name, value in zip(names, floats, strict=True)
    ]


def _as_floats(names: tuple[str, ...], values: tuple[Any, ...]) -> tuple[float, ...]:
    # Same lengths: both come from one mapping.
    pairs = zip(names, values)  # noqa: B905
    return tuple([v if type(v) is float else _as_float(n, v) for n, v in pairs])


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise MeshUsageError(f"log_metrics: a metric name must be a non-empty str, got {name!r}")


def _as_float(name: str, value: object) -> float:
    try:
        return _converted(name, value)
    except OverflowError:  # float(10**400), a Fraction as large
        # Not str() of an int: past 4300 digits, Python refuses to make it.
        what = f"an int of {value.bit_length()} bits" if isinstance(value, int) else repr(value)
        raise MeshUsageError(
            f"log_metrics: {name!r} is {what[:80]}, too large for a float (the largest is "
            "about 1.8e308); log a scaled value (its log10, for example)"
        ) from None


def _converted(name: str, value: object) -> float:
    if type(value) is int:
        return float(value)
    # A tensor, an array or a numpy scalar: one call if it holds one value. Tried before the
    # ABC check (numbers.Real), which costs a tensor as much as its .item().
    item = getattr(value, "item", None)
    if item is not None:
        try:
            return float(item())
        except (RuntimeError, ValueError):  # more than one element
            if not hasattr(value, "shape"):
                raise MeshUsageError(
                    f"log_metrics: {name!r} must be a number or a 0-d tensor, got "
                    f"{type(value).__name__}"
                ) from None
            raise MeshUsageError(
                f"log_metrics: {name!r} is a tensor of shape {tuple(value.shape)}; log a "
                "number or a 0-d tensor (for example its .mean())"
            ) from None
        except TypeError:  # an .item() that is not a number's
            pass
    elif isinstance(value, numbers.Real):  # bool, Fraction, numpy scalars
        return float(value)
    raise MeshUsageError(
        f"log_metrics: {name!r} must be a number or a 0-d tensor, got {type(value).__name__}"
    )


# -- the controller's side ----------------------------------------------------------------------

# How many values one mesh keeps (the oldest go first): a day of 10 metrics on 8 ranks at a step
# a second is ~7M; charts and procs.metrics() need the recent past, not everything.
KEEP = 500_000


class MetricsLog:
    """The values the ranks of one proc mesh logged, oldest first: ``(rank, name, value, step,
    time)``. Appended on the I/O thread, read from any thread (extending and copying a list are
    atomic under the GIL); ``listen`` tells live views that values came."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self.rows: list[tuple[int, str, float, int | None, float]] = []
        self.total = 0  # values ever added (trimmed ones too): the cursor of ``since``
        self._lock = threading.Lock()  # ``since`` needs rows and total to agree
        self._listeners: list[Callable[[], None]] = []

    def add(self, rank: int, records: Any) -> None:
        with self._lock:
            before = len(self.rows)
            self.rows.extend((rank, name, value, step, t) for name, value, step, t in records)
            self.total += len(self.rows) - before
            if len(self.rows) > self.keep:
                del self.rows[: len(self.rows) - self.keep]
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:
                pass  # a live view that failed must not stop the others (or the I/O thread)

    def since(self, cursor: int) -> tuple[list[tuple[int, str, float, int | None, float]], int]:
        """The rows added after ``cursor`` (a ``total`` seen before; 0: all that are kept), and
        the cursor to pass next time. Rows trimmed meanwhile are lost to the caller."""
        with self._lock:
            new = self.total - cursor
            rows = self.rows[-new:] if 0 < new < len(self.rows) else self.rows[:] if new > 0 else []
            return rows, self.total

    def listen(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn`` (on the I/O thread) whenever values arrive; returns the undo."""
        self._listeners.append(fn)
        return lambda: self._listeners.remove(fn) if fn in self._listeners else None

    def table(self, shape: Shape, names: Sequence[str] = ()) -> Any:
        """The rows of the ranks of ``shape`` (a view of the mesh), oldest first: one per
        value, with ``name``, ``value``, ``step``, ``time``, ``rank`` (the flat rank in the
        view) and one column per dimension; a pandas ``DataFrame`` when pandas is installed,
        else a list of dicts (``ProcMesh.metrics``). ``names`` keeps only those metrics."""
        wanted = set(names)
        labels = shape.labels
        rows = []
        for rank, name, value, step, t in list(self.rows):
            if wanted and name not in wanted:
                continue
            index = shape.local_index(rank)
            if index is None:
                continue
            row: dict[str, Any] = {"name": name, "value": value, "step": step, "time": t}
            row["rank"] = index
            row.update(zip(labels, shape.point(index).values(), strict=True))
            rows.append(row)
        try:
            import pandas
        except ImportError:
            return rows
        columns = ["name", "value", "step", "time", "rank", *labels]
        return pandas.DataFrame(rows, columns=columns)


def local_log() -> MetricsLog:
    return _local


# What the controller process itself logs (rank 0 of ``this_proc()``).
_local = MetricsLog()

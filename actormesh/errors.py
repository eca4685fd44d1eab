"""Every exception a user of actormesh can catch, in one place: the runtime's are defined here;
the notebook tools' are subclasses defined next to their tool (marked *), because they render
with the tool's helpers and this module, the package's bottom layer, imports nothing above it.

```
MeshError                 base of everything actormesh raises on purpose
├── ActorError            user code raised remotely (rank, actor, endpoint, remote traceback)
│   ├── MeshCellError *   a %%mesh cell raised on some ranks (kernel/cell_errors.py)
│   └── ActorSupervisionError  ... and that ended the actor (also a SupervisionError, below)
├── SupervisionError      a worker died or stopped answering (rank, pid, exit code/signal, stderr)
│   ├── ActorSupervisionError  an actor ended (a BaseException, abort, __supervise__, stop)
│   └── MeshClosedError   the mesh was stopped, then used (also a RuntimeError)
├── MeshTimeoutError      a wait passed its deadline (also a TimeoutError)
│   └── CellTimeout *     a %%mesh --timeout cell ran past it (kernel/cell_errors.py)
├── MeshUsageError        an API used in a way that cannot work, a bad slice (also a ValueError)
│   ├── MeshIndexError    an index out of range (also an IndexError)
│   ├── MeshTypeError     a value of the wrong type (also a TypeError)
│   └── UnknownEndpointError  mesh.name with no such endpoint (also an AttributeError)
├── CellSyntaxError *     a %%mesh cell does not compile (kernel/cell_errors.py)
├── RanksPaused *         a notebook wait on ranks all paused in the debugger (debugger/session.py)
└── DapError *            a debugger request to a rank failed (debugger/dap.py)
CellInterrupted *         a %%mesh cell interrupted: a KeyboardInterrupt (kernel/cell_errors.py)
```

``ActorError`` and ``SupervisionError`` are also ``MeshFailure`` objects: what a mesh's owner
(``__supervise__``) and the fault hook receive, named as in Monarch.

``ActorSupervisionError`` is both: a failure that ended an actor (or a call to an actor that has
ended) is a supervision event in Monarch, which its code catches as ``SupervisionError``, while
code written for actormesh catches it as the ``ActorError`` it always was; either way it carries
the rank, the remote traceback and everything else an ``ActorError`` carries.

Remote failures travel as text (type name, message, traceback), never as pickled exception
objects, so the controller never depends on unpickling a user's exception class.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import cell_names


class MeshError(Exception):
    """Base class of every error actormesh raises on purpose."""


class MeshUsageError(MeshError, ValueError):
    """An API was used in a way that cannot work (wrong mesh size, unknown endpoint, a bad
    slice or dimension name, ...)."""


class MeshIndexError(MeshUsageError, IndexError):
    """An index or coordinate out of range (``mesh.slice(gpus=9)`` on 8 gpus). Also an
    ``IndexError``, as such errors are in Python."""


class MeshTypeError(MeshUsageError, TypeError):
    """A value of the wrong type given to a mesh API (``mesh.slice(gpus="0")``). Also a
    ``TypeError``, as such errors are in Python."""


class UnknownEndpointError(MeshUsageError, AttributeError):
    """``mesh.name`` where the actor has no endpoint ``name``. An ``AttributeError`` too, so that
    ``hasattr``, ``getattr(mesh, name, default)``, ``copy`` and completers work."""


class MeshTimeoutError(MeshError, TimeoutError):
    """A wait passed its deadline. The message names what had not answered."""


@dataclass(frozen=True)
class RemoteFailure:
    """One rank's failure, as text: what happened, where, and the remote traceback."""

    rank: str  # the rank's coordinates, e.g. "{hosts=0, gpus=3}"
    actor: str
    endpoint: str
    exc_type: str
    message: str
    traceback: str  # the remote traceback, already rendered as text on the worker
    # The actor ended with this failure, or had ended (stopped, __init__ failed) before the call
    # came: the caller's error is an ActorSupervisionError.
    actor_ended: bool = False

    def headline(self) -> str:
        return f"{self.exc_type}: {self.message}" if self.message else self.exc_type

    @property
    def where(self) -> str:
        """``actor.endpoint``, or the actor alone for a failure outside an endpoint."""
        return f"{self.actor}.{self.endpoint}" if self.endpoint else self.actor


@dataclass(frozen=True)
class ProcDeath:
    """How a worker process ended, as seen by its host agent."""

    rank: str
    host: str
    pid: int
    exitcode: int | None  # None when killed by a signal
    signal: str | None  # "SIGKILL", ...
    stderr_tail: tuple[str, ...] = field(default=())
    reason: str = ""  # extra words, e.g. "host lost" or "stopped"

    def describe(self) -> str:
        how = f"was killed by {self.signal}" if self.signal else f"exited with code {self.exitcode}"
        if self.reason:
            how += f" ({self.reason})"
        return f"process of rank {self.rank} (pid {self.pid} on {self.host}) {how}"


def rank_ranges(values: Iterable[int]) -> str:
    """``0-3``, ``0,2``, ``0-2,5`` (sorted, runs of consecutive values collapsed)."""
    xs = sorted(set(values))
    parts, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(parts)


def _compact(names: tuple[str, ...], points: list[tuple[int, ...]]) -> list[str]:
    # The last dimension as ranges; then rows whose rest reads the same merge on this one.
    if len(names) == 1:
        return [f"{names[0]}={rank_ranges([p[0] for p in points])}"]
    rows: dict[int, list[tuple[int, ...]]] = {}
    for p in points:
        rows.setdefault(p[0], []).append(p[1:])
    merged: dict[tuple[str, ...], list[int]] = {}
    for first, rest in sorted(rows.items()):
        merged.setdefault(tuple(_compact(names[1:], rest)), []).append(first)
    return [
        f"{names[0]}={rank_ranges(firsts)},{tail}"
        for tails, firsts in merged.items()
        for tail in tails
    ]


def coordinates(ranks: Sequence[str]) -> str:
    """Rank labels (``{gpus=3}``, ``hosts=0,gpus=1``) as one text, in order, contiguous
    coordinates as ranges: ``gpus=0-3``, ``gpus=0,2``, ``hosts=0,gpus=0-1``. Output from ranks is
    prefixed with it (``[gpus=0-3] hello``)."""
    by_dims: dict[tuple[str, ...], list[tuple[int, ...]]] = {}
    others: list[str] = []
    for label in dict.fromkeys(ranks):
        try:
            pairs = [kv.split("=") for kv in label.strip("{}").replace(" ", "").split(",")]
            names = tuple(k for k, _ in pairs)
            by_dims.setdefault(names, []).append(tuple(int(v) for _, v in pairs))
        except ValueError:  # not coordinates: said as it is
            others.append(label)
    parts = [part for names, pts in by_dims.items() for part in _compact(names, pts)]
    text = "; ".join(parts + sorted(others))
    if len(text) > 100:  # scattered ranks of a large mesh: the first ones and how many
        text = text[:100].rsplit(",", 1)[0] + f", ... ({len(dict.fromkeys(ranks))} ranks)"
    return text


def format_ranks(ranks: Sequence[str]) -> str:
    """``rank gpus=2``, ``ranks gpus=0-3``: :func:`coordinates` as the subject of a sentence."""
    return f"{'rank' if len(set(ranks)) == 1 else 'ranks'} {coordinates(ranks)}"


class MeshFailure:
    """A failure that reached a mesh's owner: its ``__supervise__(failure)``, else the fault hook
    (Monarch's name). Every failure the owner receives is an ``ActorError`` or a
    ``SupervisionError`` and keeps all of their attributes; this adds Monarch's.

    ``mesh_name`` names the mesh that failed (the actor mesh's name for a failure of an actor
    mesh, the proc mesh's id for a lost process); ``mesh`` is the ``ProcMesh`` it ran on, where
    known. Both are ``None`` on a failure a caller received directly.
    """

    mesh_name: str | None = None
    mesh: object | None = None

    def report(self) -> str:
        """The failure as text for a person: where, what, and the remote traceback or stderr."""
        where = f"mesh {self.mesh_name!r}: " if self.mesh_name else ""
        return where + str(self)

    def _failure_state(self) -> dict[str, object]:
        # Kept across pickling: an owner actor escalates what it did not handle to its own owner.
        return {"mesh_name": self.mesh_name, "mesh": self.mesh}


class ActorError(MeshError, MeshFailure):
    """User code raised inside an endpoint (or an actor's ``__init__``) on one or more ranks.

    The actor survives and keeps serving, unless this is an ``ActorSupervisionError``.
    ``failures`` holds one :class:`RemoteFailure` per failed rank; identical tracebacks from
    many ranks are shown once with their ranks.
    """

    def __init__(self, failures: Sequence[RemoteFailure]):
        self.failures: tuple[RemoteFailure, ...] = tuple(failures)
        super().__init__(self._summary())

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.failures,), self._failure_state())

    @property
    def rank(self) -> str:
        return self.failures[0].rank

    @property
    def exc_type(self) -> str:
        return self.failures[0].exc_type

    @property
    def remote_traceback(self) -> str:
        return self.failures[0].traceback

    def groups(self) -> list[tuple[list[str], RemoteFailure]]:
        """Failures grouped by identical traceback: ``[(ranks, failure), ...]``."""
        groups: dict[tuple[str, str, str], tuple[list[str], RemoteFailure]] = {}
        for f in self.failures:
            key = (f.exc_type, f.message, f.traceback)
            groups.setdefault(key, ([], f))[0].append(f.rank)
        return list(groups.values())

    def _heading(self, ranks: list[str], failure: RemoteFailure) -> str:
        """One group's first line: which ranks, what raised, and what it raised."""
        return f"[{format_ranks(ranks)}] {failure.where} raised {failure.headline()}"

    def _summary(self) -> str:
        return "\n".join(self._heading(ranks, f) for ranks, f in self.groups())

    def __str__(self) -> str:
        # No leading blank line: Python prints "ActorError: " and the first heading on one line.
        # A notebook's cell files read as IPython names them ("Cell In[8], line 10").
        return cell_names.in_text(
            "\n".join(
                f"{self._heading(ranks, f)}\nRemote traceback:\n{f.traceback.rstrip()}"
                for ranks, f in self.groups()
            )
        )

    def _render_traceback_(self) -> list[str]:
        # IPython calls this instead of printing the (useless) local traceback.
        out = []
        for ranks, f in self.groups():
            out.append(f"\x1b[31m{self._heading(ranks, f)}\x1b[0m")
            out.extend(cell_names.in_text(f.traceback.rstrip()).splitlines())
        return out


class SupervisionError(MeshError, RuntimeError, MeshFailure):
    """A worker process died (or its host was lost) while a call to it was pending or made.

    ``deaths`` says for each lost process its rank, pid, exit code or signal and the last lines
    it wrote to stderr. Also a ``RuntimeError``, as Monarch's is.
    """

    def __init__(self, deaths: Sequence[ProcDeath], context: str = ""):
        self.deaths: tuple[ProcDeath, ...] = tuple(deaths)
        self.context = context
        super().__init__(self._summary())

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.deaths, self.context), self._failure_state())

    @property
    def rank(self) -> str:
        return self.deaths[0].rank

    # The first lost process's; None when no process was lost (an actor ended, a stopped mesh).
    @property
    def pid(self) -> int | None:
        return self.deaths[0].pid if self.deaths else None

    @property
    def exitcode(self) -> int | None:
        return self.deaths[0].exitcode if self.deaths else None

    @property
    def signal(self) -> str | None:
        return self.deaths[0].signal if self.deaths else None

    def _summary(self) -> str:
        if not self.deaths:
            return self.context or "a process was lost"
        head = f"{self.context}: " if self.context else ""
        lines = [head + "; ".join(d.describe() for d in self.deaths[:4])]
        if len(self.deaths) > 4:
            lines[0] += f"; and {len(self.deaths) - 4} more"
        tail = self.deaths[0].stderr_tail
        if tail:
            lines.append(f"last lines of stderr of rank {self.deaths[0].rank}:")
            lines.extend("    " + line for line in tail)
        lines.append("Call procs.heal() to respawn dead ranks, or stop the mesh.")
        return "\n".join(lines)

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[31mSupervisionError\x1b[0m: {self}"]


class ActorSupervisionError(ActorError, SupervisionError):
    """A failure that ended the actor, or a call to an actor that had ended: an ``ActorError``
    (``failures``, ``rank``, ``exc_type``, ``remote_traceback``) that is also a
    ``SupervisionError``, as Monarch raises for an actor that failed.

    What ends an actor: an endpoint that raises a ``BaseException`` that is not an ``Exception``,
    an ``@endpoint(explicit_response_port=True)`` method that raises, ``abort()``, a
    ``__supervise__`` that raises or leaves a failure unhandled, ``ActorMesh.stop()``, an
    ``__init__`` that raised. Its process lives on, so ``deaths`` is empty.
    """

    def __init__(self, failures: Sequence[RemoteFailure]):
        self.failures = tuple(failures)
        self.deaths = ()
        self.context = ""
        Exception.__init__(self, self._summary())

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.failures,), self._failure_state())


def actor_error(failures: Sequence[RemoteFailure]) -> ActorError:
    """The error of a call whose ranks failed with ``failures``: an ``ActorSupervisionError``
    when one of them ended its actor (or found it ended), else an ``ActorError``."""
    if any(f.actor_ended for f in failures):
        return ActorSupervisionError(failures)
    return ActorError(failures)


class MeshClosedError(SupervisionError):
    """The mesh (or the runtime) was stopped, and then used.

    A ``SupervisionError`` (with no deaths) because Monarch raises that for a call on a stopped
    mesh, so code written for Monarch that catches it keeps working.
    """

    def __init__(self, message: str) -> None:
        super().__init__((), message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.context,), self._failure_state())

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[31mMeshClosedError\x1b[0m: {self}"]

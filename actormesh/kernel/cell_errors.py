"""The errors a ``%%mesh`` cell raises, each rendered as IPython shows it: ``MeshCellError`` (one
block per distinct traceback, with its ranks), ``CellInterrupted``, ``CellTimeout`` and
``CellSyntaxError``, and the report of where an interrupt found each rank.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping, Sequence

from .. import cell_names
from ..errors import ActorError, MeshError, MeshTimeoutError, RemoteFailure
from .display import prefix
from .executor import CellFailure


def _failure_rank(f: RemoteFailure) -> int | str:
    return int(f.rank) if f.rank.isdigit() else f.rank


class MeshCellError(ActorError):
    """A ``%%mesh`` cell raised on some ranks: one block per distinct traceback, with its ranks.

    An :class:`~actormesh.ActorError`: ``failures`` has one entry per failed rank.
    """

    def groups_by_rank(self) -> list[tuple[list[int | str], RemoteFailure]]:
        return [([_failure_rank(f) for f in fs], fs[0]) for fs in self._grouped()]

    def _grouped(self) -> list[list[RemoteFailure]]:
        groups: dict[tuple[str, str, str], list[RemoteFailure]] = {}
        for f in self.failures:
            groups.setdefault((f.exc_type, f.message, f.traceback), []).append(f)
        return list(groups.values())

    def _summary(self) -> str:
        return "; ".join(f"{prefix(ranks)} {f.headline()}" for ranks, f in self.groups_by_rank())

    def __str__(self) -> str:
        return self._summary()

    def _render_traceback_(self) -> list[str]:
        out = []
        for ranks, f in self.groups_by_rank():
            out.append(f"\x1b[31m{prefix(ranks)} {f.headline()}\x1b[0m")
            out.extend(cell_names.in_text(f.traceback.rstrip()).splitlines())
        return out


def cell_error(filename: str, failures: Mapping[int, CellFailure | str]) -> MeshCellError:
    """The error of a cell; a ``str`` failure says how a rank's process died."""
    remote = []
    for rank, f in sorted(failures.items()):
        if isinstance(f, str):
            remote.append(RemoteFailure(str(rank), "%%mesh", filename, "SupervisionError", f, ""))
        else:
            remote.append(
                RemoteFailure(str(rank), "%%mesh", filename, f.ename, f.evalue, f.traceback)
            )
    return MeshCellError(remote)


def _where(f: CellFailure) -> str:
    return f" at line {f.line}" if f.line else ""


def _headline_colored(lines: list[str], color: str) -> list[str]:
    """``lines`` as a traceback for IPython, the first one in an ANSI ``color``."""
    return [f"\x1b[{color}m{line}\x1b[0m" if i == 0 else line for i, line in enumerate(lines)]


class CellInterrupted(KeyboardInterrupt):
    """A ``%%mesh`` cell was interrupted (kernel interrupt, or ``--timeout``)."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines

    def _render_traceback_(self) -> list[str]:
        return _headline_colored(self.lines, "33")  # yellow


class CellSyntaxError(MeshError):
    """The body of a ``%%mesh`` cell does not compile (found before anything is sent).

    Not a ``SyntaxError`` subclass: IPython would show the magic's own frames for one."""

    def __init__(self, error: SyntaxError) -> None:
        super().__init__(str(error))
        self.error = error

    def _render_traceback_(self) -> list[str]:
        lines = traceback.format_exception_only(SyntaxError, self.error)
        return "".join(lines).rstrip().splitlines()


class CellTimeout(MeshTimeoutError):
    """A ``%%mesh --timeout S`` cell ran past its deadline; its ranks were interrupted."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines

    def _render_traceback_(self) -> list[str]:
        return _headline_colored(self.lines, "31")  # red


def interruption_report(
    headline: str,
    outcomes: Mapping[int, CellFailure | str | None],
    still_running: Sequence[int],
) -> list[str]:
    """Lines saying where each rank was stopped (grouped), and which did not stop."""
    lines = [headline]
    where: dict[str, list[int]] = {}
    for rank, f in outcomes.items():
        if f is None:
            text = "had finished"
        elif isinstance(f, str):
            text = f"died: {f}"
        elif f.interrupted:
            text = f"interrupted{_where(f)}"
        else:
            text = f"raised {f.ename}: {f.evalue}{_where(f)}"
        where.setdefault(text, []).append(rank)
    for text, ranks in where.items():
        lines.append(f"{prefix(ranks)} {text}")
    if still_running:
        lines.append(
            f"{prefix(list(still_running))} still running: the interrupt lands when the rank "
            "returns to Python (see %mesh stacks); its next cell waits for it"
        )
    return lines

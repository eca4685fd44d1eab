"""A call's arguments, pickled once for every rank it goes to (``pickle_arguments``); an error
that names the argument that cannot be pickled; and, while they are pickled, who will read them
(``message_readers``: an object that stands for a value held on those processes keeps it there
until each has read it) and what to undo if they are not sent after all (``on_unsent``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..messaging import SIMPLE_TYPES, dumps

if TYPE_CHECKING:
    from .proc_table import ProcTable


class _Pickling(threading.local):
    """What the arguments being pickled on this thread are for (``message_readers``)."""

    to: tuple[ProcTable, tuple[int, ...]] | None = None
    unsent: list[Callable[[], None]] | None = None


_pickling = _Pickling()


def message_readers() -> frozenset[bytes] | None:
    """While this thread pickles the arguments of a call or a spawn: the mailboxes of the
    processes that will unpickle them (one object each); else ``None``. An object that stands
    for a value held on those processes (a MeshTensor) keeps it there until each has read it."""
    to = _pickling.to
    if to is None:
        return None
    procs, ranks = to
    return frozenset(procs.addresses[r].mailbox for r in ranks)


def on_unsent(callback: Callable[[], None]) -> None:
    """Call ``callback`` if the arguments being pickled are not sent after all (pickling
    another argument failed); nothing happens outside ``message_readers``'s window."""
    if _pickling.unsent is not None:
        _pickling.unsent.append(callback)


def pickle_arguments(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    what: str,
    to: tuple[ProcTable, tuple[int, ...]] | None = None,
) -> tuple[bytes, list[Any]]:
    """Pickle call arguments, or raise what pickling raised, with a note (PEP 678) that says
    which argument cannot be pickled (nothing is sent). The exception keeps its type, as
    Monarch's does: code that catches pickle's ``TypeError`` keeps catching it. ``to``: the
    processes (table and ranks) that will read them, for ``message_readers``."""
    simple = _all_simple(args, kwargs)
    if simple or to is None:
        return _pickle(args, kwargs, what, simple)
    before = _pickling.to, _pickling.unsent
    unsent: list[Callable[[], None]] = []
    _pickling.to, _pickling.unsent = to, unsent
    try:
        return _pickle(args, kwargs, what, simple)
    except BaseException:
        for callback in unsent:
            callback()
        raise
    finally:
        _pickling.to, _pickling.unsent = before


def _pickle(
    args: tuple[Any, ...], kwargs: dict[str, Any], what: str, simple: bool
) -> tuple[bytes, list[Any]]:
    try:
        return dumps((args, kwargs), simple=simple)
    except Exception as exc:
        named = [(f"argument {i}", a) for i, a in enumerate(args)]
        named += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
        for label, value in named:
            try:
                dumps(value)
            except Exception as inner:
                add_note(
                    inner,
                    f"{label} of {what} ({type(value).__module__}.{type(value).__qualname__}) "
                    f"cannot be pickled, so it cannot be sent to an actor",
                )
                raise inner from None  # the failure of the whole tuple says the same again
        add_note(exc, f"the arguments of {what} cannot be pickled")
        raise


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (PEP 678), also on Python 3.10, which has only the attribute."""
    notes = getattr(exc, "__notes__", None)
    if not isinstance(notes, list):
        notes = []
        try:
            exc.__notes__ = notes  # type: ignore[attr-defined]
        except AttributeError:
            return  # an exception type that refuses attributes keeps its message alone
    notes.append(note)


def _all_simple(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    simple = SIMPLE_TYPES
    for a in args:
        if type(a) not in simple:
            return False
    if kwargs:
        for v in kwargs.values():
            if type(v) not in simple:
                return False
    return True

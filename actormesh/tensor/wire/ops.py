"""What travels in the op stream, shared by the controller and the workers (pure, no I/O).

An op is a plain tuple ``(kind, out, ins, meta, payload, site)``:

- ``kind`` one of the table in ``kinds.py`` (``"aten"``, ``"distribute"``, ``"remote_call"``,
  ...), which names the worker function that runs it;
- ``out`` the ids the controller allocated for its results (an in-place op names its input);
- ``ins`` the ids it reads, so a worker sees at once whether an input is poisoned;
- ``meta`` one ``(shape, dtype, per_rank)`` per output: what a failed rank's stand-in must look
  like, known on the controller from shape propagation;
- ``payload`` the handler's arguments, a tuple of the fields ``kinds.py`` lists for the kind,
  with :class:`Ref` where a remote value goes;
- ``site`` the ``file:line`` of the user's code that issued it (for error reports; the whole
  controller stack with ``ACTORMESH_TENSOR_TRACEBACKS=1``).

Tuples and small classes pickle several times faster than dataclasses, and a batch holds
hundreds of ops.
"""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any

from ... import config

Op = tuple[str, tuple[int, ...], tuple[int, ...], tuple[Any, ...], Any, str]


class Ref:
    """A remote value by id, inside an op's arguments."""

    __slots__ = ("id",)

    def __init__(self, id: int) -> None:
        self.id = id

    def __reduce__(self) -> tuple[Any, ...]:
        return (Ref, (self.id,))

    # By value: a program's template (programs.py) holds Refs to slots, and equal templates
    # must compare equal.
    def __eq__(self, other: object) -> bool:
        return type(other) is Ref and other.id == self.id

    def __hash__(self) -> int:
        return hash((Ref, self.id))

    def __repr__(self) -> str:
        return f"Ref({self.id})"


class _Input:
    """``IN``: in the arguments of an op from the controller's fast path, the op's next input
    (its ``ins``, in order). One object: pickle writes it once per batch, where each ``Ref``
    would cost a call to build and another to pickle."""

    __slots__ = ()

    def __reduce__(self) -> str:
        return "IN"

    def __repr__(self) -> str:
        return "IN"


IN = _Input()


class NoOutputs(tuple):
    """The ``meta`` of an op that has no outputs (an in-place ``_foreach_`` op), one object per
    plan of the recorder's fast path: its identity then names the plan, as a plan's own ``meta``
    tuple does for an op with outputs (the one empty tuple could not; controller/programs.py)."""

    __slots__ = ()


@dataclass(frozen=True)
class FailureInfo:
    """One rank's record of the op that originally failed (text only, see errors.py)."""

    rank: str
    op: str
    site: str
    exc_type: str
    message: str
    traceback: str
    serial: int  # per rank, so one failure reported by many values is reported once


def torch_constant(name: str) -> Any:
    """``torch.<name>``: how a batch carries memory formats (packing.pack)."""
    import torch

    return getattr(torch, name)


def op_name(op: Op) -> str:
    kind, payload = op[0], op[4]
    if kind == "aten":
        return str(payload[0])
    if kind == "remote_call":
        return f"remote function {payload[1]}"
    return kind


# -- issue sites -------------------------------------------------------------------------------

# The whole tensor package (controller, wire and worker) is skipped: a site is the user's line.
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIP: tuple[str, ...] = (_HERE,)
_sites: dict[Any, str] = {}
# ACTORMESH_TENSOR_TRACEBACKS=1: a site is the whole controller stack, not one file:line.
FULL_STACKS = config.TENSOR_TRACEBACKS == "1"


def _skip_prefixes() -> tuple[str, ...]:
    global _SKIP
    if len(_SKIP) == 1:
        import torch

        _SKIP = (_HERE, os.path.dirname(os.path.abspath(torch.__file__)), "<frozen ")
    return _SKIP


def issue_site(depth: int = 1) -> str:
    """``file:line`` of the innermost frame outside this package and torch (about 1 µs).
    ``depth``: where the search starts, as for ``sys._getframe`` (a caller that knows how many
    frames of its own lie above the user's saves creating their frame objects)."""
    skip = _skip_prefixes()
    try:
        frame = sys._getframe(depth)
    except ValueError:  # fewer frames than that
        frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "<unknown>"
    if FULL_STACKS:
        return _stack(frame)
    key = (frame.f_code, frame.f_lineno)
    site = _sites.get(key)
    if site is None:
        if len(_sites) > 4096:
            _sites.clear()
        # One string object per site: pickle then writes it once per batch.
        site = _sites[key] = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    return site


def _stack(frame: Any) -> str:
    """The controller's stack from ``frame`` outwards, as a traceback prints it (outermost
    first), without this package's frames; torch's stay (an optimizer's step shows its line).
    One string per distinct stack, so that a batch pickles it once."""
    frames = []
    f = frame
    while f is not None:
        if not f.f_code.co_filename.startswith(_HERE):
            frames.append((f, f.f_lineno))
        f = f.f_back
    key = tuple((f.f_code, line) for f, line in frames)
    site = _sites.get(key)
    if site is None:
        if len(_sites) > 4096:
            _sites.clear()
        summary = traceback.StackSummary.extract(reversed(frames))
        site = _sites[key] = "".join(summary.format()).rstrip("\n")
    return site

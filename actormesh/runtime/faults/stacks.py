"""Stack dumps and interrupts of a worker, served by its I/O thread (never by the busy thread).

``format_stacks`` walks ``sys._current_frames()``: it needs the GIL but not the cooperation of
the thread being inspected. A thread wedged in C code that holds the GIL blocks even that; then
the host agent asks the process for a faulthandler dump (SIGUSR1), which needs no GIL.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from ..extent import Point

# Actor names that start with this are reserved for tools built on the runtime (a notebook
# kernel's executor, a debugger's agent): stack dumps leave them out, since they are not the
# user's code; a tool actor that runs the user's code (a cell executor) says so with a class
# attribute ``runs_user_code = True`` and is shown while it does. User actors should not use it.
TOOL_ACTOR_PREFIX = "_mesh_"
# The actormesh package itself (runner, %%mesh executor): its frames are not the user's.
_PACKAGE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")) + os.sep
_BUSY_FOR = re.compile(r" for [0-9.]+ s$", re.M)
# Runtime frames that say nothing to a user (the actor loop waiting for a message, ...).
_RUNTIME_THREADS = ("actormesh-io",)


STOPPED_HINT = (
    "the process is stopped (SIGSTOP, a job-control stop or a tracer); it runs nothing and "
    "answers nothing until SIGCONT resumes it"
)


def stopped(pid: int) -> bool:
    """Whether process ``pid`` of this host is stopped (state ``T`` or ``t`` in /proc)."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # "pid (comm) state ...": comm may hold spaces and parentheses, the last ")" ends it.
    fields = stat[stat.rfind(b")") + 2 :].split(b" ", 1)
    return fields[0] in (b"T", b"t")


class BusyActor(Protocol):
    """An actor's runner as a stack dump reads it (``actors/runner.py``'s ``ActorRunner``, a
    higher layer): its thread, its name, its actor and what it is busy with since when."""

    @property
    def thread(self) -> threading.Thread: ...
    @property
    def name(self) -> str: ...
    @property
    def instance(self) -> Any: ...
    @property
    def busy(self) -> tuple[str, float] | None: ...


class RankTexts(Protocol):
    """Text per rank: a ``ValueMesh[str]`` (``meshes/value_mesh.py``, a higher layer)."""

    def items(self) -> Iterator[tuple[Point, str]]: ...


def format_stacks(runners: Iterable[BusyActor], skip: Iterable[int] = ()) -> str:
    """The Python stack of every thread of this process except the runtime's own, as text."""
    by_ident = {r.thread.ident: r for r in runners}
    skipped = set(skip)
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    now = time.monotonic()
    for ident, frame in sorted(sys._current_frames().items(), key=lambda kv: str(names.get(kv[0]))):
        name = names.get(ident, f"thread {ident}")
        if ident in skipped or name.startswith(_RUNTIME_THREADS):
            continue
        runner = by_ident.get(ident)
        if runner is not None:
            if runner.name.startswith(TOOL_ACTOR_PREFIX) and not getattr(
                runner.instance, "runs_user_code", False
            ):
                # A tool's own actor (a sidebar's status poll, a debugger's agent) is never the
                # user's, whatever code it is in (psutil, debugpy): one caught busy would set
                # its rank apart from ranks caught a moment later.
                continue
            busy = runner.busy
            if busy is None:
                if not runner.name.startswith(TOOL_ACTOR_PREFIX):  # a tool's own: noise
                    out.append(f"actor {runner.name}: idle\n")
                continue
            # Drop the runtime's own frames: start at the endpoint or the cell.
            stack = traceback.extract_stack(frame)
            user = [
                f
                for f in stack
                if not f.filename.endswith("threading.py") and not f.filename.startswith(_PACKAGE)
            ]
            if not user and runner.name.startswith(TOOL_ACTOR_PREFIX):
                # A user-code tool (a cell executor) between cells, in actormesh only: noise.
                continue
            out.append(f"actor {runner.name}: in {busy[0]} for {now - busy[1]:.1f} s\n")
            out.append("".join(traceback.format_list(user or stack)))
        else:
            out.append(f"thread {name}:\n")
            out.append("".join(traceback.format_stack(frame)))
    return "".join(out) or "(no user threads)\n"


def without_busy_time(text: str) -> str:
    """A stack dump without how long each actor has been busy, which differs from rank to
    rank: what compares equal when two ranks are in the same place."""
    return _BUSY_FOR.sub("", text)


def raise_in_thread(ident: int, exc: type[BaseException] | None) -> None:
    """Schedule ``exc`` in thread ``ident`` (``None`` cancels a pending one)."""
    arg = ctypes.py_object(exc) if exc is not None else None  # None passes NULL: cancel
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), arg)


def group_stacks(stacks: RankTexts) -> list[tuple[list[str], str]]:
    """Ranks with identical stacks together: ``[(["gpus=0", "gpus=2"], text), ...]``,
    largest group first."""
    groups: dict[str, tuple[list[str], str]] = {}
    for point, text in stacks.items():
        label = ",".join(f"{k}={v}" for k, v in point.items() if point.extent[k] > 1) or "0"
        key = without_busy_time(text)
        groups.setdefault(key, ([], text))[0].append(label)
    return sorted(groups.values(), key=lambda g: -len(g[0]))


def render_grouped(stacks: RankTexts) -> str:
    parts = []
    for ranks, text in group_stacks(stacks):
        parts.append(f"=== ranks {', '.join(ranks)} ===\n{text}")
    return "\n".join(parts)

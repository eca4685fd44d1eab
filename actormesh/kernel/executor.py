"""The rank side of ``%%mesh``: an actor that runs notebook cells in a per-rank namespace.

One ``MeshExecutor`` is spawned lazily on every rank of a proc mesh the first time a cell runs
there; its namespace persists across cells. A cell is compiled under a file name such as
``<mesh-cell-7>`` whose source is registered in ``linecache``, so tracebacks show the cell's own
lines; the last expression's value comes back (like IPython's ``Out``). Rich output goes to the
kernel as it happens (``rank_display.py``).

This module is imported by workers: it must stay cheap to import (no IPython at import time).
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import contextlib
import inspect
import linecache
import os
import socket
import sys
import threading
import time
import traceback
import types
from dataclasses import dataclass
from typing import Any

from ..runtime.actors import Actor, current_rank, endpoint, local_actor_host
from ..runtime.faults import TOOL_ACTOR_PREFIX
from ..runtime.messaging import Port, dumps
from .rank_display import cell_output, display, flush_figures, install_display_hook

# The kernel's actors on every rank, under the runtime's reserved prefix for tools.
EXECUTOR_NAME = f"{TOOL_ACTOR_PREFIX}executor"
STATUS_NAME = f"{TOOL_ACTOR_PREFIX}status"

# -- what travels back to the kernel ---------------------------------------------------------------


@dataclass(frozen=True)
class Repr:
    """Stands for a value that could not be pickled: shows the value's repr."""

    text: str

    def __repr__(self) -> str:
        return self.text


@dataclass(frozen=True)
class CellFailure:
    """A cell raised on one rank: the exception as text, from the cell's first frame on."""

    ename: str
    evalue: str
    traceback: str
    line: int | None  # the line of the cell where it was raised, when known

    @property
    def interrupted(self) -> bool:
        return self.ename == "KeyboardInterrupt"


# -- running cells ---------------------------------------------------------------------------------

# What the executor of this process is running: read by MeshStatus from its own thread.
_running: dict[str, Any] = {}


def _transportable(value: Any) -> Any:
    """``value`` if it can travel to the kernel, else its repr (a cell must not fail on it)."""
    if value is None or type(value) in (int, float, str, bool, bytes):
        return value
    try:
        dumps(value)  # large buffers stay out of band: a trial costs little even for tensors
    except Exception:
        try:
            return Repr(repr(value))
        except Exception as exc:
            return Repr(f"<{type(value).__name__}: repr failed: {exc}>")
    return value


def _failure(exc: BaseException, filename: str) -> CellFailure:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next  # start at the cell: the executor's own frames say nothing
    line = None
    t = tb
    while t is not None:
        if t.tb_frame.f_code.co_filename == filename:
            line = t.tb_lineno
        t = t.tb_next
    if isinstance(exc, SyntaxError) and exc.filename == filename:
        line = exc.lineno
        tb = None
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    etype = type(exc)
    name = etype.__qualname__
    if etype.__module__ not in ("builtins", "__main__", "__mesh__"):
        name = f"{etype.__module__}.{name}"
    return CellFailure(name, str(exc), text, line)


class MeshExecutor(Actor):
    """Runs ``%%mesh`` cells on one rank. Spawned by the kernel; not used directly."""

    runs_user_code = True  # a tool actor whose stack is the user's cell (faults/stacks.py)

    def __init__(self) -> None:
        point = current_rank()
        self.rank = point.rank
        self.ns: dict[str, Any] = {
            "__name__": "__mesh__",
            "__builtins__": builtins,
            "rank": point.rank,
            "size": point.extent.nelem,
            "display": display,
        }
        import actormesh

        self.ns["am"] = actormesh
        self._loop: asyncio.AbstractEventLoop | None = None
        install_display_hook()

    @endpoint
    def run(
        self,
        filename: str,
        source: str,
        port: Port,
        actor_key: str | None = None,
        engine_turn: tuple[int, dict[str, int]] | None = None,
    ) -> tuple[Any, CellFailure | None]:
        """Run ``source`` here: ``(value of the last expression, None)`` or ``(None, failure)``.
        Rich output goes to ``port`` while the cell runs. ``engine_turn``: the cell's number
        and the tensor engines' batches sent before it (see ``_engine_turn``)."""
        ns = self.ns
        if actor_key is not None:
            ns["actor"] = _local_actor(actor_key)
        lines = source.splitlines(keepends=True)
        linecache.cache[filename] = (len(source), None, lines, filename)
        cell_output.port, cell_output.rank = port, self.rank
        _running.update(cell=filename, since=time.monotonic(), thread=threading.get_ident())
        value, failure = None, None
        try:
            with _engine_turn(ns, source, engine_turn):
                value = _transportable(self._execute(source, filename))
            flush_figures()
        except BaseException as exc:  # KeyboardInterrupt (interrupt) and SystemExit included
            failure = _failure(exc, filename)
            try:
                flush_figures()
            except Exception:
                pass
        finally:
            _running.clear()
            cell_output.port = None
        return value, failure

    def _execute(self, source: str, filename: str) -> Any:
        flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        tree = ast.parse(source, filename=filename)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body[-1].value)
            del tree.body[-1]
        value = None
        if tree.body:
            value = self._eval(compile(tree, filename, "exec", flags=flags))
        if last is not None:
            value = self._eval(compile(last, filename, "eval", flags=flags))
            if source.rstrip().endswith(";"):
                value = None  # as in IPython: a trailing semicolon hides the value
        return value

    def _eval(self, code: types.CodeType) -> Any:
        result = eval(code, self.ns)  # the code of a cell the user sent to this rank
        if code.co_flags & inspect.CO_COROUTINE:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            result = self._loop.run_until_complete(result)
        return result

    @endpoint
    def push(self, values: dict[str, Any]) -> None:
        self.ns.update(values)

    @endpoint
    def pull(self, name: str) -> Any:
        try:
            return _transportable(self.ns[name])
        except KeyError:
            raise NameError(f"name {name!r} is not defined on rank {self.rank}") from None


def _engine_turn(
    ns: dict[str, Any], source: str, engine_turn: tuple[int, dict[str, int]] | None
) -> contextlib.AbstractContextManager[Any]:
    """A cell that reads a tensor engine's values in this process runs between the engine's
    batches, holding its lock (``actormesh.tensor.worker.local.CellTurn``), so that the cell's
    and the engine's collectives come in the same order on every rank; other cells do not wait.
    Every cell, whatever it reads, then lets through the engine's messages sent after it."""
    if not engine_turn or "actormesh.tensor.worker.engine" not in sys.modules:
        return contextlib.nullcontext()  # no engine in this process: none waits for the cell
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):  # ValueError: a null byte, before Python 3.12
        tree = None  # _execute reports it; the cell touches nothing, but must release
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} if tree else set()
    from ..tensor.worker.local import CellTurn

    cell, batches = engine_turn
    return CellTurn(cell, ns, names, batches)


def _local_actor(key: str) -> Any:
    host = local_actor_host()
    runner = None if host is None else host.actors.get(key)
    return None if runner is None else runner.instance


def local_executor() -> MeshExecutor | None:
    """This rank's ``%%mesh`` executor, once a cell has made it (for the debugger's agent)."""
    host = local_actor_host()
    for runner in list(host.actors.values()) if host is not None else ():
        if runner.name == EXECUTOR_NAME and isinstance(runner.instance, MeshExecutor):
            return runner.instance
    return None


# -- status ----------------------------------------------------------------------------------------


class MeshStatus(Actor):
    """Answers ``%mesh status`` on its own thread, so it answers while a cell runs."""

    @endpoint
    def status(self) -> dict[str, Any]:
        import psutil

        proc = psutil.Process()
        now = time.monotonic()
        info: dict[str, Any] = {
            "rank": current_rank().rank,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "rss": proc.memory_info().rss,
            "cpu": proc.cpu_percent(interval=None),
            "threads": proc.num_threads(),
            "gpu_mem": _gpu_memory(),
        }
        running = dict(_running)
        if running:
            info["cell"] = running["cell"]
            info["cell_for"] = now - running["since"]
            info["cell_line"] = _line_of(running["thread"], running["cell"])
        host = local_actor_host()
        # The sidebar and the debugger show a rank's first busy actor: one in an op before an
        # engine between ops (a slice's engine runs an op while the whole mesh's one starts),
        # then the one busy longest.
        busy: list[tuple[tuple[bool, float], tuple[Any, ...]]] = []
        tensor = sys.modules.get("actormesh.tensor.worker.engine")
        for runner in list(host.actors.values()) if host is not None else ():
            state = runner.busy
            if state is not None and not runner.name.startswith(TOOL_ACTOR_PREFIX):
                entry: tuple[Any, ...] = (runner.name, state[0], now - state[1])
                in_op = True
                if tensor is not None:  # a tensor engine says which op: (..., busy text)
                    from ..tensor.tools import activity, between_ops

                    what = activity(runner.instance)
                    if what is not None:
                        entry = (*entry, what)
                        in_op = not between_ops(runner.instance)
                busy.append(((in_op, entry[2]), entry))
        info["busy"] = [entry for _, entry in sorted(busy, key=lambda b: b[0], reverse=True)]
        return info


def _line_of(ident: int, filename: str) -> int | None:
    frame = sys._current_frames().get(ident)
    line = None
    while frame is not None:
        if frame.f_code.co_filename == filename:
            line = frame.f_lineno
            break
        frame = frame.f_back
    return line


def _gpu_memory() -> int | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return int(torch.cuda.memory_allocated())
    except Exception:
        pass
    return None

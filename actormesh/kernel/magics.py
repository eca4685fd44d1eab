"""``%%mesh`` and ``%mesh``: run notebook cells on the ranks of a mesh, and look after them."""

from __future__ import annotations

import ast
import itertools
import shlex
import sys
from collections.abc import Callable
from typing import Any

from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics, line_cell_magic, magics_class

from ..errors import MeshError
from ..runtime.faults import render_grouped
from ..runtime.meshes import ValueMesh
from ..runtime.messaging import node_if_started
from . import debugger_seam
from .cell_errors import CellInterrupted, CellSyntaxError
from .cells import CellOptions, CellRun, PendingCell
from .magic_args import CellArgs, identifier, usage
from .selection import SelectionError, resolve_target, select, values_of
from .status_table import show_table, status_rows
from .targets import MeshRegistry, MeshTools, Target

_SUBCOMMANDS = ("status", "push", "pull", "stacks", "interrupt", "on", "off", "plot", "dbg")


@magics_class
class MeshMagics(Magics):
    """The actormesh magics; loaded by the actormesh kernel and by ``%load_ext actormesh``."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.registry = MeshRegistry()
        self._count = itertools.count(1)
        self._runs_of_cell: dict[int, int] = {}  # In [N] -> %%mesh runs it made so far
        self._auto: str | None = None  # the line of %mesh on
        self._pending: list[PendingCell] = []
        self.last_target: str | None = None
        self._live_plots: list[Any] = []  # %mesh plot --live figures still redrawing
        self._port_mark = 0  # the node's last port id when the running cell started

    @property
    def ip(self) -> InteractiveShell:
        assert self.shell is not None
        return self.shell

    @line_cell_magic
    def mesh(self, line: str, cell: str | None = None) -> Any:
        """Run a cell on every rank of a mesh, or manage the mesh (line form).

        %%mesh TARGET [--ranks SEL] [--noblock] [--timeout S] [--no-dedup] [-o NAME]
            Run the cell on each rank of TARGET (a ProcMesh or ActorMesh, e.g. procs,
            procs.slice(gpus=1), trainers), in a namespace per rank that persists across cells
            (`rank`, `size`, `am`, `display` are defined; `actor` is the rank's actor when
            TARGET is an ActorMesh). Output streams live, grouped by rank; identical lines from
            several ranks are shown once. The last expression's values come back as a
            ValueMesh, stored in `_mesh` (or NAME). Interrupting the kernel interrupts the
            ranks. SEL: 0 | 0,2 | 1:4 | ::2 | gpus=1 | hosts=0,gpus=0:2. --noblock returns at
            once (`_mesh.get()` waits); --timeout interrupts the ranks after S seconds;
            --no-dedup shows every rank's lines. A cell that reads a tensor engine's values
            (a pushed MeshTensor's DTensor) runs after the tensor ops sent before it, and the
            ops issued after it (while a --noblock cell runs too) wait for it on every rank;
            `am.tensor.adopt(procs, "NAME")` makes a MeshTensor of NAME.

            In [2]: %%mesh procs
               ...: print("hello")
               ...: rank * 10
            [gpus=0-3] hello
            Out[2]: ValueMesh({gpus=0: 0, gpus=1: 10, gpus=2: 20, gpus=3: 30})

        %mesh status [TARGET]        rank, host, pid, state, what runs and for how long, memory
        %mesh push TARGET NAME...    copy kernel variables into every rank's namespace
        %mesh pull TARGET NAME       a ValueMesh of NAME from every rank
        %mesh stacks [TARGET]        Python stacks of every rank, identical ones grouped
        %mesh interrupt [TARGET]     interrupt what the ranks are running (all meshes by default)
        %mesh plot NAME... [--on TARGET] [--live | --stop]
                                     metrics the ranks logged (am.log_metrics), a line per
                                     rank; --live redraws as values come, also while later
                                     cells train (--stop ends that)
        %mesh on TARGET [options]    run every following cell as %%mesh TARGET [options]
        %mesh off                    back to running cells in the kernel
        %mesh dbg ...                the debugger: list, where, eval, continue, next, step,
                                     out, pause, wait, break, inspect, on, off, widget
                                     (%mesh dbg alone describes them)

            In [3]: %mesh pull procs rank
            Out[3]: ValueMesh({gpus=0: 0, gpus=1: 1, gpus=2: 2, gpus=3: 3})
        """
        if cell is not None:
            return self._cell(line, cell)
        return self._line(line)

    # -- %%mesh ----------------------------------------------------------------------------------

    def _cell(self, line: str, cell: str) -> Any:
        args = CellArgs(line)
        target = self.target(args.target)
        try:
            selection = select(target.shape, args.ranks)
        except SelectionError as exc:
            raise usage(f"%%mesh: {exc}") from None
        filename = self._filename()
        try:  # here, not on every rank: one clear error, and nothing is sent
            compile(cell, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
        except SyntaxError as exc:
            raise CellSyntaxError(exc) from None
        options = CellOptions(
            filename=filename,
            source=cell,
            selection=selection,
            dedup=args.dedup,
            timeout=args.timeout,
        )
        run = CellRun(target, options)
        self.last_target = args.target
        user_ns = self.ip.user_ns
        if args.noblock:
            run.start()
            pending = PendingCell(run)
            self._pending = [p for p in self._pending if not p.done()] + [pending]
            user_ns[args.output] = pending
            return pending
        values = run.run_blocking()
        if values is None:  # ranks paused in the debugger: `_mesh.get()` waits for them
            user_ns[args.output] = PendingCell(run)
            return None
        user_ns[args.output] = values
        if cell.rstrip().endswith(";") or all(v is None for v in values.values()):
            return None
        return values

    def _filename(self) -> str:
        # The running cell's In [N]: IPython stores its input before running it (and, from
        # IPython 9 on, has already advanced execution_count to the next cell's number).
        history = getattr(getattr(self.shell, "history_manager", None), "input_hist_raw", None)
        count = len(history) - 1 if history else next(self._count)
        # One cell may run the magic many times (run_cell_magic in a loop): each run is a
        # source of its own, or the ranks' tracebacks would show another run's lines.
        k = self._runs_of_cell[count] = self._runs_of_cell.get(count, 0) + 1
        return f"<mesh-cell-{count}>" if k == 1 else f"<mesh-cell-{count}.{k}>"

    def ran_on_mesh(self, n: int) -> bool:
        """Whether cell In [n] ran ``%%mesh``: its ranks know its source as ``<mesh-cell-n>``."""
        return n in self._runs_of_cell

    def target(self, text: str) -> Target:
        try:
            obj = resolve_target(text, self.ip.user_ns)
            return self.registry.target(obj, text)
        except SelectionError as exc:
            raise usage(f"%mesh: {exc}") from None

    def _targets(self, text: str | None) -> list[MeshTools | Target]:
        if text:
            return [self.target(text)]
        live = self.registry.live()
        if not live:
            raise usage("%mesh: no live proc mesh; spawn one with am.this_host().spawn_procs()")
        return list(live)

    # -- %mesh SUBCOMMAND ------------------------------------------------------------------------

    def _line(self, line: str) -> Any:
        try:
            words = shlex.split(line)
        except ValueError as exc:
            raise usage(f"%mesh: cannot parse {line!r}: {exc}") from None
        if not words:
            state = f"on: %%mesh {self._auto}" if self._auto else "off"
            print(f"%mesh {state}. Subcommands: {', '.join(_SUBCOMMANDS)}; see %mesh?")
            return None
        command, rest = words[0], words[1:]
        handler: Callable[[list[str]], Any] | None = getattr(self, f"_cmd_{command}", None)
        if command not in _SUBCOMMANDS or handler is None:
            raise usage(
                f"%mesh: unknown subcommand {command!r}; use one of {', '.join(_SUBCOMMANDS)} "
                "(or %%mesh TARGET for a cell)"
            )
        try:
            return handler(rest)
        except MeshError as exc:
            raise usage(f"%mesh {command}: {exc}") from None

    def _cmd_status(self, rest: list[str]) -> None:
        if len(rest) > 1:
            raise usage("%mesh status takes at most one TARGET")
        rows = []
        for t in self._targets(rest[0] if rest else None):
            rows.extend(status_rows(t))
        show_table(["rank", "host", "pid", "state", "running", "for", "memory", "gpu memory"], rows)

    def _cmd_plot(self, rest: list[str]) -> None:
        from .plots import LivePlot, show

        names, target, live = [], None, False
        words = iter(rest)
        for word in words:
            if word == "--stop":
                for plot in self._live_plots:
                    plot.stop()
                self._live_plots.clear()
                return
            if word == "--live":
                live = True
            elif word == "--on":
                target = next(words, None)
                if target is None:
                    raise usage("%mesh plot --on needs a TARGET")
            elif word.startswith("-"):
                raise usage(f"%mesh plot: unknown option {word!r}; use --on TARGET, --live, --stop")
            else:
                names.append(word)
        if not names:
            raise usage("%mesh plot NAME...: give the metric names to draw, e.g. %mesh plot loss")
        meshes, logs = [], []
        for t in self._targets(target):
            tools = t if isinstance(t, MeshTools) else t.tools
            meshes.append((tools.table.mesh_id, t.procs))
            logs.append(tools.record.metrics)
        if not live:
            show(meshes, names)
            return
        plot = LivePlot(meshes, names, logs)
        plot.start()
        self._live_plots.append(plot)

    def _cmd_push(self, rest: list[str]) -> None:
        if len(rest) < 2:
            raise usage("%mesh push TARGET NAME...: give a TARGET and at least one name")
        target = self.target(rest[0])
        values = {}
        for name in rest[1:]:
            identifier(name, "%mesh push NAME")
            if name not in self.ip.user_ns:
                raise usage(f"%mesh push: name {name!r} is not defined")
            values[name] = _for_rank(self.ip.user_ns[name])
        ranks = select(target.shape, None).ranks
        futures = [target.tools.executor(r).push.call_one(values) for r in ranks]
        for fut in futures:
            fut.get(timeout=60)

    def _cmd_pull(self, rest: list[str]) -> ValueMesh[Any]:
        if len(rest) != 2:
            raise usage("%mesh pull TARGET NAME: give a TARGET and one name")
        target = self.target(rest[0])
        name = identifier(rest[1], "%mesh pull NAME")
        selection = select(target.shape, None)
        futures = [target.tools.executor(r).pull.call_one(name) for r in selection.ranks]
        values = [fut.get(timeout=60) for fut in futures]
        return values_of(target.tools.shape, selection, values)

    def _cmd_stacks(self, rest: list[str]) -> None:
        if len(rest) > 1:
            raise usage("%mesh stacks takes at most one TARGET")
        for t in self._targets(rest[0] if rest else None):
            stacks = t.procs.stacks().get(timeout=10)
            mesh_id = (t if isinstance(t, MeshTools) else t.tools).table.mesh_id
            debugger = debugger_seam.installed()
            if debugger is not None:  # where its paused ranks are
                stacks = debugger.annotate_stacks(stacks, mesh_id)
            print(render_grouped(stacks))

    def _cmd_dbg(self, rest: list[str]) -> Any:
        debugger = debugger_seam.installed()
        if debugger is None:
            raise usage(
                "%mesh dbg: the debugger is not loaded here; `%load_ext actormesh` loads it"
            )
        return debugger.run(rest)

    def _cmd_interrupt(self, rest: list[str]) -> None:
        if len(rest) > 1:
            raise usage("%mesh interrupt takes at most one TARGET")
        for t in self._targets(rest[0] if rest else None):
            t.procs.interrupt()

    def _cmd_on(self, rest: list[str]) -> None:
        if not rest:
            raise usage("%mesh on TARGET [options]: give a TARGET")
        line = shlex.join(rest)
        args = CellArgs(line)
        if args.noblock:
            raise usage("%mesh on: --noblock is not allowed (each cell would return at once)")
        self.target(args.target)  # fail now, not at the next cell
        self._auto = line
        transformers = self.ip.input_transformers_cleanup
        if self._transform not in transformers:
            transformers.append(self._transform)
        print(f"%mesh on: the following cells run as %%mesh {line} (%mesh off to stop)")

    def _cmd_off(self, rest: list[str]) -> None:
        if rest:
            raise usage("%mesh off takes no argument")
        self._auto = None
        transformers = self.ip.input_transformers_cleanup
        if self._transform in transformers:
            transformers.remove(self._transform)

    def _transform(self, lines: list[str]) -> list[str]:
        """With ``%mesh on``: a cell that is not a magic runs as ``%%mesh TARGET``."""
        if self._auto is None:
            return lines
        first = next((s.strip() for s in lines if s.strip()), "")
        if not first or first.startswith(("%mesh", "%%")):
            return lines
        return [f"%%mesh {self._auto}\n", *lines]

    # -- kernel interrupt of a plain cell ---------------------------------------------------------

    def pre_run_cell(self, info: Any) -> None:
        node = node_if_started()
        self._port_mark = node.last_port_id if node is not None else 0

    def post_run_cell(self, result: Any) -> None:
        """Send the tensor ops the cell recorded; if it was interrupted, interrupt the ranks
        still running the calls it made.

        Those are the calls whose replies are still awaited; the endpoints others started
        (a ``--noblock`` cell, another thread) keep running."""
        stream = sys.modules.get("actormesh.tensor.controller.stream")
        if stream is not None:  # loaded once a tensor was made: only then is there a stream
            stream.flush_all()
        exc = getattr(result, "error_in_exec", None)
        if not isinstance(exc, KeyboardInterrupt) or isinstance(exc, CellInterrupted):
            return
        node = node_if_started()
        if node is None:
            return  # no mesh was ever made here
        pending: dict[str, tuple[Any, set[int]]] = {}
        for handler in node.handlers_since(self._port_mark):
            table = getattr(handler, "procs", None)
            ranks_of = getattr(handler, "pending_ranks", None)
            if table is None or ranks_of is None:
                continue
            for mesh_id, rank in ranks_of():
                pending.setdefault(mesh_id, (table, set()))[1].add(rank)
        for table, ranks in pending.values():
            try:
                self.registry.tools(table).interrupt(sorted(ranks))
            except (MeshError, SelectionError):
                pass  # stopped meanwhile, or not this kernel's mesh: nothing to interrupt


def _for_rank(value: Any) -> Any:
    """A MeshTensor is pushed as each rank's own value of it (its DTensor), not copied."""
    tools = sys.modules.get("actormesh.tensor.tools")
    if tools is None and "actormesh.tensor" in sys.modules:
        from ..tensor import tools
    return value if tools is None else tools.for_rank(value)


def load(shell: Any) -> MeshMagics:
    """Register the magics with ``shell`` (once); returns them. Without the debugger: it is
    ``actormesh.debugger.load_ipython_extension`` that loads both."""
    existing = getattr(shell, "_actormesh_magics", None)
    if existing is not None:
        return existing
    magics = MeshMagics(shell)
    shell.register_magics(magics)
    shell.events.register("pre_run_cell", magics.pre_run_cell)
    shell.events.register("post_run_cell", magics.post_run_cell)
    shell._actormesh_magics = magics  # noqa: SLF001  our own mark on the shell: load once
    return magics

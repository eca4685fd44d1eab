"""``%mesh dbg ...``: the debugger as line magics (the kernel's ``%mesh`` delegates here).

    %mesh dbg list                              every debugged rank: paused where, or running
    %mesh dbg where [-r SEL]                    stacks of the ranks (paused ones from the debugger)
    %mesh dbg eval [-r SEL] [-f N] EXPR          EXPR in each paused rank's frame -> ValueMesh
    %mesh dbg continue|next|step|out [-r SEL]    resume / step the paused ranks
    %mesh dbg pause [-r SEL]                    pause running ranks (starts the debugger there)
    %mesh dbg wait [-r SEL] [-t S]              wait until the ranks are paused (default: all)
    %mesh dbg break FILE:LINE [-r SEL] [--clear] a breakpoint by location (FILE: path, In[N])
    %mesh dbg inspect NAME [-r SEL]             tensor / module summaries side by side
    %mesh dbg on|off                            attach to every rank / detach from all
    %mesh dbg widget                            show the debugger widget

``-m TARGET`` picks the proc mesh when the kernel has several (by default: the mesh with
paused ranks, else the only live one).
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import MeshError
from ..kernel.debugger_seam import PausedRank
from ..kernel.executor import Repr
from ..kernel.magic_args import usage
from ..kernel.selection import Selection, SelectionError, select, values_of
from ..runtime.actors import wait_hooks
from ..runtime.mesh_shape import with_shape
from ..runtime.meshes import ValueMesh
from ..runtime.shape import Shape
from . import mesh_tensors
from . import state as debugger_state
from .cell_files import CellFiles
from .dap import DapError
from .dbg_args import COMMANDS, DbgArgs
from .rank_debug import RankDebug
from .rank_values import compare_on_ranks
from .session import STEP_COMMANDS, Debugger, RanksPaused, enable_breakpoints, get_debugger
from .stack_text import annotate_stacks, grouped
from .tensors import Comparison, check_name


class DebugMagics:
    """The kernel's glue (pause hooks, cell files for the debugger) and the ``%mesh dbg``
    commands."""

    def __init__(self, mesh_magics: Any) -> None:
        self.magics = mesh_magics
        self.files = CellFiles(mesh_magics)
        self.debugger: Debugger = get_debugger()
        self.debugger.label = self.files.label
        self.debugger.sources = self.files.cell_sources
        self.debugger.notices = self._notice
        self.debugger.before_attach = self._start_status_actors
        self.widget: Any = None
        if self._end_wait_on_pause not in wait_hooks:
            wait_hooks.append(self._end_wait_on_pause)

    def _start_status_actors(self, mesh_id: str, rank: int) -> None:
        """The kernel's status actors of the mesh (which the widget asks what each rank runs),
        started and answering on ``rank`` before the debugger attaches to it."""
        for tools in self.magics.registry.live():
            if tools.table.mesh_id == mesh_id:
                actors = tools.status_actors()
                with_shape(actors, tools.rank_shape(rank)).status.call_one().get(timeout=30)

    @property
    def shell(self) -> Any:
        return self.magics.shell

    # -- the kernel's debugger_seam.Debugger -----------------------------------------------------

    def annotate_stacks(self, stacks: ValueMesh[str], mesh_id: str) -> ValueMesh[str]:
        return annotate_stacks(stacks, mesh_id)

    def paused_ranks(self) -> list[PausedRank]:
        return debugger_state.paused_ranks()

    def add_listener(self, callback: Callable[[], None]) -> Callable[[], None]:
        return debugger_state.add_listener(callback)

    def pause(self, mesh_id: str, ranks: Sequence[int]) -> None:
        debugger_state.pause(mesh_id, ranks)

    def resume(self, mesh_id: str, ranks: Sequence[int]) -> None:
        debugger_state.resume(mesh_id, ranks)

    def paused(self, mesh_id: str) -> dict[int, str]:
        return {r: rd.describe() for r, rd in self.debugger.paused_in(mesh_id).items()}

    def cell_paused(self) -> None:
        print("(%mesh dbg list / where / eval / next / continue, or the widget below)")
        try:
            from IPython.display import display

            display(self._widget().show())
        except ImportError:  # no ipywidgets: the magics still work
            pass

    def _widget(self) -> Any:
        from .widgets import DebuggerWidget

        if self.widget is None:
            self.widget = DebuggerWidget(self)
        return self.widget

    def _end_wait_on_pause(self, future: Any) -> None:
        """A cell waiting on a call (``.get()``) whose remaining ranks are all paused ends,
        saying where they are, instead of blocking the notebook (runtime wait hook)."""
        self._raise_if_all_paused(future.pending_ranks())

    def raise_if_paused(self, mesh_id: str, ranks: list[int]) -> None:
        """The same for ``_mesh.get()`` of a cell whose ranks paused."""
        self._raise_if_all_paused([(mesh_id, r) for r in ranks])

    def _raise_if_all_paused(self, pending: list[tuple[str, int]]) -> None:
        if not pending or threading.current_thread() is not threading.main_thread():
            return  # only the cell's own thread: actors and helpers keep waiting
        lines = []
        for mesh_id, rank in pending:
            rd = self.debugger.paused_in(mesh_id).get(rank)
            if rd is None:
                return
            lines.append(f"{self.debugger.rank_label(mesh_id, rank)} {rd.describe()}")
        self.cell_paused()
        raise RanksPaused(lines)

    def _notice(self, text: str) -> None:
        import sys

        print(text, file=sys.stderr)

    # -- %mesh dbg -------------------------------------------------------------------------------

    def run(self, words: list[str]) -> Any:
        if not words:
            print((__doc__ or "").split("\n\n", 1)[-1].rstrip())  # the command summary above
            return None
        if words[0] not in COMMANDS:
            got = words[0] if words else ""
            raise usage(f"%mesh dbg: unknown command {got!r}; use one of {', '.join(COMMANDS)}")
        command, rest = words[0], words[1:]
        args = DbgArgs(command, rest)
        try:
            if command in STEP_COMMANDS:
                return self._step(args, STEP_COMMANDS[command])
            handler = getattr(self, f"_cmd_{command}")
            return handler(args)
        except (DapError, MeshError) as exc:
            raise usage(f"%mesh dbg {command}: {exc}") from None

    def _mesh(self, args: DbgArgs) -> Any:
        """The MeshTools of the mesh a command is about."""
        if args.mesh is not None:
            return self.magics.target(args.mesh).tools
        live = self.magics.registry.live()
        paused = {rd.mesh_id for rd in self.debugger.paused()}
        with_paused = [t for t in live if t.table.mesh_id in paused]
        if len(with_paused) == 1:
            return with_paused[0]
        if len(live) == 1:
            return live[0]
        if not live:
            raise usage("%mesh dbg: no live proc mesh")
        raise usage("%mesh dbg: this kernel has several proc meshes; pick one with -m TARGET")

    def _ranks(self, args: DbgArgs, tools: Any, default_paused: bool) -> list[int]:
        if args.ranks is None and default_paused:
            paused = sorted(self.debugger.paused_in(tools.table.mesh_id))
            if not paused:
                raise usage(f"%mesh dbg {args.command}: no rank is paused")
            return paused
        try:
            return list(select(tools.shape, args.ranks).ranks)
        except SelectionError as exc:
            raise usage(f"%mesh dbg {args.command}: {exc}") from None

    def _rank_label(self, tools: Any, rank: int) -> str:
        return f"rank {rank} {{{tools.table.labels[rank]}}}"

    def _cmd_list(self, args: DbgArgs) -> None:
        lines = []
        for tools in self.magics.registry.live():
            mesh_id = tools.table.mesh_id
            for r in tools.shape.ranks():
                state = self.debugger.describe(mesh_id, r)
                lines.append(f"{self._rank_label(tools, r)}: {state}")
        paused = self.debugger.paused()
        print("\n".join(lines) if lines else "no live proc mesh")
        print(f"{len(paused)} paused" if paused else "no rank is paused")

    def _cmd_where(self, args: DbgArgs) -> None:
        tools = self._mesh(args)
        ranks = self._ranks(args, tools, default_paused=False)
        texts: dict[int, str] = {}
        paused = self.debugger.paused_in(tools.table.mesh_id)
        running = [r for r in ranks if r not in paused]
        stack_futures = {r: tools.proc(r).stacks() for r in running}
        for r in ranks:
            if r in paused:
                texts[r] = self._paused_stack(paused[r])
        for r, fut in stack_futures.items():
            try:
                texts[r] = next(iter(fut.get(timeout=10).values()))
            except MeshError as exc:
                texts[r] = f"(no stack: {exc})\n"
        print(grouped(texts))

    def _paused_stack(self, rd: RankDebug) -> str:
        frames = rd.frames or rd.stack()
        try:
            lines = (
                self.debugger.agent(rd.mesh_id, rd.rank)
                .source_lines.call_one([(f.path, f.line) for f in frames])
                .get(timeout=10)
            )
        except MeshError:
            lines = [""] * len(frames)
        out = [f"{rd.describe()}\n"]
        for f, src in zip(reversed(frames), reversed(lines), strict=True):
            out.append(f'  File "{self.files.label(f.path)}", line {f.line}, in {f.function}\n')
            if src.strip():
                out.append(f"    {src.strip()}\n")
        return "".join(out)

    def _cmd_eval(self, args: DbgArgs) -> ValueMesh[Any]:
        if not args.words:
            raise usage("%mesh dbg eval [-r SEL] EXPR: give an expression")
        expression = " ".join(args.words)
        tools = self._mesh(args)
        ranks = self._ranks(args, tools, default_paused=True)
        values = []
        for r in ranks:
            rd = self.debugger.ranks.get((tools.table.mesh_id, r))
            if rd is None or rd.status != "paused":
                raise usage(f"%mesh dbg eval: rank {r} is not paused")
            body = rd.evaluate(expression, frame=args.frame)
            values.append(_value(body.get("result", "")))
        return values_of(
            tools.shape, Selection(tuple(ranks), _shape_of(tools, ranks, args.ranks)), values
        )

    def _step(self, args: DbgArgs, command: str) -> None:
        tools = self._mesh(args)
        ranks = self._ranks(args, tools, default_paused=True)
        mesh_id = tools.table.mesh_id
        targets = []
        for r in ranks:
            rd = self.debugger.ranks.get((mesh_id, r))
            if rd is None or rd.status != "paused":
                if args.ranks is not None:
                    raise usage(f"%mesh dbg {args.command}: rank {r} is not paused")
                continue
            targets.append(rd)
        if command == "continue":
            for rd in targets:
                rd.resume("continue")
            print(f"continued {', '.join(str(rd.rank) for rd in targets)}")
            return
        befores = {rd.rank: rd.stops for rd in targets}
        for rd in targets:
            rd.resume(command)
        for rd in targets:
            rd.wait_stopped_after(befores[rd.rank], 10.0)
            print(f"{self._rank_label(tools, rd.rank)}: {rd.describe()}")

    def _cmd_pause(self, args: DbgArgs) -> None:
        tools = self._mesh(args)
        ranks = self._ranks(args, tools, default_paused=False)
        self.debugger.pause(tools.table.mesh_id, ranks)
        mesh_id = tools.table.mesh_id
        for r in ranks:
            rd = self.debugger.rank(mesh_id, r)
            rd.wait_paused(5.0)
            print(f"{self._rank_label(tools, r)}: {rd.describe()}")

    def _cmd_wait(self, args: DbgArgs) -> None:
        tools = self._mesh(args)
        ranks = self._ranks(args, tools, default_paused=False)
        mesh_id = tools.table.mesh_id
        ok = self.debugger.wait(
            lambda: all(r in self.debugger.paused_in(mesh_id) for r in ranks), args.timeout
        )
        if not ok:
            missing = [r for r in ranks if r not in self.debugger.paused_in(mesh_id)]
            raise usage(f"%mesh dbg wait: ranks {missing} not paused after {args.timeout:g} s")
        for r in ranks:
            print(f"{self._rank_label(tools, r)}: {self.debugger.rank(mesh_id, r).describe()}")

    def _cmd_break(self, args: DbgArgs) -> None:
        if len(args.words) != 1 or ":" not in args.words[0]:
            raise usage("%mesh dbg break FILE:LINE [-r SEL]: e.g. In[4]:7 or train.py:42")
        file, _, line_text = args.words[0].rpartition(":")
        if not line_text.isdigit() or int(line_text) < 1:
            raise usage(f"%mesh dbg break: bad line number {line_text!r}")
        path = self.files.resolve(file)
        tools = self._mesh(args)
        ranks = self._ranks(args, tools, default_paused=False)
        verified = self.debugger.set_breakpoint(
            tools.table.mesh_id, ranks, path, int(line_text), remove=args.clear
        )
        what = "cleared" if args.clear else "set"
        print(f"breakpoint {what} at {self.files.label(path)}:{line_text} on ranks "
              f"{', '.join(str(r) for r in ranks)}")  # fmt: skip
        missing = [r for r, ok in verified.items() if not ok and not args.clear]
        if missing:
            print(f"(not verified yet on ranks {missing}: the code may not be loaded there)")

    def _cmd_inspect(self, args: DbgArgs) -> Comparison:
        if len(args.words) != 1:
            raise usage("%mesh dbg inspect NAME [-r SEL]: give one variable name")
        try:
            name = check_name(args.words[0])
        except ValueError as exc:
            raise usage(f"%mesh dbg inspect: {exc}") from None
        value = mesh_tensors.mesh_value(name, self.shell.user_ns)
        if value is not None:  # a MeshTensor or MeshModule of the kernel: its shards
            shape = Shape.from_extent(mesh_tensors.extent(value))
            try:
                picked = None if args.ranks is None else list(select(shape, args.ranks).ranks)
            except SelectionError as exc:
                raise usage(f"%mesh dbg inspect: {exc}") from None
            return mesh_tensors.compare(name, value, picked)
        tools = self._mesh(args)
        ranks = self._ranks(args, tools, default_paused=False)
        return self.compare(tools.table.mesh_id, ranks, name, args.frame)

    def compare(self, mesh_id: str, ranks: list[int], name: str, frame: int = 0) -> Comparison:
        """Summaries of ``name`` on ``ranks``: in the paused frame of a paused rank, in the
        ``%%mesh`` namespace of a running one. Blocks (at most a minute)."""
        check_name(name)
        tools = self._tools(mesh_id)
        labels = {r: self._rank_label(tools, r) for r in ranks}
        return compare_on_ranks(self.debugger, mesh_id, labels, name, frame)

    def _tools(self, mesh_id: str) -> Any:
        for tools in self.magics.registry.live():
            if tools.table.mesh_id == mesh_id:
                return tools
        raise MeshError(f"proc mesh {mesh_id} is stopped")

    def _cmd_on(self, args: DbgArgs) -> None:
        tools = self._mesh(args)
        ranks = self._ranks(args, tools, default_paused=False)
        self.debugger.attach(tools.table.mesh_id, ranks)
        print(f"debugger attached to ranks {', '.join(str(r) for r in ranks)}")

    def _cmd_off(self, args: DbgArgs) -> None:
        self.debugger.clear_breakpoints()
        self.debugger.detach_all()
        print("debugger detached from every rank (breakpoints cleared)")

    def _cmd_widget(self, args: DbgArgs) -> Any:
        return self._widget().show()


def _value(text: str) -> Any:
    """A paused rank's ``evaluate`` result: a Python literal as itself, else its repr."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return Repr(text)


def _shape_of(tools: Any, ranks: list[int], sel: str | None) -> Shape:
    if sel is not None:
        selection = select(tools.shape, sel)
        if selection.shape is not None and list(selection.ranks) == ranks:
            return selection.shape
    return Shape.from_extent({"ranks": len(ranks)})


def install(mesh_magics: Any) -> DebugMagics:
    """Hook the debugger into the kernel's magics (at load): ``breakpoint()`` on ranks started
    from now on pauses them and tells this kernel."""
    enable_breakpoints()
    return DebugMagics(mesh_magics)

"""``ActormeshKernel``: an IPython kernel that hosts the actormesh controller.

The controller (its I/O thread, host agents and meshes) lives in the kernel process, so cells
spawn meshes and call actors directly. What the kernel adds to IPython's:

- the ``%%mesh`` / ``%mesh`` magics are loaded at start;
- interrupt (``interrupt_mode: message`` in the kernelspec) sends SIGINT to the kernel process
  only, never to its process group: workers are in that group and must survive an interrupt.
  The running ``%%mesh`` cell turns the ``KeyboardInterrupt`` into an interrupt of its ranks;
- the JupyterLab sidebar's requests arrive on the control channel (``actormesh_panel_request``,
  see ``panel/``), so the panel works while a cell runs;
- shutdown and restart stop every mesh before the process exits. A kernel killed outright
  (SIGKILL) leaves no worker either: each host agent watches a pipe from the controller and
  kills its workers when it closes.
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import threading
from typing import Any

from ipykernel.ipkernel import IPythonKernel
from ipykernel.kernelapp import IPKernelApp
from traitlets import Float

from .. import __version__
from .panel import REPLY_TYPE, REQUEST_TYPE, PanelService

logger = logging.getLogger(__name__)


_QUIET_REQUESTS = (
    REQUEST_TYPE,
    "create_subshell_request",
    "delete_subshell_request",
    "list_subshell_request",
)


class ActormeshKernel(IPythonKernel):
    """IPython, plus the actormesh controller and magics."""

    implementation = "actormesh"
    implementation_version = __version__
    banner = "actormesh kernel: %%mesh TARGET runs a cell on every rank (see %mesh?)"
    control_msg_types = [*IPythonKernel.control_msg_types, REQUEST_TYPE]
    # ipykernel sleeps 0.5 ms before every execute_reply, for clients that stop reading IOPub
    # at the reply. The protocol's end of a cell is the idle status, which IOPub delivers after
    # the cell's output; stdout and stderr are flushed (through the IOPub thread) before the
    # reply either way. Every cell here is that much sooner.
    _execute_sleep = Float(0.0).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        assert self.shell is not None
        self.shell.extension_manager.load_extension("actormesh")
        magics = self.shell.magics_manager.registry["MeshMagics"]
        self.panel = PanelService(magics.registry, self.shell.user_ns)
        self._history = _HistoryAfterIdle.install(self.shell.history_manager)

    def actormesh_panel_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """A request from the JupyterLab sidebar (control thread; see ``panel/service.py``)."""
        content = self.panel.handle(parent.get("content"))
        assert self.session is not None  # set before any message can arrive
        self.session.send(stream, REPLY_TYPE, content, parent, ident)

    def _publish_status(self, status: str, channel: str, parent: Any = None) -> None:
        # JupyterLab shows the notebook's busy/idle from every status message except those
        # answering a fixed list of request types (debug_request, ...). These control requests
        # end with "idle" while a cell may still run (JupyterLab 4.6 asks for a subshell for
        # each new comm target, e.g. a widget a running cell displays): no status for them.
        msg = parent or self.get_parent(channel)
        if channel == "control" and msg.get("header", {}).get("msg_type") in _QUIET_REQUESTS:
            return
        super()._publish_status(status, channel, parent)
        if status == "idle" and channel == "shell" and self._history is not None:
            self._history.idle(getattr(self, "io_loop", None))

    def _send_interrupt_children(self) -> None:
        # Only this process: ipykernel's default signals the whole process group.
        os.kill(os.getpid(), signal.SIGINT)

    async def do_shutdown(self, restart: bool) -> dict[str, Any]:
        self.panel.close()
        stop_all_meshes()  # blocks this (control) thread for at most ACTORMESH_STOP_GRACE s
        result = super().do_shutdown(restart)
        if inspect.isawaitable(result):
            result = await result
        return dict(result)


class _HistoryAfterIdle:
    """IPython writes every cell's input to its SQLite history from a thread it wakes as the
    cell starts: that thread then competes with the cell for the GIL (each ZeroMQ send of a
    cast lets it in, ~40 us a time on 2 cores), and a write still running holds the lock the
    next cell's input waits for. The kernel has it written ``WRITE_AFTER_S`` after a cell's idle
    status instead, between cells: the same rows, while no cell is starting. (IPython writes
    what is left at exit; only a kernel killed outright within that window loses a row.)"""

    WRITE_AFTER_S = 0.1

    def __init__(self, history: Any) -> None:
        self.history = history
        self._armed = False

    @classmethod
    def install(cls, history: Any) -> _HistoryAfterIdle | None:
        # Only IPython's default (write at every cell); a configured cache size is the user's.
        if history is None or not history.using_thread or history.db_cache_size > 1:
            return None
        history.db_cache_size = _NEVER
        return cls(history)

    def idle(self, loop: Any) -> None:
        """A cell ended (its idle status is out): have its input written soon, between cells."""
        if loop is None or threading.current_thread() is not threading.main_thread():
            self._write()  # a subshell's cell: no loop of ours to wait on
        elif not self._armed:
            self._armed = True
            loop.call_later(self.WRITE_AFTER_S, self._write)

    def _write(self) -> None:
        self._armed = False
        history = self.history
        if not (history.db_input_cache or history.db_output_cache):
            return
        restart = getattr(history, "_restart_thread_if_stopped", None)
        if restart is not None:
            restart()  # IPython stops the thread before a fork and restarts it on a write
        if history.save_flag is not None:
            history.save_flag.set()


_NEVER = 1 << 62  # a cache size no session reaches: the kernel says when to write


def stop_all_meshes() -> None:
    """Stop every mesh and host agent of this process's controller (if it has one)."""
    from ..runtime.procs import controller_if_started

    ctl = controller_if_started()
    if ctl is None:
        return
    try:
        ctl.shutdown()
    except Exception:
        logger.exception("stopping the meshes at kernel shutdown failed")


def main() -> None:
    """Run the kernel: ``python -m actormesh.kernel -f CONNECTION_FILE``."""
    IPKernelApp.launch_instance(
        kernel_class=ActormeshKernel,
        outstream_class="actormesh.kernel.iostream.OutStreamSkippingEmptyFlushes",
    )

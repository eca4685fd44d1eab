"""A host agent's record of each worker process, and its output: the worker's stdout and
stderr pipes, read on the agent's I/O thread and forwarded to the controller as whole lines.

The stderr tail is kept for the exit report, and while a faulthandler dump is being collected
its stderr goes to the dump instead of the logs. Lines the worker's ``sys.stderr`` marked
(``TEE_MARK``) already reached the controller as messages: only the tail keeps them.
"""

from __future__ import annotations

import os
import subprocess
from collections import deque
from dataclasses import dataclass, field
from functools import partial

from ... import config
from ..messaging import TEE_MARK, Address, Node
from ..messaging.protocol import FDLOG


@dataclass
class Worker:
    """One worker process as its agent knows it: who it is, its pipes, how it ended."""

    mesh_id: str
    rank: int
    label: str
    mailbox: bytes
    ipc: str = ""  # the path of its inbox
    pid: int = 0
    popen: subprocess.Popen[bytes] | None = None
    pipes: dict[int, str] = field(default_factory=dict)  # read fd -> "stdout" / "stderr"
    partial: dict[int, bytes] = field(default_factory=dict)
    exit_status: int | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=config.STDERR_TAIL_LINES))
    # While a faulthandler dump is being collected: its stderr goes here, not to the logs.
    capture: list[bytes] | None = None


class WorkerOutput:
    """The pipes of every worker of one agent (I/O thread only)."""

    def __init__(self, node: Node, controller: Address) -> None:
        self.node = node
        self.controller = controller

    def open_pipes(self, worker: Worker) -> list[int]:
        """Pipes for its stdout and stderr, watched from now on; returns their write ends (the
        caller hands them to the worker, then closes them)."""
        write_ends = []
        for stream in ("stdout", "stderr"):
            r, w = os.pipe()
            os.set_blocking(r, False)
            worker.pipes[r] = stream
            self.node.transport.add_reader(r, partial(self._on_readable, worker, r))
            write_ends.append(w)
        return write_ends

    def _on_readable(self, worker: Worker, fd: int) -> None:
        self.read(worker, fd)

    def read(self, worker: Worker, fd: int) -> bool:
        """Forward what ``fd`` has now; returns whether more may come without waiting."""
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self.close_pipe(worker, fd)
            return False
        text = worker.partial.pop(fd, b"") + data
        cut = text.rfind(b"\n") + 1
        if cut < len(text):
            worker.partial[fd] = text[cut:]
        if cut:
            if worker.capture is not None and worker.pipes[fd] == "stderr":
                worker.capture.append(text[:cut])
            else:
                self._forward(worker, worker.pipes[fd], text[:cut])
        return True

    def _forward(self, worker: Worker, stream: str, data: bytes) -> None:
        lines = data.decode("utf-8", "replace").splitlines(keepends=True)
        if stream == "stderr":
            worker.tail.extend(line.lstrip(TEE_MARK).rstrip("\n") for line in lines)
        # Lines marked by the worker's sys.stderr already reached the controller as messages.
        text = "".join(line for line in lines if not line.startswith(TEE_MARK))
        if text:
            self.node.send(self.controller, (FDLOG, worker.mailbox, worker.label, stream, text))

    def close_pipe(self, worker: Worker, fd: int) -> None:
        rest = worker.partial.pop(fd, b"")
        if rest:
            self._forward(worker, worker.pipes[fd], rest + b"\n")
        self.node.transport.remove_reader(fd)
        worker.pipes.pop(fd, None)
        os.close(fd)

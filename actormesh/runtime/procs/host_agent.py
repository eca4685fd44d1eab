"""The host agent: one per host. Starts workers, reaps them, forwards their raw output, relays
signals, and kills every worker when the controller goes away.

On the controller's machine the agent is a child of the controller, which hands it the job key
through a *lifeline* pipe; when that pipe closes (the controller exited, or was SIGKILLed) the
agent kills its workers and exits. Workers are forked by the agent's fork server (``zygote``).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ... import config
from ..faults.stacks import STOPPED_HINT, stopped
from ..messaging.codec import Message, dumps
from ..messaging.logs import TEE_MARK
from ..messaging.node import Node, set_node
from ..messaging.protocol import (
    AGENT_READY,
    DUMP,
    EXIT,
    FDLOG,
    REAP,
    REPLY,
    SHUTDOWN,
    SIGNAL,
    SPAWN_PROCS,
)
from ..messaging.transport import Address, Transport
from ..messaging.tunnel import TunnelEnds
from .osutil import describe_status, die_with_parent
from .sampling import ResourceSampler
from .zygote import FD_ENV

logger = logging.getLogger(__name__)


@dataclass
class Worker:
    mesh_id: str
    rank: int
    label: str
    mailbox: bytes
    pid: int = 0
    popen: subprocess.Popen[bytes] | None = None
    pipes: dict[int, str] = field(default_factory=dict)  # read fd -> "stdout" / "stderr"
    partial: dict[int, bytes] = field(default_factory=dict)
    exit_status: int | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=config.STDERR_TAIL_LINES))
    # While a faulthandler dump is being collected: its stderr goes here, not to the logs.
    capture: list[bytes] | None = None


def _address(v: list[Any]) -> Address:
    return Address(v[0], v[1], v[2], bytes.fromhex(v[3]))


class Agent:
    def __init__(self, node: Node, init: dict[str, Any]) -> None:
        self.node = node
        self.init = init
        self.controller = _address(init["controller"])
        self.workers: dict[int, Worker] = {}  # by pid
        self.by_fork_id: dict[int, Worker] = {}
        self.next_fork_id = 0
        self.zygote: subprocess.Popen[bytes] | None = None
        self.zygote_sock: socket.socket | None = None
        self.zygote_ready = False
        self.queued: list[tuple[dict[str, Any], Worker]] = []
        self.done = threading.Event()
        register = node.register
        register(SPAWN_PROCS, self._on_spawn)
        register(REAP, self._on_reap)
        register(SIGNAL, self._on_signal)
        register(SHUTDOWN, lambda _: self.done.set())
        register(DUMP, self._on_dump)
        TunnelEnds(node)  # the controller's debugger reaches this host's ranks through them
        self.sampler = ResourceSampler(node, self.controller, self._live_workers)

    def _live_workers(self) -> list[tuple[str, int, int]]:
        return [(w.mesh_id, w.rank, pid) for pid, w in list(self.workers.items()) if pid]

    # -- fork server -----------------------------------------------------------------------------

    def start_zygote(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        env[FD_ENV] = str(child.fileno())
        env["ACTORMESH_AGENT_PID"] = str(os.getpid())
        self.zygote = subprocess.Popen(
            [sys.executable, "-m", "actormesh.runtime.procs.zygote"],
            pass_fds=(child.fileno(),),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        child.close()
        self.zygote_sock = parent
        parent.send(json.dumps(self.init).encode())
        self.node.transport.add_reader(parent.fileno(), self._on_zygote)

    def _on_zygote(self) -> None:
        assert self.zygote_sock is not None
        try:
            data = self.zygote_sock.recv(1 << 20)
        except OSError:
            data = b""  # reset by a fork server that died: the same as end-of-file
        if not data:
            if not self.done.is_set():
                logger.error("the fork server exited unexpectedly; stopping this host agent")
            self.node.transport.remove_reader(self.zygote_sock.fileno())
            self.done.set()
            return
        msg = json.loads(data)
        op = msg["op"]
        if op == "ready":
            self.zygote_ready = True
            for spec, worker in self.queued:
                self._fork(spec, worker)
            self.queued.clear()
        elif op == "forked":
            worker = self.by_fork_id.pop(msg["id"])
            worker.pid = msg["pid"]
            self.workers[worker.pid] = worker
        elif op == "exit":
            self._on_worker_exit(msg["pid"], msg["status"])

    def _fork(self, request: dict[str, Any], worker: Worker) -> None:
        assert self.zygote_sock is not None
        fds = self._pipes(worker)
        fork_id = self.next_fork_id
        self.next_fork_id += 1
        self.by_fork_id[fork_id] = worker
        request = {"id": fork_id, "spec": request}
        socket.send_fds(self.zygote_sock, [json.dumps(request).encode()], fds)
        for fd in fds:
            os.close(fd)

    def _pipes(self, worker: Worker) -> list[int]:
        write_ends = []
        for stream in ("stdout", "stderr"):
            r, w = os.pipe()
            os.set_blocking(r, False)
            worker.pipes[r] = stream
            self.node.transport.add_reader(r, partial(self._on_output, worker, r))
            write_ends.append(w)
        return write_ends

    # -- requests from the controller ------------------------------------------------------------

    def _on_spawn(self, msg: Message) -> None:
        # request: SpawnRequest.wire(), the part every rank shares; p: one rank's part
        _, mesh_id, procs, request = msg.envelope
        for p in procs:
            spec = dict(request, mesh_id=mesh_id, **p)
            spec["env"] = dict(request["env"], **self._device_env(spec))
            worker = Worker(mesh_id, p["rank"], p["label"], bytes.fromhex(p["mailbox"]))
            if self.init["start_method"] == "spawn":
                self._popen(spec, worker)
            elif self.zygote_ready:
                self._fork(spec, worker)
            else:
                self.queued.append((spec, worker))

    def _device_env(self, spec: dict[str, Any]) -> dict[str, str]:
        labels, _sizes = spec["extent"]
        gpus = _visible_gpus()
        if "gpus" not in labels or not gpus:
            return {}
        point_index = _coords(spec["rank"], spec["extent"])["gpus"]
        return {"CUDA_VISIBLE_DEVICES": gpus[point_index % len(gpus)]}

    def _popen(self, spec: dict[str, Any], worker: Worker) -> None:
        out_w, err_w = self._pipes(worker)
        env = dict(os.environ, ACTORMESH_AGENT_PID=str(os.getpid()))
        popen = subprocess.Popen(
            [sys.executable, "-m", "actormesh.runtime.procs.worker"],
            stdin=subprocess.PIPE,
            stdout=out_w,
            stderr=err_w,
            env=env,
        )
        os.close(out_w)
        os.close(err_w)
        assert popen.stdin is not None
        popen.stdin.write((json.dumps({"spec": spec, "init": self.init}) + "\n").encode())
        popen.stdin.close()
        worker.pid, worker.popen = popen.pid, popen
        self.workers[popen.pid] = worker
        self._watch_popen(popen)

    def _watch_popen(self, popen: subprocess.Popen[bytes]) -> None:
        def wait() -> None:
            rc = popen.wait()
            status = -rc if rc < 0 else rc << 8  # back to a wait status
            self.node.transport.call_soon(lambda: self._on_worker_exit(popen.pid, status))

        threading.Thread(target=wait, daemon=True).start()

    def _on_reap(self, msg: Message) -> None:
        _, mesh_id, grace = msg.envelope

        def kill_leftovers() -> None:
            for w in list(self.workers.values()):
                if w.mesh_id == mesh_id and w.exit_status is None:
                    _kill(w.pid, signal.SIGKILL)

        self.node.transport.call_later(grace, kill_leftovers)

    def _on_signal(self, msg: Message) -> None:
        _, mesh_id, ranks, signum = msg.envelope
        for w in self.workers.values():
            if w.mesh_id == mesh_id and (ranks is None or w.rank in ranks):
                _kill(w.pid, signum)

    def _on_dump(self, msg: Message) -> None:
        """Stacks of a worker whose message thread cannot answer (the GIL is held in C code):
        faulthandler's SIGUSR1 handler writes them to stderr without needing the GIL."""
        _, mesh_id, rank, reply, index = msg.envelope
        worker = next(
            (w for w in self.workers.values() if w.mesh_id == mesh_id and w.rank == rank), None
        )
        if worker is None:
            return
        if stopped(worker.pid):  # it cannot run its SIGUSR1 handler: say why there is no dump
            addr_t, port_id = reply
            payload, buffers = dumps(f"({STOPPED_HINT})\n")
            self.node.send(Address(*addr_t), (REPLY, port_id, index, 0), payload, buffers)
            return
        worker.capture = []
        _kill(worker.pid, signal.SIGUSR1)

        def answer() -> None:
            captured = b"".join(worker.capture or [])
            worker.capture = None
            text = "(no answer from the message thread; faulthandler dump:)\n" + captured.decode(
                "utf-8", "replace"
            )
            addr_t, port_id = reply
            payload, buffers = dumps(text)
            self.node.send(Address(*addr_t), (REPLY, port_id, index, 0), payload, buffers)

        self.node.transport.call_later(0.3, answer)

    # -- worker output and exits -----------------------------------------------------------------

    def _on_output(self, worker: Worker, fd: int) -> None:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close_pipe(worker, fd)
            return
        text = worker.partial.pop(fd, b"") + data
        cut = text.rfind(b"\n") + 1
        if cut < len(text):
            worker.partial[fd] = text[cut:]
        if cut:
            if worker.capture is not None and worker.pipes[fd] == "stderr":
                worker.capture.append(text[:cut])
            else:
                self._forward(worker, worker.pipes[fd], text[:cut])

    def _forward(self, worker: Worker, stream: str, data: bytes) -> None:
        lines = data.decode("utf-8", "replace").splitlines(keepends=True)
        if stream == "stderr":
            worker.tail.extend(line.lstrip(TEE_MARK).rstrip("\n") for line in lines)
        # Lines marked by the worker's sys.stderr already reached the controller as messages.
        text = "".join(line for line in lines if not line.startswith(TEE_MARK))
        if text:
            self.node.send(self.controller, (FDLOG, worker.mailbox, worker.label, stream, text))

    def _close_pipe(self, worker: Worker, fd: int) -> None:
        rest = worker.partial.pop(fd, b"")
        if rest:
            self._forward(worker, worker.pipes[fd], rest + b"\n")
        self.node.transport.remove_reader(fd)
        worker.pipes.pop(fd, None)
        os.close(fd)

    def _on_worker_exit(self, pid: int, status: int) -> None:
        worker = self.workers.get(pid)
        if worker is None:
            return
        worker.exit_status = status
        # Drain what it wrote before dying, so its last words arrive before the exit report.
        for fd in list(worker.pipes):
            while fd in worker.pipes:
                self._on_output(worker, fd)
        # Shared-memory files of its TensorBuffers die with it (see buffers.py for the name).
        for name in glob.glob(f"/dev/shm/actormesh-{worker.mailbox.hex()}-{pid}-*"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)
        exitcode, signame = describe_status(status)
        report = (EXIT, worker.mesh_id, worker.rank, pid, exitcode, signame, tuple(worker.tail))
        self.node.send(self.controller, report)
        del self.workers[pid]

    def kill_all(self) -> None:
        for w in list(self.workers.values()):
            _kill(w.pid, signal.SIGKILL)
        for w in list(self.by_fork_id.values()):
            if w.pid:
                _kill(w.pid, signal.SIGKILL)
        if self.zygote is not None and self.zygote.poll() is None:
            self.zygote.kill()
            self.zygote.wait(5)


def _kill(pid: int, sig: int) -> None:
    if pid <= 0:
        return
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _coords(rank: int, extent: list[list[Any]]) -> dict[str, int]:
    labels, sizes = extent
    coords: dict[str, int] = {}
    for label, size in reversed(list(zip(labels, sizes, strict=True))):
        coords[label] = rank % size
        rank //= size
    return coords


def _visible_gpus() -> list[str]:
    try:
        count = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [v for v in visible.split(",") if v][:count]
    return [str(i) for i in range(count)]


def _read_init(fd: int) -> dict[str, Any]:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 65536)
        if not chunk:
            raise SystemExit("actormesh agent: the controller closed the lifeline before start-up")
        data += chunk
    return dict(json.loads(data))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m actormesh.runtime.procs.host_agent")
    parser.add_argument("--lifeline-fd", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="actormesh agent: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal is for the controller
    init = _read_init(args.lifeline_fd)
    die_with_parent(init["controller_pid"])
    name = f"agent{init['host_rank']}"
    node = Node(Transport(bytes.fromhex(init["key"]), init["run_dir"], name), "agent")
    set_node(node)
    agent = Agent(node, init)
    lifeline = args.lifeline_fd

    def on_lifeline() -> None:
        if not os.read(lifeline, 4096):
            node.transport.remove_reader(lifeline)
            agent.done.set()

    node.transport.add_reader(lifeline, on_lifeline)
    if init["start_method"] != "spawn":
        agent.start_zygote()
    node.start()
    agent.sampler.start()
    hello = (AGENT_READY, init["host_rank"], node.address, socket.gethostname())
    node.send(agent.controller, hello)
    signal.signal(signal.SIGTERM, lambda *_: agent.done.set())
    while not agent.done.wait(1.0):
        pass
    agent.kill_all()
    node.transport.close(linger=0.5)
    os._exit(0)


if __name__ == "__main__":
    main()

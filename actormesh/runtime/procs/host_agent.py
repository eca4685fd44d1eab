"""The host agent: one per host. Starts workers, reaps them, forwards their raw output, relays
signals, and kills every worker when the controller goes away.

On the controller's machine the agent is a child of the controller, which hands it the job key
through a *lifeline* pipe; when that pipe closes (the controller exited, or was SIGKILLed) the
agent kills its workers and exits, and when it closed without a goodbye (the controller was
killed) it first removes what the controller would have: shared memory and the run directory.
Workers are forked by the agent's fork server (``zygote``), restarted if it dies.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

from ..extent import Extent, Point
from ..faults import STOPPED_HINT, stopped
from ..messaging import (
    Address,
    Message,
    Node,
    Transport,
    TunnelEnds,
    dumps,
    forget_shared_memory,
    remove_segments,
    set_node,
)
from ..messaging.envelopes import DumpEnvelope, ReapEnvelope, SignalEnvelope, SpawnProcsEnvelope
from ..messaging.protocol import (
    AGENT_READY,
    DUMP,
    EXIT,
    REAP,
    REPLY,
    SHUTDOWN,
    SIGNAL,
    SPAWN_PROCS,
    ReplyTo,
)
from .agent_handle import address_from_json
from .osutil import (
    GOODBYE,
    describe_status,
    exit_if_orphaned,
    kill_quietly,
    raise_fd_limit,
    visible_gpus,
)
from .sampling import ResourceSampler
from .worker_output import Worker, WorkerOutput
from .zygote import FD_ENV

logger = logging.getLogger(__name__)


class Agent:
    def __init__(self, node: Node, init: dict[str, Any]) -> None:
        self.node = node
        self.init = init
        self.controller = address_from_json(init["controller"])
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
        self.output = WorkerOutput(node, self.controller)

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
            self._lost_zygote()
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

    def _lost_zygote(self) -> None:
        """The fork server died, and its workers with it (their parent-death signal): report
        them and start another, so heal() and new meshes work again on this host."""
        assert self.zygote_sock is not None and self.zygote is not None
        self.node.transport.remove_reader(self.zygote_sock.fileno())
        self.zygote_sock.close()
        self.zygote_ready = False
        self.zygote.kill()  # it closed its end: it is gone, or going
        self.zygote.wait()
        if self.done.is_set():
            return  # we are stopping: it was killed on purpose
        logger.error(
            "the fork server exited unexpectedly (%s); restarting it", self.zygote.returncode
        )
        sigkill = int(signal.SIGKILL)  # a wait status: what their parent-death signal is
        for w in [w for w in self.workers.values() if w.popen is None]:
            kill_quietly(w.pid, signal.SIGKILL)
            self._on_worker_exit(w.pid, sigkill, "its fork server died")
        for fork_id, w in list(self.by_fork_id.items()):  # forks it never answered
            del self.by_fork_id[fork_id]
            for fd in list(w.pipes):
                self.output.close_pipe(w, fd)
            self.workers[-1 - fork_id] = w
            self._on_worker_exit(-1 - fork_id, sigkill, "its fork server died")
        self.start_zygote()

    def _fork(self, request: dict[str, Any], worker: Worker) -> None:
        assert self.zygote_sock is not None
        fds = self.output.open_pipes(worker)
        fork_id = self.next_fork_id
        self.next_fork_id += 1
        self.by_fork_id[fork_id] = worker
        request = {"id": fork_id, "spec": request}
        socket.send_fds(self.zygote_sock, [json.dumps(request).encode()], fds)
        for fd in fds:
            os.close(fd)

    # -- requests from the controller ------------------------------------------------------------

    def _on_spawn(self, msg: Message) -> None:
        # request: SpawnRequest.wire(), the part every rank shares; p: one rank's part
        spawn = SpawnProcsEnvelope.of(msg)
        mesh_id, request = spawn.mesh_id, spawn.request
        for p in spawn.procs:
            spec = dict(request, mesh_id=mesh_id, **p)
            spec["env"] = dict(request["env"], **self._device_env(spec))
            ipc = p["ipc"].removeprefix("ipc://") if p.get("ipc") else ""
            worker = Worker(mesh_id, p["rank"], p["label"], bytes.fromhex(p["mailbox"]), ipc)
            if self.init["start_method"] == "spawn":
                self._popen(spec, worker)
            elif self.zygote_ready:
                self._fork(spec, worker)
            else:
                self.queued.append((spec, worker))

    def _device_env(self, spec: dict[str, Any]) -> dict[str, str]:
        labels, _sizes = spec["extent"]
        gpus = visible_gpus()
        if "gpus" not in labels or not gpus:
            return {}
        point_index = Point(spec["rank"], Extent(*spec["extent"]))["gpus"]
        return {"CUDA_VISIBLE_DEVICES": gpus[point_index % len(gpus)]}

    def _popen(self, spec: dict[str, Any], worker: Worker) -> None:
        out_w, err_w = self.output.open_pipes(worker)
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
        reap = ReapEnvelope.of(msg)
        mesh_id = reap.mesh_id

        def kill_leftovers() -> None:
            for w in list(self.workers.values()):
                if w.mesh_id == mesh_id and w.exit_status is None:
                    kill_quietly(w.pid, signal.SIGKILL)

        self.node.transport.call_later(reap.grace, kill_leftovers)

    def _on_signal(self, msg: Message) -> None:
        sent = SignalEnvelope.of(msg)
        ranks = sent.ranks
        for w in self.workers.values():
            if w.mesh_id == sent.mesh_id and (ranks is None or w.rank in ranks):
                kill_quietly(w.pid, sent.signum)

    def _on_dump(self, msg: Message) -> None:
        """Stacks of a worker whose message thread cannot answer (the GIL is held in C code):
        faulthandler's SIGUSR1 handler writes them to stderr without needing the GIL."""
        dump = DumpEnvelope.of(msg)
        mesh_id, rank, index = dump.mesh_id, dump.rank, dump.index
        to = ReplyTo.read(dump.reply)
        worker = next(
            (w for w in self.workers.values() if w.mesh_id == mesh_id and w.rank == rank), None
        )
        if worker is None:
            return
        if stopped(worker.pid):  # it cannot run its SIGUSR1 handler: say why there is no dump
            payload, buffers = dumps(f"({STOPPED_HINT})\n")
            self.node.send(Address(*to.address), (REPLY, to.port_id, index, 0), payload, buffers)
            return
        worker.capture = []
        kill_quietly(worker.pid, signal.SIGUSR1)

        def answer() -> None:
            captured = b"".join(worker.capture or [])
            worker.capture = None
            text = "(no answer from the message thread; faulthandler dump:)\n" + captured.decode(
                "utf-8", "replace"
            )
            payload, buffers = dumps(text)
            self.node.send(Address(*to.address), (REPLY, to.port_id, index, 0), payload, buffers)

        self.node.transport.call_later(0.3, answer)

    # -- worker exits ----------------------------------------------------------------------------

    def _on_worker_exit(self, pid: int, status: int, reason: str = "") -> None:
        worker = self.workers.get(pid)
        if worker is None:
            return
        worker.exit_status = status
        # Drain what it wrote before dying, so its last words arrive before the exit report.
        # Only what is there now: a child it started (a DataLoader worker, a shell) may hold
        # the write end for as long as it lives, and waiting for end-of-file would wedge this
        # agent. Such a pipe stays watched and is closed at end-of-file like any other.
        for fd in list(worker.pipes):
            while self.output.read(worker, fd):
                pass
        # What it leaves behind dies with it: its shared memory (TensorBuffers, lane slots),
        # and its sockets' files (its inbox and its actors' own, named after it: see
        # actor_address), which ZeroMQ leaves when a process ends without closing them.
        remove_segments(worker.mailbox.hex(), pid)
        forget_shared_memory(self.init["run_dir"], worker.mailbox.hex(), pid)
        if worker.ipc:
            for name in (worker.ipc, *glob.glob(glob.escape(worker.ipc) + ".*")):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name)
        exitcode, signame = describe_status(status)
        report: tuple[Any, ...] = (
            EXIT,
            worker.mesh_id,
            worker.rank,
            max(pid, 0),
            exitcode,
            signame,
            tuple(worker.tail),
        )
        if reason:
            report += (reason,)
        self.node.send(self.controller, report)
        del self.workers[pid]

    def clean_up_after_controller(self) -> None:
        """The controller was killed (it said no goodbye): remove what it cannot any more,
        the shared memory of every process of this host and, when it made it, the run
        directory."""
        for w in [*self.workers.values(), *self.by_fork_id.values()]:
            remove_segments(w.mailbox.hex())
        remove_segments(self.controller.mailbox.hex(), self.init["controller_pid"])
        if self.init.get("owns_run_dir"):
            shutil.rmtree(self.init["run_dir"], ignore_errors=True)

    def kill_all(self) -> None:
        for w in list(self.workers.values()):
            kill_quietly(w.pid, signal.SIGKILL)
        for w in list(self.by_fork_id.values()):
            if w.pid:
                kill_quietly(w.pid, signal.SIGKILL)
        if self.zygote is not None and self.zygote.poll() is None:
            self.zygote.kill()
            self.zygote.wait(5)


def _read_init(fd: int) -> tuple[dict[str, Any], bytes]:
    """The start-up message, and what followed it already (a goodbye from a quick exit)."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(fd, 65536)
        if not chunk:
            raise SystemExit("actormesh agent: the controller closed the lifeline before start-up")
        data += chunk
    line, _, rest = data.partition(b"\n")
    return dict(json.loads(line)), rest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m actormesh.runtime.procs.host_agent")
    parser.add_argument("--lifeline-fd", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="actormesh agent: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal is for the controller
    raise_fd_limit()
    init, early = _read_init(args.lifeline_fd)
    # No parent-death signal: it would fire when the controller's *thread* that started us
    # exits (a notebook helper thread), and it would kill us before we can clean up after a
    # controller killed by a signal. The lifeline ends us instead, watched by this thread,
    # which nothing else can keep busy.
    exit_if_orphaned(init["controller_pid"])
    name = f"agent{init['host_rank']}"
    node = Node(Transport(bytes.fromhex(init["key"]), init["run_dir"], name), "agent")
    set_node(node)
    agent = Agent(node, init)
    if init["start_method"] != "spawn":
        agent.start_zygote()
    node.start()
    agent.sampler.start()
    hello = (AGENT_READY, init["host_rank"], node.address, socket.gethostname())
    node.send(agent.controller, hello)
    signal.signal(signal.SIGTERM, lambda *_: agent.done.set())
    controller_died = _watch_lifeline(args.lifeline_fd, agent.done, GOODBYE in early)
    agent.done.set()  # what dies from now on is killed on purpose
    agent.kill_all()
    if controller_died:
        agent.clean_up_after_controller()
    node.transport.close(linger=0.5)
    os._exit(0)


def _watch_lifeline(fd: int, done: threading.Event, goodbye: bool) -> bool:
    """Wait for the end: returns whether the controller died (end-of-file with no goodbye)."""
    while not done.is_set():
        try:
            readable, _, _ = select.select([fd], [], [], 0.2)
        except InterruptedError:
            continue
        if not readable:
            continue
        data = os.read(fd, 4096)
        if not data:
            return not goodbye
        goodbye = goodbye or GOODBYE in data
    return False


if __name__ == "__main__":
    main()

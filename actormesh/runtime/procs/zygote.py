"""The fork server: a single-threaded process that imported torch once and forks workers.

Started by the host agent with one end of a ``SOCK_SEQPACKET`` socket pair. Requests are JSON;
each fork request carries the worker's stdout/stderr pipe ends as passed file descriptors. The
zygote never creates a ZeroMQ context or touches CUDA, so forking it is safe; it reaps its
children and reports each exit to the agent at once.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
from typing import Any

from .osutil import die_with_parent

FD_ENV = "ACTORMESH_ZYGOTE_FD"
_MAX = 1 << 20


def _send(sock: socket.socket, obj: dict[str, Any]) -> None:
    sock.send(json.dumps(obj).encode())


def main() -> None:
    sock = socket.socket(fileno=int(os.environ.pop(FD_ENV)))
    parent = int(os.environ.pop("ACTORMESH_AGENT_PID"))
    die_with_parent(parent)
    init = json.loads(sock.recv(_MAX))
    # No collection while preloading: each full one walks every object imported so far (~80 ms
    # of CPU per pass once torch is in), and what is imported here lives as long as we do.
    gc.disable()
    for module in init["preload"]:
        try:
            importlib.import_module(module)
        except Exception as exc:  # a missing optional module only costs start-up time later
            print(f"actormesh fork server: could not preload {module}: {exc}", file=sys.stderr)
    from . import worker  # noqa: F401  (imports zmq, cloudpickle and the runtime once)

    # Into the permanent generation: the workers' collections never walk the preloaded objects
    # either (a pass over torch's ~170k costs ~80 ms of CPU) nor write to them, which would
    # un-share their pages.
    gc.freeze()
    gc.enable()
    _send(sock, {"op": "ready", "pid": os.getpid()})
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    me = os.getpid()
    while True:
        readable, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in readable:
            try:
                os.read(wake_r, 4096)
            except BlockingIOError:
                pass
            _reap(sock)
        if sock.fileno() in readable:
            data, fds, _, _ = socket.recv_fds(sock, _MAX, 2)
            if not data:
                os._exit(0)  # the agent is gone; our children die with us (PDEATHSIG)
            request = json.loads(data)
            pid = os.fork()
            if pid == 0:
                sock.close()
                for fd in (wake_r, wake_w):
                    os.close(fd)
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                # Interrupts reach endpoints as messages; a group-wide Ctrl-C must not kill us.
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                _child(request, fds, me, init)
            for fd in fds:
                os.close(fd)
            _send(sock, {"op": "forked", "id": request["id"], "pid": pid})


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(sock, {"op": "exit", "pid": pid, "status": status})


def _child(request: dict[str, Any], fds: list[int], zygote_pid: int, init: dict[str, Any]) -> None:
    code = 1
    try:
        die_with_parent(zygote_pid)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in fds:
            os.close(fd)
        from . import rank_exit, worker

        worker.run(request["spec"], bytes.fromhex(init["key"]), init)
        code = 0
        rank_exit.run_exit_handlers()  # only after a graceful stop
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


if __name__ == "__main__":
    main()

"""The rank side of the debugger: debugpy inside a worker, started on first use.

Nothing here runs until a rank calls ``breakpoint()`` or the kernel asks for the debugger
(``%mesh dbg on``, a breakpoint by location, a pause): a mesh that never debugs starts no
debugger thread and traces nothing. Its workers import debugpy only if the fork server they
come from preloaded it (``preload``, when the controller's debugger is on). The kernel routes
``breakpoint()`` here by setting ``PYTHONBREAKPOINT`` to :func:`breakpoint_hook` in the
environment the workers inherit; the runtime knows nothing of it.

debugpy runs with its adapter in process (no extra process per rank) and listens on loopback
only, through an acceptor of ours rather than pydevd's: pydevd hands the session to whoever
connects last, so any local user could take a paused rank from the kernel. Ours accepts only
connections from processes of this rank's own user (the kernel, or the host agent's tunnel for
a rank on another host), checked in ``/proc/net/tcp`` before pydevd sees them; a new accepted
connection replaces the previous one, which is how the kernel recovers a lost session. The
order on ``breakpoint()`` is: listen, report "paused" to the controller (which
attaches a DAP client), wait for the client, stop. The runtime's own threads (the I/O thread,
the main thread, the status and debug actors) are marked so pydevd never traces or suspends
them: a paused rank still answers heartbeats, stack dumps and status requests. The actormesh
package itself is never traced either, so stepping stays in user code.

This module is imported by workers: it must stay cheap to import (debugpy only when asked).
"""

from __future__ import annotations

import hashlib
import hmac
import linecache
import os
import socket
import sys
import threading
import time
import types
from typing import Any

from ..runtime.actors import Actor, endpoint
from ..runtime.messaging import node_if_started
from ..runtime.messaging.protocol import DEBUGGER

ATTACH_TIMEOUT = float(os.environ.get("ACTORMESH_DEBUG_ATTACH_TIMEOUT", "30"))
# Threads that belong to the runtime (or to the kernel's helpers on the rank): never traced.
DEBUG_AGENT_NAME = "_mesh_debug"  # under the runtime's prefix reserved for tools' actors
RUNTIME_THREADS = ("actormesh-", "actor-_mesh_status", f"actor-{DEBUG_AGENT_NAME}")
# Cell files of %%mesh are user code (pydevd counts every "<...>" file as library code).
USER_CELL_PREFIXES = ("<mesh-cell",)

_lock = threading.Lock()
_port: int | None = None


# The actormesh package (this file is actormesh/debugger/rank.py).
ACTORMESH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _package_dir(module: types.ModuleType) -> str:
    return os.path.dirname(os.path.abspath(str(module.__file__)))


def hide_runtime_threads() -> None:
    """Mark the runtime's threads so pydevd neither traces nor suspends them.

    Only ``pydev_do_not_trace``: pydevd's other mark (``is_pydev_daemon_thread``) would also
    hide them from ``threading.enumerate()``, which the stack dumps use to name threads, and
    on the main thread it would make pydevd end the session (it sees no non-daemon thread)."""
    for t in threading.enumerate():
        if t is threading.main_thread() or t.name.startswith(RUNTIME_THREADS):
            t.pydev_do_not_trace = True  # type: ignore[attr-defined]


def access_token(key: bytes) -> str:
    """What a DAP client must present before pydevd obeys it: derived from the controller's
    signing key, so only the processes that may send this rank signed messages can debug it
    (the port itself is open to every local user)."""
    return hmac.new(key, b"actormesh-debugger", hashlib.sha256).hexdigest()


def import_pydevd() -> None:
    """Import debugpy's pydevd, and only that: no thread, no socket, no tracing (the fork
    server calls it, and forks afterwards).

    Importing it installs debugpy's ``sys.breakpointhook``, which ignores ``PYTHONBREAKPOINT``
    and drops the breakpoint while no client is connected (a rank detached by ``%mesh dbg
    off``): the hook in place before is put back, so ``breakpoint()`` still reaches
    :func:`breakpoint_hook`."""
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    hook = sys.breakpointhook
    import debugpy._vendored.force_pydevd  # noqa: F401  (loads the vendored pydevd)
    import pydevd  # noqa: F401

    sys.breakpointhook = hook


def listen() -> int:
    """Start pydevd listening on loopback (once per process); returns its port."""
    global _port
    with _lock:
        if _port is None:
            import_pydevd()
            import debugpy
            import pydevd
            from _pydevd_bundle import pydevd_filtering
            from _pydevd_bundle.pydevd_constants import get_global_debugger

            node = node_if_started()
            hide_runtime_threads()  # before pydevd enables tracing of every thread
            # What debugpy.listen(in_process_debug_adapter=True) does, plus an access token
            # and the actormesh package in the do-not-trace list (stepping stays in user code).
            pydevd_filtering.USER_CODE_BASENAMES_STARTING_WITH = (
                *pydevd_filtering.USER_CODE_BASENAMES_STARTING_WITH,
                *USER_CELL_PREFIXES,
            )
            pydevd.settrace(
                host="127.0.0.1",
                port=0,
                suspend=False,
                patch_multiprocessing=False,
                wait_for_ready_to_run=False,
                block_until_connected=False,
                notify_stdin=False,
                dont_trace_start_patterns=(ACTORMESH_DIR, _package_dir(debugpy)),
                dont_trace_end_patterns=("debugpy_launcher.py",),
                access_token=None if node is None else access_token(node.key),
            )
            py_db = get_global_debugger()
            py_db.wait_for_server_socket_ready()
            _stop_pydevd_acceptor(py_db)
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.bind(("127.0.0.1", 0))
            # pydevd writes a DAP message as two sends (header, body): with Nagle's algorithm
            # the body waits for the client's delayed ACK, 40 ms on every answer. Accepted
            # connections inherit the option.
            server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            server.listen(4)
            acceptor = threading.Thread(
                target=_accept, args=(server, py_db), name="actormesh-debug-accept", daemon=True
            )
            acceptor.pydev_do_not_trace = True  # type: ignore[attr-defined]
            acceptor.start()
            _port = int(server.getsockname()[1])
        hide_runtime_threads()  # actors spawned since the last call
        return _port


def _stop_pydevd_acceptor(py_db: Any) -> None:
    """End pydevd's own accept loop (it takes any connection) before its port is known to
    anyone; a connection it accepted meanwhile is dropped."""
    # pydevd has no public API for its accept loop (debugpy 1.8 names these).
    waiter = py_db._waiting_for_connection_thread  # noqa: SLF001
    waiter._kill_received = True  # noqa: SLF001
    server = waiter._server_socket  # noqa: SLF001
    waiter._server_socket = None  # noqa: SLF001
    if server is not None:
        try:
            server.shutdown(socket.SHUT_RDWR)  # wakes its accept(), which then sees the kill
        except OSError:
            pass
        server.close()
    waiter.join(5)
    if getattr(py_db, "reader", None) is not None:
        _drop_session(py_db)


def _drop_session(py_db: Any) -> None:
    from _pydevd_bundle.pydevd_api import PyDevdAPI

    # What pydevd does when a client replaces another without saying goodbye: suspended
    # threads stay suspended, for the next client.
    PyDevdAPI().request_disconnect(py_db, resume_threads=False)


def _accept(server: socket.socket, py_db: Any) -> None:
    while True:
        try:
            conn, peer = server.accept()
        except OSError:
            return
        try:
            allowed = peer_uid(server.getsockname()[1], peer[1]) == os.geteuid()
        except OSError:
            allowed = False
        if not allowed:
            # Neither pydevd nor the current session ever sees it.
            print(
                f"actormesh debugger: refused a connection from port {peer[1]} of another user",
                file=sys.stderr,
            )
            conn.close()
            continue
        if getattr(py_db, "reader", None) is not None:
            _drop_session(py_db)
        py_db.initialize_network(conn, terminate_on_socket_close=False)


def peer_uid(my_port: int, peer_port: int) -> int | None:
    """The user owning the loopback TCP socket at ``peer_port`` connected to ``my_port`` of this
    host (``/proc/net/tcp``: the kernel records the creator's uid per socket); ``None`` when
    there is none."""
    want_local, want_remote = f":{peer_port:04X}", f":{my_port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if fields[1].endswith(want_local) and fields[2].endswith(want_remote):
                return int(fields[7])
    return None


def client_connected() -> bool:
    if _port is None:
        return False
    import debugpy

    return bool(debugpy.is_client_connected())


def stop_here(frame: types.FrameType) -> None:
    """Pause this thread at ``frame`` until the kernel's debugger lets it go.

    Without a client yet, tell the controller where we are and wait for it to attach. Never
    returns silently without stopping: if no client attaches in time, say so on stderr."""
    port = listen()
    if not client_connected():
        node = node_if_started()
        if node is None or node.controller is None or node.mesh_id is None:
            print("breakpoint(): not in an actormesh worker; continuing", file=sys.stderr)
            return
        rank = _proc_rank()
        where = {
            "host": socket.gethostname(),
            "port": port,
            "pid": os.getpid(),
            "file": frame.f_code.co_filename,
            "line": frame.f_lineno,
            "function": frame.f_code.co_name,
            "pg_timeout": _process_group_timeout(),
        }
        node.send(node.controller, (DEBUGGER, "paused", node.mesh_id, rank, where))
        deadline = time.monotonic() + ATTACH_TIMEOUT
        while not client_connected():
            if time.monotonic() > deadline:
                print(
                    f"breakpoint() at {frame.f_code.co_filename}:{frame.f_lineno}: no debugger "
                    f"attached within {ATTACH_TIMEOUT:g} s (the actormesh kernel attaches to "
                    "paused ranks); continuing",
                    file=sys.stderr,
                )
                return
            time.sleep(0.005)
    import pydevd

    pydevd.settrace(
        suspend=True,
        trace_only_current_thread=True,
        patch_multiprocessing=False,
        stop_at_frame=frame,
        notify_stdin=False,
    )


def breakpoint_hook(*args: Any, **kwargs: Any) -> None:
    """``sys.breakpointhook`` of the workers (through ``PYTHONBREAKPOINT``).

    In a process that is not a worker (the kernel itself, a subprocess), behave as the
    default hook: pdb at the caller."""
    frame = sys._getframe(1)
    node = node_if_started()
    if node is None or node.role != "worker":
        import pdb

        pdb.Pdb().set_trace(frame)
        return
    stop_here(frame)


def _proc_rank() -> int:
    from ..runtime.actors import process_context

    ctx = process_context()
    return 0 if ctx is None else int(ctx.actor_instance.rank.rank)


def _process_group_timeout() -> float | None:
    """The default process group's timeout in seconds, if torch.distributed is in use here
    (peers waiting for this rank in a collective give up after it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return None
        # torch has no public API for a group's timeout: private, hence the guard below.
        pg = dist.distributed_c10d._get_default_group()  # noqa: SLF001
        device = torch.device("cuda" if dist.get_backend(pg) == "nccl" else "cpu")
        return float(pg._get_backend(device).options._timeout.total_seconds())  # noqa: SLF001
    except Exception:  # private API: a torch that lacks it gives no warning, not a failure
        return None


def source_lines(locations: list[tuple[str, int]]) -> list[str]:
    """The source text of each ``(file, line)`` as this process sees it (linecache)."""
    return [linecache.getline(path, line).rstrip("\n") for path, line in locations]


class DebugAgent(Actor):
    """The kernel's helper on each rank (``_mesh_debug``): starts debugpy, adds sources.

    Its thread is marked as the runtime's, so it answers while the rank's user threads are
    paused."""

    @endpoint
    def listen(self) -> dict[str, Any]:
        port = listen()
        return {"host": socket.gethostname(), "port": port, "pid": os.getpid()}

    @endpoint
    def add_sources(self, sources: dict[str, str]) -> None:
        """Put notebook cells' source in this rank's linecache (actor classes defined in a
        cell travel as code only: their file exists only in the kernel)."""
        for path, text in sources.items():
            if path not in linecache.cache:
                linecache.cache[path] = (len(text), None, text.splitlines(True), path)

    @endpoint
    def materialize(self, path: str, text: str) -> None:
        """Write a notebook cell's source to its file name on this host, if missing: pydevd
        only accepts breakpoints in files that exist (ipykernel's own debugger does the same
        with the cells it debugs)."""
        if os.path.exists(path):
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)  # ranks of one host race to write the same file

    @endpoint
    def source_lines(self, locations: list[tuple[str, int]]) -> list[str]:
        return source_lines(locations)

    @endpoint
    def summarize(self, expression: str, cap: int) -> Any:
        """Tensor summary of a name in this rank's ``%%mesh`` namespace (a running rank)."""
        from .tensors import summarize_in

        namespace = _executor_namespace()
        if namespace is None:
            raise NameError("no %%mesh cell has run on this rank yet")
        return summarize_in(expression, namespace, cap)


def _executor_namespace() -> dict[str, Any] | None:
    from ..kernel.executor import local_executor

    executor = local_executor()
    return None if executor is None else dict(executor.ns)

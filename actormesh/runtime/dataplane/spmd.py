"""Run an unmodified torchrun-style script on a proc mesh: ``actormesh run``.

``python -m actormesh run --nproc-per-host 4 train.py --lr 0.1`` (or ``spmd.run("train.py",
["--lr", "0.1"], nproc_per_host=4)``) starts 4 worker processes and runs ``train.py`` as
``__main__`` in each, with ``sys.argv`` set and the environment torchrun would give it:
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
``GROUP_WORLD_SIZE``, ``ROLE_RANK``, ``ROLE_NAME``, ``ROLE_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``, ``TORCHELASTIC_RUN_ID``, ``TORCHELASTIC_RESTART_COUNT``,
``TORCHELASTIC_MAX_RESTARTS``, ``TORCHELASTIC_USE_AGENT_STORE``, and ``OMP_NUM_THREADS=1``
unless set (torchrun's default with more than one process per host).

As with torchrun, the rendezvous store is not hosted by the script: rank 0's process serves a
``TCPStore`` on a port it bound itself (see :mod:`actormesh.runtime.dataplane.distributed`) and
every rank's ``init_process_group`` connects to it as a client
(``TORCHELASTIC_USE_AGENT_STORE=True``).

What the script sees differently from torchrun: it runs on an actor's thread, not the main
thread (``signal.signal`` raises there), and its ``atexit`` handlers run when the worker process
ends, not when the script returns. ``sys.exit(n)`` ends the script with status ``n`` (the
worker survives it). Output is labelled with the rank (``[procs=2] ...``). A rank that raises
is an ``ActorError`` with its traceback, a rank whose process dies a ``SupervisionError``; like
torchrun, the first failure (or non-zero exit) stops the other ranks after a short grace, and
``actormesh run`` exits with status 1 (or the rank's non-zero exit status).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ... import config
from ...errors import (
    ActorError,
    MeshClosedError,
    MeshError,
    MeshTimeoutError,
    ProcDeath,
    RemoteFailure,
    SupervisionError,
)
from ..actors import Future, completed_future, then
from ..mesh_shape import view_shape
from ..meshes import ProcMesh, ValueMesh, new_value_mesh
from .distributed import (
    helper_mesh,
    mesh_layout,
    rank0,
    release_on_failure,
)
from .elastic_env import omp_threads, serve_store, torchrun_envs
from .script_runner import ScriptRunner

logger = logging.getLogger(__name__)

# After the first failing rank, how long the others get to report (so that an error every rank
# hits is shown once, with all its ranks) before they are stopped.
FAILURE_GRACE = 2.0
DIM = "procs"  # not "gpus": torchrun scripts expect to see every GPU and pick by LOCAL_RANK


# -- the controller's side ----------------------------------------------------------------------


def launch(
    procs: ProcMesh,
    script: str,
    args: Sequence[str] = (),
    *,
    module: bool = False,
    run_id: str | None = None,
    master_addr: str | None = None,
) -> Future[ValueMesh[int]]:
    """Run ``script`` (or, with ``module=True``, ``python -m script``) on every rank of
    ``procs``, torchrun-style; don't wait.

    The future gives each rank's exit status (0, or the ``sys.exit`` code); it fails with
    ``ActorError`` when a rank raised (after every rank answered) and with ``SupervisionError``
    as soon as a rank's process dies. Unlike :func:`run`, nothing is stopped on failure: ranks
    that wait in a collective for a failed rank wait until the process group's timeout, or until
    you stop the mesh. Any thread may call it.
    """
    run_id = run_id or uuid.uuid4().hex[:12]
    omp = omp_threads(max(len(g) for g in _by_host(procs)))
    helpers, store = serve_store(procs, master_addr)
    runners = helper_mesh(procs, "spmd", ScriptRunner)

    def start(addr_port: tuple[str, int]) -> Future[ValueMesh[int]]:
        port = addr_port[1]
        envs = torchrun_envs(procs, *addr_port, run_id, omp)
        done: Future[ValueMesh[tuple[int, int]]] = runners.run.call(
            script, list(args), envs, module
        )

        def codes(values: ValueMesh[tuple[int, int]]) -> Future[ValueMesh[int]]:
            rank0(helpers).release_store.call_one(port)  # the script's group is gone
            return completed_future(
                new_value_mesh(view_shape(procs), [c for _, c in values.values()])
            )

        return then(done, codes)

    result = then(store, start)
    release_on_failure(result, helpers, store)
    return result


def _by_host(procs: ProcMesh) -> list[list[int]]:
    groups: dict[int, list[int]] = {}
    for m in mesh_layout(procs):
        groups.setdefault(m.group_rank, []).append(m.rank)
    return list(groups.values())


def run(
    script: str,
    args: Sequence[str] = (),
    *,
    nproc_per_host: int = 1,
    module: bool = False,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    run_id: str | None = None,
    master_addr: str | None = None,
) -> int:
    """Run ``script`` torchrun-style on ``nproc_per_host`` new processes of this host; block.

    Returns the exit status: 0 when every rank ended normally (or with ``sys.exit(0)``), else the
    first non-zero ``sys.exit`` status. Raises ``ActorError`` (with the tracebacks, identical ones
    grouped) when a rank raised, ``SupervisionError`` when a rank's process died, and
    ``MeshTimeoutError`` after ``timeout`` seconds. On the first failure the other ranks get
    ``FAILURE_GRACE`` seconds to report, then every process is stopped (as torchrun does); the
    processes are always stopped before this returns. Blocks the calling thread (any thread).
    """
    from ..procs import this_host

    if nproc_per_host < 1:
        raise ValueError(f"nproc_per_host must be at least 1, got {nproc_per_host}")
    if not module and not os.path.isfile(script):
        raise FileNotFoundError(f"can't open file {script!r}: no such file")
    procs = this_host().spawn_procs(per_host={DIM: nproc_per_host}, env=env, name="spmd")
    try:
        return _run_on(procs, script, args, module, timeout, run_id, master_addr)
    finally:
        procs.stop().get(timeout=config.STOP_GRACE + 30)


def _run_on(
    procs: ProcMesh,
    script: str,
    args: Sequence[str],
    module: bool,
    timeout: float | None,
    run_id: str | None,
    master_addr: str | None,
) -> int:
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout

    def left() -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    _helpers, store = serve_store(procs, master_addr)
    addr, port = store.get(timeout=left())
    omp = omp_threads(max(len(g) for g in _by_host(procs)))
    envs = torchrun_envs(procs, addr, port, run_id or uuid.uuid4().hex[:12], omp)
    runners = helper_mesh(procs, "spmd", ScriptRunner)
    stream = runners.run.stream(script, list(args), envs, module)
    codes, failures, deaths = _outcomes(stream, len(procs), left)
    if deaths:
        raise SupervisionError(deaths, f"{script} failed: a rank's process died")
    if failures:
        raise ActorError(failures)
    return next((codes[r] for r in sorted(codes) if codes[r] != 0), 0)


def _outcomes(
    stream: Any, n: int, left: Callable[[], float | None]
) -> tuple[dict[int, int], list[RemoteFailure], list[ProcDeath]]:
    """The exit codes, failures and deaths of the ``n`` ranks as their results come off
    ``stream`` (``left()``: the time left). Once one rank failed, the others get
    ``FAILURE_GRACE`` seconds to end too before the run stops waiting for them."""
    codes: dict[int, int] = {}
    failures: list[RemoteFailure] = []
    deaths: list[ProcDeath] = []
    failed_at: float | None = None
    for _ in range(n):
        wait = left()
        if failed_at is not None:
            grace = failed_at + FAILURE_GRACE - time.monotonic()
            wait = grace if wait is None else min(wait, grace)
            if wait <= 0:
                break
        try:
            fut = stream.next(timeout=wait)
        except MeshTimeoutError:
            if failed_at is not None:
                break  # the grace is over: stop the ranks still running
            raise
        exc = fut.exception()
        if isinstance(exc, ActorError):
            failures.extend(exc.failures)
        elif isinstance(exc, MeshClosedError):
            # Also a SupervisionError, but with no deaths: counted as one, the run ended as if
            # every rank had succeeded. The mesh was stopped under the script: say so.
            raise exc
        elif isinstance(exc, SupervisionError):
            deaths.extend(exc.deaths)
        elif exc is not None:
            raise exc
        else:
            rank, code = fut.get()
            codes[rank] = code
            if code == 0:
                continue
        if failed_at is None:
            failed_at = time.monotonic()
    return codes, failures, deaths


# -- command line ----------------------------------------------------------------------------------


def _nproc(value: str) -> int:
    if value in ("gpu", "auto", "cpu"):
        import torch

        if value != "cpu" and torch.cuda.is_available():
            return torch.cuda.device_count()
        if value == "gpu":
            raise argparse.ArgumentTypeError("--nproc-per-host gpu, but no GPU is visible")
        return os.cpu_count() or 1
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of processes, or gpu, cpu or auto: {value!r}"
        ) from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"need at least one process per host, got {n}")
    return n


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="actormesh run",
        description="Run a torchrun-style training script on a mesh of local worker processes.",
        allow_abbrev=False,
    )
    p.add_argument(
        "--nproc-per-host",
        "--nproc-per-node",
        "--nproc_per_node",
        dest="nproc",
        type=_nproc,
        default=1,
        metavar="N",
        help="processes on this host: a number, or gpu, cpu, auto (default 1)",
    )
    p.add_argument("--run-id", default=None, help="TORCHELASTIC_RUN_ID (default: random)")
    p.add_argument("--master-addr", "--master_addr", default=None, help="rank 0's address")
    p.add_argument("--timeout", type=float, default=None, help="seconds before giving up")
    p.add_argument(
        "-m", "--module", action="store_true", help="run the target as a module (python -m)"
    )
    p.add_argument("script", help="the training script (or module, with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``actormesh run``: the arguments after ``run``; returns the exit status."""
    ns = parser().parse_args(argv)
    try:
        return run(
            ns.script,
            ns.args,
            nproc_per_host=ns.nproc,
            module=ns.module,
            timeout=ns.timeout,
            run_id=ns.run_id,
            master_addr=ns.master_addr,
        )
    except MeshError as err:
        print(f"actormesh run: {ns.script} failed:{_indent(str(err))}", file=sys.stderr)
        return 1
    except FileNotFoundError as err:
        print(f"actormesh run: {err}", file=sys.stderr)
        return 2  # as python does for a missing script
    except KeyboardInterrupt:
        print("actormesh run: interrupted", file=sys.stderr)
        return 130


def _indent(text: str) -> str:
    return text if text.startswith("\n") else "\n" + text


if __name__ == "__main__":
    sys.exit(main())

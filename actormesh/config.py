"""Environment variables and default timeouts, in one place.

Every knob can be set in the environment of the controller; workers and host agents inherit the
values they need through their start-up message, never through the command line.
"""

from __future__ import annotations

import os


def _float(name: str, default: float, unit: str = "seconds") -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise ValueError(f"{name}={raw!r} is not a number of {unit} (0 or more)")
    return value


def _bytes(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{name}={raw!r} is not a number of bytes (a whole number, 0 or more)")
    return value


# How long spawn_procs waits for every worker to report ready.
SPAWN_TIMEOUT = _float("ACTORMESH_SPAWN_TIMEOUT", 120.0)
# Default deadline of Future.get() when none is given; 0 means wait without a deadline (a dead
# worker still fails the wait at once: supervision never lets a call hang on a dead process).
DEFAULT_GET_TIMEOUT = _float("ACTORMESH_GET_TIMEOUT", 0.0)
# How long a stopping worker gets to exit before its agent kills it.
STOP_GRACE = _float("ACTORMESH_STOP_GRACE", 5.0)
# Modules the fork server imports once, so that each forked worker starts with them loaded.
PRELOAD = [m for m in os.environ.get("ACTORMESH_PRELOAD", "torch").split(",") if m]
# "forkserver" (default: fork from a zygote that has imported PRELOAD) or "spawn" (fresh
# interpreter per worker: slower, but nothing is inherited).
START_METHOD = os.environ.get("ACTORMESH_START_METHOD", "forkserver")
# The Linux scheduling policy of worker processes: "batch" (SCHED_BATCH: a worker that wakes up
# does not preempt a busy core; it takes an idle one or waits for the current time slice, so a
# controller that casts to many ranks finishes sending before they run) or "other" (the
# default policy, as any process). The controller and the host agents keep the default.
WORKER_SCHED = os.environ.get("ACTORMESH_WORKER_SCHED", "batch").strip().lower()
if WORKER_SCHED not in ("batch", "other"):
    raise ValueError(f"ACTORMESH_WORKER_SCHED={WORKER_SCHED!r}: use 'batch' or 'other'")
# Tensor ops (actormesh.tensor) remember where the user issued them, for the error a failed op
# raises: "0" (default) the file:line of the user's frame (about 0.5 µs per op), "1" the whole
# controller stack of each op (about 10 µs per op: for finding which call path issued it).
TENSOR_TRACEBACKS = os.environ.get("ACTORMESH_TENSOR_TRACEBACKS", "0").strip()
if TENSOR_TRACEBACKS not in ("0", "1"):
    raise ValueError(f"ACTORMESH_TENSOR_TRACEBACKS={TENSOR_TRACEBACKS!r}: use '0' or '1'")
# actormesh.distribute() of a tensor larger than this many bytes sends each rank only its own
# block (one message per distinct block, ahead of the op); a smaller tensor travels whole with
# the op, and every rank keeps its slice.
TENSOR_SHARD_BYTES = _bytes("ACTORMESH_TENSOR_SHARD_BYTES", 64 * 2**20)
# How long a tensor sync point given no timeout (t.item(), t.get(), float(t), actormesh.inspect)
# waits for the ranks, which first run every op issued before it; 0: no deadline. Long enough
# for a long step, short of forever: a collective that only some ranks entered (a remote
# function that runs one on some ranks only) never ends, and the error names the ranks.
TENSOR_TIMEOUT = _float("ACTORMESH_TENSOR_TIMEOUT", 300.0)
# Where ipc:// sockets live; the path of a unix socket must stay short (108 bytes).
RUN_DIR = os.environ.get("ACTORMESH_RUN_DIR", "/tmp")
# Lines of a dead worker's stderr kept for its SupervisionError.
STDERR_TAIL_LINES = 30
# Hosts other than the controller's (actormesh.hosts): how often controller and host agents
# exchange heartbeats, and how long without one before the other side counts as lost (the
# agent then kills its workers; the controller fails the host's ranks with SupervisionError).
HOST_HEARTBEAT = _float("ACTORMESH_HOST_HEARTBEAT", 0.5)
# 10 s, not 3: on a loaded 2-core machine (load ~20) a live agent was silent for 3.3 s while its
# host spawned workers, and was taken for lost; a busy training host is such a machine.
HOST_DEADLINE = _float("ACTORMESH_HOST_DEADLINE", 10.0)
# Encrypt tcp:// traffic between hosts with CurveZMQ: "auto" (on as soon as a host that is not
# the controller's joins), "1" (same), or "0" (off: messages are still signed, not secret).
CURVE = os.environ.get("ACTORMESH_CURVE", "auto").strip().lower()
# Replies of a call() relayed to another host come back through its host agent, one message per
# host (relay.py). The agent sends what it has when all its ranks answered, and at the latest
# this many seconds after it got a reply it still holds (so a slow rank delays the others' by no
# more than that). Read by the caller at each call, which tells the agent; 0: every rank replies
# to the caller directly.
REPLY_WINDOW = _float("ACTORMESH_REPLY_WINDOW", 0.003)
# A thread that waits in Future.get() for a call's replies keeps checking for them for up to
# this many microseconds before it sleeps: a reply that comes meanwhile is read without waking
# a sleeping CPU (on a virtual machine whose idle CPUs halt, that wake-up is most of a quick
# call's round trip). Only for a call to at most SPIN_RANKS ranks (half the cores this process
# may use, so the ranks keep a core each), only in the main thread (the one with a reply inbox),
# and not after a wait that outlasted the window, until waits are quick again. 0: always sleep
# at once.
WAIT_SPIN_US = _float("ACTORMESH_WAIT_SPIN_US", 300.0, "microseconds")
# The cores this process may run on (its affinity where the OS tells it, else the machine's).
USABLE_CORES = (
    len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
)
SPIN_RANKS = USABLE_CORES // 2 if hasattr(os, "sched_getaffinity") else 0
# Where the controller listens for host agents, and the address it gives them to reach it
# (default: this machine's name, resolved), when listen_for_hosts() is not told.
HOST_LISTEN = os.environ.get("ACTORMESH_LISTEN", "0.0.0.0:29500")
ADVERTISE = os.environ.get("ACTORMESH_ADVERTISE", "")

"""The control protocol, written down once: every message kind, its fields, who sends it and
which handler takes it in which kind of process.

A message on the control plane is a signed envelope, a plain tuple ``(kind, field, ...)``, and
an optional pickled payload with out-of-band buffers (``codec.py``). Tuples stay on the wire
because a call's cost is mostly per-message Python: a tuple of strings, ints and bytes pickles
fastest. This table is the place that gives those positions their names; a handler reads them
by name through its kind's class in ``envelopes.py``, generated from the table
(``CallEnvelope.of(msg).endpoint``).

Process roles: the *controller* (a script or kernel; a worker that spawns meshes of its own is a
controller too), a *worker* (one rank), a host *agent* (starts and reaps a host's workers; the
local one is a child of the controller, remote ones dial in, see ``actormesh.hosts``).

Handlers are registered with :meth:`Node.register`, which refuses a kind this table does not
know and a second handler for the same kind. ``tests/unit/test_protocol.py`` checks that every
kind has exactly one registration, at the place named here; with ``ACTORMESH_CHECK_PROTOCOL=1``
(the test suite sets it) every envelope sent is checked against its kind's fields.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, NamedTuple

# Nothing of the package at import time: scripts/write_envelopes.py loads this file alone, and
# writes envelopes.py from its table.
if TYPE_CHECKING:
    from ..shape import Shape

CONTROLLER, WORKER, AGENT = "controller", "worker", "agent"
EVERY_ROLE = (CONTROLLER, WORKER, AGENT)

# Status of a reply (the third field of REPLY).
OK, FAILED = 0, 1

# -- the kinds -------------------------------------------------------------------------------
# Replies and ports: handled by every node.
REPLY = "reply"
REPLIES = "replies"
PORT = "port"
DIED = "died"
BATCH = "batch"
BUF_DONE = "buf_done"
# To a worker.
SPAWN_ACTOR = "spawn_actor"
CALL = "call"
STOP = "stop"
STOP_ACTOR = "stop_actor"
SUPERVISE = "supervise"
STACKS = "stacks"
INTERRUPT = "interrupt"
MOVED = "moved"
WAITS = "waits"
# To whoever owns a TensorBuffer.
BUF_READ = "buf_read"
BUF_WRITE = "buf_write"
BUF_CUDA = "buf_cuda"
# To the controller that spawned the sender's proc mesh.
SINGLETON = "singleton"
# To a host agent.
SPAWN_PROCS = "spawn_procs"
REAP = "reap"
SIGNAL = "signal"
SHUTDOWN = "shutdown"
DUMP = "dump"
TUNNEL = "tunnel"
RELAY = "relay"
HEARTBEAT = "hb"
# To the controller.
AGENT_READY = "agent_ready"
READY = "ready"
EXIT = "exit"
LOG = "log"
FDLOG = "fdlog"
UNHANDLED = "unhandled"
OWNED = "owned"
ACTOR_STOPPED = "actor_stopped"
AGENT_HEARTBEAT = "agent_hb"
DEBUGGER = "debugger"
METRICS = "metrics"
RESOURCES = "resources"


class Kind(NamedTuple):
    """One message kind. ``fields`` follow the kind in the envelope; a name ending in ``?`` is
    optional (and only trailing fields are). ``handler`` is where it is registered, as
    ``module:qualified name`` under ``actormesh``."""

    name: str
    fields: tuple[str, ...]
    senders: tuple[str, ...]
    roles: tuple[str, ...]
    handler: str
    doc: str

    @property
    def arity(self) -> tuple[int, int]:
        """The fewest and the most fields an envelope of this kind has."""
        required = sum(1 for f in self.fields if not f.endswith("?"))
        return required, len(self.fields)


_NODE = "runtime.messaging.node:Node.__init__"

_TABLE = [
    # -- every node ------------------------------------------------------------------------------
    Kind(REPLY, ("port_id", "index", "status", "after?", "datagrams?"), EVERY_ROLE, EVERY_ROLE,
         _NODE,
         "The answer of one rank to a call, spawn, stack dump or interrupt; the payload is the "
         "value (status OK) or the rendered failure (FAILED). ``after``: when the reply took "
         "another route than the rank's earlier messages to the caller's process, the sequence "
         "number of the last of them, handled first (see Node.in_order). "
         "``datagrams``: on a reply to a reply inbox that went through the process inbox "
         "instead, the sequence number of its sender's last datagram to that inbox, which is "
         "handled first (Node._on_reply)."),
    Kind(REPLIES, ("items",), (AGENT,), EVERY_ROLE, _NODE,
         "Several REPLY of one host, gathered by its agent's relay: items are (port_id, sender, "
         "index, status, after, payload size, buffer count); payloads follow, concatenated."),
    Kind(PORT, ("port_id", "rank?", "status?"), EVERY_ROLE, EVERY_ROLE, _NODE,
         "A value sent to an open port (Port.send, tunnel data back to the controller); "
         "``rank``: the sender's rank in the slice that messaged it, or None; ``status`` 1: "
         "the payload is a rendered failure (Port.exception)."),
    Kind(DIED, ("mailbox", "death"), (CONTROLLER,), EVERY_ROLE, _NODE,
         "A process died: fail what waits on it (ports, calls in flight). Also sent to a "
         "process that just started, for each death before it (Controller.catch_up): a mailbox "
         "stays dead, as a healed rank lives on under a new one."),
    Kind(BATCH, ("items",), EVERY_ROLE, EVERY_ROLE, _NODE,
         "Back-to-back one-way messages to one process, signed once: items are (envelope, "
         "payload) (Transport.send_one_way)."),
    Kind(BUF_DONE, ("port_id", "ok", "error"), EVERY_ROLE, EVERY_ROLE, _NODE,
         "A TensorBuffer owner's answer to BUF_READ (the bytes as one buffer), BUF_WRITE or "
         "BUF_CUDA (a pickled CUDA IPC handle as one buffer, when asked for)."),
    # -- worker (actors live in the controller too: this_proc()) ---------------------------
    Kind(SPAWN_ACTOR, ("key", "name", "shape", "reply", "owner?"), (CONTROLLER, WORKER),
         (CONTROLLER, WORKER), "runtime.actors.actor_host:ActorHost.__init__",
         "Make the actor of mesh ``key`` here; the payload is (class, args, kwargs). ``shape`` "
         "is the actor mesh's Shape, a REPLY for ``__init__`` goes to ``reply``. ``owner``: "
         "the actor that spawned it (ownership.Owner), None when the script did."),
    Kind(SUPERVISE, ("owner",), (CONTROLLER, WORKER), (CONTROLLER, WORKER),
         "runtime.actors.actor_host:ActorHost.__init__",
         "A failure nobody handled, of an actor mesh that the actor ``owner`` (a key) of this "
         "process spawned: for its ``__supervise__``. The payload is the failure."),
    Kind(CALL, ("key", "endpoint", "shape", "reply"), EVERY_ROLE, (CONTROLLER, WORKER),
         "runtime.actors.actor_host:ActorHost.__init__",
         "Call an endpoint of actor mesh ``key``; the payload is (args, kwargs). ``shape`` (as "
         "shape_state) says which ranks the cast reaches, ``reply`` where the REPLY goes (None: "
         "a broadcast). Calls on the same host usually go straight to the actor's own socket."),
    Kind(STOP_ACTOR, ("key", "shape", "reply"), (CONTROLLER, WORKER), (CONTROLLER, WORKER),
         "runtime.actors.actor_host:ActorHost.__init__",
         "Stop the actor of mesh ``key`` here (ActorMesh.stop): it runs ``__cleanup__(None)`` "
         "and then fails every call; a REPLY goes to ``reply`` once it has."),
    Kind(STOP, (), (CONTROLLER,), (WORKER,), "runtime.procs.worker:run",
         "Stop the actors (each gets the stop grace period) and exit."),
    Kind(STACKS, ("shape", "reply"), (CONTROLLER, WORKER), (WORKER,), "runtime.procs.worker:run",
         "Answer with this process's stacks as text (the I/O thread answers; a busy actor "
         "does not delay it)."),
    Kind(WAITS, ("reply",), (CONTROLLER, WORKER), (WORKER,), "runtime.procs.worker:run",
         "Answer (a REPLY) with the calls this process's actors are blocked on in Future.get: "
         "(actor, endpoint, [(mesh_id, rank), ...]) each; a timeout looks for a wait cycle."),
    Kind(INTERRUPT, (), (CONTROLLER, WORKER), (WORKER,), "runtime.procs.worker:run",
         "KeyboardInterrupt in every actor busy in an endpoint."),
    Kind(MOVED, ("mesh_id", "rank", "address", "relay"), (CONTROLLER,), (WORKER,),
         "runtime.procs.worker:run",
         "A healed rank of a mesh lives at a new address (a new mailbox, and on another host "
         "a new path: rehost.py): this process's copy of the mesh's table follows, and so do "
         "copies it unpickles later (proc_table.note_move)."),
    Kind(BUF_READ, ("buffer_id", "reply"), EVERY_ROLE, EVERY_ROLE,
         "runtime.dataplane.buffers:TensorBuffer.__init__",
         "Send the buffer's bytes to ``reply`` (BUF_DONE); registered with the first buffer."),
    Kind(BUF_WRITE, ("buffer_id", "reply"), EVERY_ROLE, EVERY_ROLE,
         "runtime.dataplane.buffers:TensorBuffer.__init__",
         "Copy the one out-of-band buffer into the tensor, then BUF_DONE to ``reply``."),
    Kind(BUF_CUDA, ("buffer_id", "reply", "want_handle"), EVERY_ROLE, EVERY_ROLE,
         "runtime.dataplane.buffers:TensorBuffer.__init__",
         "A reader on the owner's GPU is about to copy through CUDA IPC: finish the work issued "
         "on the device, then BUF_DONE to ``reply`` (with an IPC handle if ``want_handle``)."),
    # -- host agent ------------------------------------------------------------------------------
    Kind(SPAWN_PROCS, ("mesh_id", "procs", "request"), (CONTROLLER,), (AGENT,),
         "runtime.procs.host_agent:Agent.__init__",
         "Start these ranks of mesh ``mesh_id`` (``procs``: one dict per rank) as the spawn "
         "request says; each reports READY, later EXIT."),
    Kind(REAP, ("mesh_id", "grace"), (CONTROLLER,), (AGENT,),
         "runtime.procs.host_agent:Agent.__init__",
         "The mesh is stopping: kill its workers still alive after ``grace`` seconds."),
    Kind(SIGNAL, ("mesh_id", "ranks", "signum"), (CONTROLLER,), (AGENT,),
         "runtime.procs.host_agent:Agent.__init__", "Send a signal to these ranks' processes."),
    Kind(SHUTDOWN, (), (CONTROLLER,), (AGENT,), "runtime.procs.host_agent:Agent.__init__",
         "Kill every worker of this host and exit."),
    Kind(DUMP, ("mesh_id", "rank", "reply", "index"), (CONTROLLER,), (AGENT,),
         "runtime.procs.host_agent:Agent.__init__",
         "A faulthandler dump of a rank wedged with the GIL held (SIGUSR1), answered as REPLY."),
    Kind(TUNNEL, ("tunnel_id", "op", "port?", "reply?"), (CONTROLLER,), (AGENT,),
         "runtime.messaging.tunnel:TunnelEnds.__init__",
         "A byte stream to a loopback port on the agent's host (the debugger reaching a rank's "
         "debugpy): op 'open' (port, reply), 'data' (payload), 'close'."),
    Kind(RELAY, ("mesh_id", "shape", "one_way", "envelope", "window"), (CONTROLLER, WORKER),
         (AGENT,), "runtime.meshes.relay:Relayer.__init__",
         "Fan ``envelope`` (CALL, SPAWN_ACTOR, STACKS, INTERRUPT) out to this host's ranks of "
         "the mesh in ``shape``; with a window, gather their replies into REPLIES."),
    Kind(HEARTBEAT, (), (CONTROLLER,), (AGENT,), "hosts.agent_main:RemoteAgent.__init__",
         "The controller is alive (a remote agent kills its workers when these stop)."),
    # -- controller ------------------------------------------------------------------------------
    Kind(AGENT_READY, ("host_rank", "address", "hostname"), (AGENT,), (CONTROLLER,),
         "runtime.procs.controller:Controller.__init__", "A host agent is up and listening."),
    Kind(READY, ("mesh_id", "rank", "pid", "tcp_port?"), (WORKER,), (CONTROLLER,),
         "runtime.procs.worker_reports:WorkerReports.__init__",
         "A worker is up (``tcp_port``: the port it bound, when it listens on TCP)."),
    Kind(EXIT, ("mesh_id", "rank", "pid", "exitcode", "signal", "stderr_tail", "reason?"),
         (AGENT,), (CONTROLLER,), "runtime.procs.worker_reports:WorkerReports.__init__",
         "A worker ended; its agent says how, with the last lines of its stderr (and why, when "
         "it knows: ``reason``, e.g. its fork server died)."),
    Kind(LOG, ("mailbox", "label", "stream", "text"), (WORKER,), (CONTROLLER,),
         "runtime.procs.worker_reports:WorkerReports.__init__",
         "Output a rank printed (sys.stdout/sys.stderr), labelled by rank."),
    Kind(FDLOG, ("mailbox", "label", "stream", "text"), (AGENT,), (CONTROLLER,),
         "runtime.procs.worker_reports:WorkerReports.__init__",
         "Output a rank wrote to its file descriptors 1/2 (C code, subprocesses), read by its "
         "agent."),
    Kind(UNHANDLED, ("mesh_id",), (WORKER,), (CONTROLLER,),
         "runtime.procs.worker_reports:WorkerReports.__init__",
         "An actor failed where nobody was waiting (a broadcast): the payload is the failure, "
         "for the fault hook."),
    Kind(OWNED, ("mesh_id", "rank", "owner"), (WORKER,), (CONTROLLER,),
         "runtime.procs.worker_reports:WorkerReports.__init__",
         "Rank ``rank`` of proc mesh ``mesh_id`` hosts an actor that the actor ``owner`` "
         "(ownership.Owner) spawned: if the rank is lost, that owner hears of it."),
    Kind(ACTOR_STOPPED, ("mesh_id", "rank", "key"), (WORKER,), (CONTROLLER,),
         "runtime.procs.worker_reports:WorkerReports.__init__",
         "The actor of mesh ``key`` on rank ``rank`` of proc mesh ``mesh_id`` was stopped "
         "(ActorMesh.stop, from any process): ``heal()`` does not bring it back."),
    Kind(SINGLETON, ("name", "reply"), (CONTROLLER, WORKER), (CONTROLLER,),
         "runtime.procs.singletons:_install",
         "get_or_spawn_controller: the actor named ``name`` of the root controller, spawned "
         "there from the payload (class, args, kwargs) if it is not yet; passed on by a "
         "controller that is a worker. The ActorMesh goes in a REPLY to ``reply``."),
    Kind(AGENT_HEARTBEAT, ("host_rank",), (AGENT,), (CONTROLLER,),
         "hosts.listener:HostListener.__init__", "A remote host agent is alive."),
    Kind(DEBUGGER, ("event", "mesh_id", "rank", "where"), (WORKER,), (CONTROLLER,),
         "debugger.session:_install_handler",
         "A rank stopped in the debugger (``breakpoint()``, a breakpoint, a pause)."),
    Kind(METRICS, ("mesh_id", "rank", "calls"), (WORKER,), (CONTROLLER,),
         "runtime.procs.worker_reports:WorkerReports.__init__",
         "Training metrics a rank logged (``log_metrics``), batched on the rank: calls are "
         "(step, time, names, values), one per call (``metrics.py``)."),
    Kind(RESOURCES, ("time", "samples"), (AGENT,), (CONTROLLER,),
         "runtime.procs.worker_reports:WorkerReports.__init__",
         "A host agent's once-a-second sample of its workers: samples are (mesh_id, rank, cpu "
         "%, rss bytes, GPU memory bytes or None, GPU utilisation % or None) "
         "(``procs/sampling.py``)."),
]  # fmt: skip

KINDS: dict[str, Kind] = {k.name: k for k in _TABLE}

# The test suite turns this on: every envelope sent is checked against the table.
CHECK = os.environ.get("ACTORMESH_CHECK_PROTOCOL") == "1"


class ProtocolError(Exception):
    """An envelope that the protocol table does not allow (a runtime bug, never the user's)."""


def check_envelope(envelope: tuple[Any, ...]) -> None:
    """Raise :class:`ProtocolError` unless ``envelope`` is a known kind with its fields."""
    kind = KINDS.get(envelope[0]) if envelope else None
    if kind is None:
        raise ProtocolError(f"unknown message kind in {envelope!r:.200}: see protocol.py")
    least, most = kind.arity
    if not least <= len(envelope) - 1 <= most:
        raise ProtocolError(
            f"a {kind.name!r} message has the fields {kind.fields}, got {len(envelope) - 1}: "
            f"{envelope!r:.200}"
        )


# -- the envelopes by field name ---------------------------------------------------------------
# envelopes.py holds one NamedTuple per kind, generated from the table above: a handler reads
# ``CallEnvelope.of(msg).endpoint``, never ``msg.envelope[2]``. Envelopes stay plain tuples on
# the wire (they pickle fastest); ``of`` gives the tuple its field names where it is read.
# tests/unit/test_protocol.py checks that envelopes.py is what this writes.


def class_name(kind: Kind) -> str:
    """``SPAWN_ACTOR`` -> ``SpawnActorEnvelope``: the envelope class of a kind."""
    constant = next(k for k, v in globals().items() if k.isupper() and v == kind.name)
    return "".join(part.capitalize() for part in constant.split("_")) + "Envelope"


# -- field forms -----------------------------------------------------------------------------


class ReplyTo(NamedTuple):
    """A ``reply`` field, read by name: the caller's inbox (an ``Address`` as a tuple), its
    port, and ``after``: the caller's process mailbox when the answer travels by another route
    than what this process sends that process directly (see ``Node.in_order``), else None.
    Senders build it as the plain tuple ``(address, port_id[, after])``."""

    address: tuple[Any, ...]
    port_id: int
    after: bytes | None = None

    @classmethod
    def read(cls, reply: tuple[Any, ...]) -> ReplyTo:
        return _new(cls, reply if len(reply) == 3 else (*reply, None))


_new = tuple.__new__


def shape_state(shape: Shape) -> tuple[Any, ...]:
    """A Shape as plain tuples (cheap to pickle); :func:`shape_from_state` undoes it."""
    mapping = shape.mapping
    if mapping is None:
        return (shape.labels, shape.offset, shape.sizes, shape.strides)
    return (shape.labels, shape.offset, shape.sizes, shape.strides, mapping)


_shapes: dict[tuple[Any, ...], Shape] = {}


def shape_from_state(state: tuple[Any, ...]) -> Shape:
    shape = _shapes.get(state)
    if shape is None:
        if len(_shapes) > 4096:
            _shapes.clear()
        from ..shape import unchecked_shape  # once per new shape: see the top of the file

        shape = _shapes[state] = unchecked_shape(*state)
    return shape

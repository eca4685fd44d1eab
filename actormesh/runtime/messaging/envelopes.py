"""Every message kind's envelope by field name, generated from the table in
``protocol.py`` by ``scripts/write_envelopes.py``: do not edit.

A handler reads ``CallEnvelope.of(msg).endpoint``, not ``msg.envelope[2]``; ``read`` does
the same for an envelope that is not (yet) a message (one a relay passes on): the
envelope's fields as the kind's ``NamedTuple``, optional trailing fields that it leaves
out as ``None``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from .codec import Message

_new = tuple.__new__
_PADS = ((), (None,), (None, None), (None, None, None))  # for missing optional fields


class ReplyEnvelope(NamedTuple):
    """'reply': The answer of one rank to a call, spawn, stack dump or interrupt; the payload is
    the value (status OK) or the rendered failure (FAILED). ``after``: when the reply took
    another route than the rank's earlier messages to the caller's process, the sequence number
    of the last of them, handled first (see Node.in_order). ``datagrams``: on a reply to a
    reply inbox that went through the process inbox instead, the sequence number of its
    sender's last datagram to that inbox, which is handled first (Node._on_reply)."""

    kind: str
    port_id: Any
    index: Any
    status: Any
    after: Any = None
    datagrams: Any = None

    @classmethod
    def of(cls, msg: Message) -> ReplyEnvelope:
        env = msg.envelope
        if len(env) < 6:
            env += _PADS[6 - len(env)]
        return _new(cls, env)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> ReplyEnvelope:
        env = envelope
        if len(env) < 6:
            env += _PADS[6 - len(env)]
        return _new(cls, env)


class RepliesEnvelope(NamedTuple):
    """'replies': Several REPLY of one host, gathered by its agent's relay: items are (port_id,
    sender, index, status, after, payload size, buffer count); payloads follow, concatenated."""

    kind: str
    items: Any

    @classmethod
    def of(cls, msg: Message) -> RepliesEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> RepliesEnvelope:
        return _new(cls, envelope)


class PortEnvelope(NamedTuple):
    """'port': A value sent to an open port (Port.send, tunnel data back to the controller);
    ``rank``: the sender's rank in the slice that messaged it, or None; ``status`` 1: the
    payload is a rendered failure (Port.exception)."""

    kind: str
    port_id: Any
    rank: Any = None
    status: Any = None

    @classmethod
    def of(cls, msg: Message) -> PortEnvelope:
        env = msg.envelope
        if len(env) < 4:
            env += _PADS[4 - len(env)]
        return _new(cls, env)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> PortEnvelope:
        env = envelope
        if len(env) < 4:
            env += _PADS[4 - len(env)]
        return _new(cls, env)


class DiedEnvelope(NamedTuple):
    """'died': A process died: fail what waits on it (ports, calls in flight)."""

    kind: str
    mailbox: Any
    death: Any

    @classmethod
    def of(cls, msg: Message) -> DiedEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> DiedEnvelope:
        return _new(cls, envelope)


class RevivedEnvelope(NamedTuple):
    """'revived': A healed rank answers again at that mailbox: forget its death."""

    kind: str
    mailbox: Any

    @classmethod
    def of(cls, msg: Message) -> RevivedEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> RevivedEnvelope:
        return _new(cls, envelope)


class BatchEnvelope(NamedTuple):
    """'batch': Back-to-back one-way messages to one process, signed once: items are (envelope,
    payload) (Transport.send_one_way)."""

    kind: str
    items: Any

    @classmethod
    def of(cls, msg: Message) -> BatchEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> BatchEnvelope:
        return _new(cls, envelope)


class BufDoneEnvelope(NamedTuple):
    """'buf_done': A TensorBuffer owner's answer to BUF_READ (the bytes as one buffer), BUF_WRITE
    or BUF_CUDA (a pickled CUDA IPC handle as one buffer, when asked for)."""

    kind: str
    port_id: Any
    ok: Any
    error: Any

    @classmethod
    def of(cls, msg: Message) -> BufDoneEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> BufDoneEnvelope:
        return _new(cls, envelope)


class SpawnActorEnvelope(NamedTuple):
    """'spawn_actor': Make the actor of mesh ``key`` here; the payload is (class, args, kwargs).
    ``shape`` is the actor mesh's Shape, a REPLY for ``__init__`` goes to ``reply``. ``owner``:
    the actor that spawned it (ownership.Owner), None when the script did."""

    kind: str
    key: Any
    name: Any
    shape: Any
    reply: Any
    owner: Any = None

    @classmethod
    def of(cls, msg: Message) -> SpawnActorEnvelope:
        env = msg.envelope
        if len(env) < 6:
            env += _PADS[6 - len(env)]
        return _new(cls, env)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> SpawnActorEnvelope:
        env = envelope
        if len(env) < 6:
            env += _PADS[6 - len(env)]
        return _new(cls, env)


class SuperviseEnvelope(NamedTuple):
    """'supervise': A failure nobody handled, of an actor mesh that the actor ``owner`` (a key) of
    this process spawned: for its ``__supervise__``. The payload is the failure."""

    kind: str
    owner: Any

    @classmethod
    def of(cls, msg: Message) -> SuperviseEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> SuperviseEnvelope:
        return _new(cls, envelope)


class CallEnvelope(NamedTuple):
    """'call': Call an endpoint of actor mesh ``key``; the payload is (args, kwargs). ``shape``
    (as shape_state) says which ranks the cast reaches, ``reply`` where the REPLY goes (None: a
    broadcast). Calls on the same host usually go straight to the actor's own socket."""

    kind: str
    key: Any
    endpoint: Any
    shape: Any
    reply: Any

    @classmethod
    def of(cls, msg: Message) -> CallEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> CallEnvelope:
        return _new(cls, envelope)


class StopActorEnvelope(NamedTuple):
    """'stop_actor': Stop the actor of mesh ``key`` here (ActorMesh.stop): it runs
    ``__cleanup__(None)`` and then fails every call; a REPLY goes to ``reply`` once it has."""

    kind: str
    key: Any
    shape: Any
    reply: Any

    @classmethod
    def of(cls, msg: Message) -> StopActorEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> StopActorEnvelope:
        return _new(cls, envelope)


class StopEnvelope(NamedTuple):
    """'stop': Stop the actors (each gets the stop grace period) and exit."""

    kind: str

    @classmethod
    def of(cls, msg: Message) -> StopEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> StopEnvelope:
        return _new(cls, envelope)


class StacksEnvelope(NamedTuple):
    """'stacks': Answer with this process's stacks as text (the I/O thread answers; a busy actor
    does not delay it)."""

    kind: str
    shape: Any
    reply: Any

    @classmethod
    def of(cls, msg: Message) -> StacksEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> StacksEnvelope:
        return _new(cls, envelope)


class WaitsEnvelope(NamedTuple):
    """'waits': Answer (a REPLY) with the calls this process's actors are blocked on in
    Future.get: (actor, endpoint, [(mesh_id, rank), ...]) each; a timeout looks for a wait
    cycle."""

    kind: str
    reply: Any

    @classmethod
    def of(cls, msg: Message) -> WaitsEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> WaitsEnvelope:
        return _new(cls, envelope)


class InterruptEnvelope(NamedTuple):
    """'interrupt': KeyboardInterrupt in every actor busy in an endpoint."""

    kind: str

    @classmethod
    def of(cls, msg: Message) -> InterruptEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> InterruptEnvelope:
        return _new(cls, envelope)


class MovedEnvelope(NamedTuple):
    """'moved': A healed rank of a mesh this process talks to lives at a new address (rehost.py)."""

    kind: str
    mesh_id: Any
    rank: Any
    address: Any
    relay: Any

    @classmethod
    def of(cls, msg: Message) -> MovedEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> MovedEnvelope:
        return _new(cls, envelope)


class BufReadEnvelope(NamedTuple):
    """'buf_read': Send the buffer's bytes to ``reply`` (BUF_DONE); registered with the first
    buffer."""

    kind: str
    buffer_id: Any
    reply: Any

    @classmethod
    def of(cls, msg: Message) -> BufReadEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> BufReadEnvelope:
        return _new(cls, envelope)


class BufWriteEnvelope(NamedTuple):
    """'buf_write': Copy the one out-of-band buffer into the tensor, then BUF_DONE to ``reply``."""

    kind: str
    buffer_id: Any
    reply: Any

    @classmethod
    def of(cls, msg: Message) -> BufWriteEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> BufWriteEnvelope:
        return _new(cls, envelope)


class BufCudaEnvelope(NamedTuple):
    """'buf_cuda': A reader on the owner's GPU is about to copy through CUDA IPC: finish the work
    issued on the device, then BUF_DONE to ``reply`` (with an IPC handle if ``want_handle``)."""

    kind: str
    buffer_id: Any
    reply: Any
    want_handle: Any

    @classmethod
    def of(cls, msg: Message) -> BufCudaEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> BufCudaEnvelope:
        return _new(cls, envelope)


class SpawnProcsEnvelope(NamedTuple):
    """'spawn_procs': Start these ranks of mesh ``mesh_id`` (``procs``: one dict per rank) as the
    spawn request says; each reports READY, later EXIT."""

    kind: str
    mesh_id: Any
    procs: Any
    request: Any

    @classmethod
    def of(cls, msg: Message) -> SpawnProcsEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> SpawnProcsEnvelope:
        return _new(cls, envelope)


class ReapEnvelope(NamedTuple):
    """'reap': The mesh is stopping: kill its workers still alive after ``grace`` seconds."""

    kind: str
    mesh_id: Any
    grace: Any

    @classmethod
    def of(cls, msg: Message) -> ReapEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> ReapEnvelope:
        return _new(cls, envelope)


class SignalEnvelope(NamedTuple):
    """'signal': Send a signal to these ranks' processes."""

    kind: str
    mesh_id: Any
    ranks: Any
    signum: Any

    @classmethod
    def of(cls, msg: Message) -> SignalEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> SignalEnvelope:
        return _new(cls, envelope)


class ShutdownEnvelope(NamedTuple):
    """'shutdown': Kill every worker of this host and exit."""

    kind: str

    @classmethod
    def of(cls, msg: Message) -> ShutdownEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> ShutdownEnvelope:
        return _new(cls, envelope)


class DumpEnvelope(NamedTuple):
    """'dump': A faulthandler dump of a rank wedged with the GIL held (SIGUSR1), answered as
    REPLY."""

    kind: str
    mesh_id: Any
    rank: Any
    reply: Any
    index: Any

    @classmethod
    def of(cls, msg: Message) -> DumpEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> DumpEnvelope:
        return _new(cls, envelope)


class TunnelEnvelope(NamedTuple):
    """'tunnel': A byte stream to a loopback port on the agent's host (the debugger reaching a
    rank's debugpy): op 'open' (port, reply), 'data' (payload), 'close'."""

    kind: str
    tunnel_id: Any
    op: Any
    port: Any = None
    reply: Any = None

    @classmethod
    def of(cls, msg: Message) -> TunnelEnvelope:
        env = msg.envelope
        if len(env) < 5:
            env += _PADS[5 - len(env)]
        return _new(cls, env)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> TunnelEnvelope:
        env = envelope
        if len(env) < 5:
            env += _PADS[5 - len(env)]
        return _new(cls, env)


class RelayEnvelope(NamedTuple):
    """'relay': Fan ``envelope`` (CALL, SPAWN_ACTOR, STACKS, INTERRUPT) out to this host's ranks
    of the mesh in ``shape``; with a window, gather their replies into REPLIES."""

    kind: str
    mesh_id: Any
    shape: Any
    one_way: Any
    envelope: Any
    window: Any

    @classmethod
    def of(cls, msg: Message) -> RelayEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> RelayEnvelope:
        return _new(cls, envelope)


class HeartbeatEnvelope(NamedTuple):
    """'hb': The controller is alive (a remote agent kills its workers when these stop)."""

    kind: str

    @classmethod
    def of(cls, msg: Message) -> HeartbeatEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> HeartbeatEnvelope:
        return _new(cls, envelope)


class AgentReadyEnvelope(NamedTuple):
    """'agent_ready': A host agent is up and listening."""

    kind: str
    host_rank: Any
    address: Any
    hostname: Any

    @classmethod
    def of(cls, msg: Message) -> AgentReadyEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> AgentReadyEnvelope:
        return _new(cls, envelope)


class ReadyEnvelope(NamedTuple):
    """'ready': A worker is up (``tcp_port``: the port it bound, when it listens on TCP)."""

    kind: str
    mesh_id: Any
    rank: Any
    pid: Any
    tcp_port: Any = None

    @classmethod
    def of(cls, msg: Message) -> ReadyEnvelope:
        env = msg.envelope
        if len(env) < 5:
            env += _PADS[5 - len(env)]
        return _new(cls, env)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> ReadyEnvelope:
        env = envelope
        if len(env) < 5:
            env += _PADS[5 - len(env)]
        return _new(cls, env)


class ExitEnvelope(NamedTuple):
    """'exit': A worker ended; its agent says how, with the last lines of its stderr (and why,
    when it knows: ``reason``, e.g. its fork server died)."""

    kind: str
    mesh_id: Any
    rank: Any
    pid: Any
    exitcode: Any
    signal: Any
    stderr_tail: Any
    reason: Any = None

    @classmethod
    def of(cls, msg: Message) -> ExitEnvelope:
        env = msg.envelope
        if len(env) < 8:
            env += _PADS[8 - len(env)]
        return _new(cls, env)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> ExitEnvelope:
        env = envelope
        if len(env) < 8:
            env += _PADS[8 - len(env)]
        return _new(cls, env)


class LogEnvelope(NamedTuple):
    """'log': Output a rank printed (sys.stdout/sys.stderr), labelled by rank."""

    kind: str
    mailbox: Any
    label: Any
    stream: Any
    text: Any

    @classmethod
    def of(cls, msg: Message) -> LogEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> LogEnvelope:
        return _new(cls, envelope)


class FdlogEnvelope(NamedTuple):
    """'fdlog': Output a rank wrote to its file descriptors 1/2 (C code, subprocesses), read by
    its agent."""

    kind: str
    mailbox: Any
    label: Any
    stream: Any
    text: Any

    @classmethod
    def of(cls, msg: Message) -> FdlogEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> FdlogEnvelope:
        return _new(cls, envelope)


class UnhandledEnvelope(NamedTuple):
    """'unhandled': An actor failed where nobody was waiting (a broadcast): the payload is the
    failure, for the fault hook."""

    kind: str
    mesh_id: Any

    @classmethod
    def of(cls, msg: Message) -> UnhandledEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> UnhandledEnvelope:
        return _new(cls, envelope)


class OwnedEnvelope(NamedTuple):
    """'owned': Rank ``rank`` of proc mesh ``mesh_id`` hosts an actor that the actor ``owner``
    (ownership.Owner) spawned: if the rank is lost, that owner hears of it."""

    kind: str
    mesh_id: Any
    rank: Any
    owner: Any

    @classmethod
    def of(cls, msg: Message) -> OwnedEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> OwnedEnvelope:
        return _new(cls, envelope)


class ActorStoppedEnvelope(NamedTuple):
    """'actor_stopped': The actor of mesh ``key`` on rank ``rank`` of proc mesh ``mesh_id`` was
    stopped (ActorMesh.stop, from any process): ``heal()`` does not bring it back."""

    kind: str
    mesh_id: Any
    rank: Any
    key: Any

    @classmethod
    def of(cls, msg: Message) -> ActorStoppedEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> ActorStoppedEnvelope:
        return _new(cls, envelope)


class SingletonEnvelope(NamedTuple):
    """'singleton': get_or_spawn_controller: the actor named ``name`` of the root controller,
    spawned there from the payload (class, args, kwargs) if it is not yet; passed on by a
    controller that is a worker. The ActorMesh goes in a REPLY to ``reply``."""

    kind: str
    name: Any
    reply: Any

    @classmethod
    def of(cls, msg: Message) -> SingletonEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> SingletonEnvelope:
        return _new(cls, envelope)


class AgentHeartbeatEnvelope(NamedTuple):
    """'agent_hb': A remote host agent is alive."""

    kind: str
    host_rank: Any

    @classmethod
    def of(cls, msg: Message) -> AgentHeartbeatEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> AgentHeartbeatEnvelope:
        return _new(cls, envelope)


class DebuggerEnvelope(NamedTuple):
    """'debugger': A rank stopped in the debugger (``breakpoint()``, a breakpoint, a pause)."""

    kind: str
    event: Any
    mesh_id: Any
    rank: Any
    where: Any

    @classmethod
    def of(cls, msg: Message) -> DebuggerEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> DebuggerEnvelope:
        return _new(cls, envelope)


class MetricsEnvelope(NamedTuple):
    """'metrics': Training metrics a rank logged (``log_metrics``), batched on the rank: calls are
    (step, time, names, values), one per call (``metrics.py``)."""

    kind: str
    mesh_id: Any
    rank: Any
    calls: Any

    @classmethod
    def of(cls, msg: Message) -> MetricsEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> MetricsEnvelope:
        return _new(cls, envelope)


class ResourcesEnvelope(NamedTuple):
    """'resources': A host agent's once-a-second sample of its workers: samples are (mesh_id,
    rank, cpu %, rss bytes, GPU memory bytes or None, GPU utilisation % or None)
    (``procs/sampling.py``)."""

    kind: str
    time: Any
    samples: Any

    @classmethod
    def of(cls, msg: Message) -> ResourcesEnvelope:
        return _new(cls, msg.envelope)

    @classmethod
    def read(cls, envelope: tuple[Any, ...]) -> ResourcesEnvelope:
        return _new(cls, envelope)


def kind_of(envelope: tuple[Any, ...]) -> str:
    """The kind of an envelope that is not (yet) a message (one a relay passes on): its
    first field, in every kind (a message has it as ``Message.kind``)."""
    return envelope[0]  # type: ignore[no-any-return]


def port_id_of(msg: Message) -> Any:
    """The port a message goes to (Node.to_port): the first field of reply, port, buf_done."""
    return msg.envelope[1]

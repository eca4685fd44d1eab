"""The controller's side of remote hosts: registration, heartbeats, and host meshes built from
agents that dialled in.

``listen_for_hosts()`` makes the controller reachable over tcp:// and starts a registration
thread that owns one ROUTER socket (agents' hellos arrive there; see ``handshake``). A registered
agent becomes a ``RemoteAgentHandle`` in the controller's agent list, exactly like the local
agent except for how its death is noticed: not a pipe, but heartbeats. Every ``HOST_HEARTBEAT``
seconds the controller's I/O thread sends each agent a heartbeat and checks when it last heard
from it; after ``HOST_DEADLINE`` seconds of silence the host is lost and every rank on it fails
with a ``SupervisionError`` naming the host. The agent does the same the other way round.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq
from zmq import EVENT_ACCEPTED, EVENT_DISCONNECTED
from zmq.utils.monitor import recv_monitor_message

from .. import config
from ..errors import MeshTimeoutError, MeshUsageError
from ..runtime.messaging import Message, curve_keys
from ..runtime.messaging.envelopes import AgentHeartbeatEnvelope
from ..runtime.messaging.protocol import AGENT_HEARTBEAT, HEARTBEAT, SHUTDOWN
from ..runtime.procs import AgentHandle, Controller, HostMesh, get_controller, new_host_mesh
from ..runtime.shape import Shape
from . import handshake
from .netif import is_wildcard, split_host_port

logger = logging.getLogger(__name__)

# Connections to the listener at once before it sheds them all (registrations are brief).
MAX_PEERS = 64


class RemoteAgentHandle(AgentHandle):
    """A host agent that dialled in from another host; watched through heartbeats."""

    def __init__(self, host_rank: int, name: str, run_dir: str, info: dict[str, Any]) -> None:
        super().__init__(host_rank, None, None)
        self.name = name
        self.run_dir = run_dir
        self.info = info
        self.last_seen = time.monotonic()
        self.taken = False  # handed out in a HostMesh already
        self.closing = False

    def __repr__(self) -> str:
        return f"<host agent {self.name}{' (dead)' if self.dead else ''}>"

    def close(self, timeout: float = 3.0) -> None:
        """Tell the agent to kill its workers and exit (it also does when heartbeats stop)."""
        if self.closing or self.dead or self.address is None:
            return
        self.closing = True
        try:
            get_controller().node.send(self.address, (SHUTDOWN,))
        except Exception:
            logger.debug("could not send shutdown to %s", self.name, exc_info=True)


def curve_wanted() -> bool:
    setting = config.CURVE
    if setting in ("0", "off", "false", "no"):
        return False
    if setting not in ("auto", "1", "on", "true", "yes"):
        raise MeshUsageError(f"ACTORMESH_CURVE={setting!r}: use auto, 1 or 0")
    return True


class HostListener:
    """Where host agents dial in. Made by :func:`listen_for_hosts`; not constructed by users.

    ``address`` is what an agent gets as ``--connect``; ``agent_command()`` the whole command.
    """

    def __init__(
        self, ctl: Controller, bind: str, advertise: str | None, encrypt: bool | None
    ) -> None:
        host, port = split_host_port(bind, 29500)
        if advertise is None:
            advertise = config.ADVERTISE or (host if not is_wildcard(host) else _own_address())
        self.ctl = ctl
        self.encrypt = curve_wanted() if encrypt is None else encrypt
        keys = curve_keys(ctl.key) if self.encrypt else None
        if ctl.node.address.tcp is None:
            ctl.node.listen_tcp(host if not is_wildcard(host) else "*", advertise, keys)
        # Workers spawned on this host from now on listen on tcp:// too (at the advertised
        # address, which must be this machine's), so remote actors can call and answer them.
        ctl.local_tcp = {"tcp_host": advertise, "curve": self.encrypt}
        ctl.find_spare = self.take_spare
        self._ctx = zmq.Context()
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        # Anyone who can reach this port can send before any signature is checked: ZeroMQ
        # drops the connection of a frame larger than a hello, before allocating it. (The
        # tcp:// inboxes cannot be bounded so: a signed message carries tensors of any size as
        # frames. Curve keeps peers without the key from sending them anything; without
        # Curve, ACTORMESH_CURVE=0, one who can connect can make a process allocate a frame.)
        self._router.setsockopt(zmq.MAXMSGSIZE, handshake.MAX_FRAME)
        where = "*" if is_wildcard(host) else host
        if port:
            self._router.bind(f"tcp://{where}:{port}")
        else:
            port = self._router.bind_to_random_port(f"tcp://{where}")
        self.address = f"tcp://{advertise}:{port}"
        self._endpoint = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._peers = 0
        self._monitor = self._router.get_monitor_socket(EVENT_ACCEPTED | EVENT_DISCONNECTED)
        self.agents: list[RemoteAgentHandle] = []
        self._seen_nonces: set[str] = set()
        self._changed = threading.Condition()
        self._closed = False
        self.heartbeat = config.HOST_HEARTBEAT
        self.deadline = config.HOST_DEADLINE
        ctl.node.register(AGENT_HEARTBEAT, self._on_agent_hb)
        self._thread = threading.Thread(target=self._serve, name="actormesh-hosts", daemon=True)
        self._thread.start()
        transport = ctl.node.transport
        transport.call_soon(lambda: transport.call_later(self.heartbeat, self._tick))
        atexit.register(self.close)
        logger.info("listening for host agents on %s", self.address)

    def __repr__(self) -> str:
        return f"<HostListener {self.address}: {len(self.live())} hosts>"

    # -- what agents need ------------------------------------------------------------------------

    def agent_command(self, python: str | None = None) -> list[str]:
        """The command that starts a host agent dialling this controller (key not included)."""
        return [python or sys.executable, "-m", "actormesh", "host", "--connect", self.address]

    def write_key_file(self, path: str) -> str:
        """Write the job key (hex, mode 0600) where agents can read it (ACTORMESH_KEY_FILE)."""
        return write_key_file(path, self.ctl.key)

    def agent_env(self) -> dict[str, str]:
        """Environment that gives an agent the job key (for schedulers that pass environments)."""
        return {"ACTORMESH_KEY": self.ctl.key.hex()}

    # -- host meshes -----------------------------------------------------------------------------

    def live(self) -> list[RemoteAgentHandle]:
        return [a for a in self.agents if not a.dead]

    def wait_for_hosts(
        self,
        n: int,
        timeout: float | None = None,
        where: Callable[[dict[str, Any]], bool] | None = None,
    ) -> HostMesh:
        """Wait until ``n`` agents not yet in a host mesh have registered and started; return them
        as a host mesh of extent ``{hosts: n}``, ordered by host name, then address (the first
        ``n`` to register are taken).

        Blocks (user thread) at most ``timeout`` seconds (default ``ACTORMESH_SPAWN_TIMEOUT``)
        and raises ``MeshTimeoutError`` saying how many arrived. ``where`` picks agents by what
        they said when registering (e.g. their Slurm job id).
        """
        if not isinstance(n, int) or n < 1:
            raise MeshUsageError(f"wait_for_hosts needs a positive number of hosts, got {n!r}")
        timeout = config.SPAWN_TIMEOUT if timeout is None else timeout
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                free = [
                    a
                    for a in self.agents
                    if not a.taken
                    and not a.dead
                    and a.ready.done()
                    and (where is None or where(a.info))
                ]
                if len(free) >= n:
                    chosen = sorted(free[:n], key=_host_order)
                    for a in chosen:
                        a.taken = True
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MeshTimeoutError(
                        f"{len(free)} of {n} host agents dialled in to {self.address} within "
                        f"{timeout:.0f} s; check that they were started with --connect "
                        f"{self.address} and the job key, and can reach this address"
                    )
                self._changed.wait(min(left, 0.5))
        return new_host_mesh(self.ctl, list(chosen), Shape.from_extent({"hosts": n}))

    def take_spare(self) -> RemoteAgentHandle | None:
        """A started agent in no host mesh yet (for healing a lost host), now taken; or None."""
        with self._changed:
            for agent in sorted(self.agents, key=_host_order):
                started = agent.ready.done() and agent.ready.exception() is None
                if started and not agent.taken and not agent.dead:
                    agent.taken = True
                    return agent
        return None

    # -- registration thread ---------------------------------------------------------------------

    def _serve(self) -> None:
        router = self._router
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        while not self._closed:
            try:
                events = dict(poller.poll(200))
                if self._monitor in events:
                    self._count_peers()
                if router not in events:
                    continue
                frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                if self._closed:
                    return
                raise
            ident, body = frames[0], frames[1:]
            try:
                info = handshake.check_hello(self.ctl.key, body, self._seen_nonces)
            except (handshake.HandshakeError, ValueError, KeyError) as exc:
                logger.warning("refused a host agent: %s", exc)
                router.send_multipart([ident, handshake.REFUSED, str(exc).encode()])
                continue
            agent = self._register(info)
            answer = {
                "host_rank": agent.host_rank,
                "controller": _address_json(self.ctl.node.address),
                "curve": self.encrypt,
                "heartbeat": self.heartbeat,
                "deadline": self.deadline,
                "preload": config.PRELOAD,
                "start_method": config.START_METHOD,
                "worker_sched": config.WORKER_SCHED,
            }
            router.send_multipart([ident, *handshake.welcome(self.ctl.key, info["nonce"], answer)])

    def _count_peers(self) -> None:
        """Shed every connection when too many are open: agents register on short ones, so
        many means someone without the key holds them, and each costs this process a file.
        Rebinding ends the connections the listener accepted (ZeroMQ owns them through it)."""
        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)["event"]
            self._peers = self._peers + 1 if event == EVENT_ACCEPTED else max(0, self._peers - 1)
        if self._peers >= MAX_PEERS:
            logger.warning(
                "%d connections to the host listener and no registration: dropping them all",
                self._peers,
            )
            self._router.unbind(self._endpoint)
            self._router.bind(self._endpoint)
            self._peers = 0

    def _register(self, info: dict[str, Any]) -> RemoteAgentHandle:
        agent = self.ctl.add_agent(
            lambda host_rank: RemoteAgentHandle(host_rank, str(info["name"]), info["run_dir"], info)
        )
        agent.ready.add_done_callback(lambda _: self._notify())
        with self._changed:
            self.agents.append(agent)
        logger.info("host agent %s registered as host %d", agent.name, agent.host_rank)
        return agent

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    # -- heartbeats (controller's I/O thread) ----------------------------------------------------

    def _on_agent_hb(self, msg: Message) -> None:
        host_rank = AgentHeartbeatEnvelope.of(msg).host_rank
        agents = self.ctl.agents
        if 0 <= host_rank < len(agents):
            agent = agents[host_rank]
            if isinstance(agent, RemoteAgentHandle):
                agent.last_seen = time.monotonic()

    def _tick(self) -> None:
        if self._closed:
            return
        node = self.ctl.node
        now = time.monotonic()
        for agent in list(self.agents):
            if agent.dead or agent.closing:
                continue
            silent = now - agent.last_seen
            if silent > self.deadline:
                self._lose(agent, f"no heartbeat from host {agent.name} for {silent:.1f} s")
                continue
            if agent.address is not None:
                node.send(agent.address, (HEARTBEAT,))
        node.transport.call_later(self.heartbeat, self._tick)

    def _lose(self, agent: RemoteAgentHandle, why: str) -> None:
        logger.warning("lost %s", why)
        self.ctl.lose_agent(
            agent, f"host {agent.name} was lost: {why}", f"host {agent.name} was lost ({why})"
        )
        if agent.address is not None:
            self.ctl.node.transport.forget(agent.address)
        self._notify()

    # -- closing ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Tell every agent to exit (killing its workers) and stop listening. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for agent in self.agents:
            agent.close()
        self._thread.join(timeout=2)
        self._router.disable_monitor()
        self._monitor.close(linger=0)
        self._router.close(linger=0)
        self._ctx.term()


def _host_order(agent: RemoteAgentHandle) -> tuple[str, tuple[int, ...], str]:
    address = str(agent.info.get("address", ""))
    parts = tuple(int(p) for p in address.split(".") if p.isdigit())
    return (str(agent.info.get("hostname", "")), parts, address)


def _address_json(a: Any) -> list[Any]:
    return [a.host, a.ipc, a.tcp, a.mailbox.hex()]


def _own_address() -> str:
    try:
        ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        ip = "127.0.0.1"
    if ip.startswith("127."):
        logger.warning(
            "this host's name resolves to %s: agents on other hosts cannot reach it; pass "
            "advertise= to listen_for_hosts() or set ACTORMESH_ADVERTISE",
            ip,
        )
    return ip


def write_key_file(path: str, key: bytes | None = None) -> str:
    """Write the job key (hex) to ``path`` with mode 0600; returns the path."""
    key = get_controller().key if key is None else key
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key.hex() + "\n")
    return path


_listener: HostListener | None = None
_listener_lock = threading.Lock()


def listen_for_hosts(
    address: str | None = None, advertise: str | None = None, encrypt: bool | None = None
) -> HostListener:
    """Let host agents on other machines dial in to this controller (idempotent).

    ``address`` is ``HOST:PORT`` to listen on (default ``ACTORMESH_LISTEN``, ``0.0.0.0:29500``;
    port 0 picks a free one); ``advertise`` is the address agents reach it at (default the
    listening address, or this machine's resolved name). Cross-host traffic is encrypted with
    CurveZMQ unless ``encrypt=False`` or ``ACTORMESH_CURVE=0``.
    """
    global _listener
    with _listener_lock:
        if _listener is None or _listener._closed:  # noqa: SLF001  same module's singleton
            _listener = HostListener(
                get_controller(), address or config.HOST_LISTEN, advertise, encrypt
            )
        return _listener


def wait_for_hosts(n: int, timeout: float | None = None, listen: str | None = None) -> HostMesh:
    """Wait for ``n`` host agents started by any scheduler (Kubernetes, ssh, torchx...) to dial
    in, and return them as a ``HostMesh`` of extent ``{hosts: n}``.

    Each agent runs ``python -m actormesh host --connect ADDR`` with the job key in
    ``ACTORMESH_KEY_FILE`` (or ``ACTORMESH_KEY``). Blocks at most ``timeout`` seconds.
    """
    return listen_for_hosts(listen).wait_for_hosts(n, timeout)

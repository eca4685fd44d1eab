"""``python -m actormesh host --connect ADDR``: the host agent that a scheduler starts on each
machine (Slurm's srun, a Kubernetes pod, ssh...).

It reads the job key from ``--key-file``, ``ACTORMESH_KEY_FILE`` or ``ACTORMESH_KEY`` (never
from the command line, which other users can read), dials the controller, registers its host
(see ``handshake``), and from then on does for its machine what the local agent does: spawn and
reap workers, relay signals, forward output, dump stacks. It exchanges heartbeats with the
controller; when the controller's stop for longer than the deadline (the controller exited, or
the link is cut), it kills its workers and exits, so nothing is left behind on the host.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import sys
import threading
import time
from typing import Any

import zmq

from ..runtime.meshes import Relayer
from ..runtime.messaging import (
    Address,
    Message,
    Node,
    Transport,
    curve_keys,
    make_run_dir,
    read_key_file,
    set_node,
)
from ..runtime.messaging.envelopes import SpawnProcsEnvelope
from ..runtime.messaging.protocol import AGENT_HEARTBEAT, AGENT_READY, HEARTBEAT
from ..runtime.procs.host_agent import Agent
from . import handshake
from .netif import interface_of, source_address, split_host_port

logger = logging.getLogger("actormesh.hosts.agent")


class RemoteAgent(Agent):
    """The local agent's work, plus heartbeats and the environment a multi-host job needs."""

    def __init__(self, node: Node, init: dict[str, Any]) -> None:
        super().__init__(node, init)
        self.last_heartbeat = time.monotonic()
        node.register(HEARTBEAT, self._on_heartbeat)
        self.relayer = Relayer(node)
        # torch.distributed in the workers: advertise the address other hosts reach us at, not
        # whatever the host name resolves to (often 127.0.0.1 in containers and test hosts).
        self.host_env = {"ACTORMESH_HOST_ADDR": init["tcp_host"]}
        ifname = init.get("ifname")
        if ifname:
            for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                if var not in os.environ:
                    self.host_env[var] = ifname

    def _on_spawn(self, msg: Message) -> None:
        # Remember where this host's workers listen, to fan casts out to them (relay.py).
        spawn = SpawnProcsEnvelope.of(msg)
        mesh_id = spawn.mesh_id
        for p in spawn.procs:
            address = Address(self.node.address.host, p["ipc"], None, bytes.fromhex(p["mailbox"]))
            self.relayer.add(mesh_id, p["rank"], address)
        super()._on_spawn(msg)

    def _on_worker_exit(self, pid: int, status: int, reason: str = "") -> None:
        worker = self.workers.get(pid)
        if worker is not None:
            self.relayer.remove(worker.mesh_id, worker.rank)
        super()._on_worker_exit(pid, status, reason)

    def _on_heartbeat(self, _: Message) -> None:
        self.last_heartbeat = time.monotonic()

    def _device_env(self, spec: dict[str, Any]) -> dict[str, str]:
        env = {k: v for k, v in self.host_env.items() if k not in spec["env"]}
        env.update(super()._device_env(spec))
        return env


def load_key(key_file: str | None) -> bytes:
    path = key_file or os.environ.get("ACTORMESH_KEY_FILE")
    if path:
        return read_key_file(path)
    text = os.environ.pop("ACTORMESH_KEY", "")  # workers need not see it in their environment
    if not text:
        raise SystemExit(
            "actormesh host: no job key; set ACTORMESH_KEY_FILE (a file written by the "
            "controller's write_key_file) or ACTORMESH_KEY, or pass --key-file"
        )
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise SystemExit("actormesh host: ACTORMESH_KEY is not hex") from None


def register(key: bytes, connect: str, info: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Send the hello and wait for the welcome (the controller may not be listening yet)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(connect)
        frames, nonce = handshake.hello(key, info)
        sock.send_multipart(frames)
        if not sock.poll(int(timeout * 1000)):
            raise SystemExit(
                f"actormesh host: no answer from the controller at {connect} within "
                f"{timeout:.0f} s (is it listening? is the address reachable from this host?)"
            )
        return handshake.check_welcome(key, sock.recv_multipart(), nonce)
    except handshake.HandshakeError as exc:
        raise SystemExit(f"actormesh host: registration failed: {exc}") from exc
    finally:
        sock.close(linger=0)
        ctx.term()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m actormesh host",
        description="Run an actormesh host agent that dials back to a controller.",
    )
    parser.add_argument("--connect", required=True, help="the controller's address, HOST:PORT")
    parser.add_argument("--key-file", help="file holding the job key (else ACTORMESH_KEY_FILE)")
    parser.add_argument("--name", help="name of this host in errors (default HOSTNAME/ADDRESS)")
    parser.add_argument("--address", help="address to advertise (default: route to controller)")
    parser.add_argument(
        "--register-timeout", type=float, default=300.0, help="seconds to wait for the welcome"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="actormesh host agent: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    key = load_key(args.key_file)
    try:
        ctl_host, ctl_port = split_host_port(args.connect)
        ip = args.address or source_address(ctl_host, ctl_port)
    except (ValueError, OSError) as exc:
        raise SystemExit(f"actormesh host: bad --connect {args.connect!r}: {exc}") from exc
    hostname = socket.gethostname()
    name = args.name or f"{hostname}/{ip}"
    run_dir = make_run_dir()
    try:
        return _run(args, key, ip, hostname, name, run_dir)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _run(
    args: argparse.Namespace, key: bytes, ip: str, hostname: str, name: str, run_dir: str
) -> int:
    info = {
        "name": name,
        "hostname": hostname,
        "address": ip,
        "pid": os.getpid(),
        "run_dir": run_dir,
        "slurm_job": os.environ.get("SLURM_JOB_ID"),
    }
    welcome = register(
        key, f"tcp://{args.connect.removeprefix('tcp://')}", info, args.register_timeout
    )
    init = {
        "key": key.hex(),
        "controller": welcome["controller"],
        "run_dir": run_dir,
        "host_rank": welcome["host_rank"],
        "preload": welcome["preload"],
        "start_method": welcome["start_method"],
        "worker_sched": welcome.get("worker_sched", "batch"),
        "controller_pid": 0,
        "host_id": name,
        "tcp_host": ip,
        "curve": welcome["curve"],
        "ifname": interface_of(ip),
    }
    keys = curve_keys(key) if welcome["curve"] else None
    transport = Transport(key, run_dir, f"agent{init['host_rank']}", ip, name, curve=keys)
    node = Node(transport, "agent")
    set_node(node)
    agent = RemoteAgent(node, init)
    controller = agent.controller
    if init["start_method"] != "spawn":
        agent.start_zygote()
    node.start()
    agent.sampler.start()
    node.send(controller, (AGENT_READY, init["host_rank"], node.address, name))
    signal.signal(signal.SIGTERM, lambda *_: agent.done.set())
    interval, deadline = float(welcome["heartbeat"]), float(welcome["deadline"])
    agent.last_heartbeat = time.monotonic()
    code = _heartbeat_loop(agent, controller, init["host_rank"], interval, deadline)
    agent.kill_all()
    node.transport.close(linger=0.5)
    return code


def _heartbeat_loop(
    agent: RemoteAgent, controller: Address, host_rank: int, interval: float, deadline: float
) -> int:
    node = agent.node
    stop = agent.done
    while not stop.wait(interval):
        node.send(controller, (AGENT_HEARTBEAT, host_rank))
        silent = time.monotonic() - agent.last_heartbeat
        if silent > deadline:
            logger.error(
                "no heartbeat from the controller for %.1f s: killing this host's workers", silent
            )
            return 1
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "actormesh-host-agent"
    sys.exit(main())

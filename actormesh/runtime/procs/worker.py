"""A worker process: one rank of a proc mesh, hosting that rank's actors.

Its main thread only waits; the I/O thread receives messages and hands calls to the actors'
threads, so heartbeats, stack dumps and stop requests are answered even while an endpoint runs.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
import threading
from functools import partial
from typing import Any, NoReturn

from ... import config
from ..actors import ActorHost, ActorInstance, Context, blocked_on, set_process_context
from ..extent import Extent, Point
from ..faults import format_stacks
from ..messaging import (
    Address,
    Message,
    Node,
    Transport,
    capture_output,
    curve_keys,
    dumps,
    flush_output,
    reply_port,
    set_node,
    start_outbox,
)
from ..messaging.envelopes import StacksEnvelope, WaitsEnvelope
from ..messaging.protocol import (
    INTERRUPT,
    MOVED,
    OK,
    READY,
    REPLY,
    STACKS,
    STOP,
    WAITS,
    shape_from_state,
)
from . import rehost
from .controller import controller_if_started
from .rank_exit import run_exit_handlers

logger = logging.getLogger(__name__)


def _address(v: list[Any]) -> Address:
    return Address(v[0], v[1], v[2], bytes.fromhex(v[3]))


def run(spec: dict[str, Any], key: bytes, init: dict[str, Any]) -> None:
    """Run this process as the worker described by ``spec``; returns when told to stop."""
    _enter(spec, init)
    node = _worker_node(spec, key, init)
    host = ActorHost(node, proc_rank=spec["rank"])
    controls = _Controls(node, host, spec["rank"])
    node.register(STOP, controls.on_stop)
    node.register(STACKS, controls.on_stacks)
    node.register(INTERRUPT, controls.on_interrupt)
    node.register(WAITS, controls.on_waits)
    node.register(MOVED, partial(rehost.on_moved, node))  # a healed rank's new address
    labels, sizes = spec["extent"]
    point = Point(spec["rank"], Extent(labels, sizes))
    set_process_context(Context(ActorInstance(spec["label"], point, spec["mesh_id"]), point))
    capture_output(node, spec["label"])
    _deliver_output_before_exit(node)
    # The worker is an entry point: its own warnings go to the controller, labelled by rank.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    package_logger = logging.getLogger("actormesh")
    package_logger.addHandler(handler)
    package_logger.setLevel(logging.WARNING)
    node.start()
    ready: tuple[Any, ...] = (READY, spec["mesh_id"], spec["rank"], os.getpid())
    if node.address.tcp is not None:
        ready += (node.address.tcp,)  # the port was picked at bind time: tell the controller
    assert node.controller is not None  # _worker_node set it
    node.send(node.controller, ready)
    parent = os.getppid()
    while not controls.stop.wait(0.5):
        if os.getppid() != parent:
            os._exit(1)  # orphaned: whoever started us is gone
    host.stop_all(timeout=config.STOP_GRACE / 2)
    # An actor here spawned proc meshes: they stop with this rank, while its node still runs
    # (at exit, the controller's own handler would find it closed and leave them behind).
    nested = controller_if_started()
    if nested is not None:
        nested.shutdown()
    flush_output()
    node.close()


def _enter(spec: dict[str, Any], init: dict[str, Any]) -> None:
    """This process as the spec says: its scheduling, environment, directory, ``sys.path``,
    and faulthandler's stack dumps."""
    _set_scheduling_policy(init.get("worker_sched", "batch"))  # before any thread starts
    for k, v in spec["env"].items():
        os.environ[k] = v
    if "tcp_host" in spec:  # the address other hosts reach us at (torch.distributed uses it)
        os.environ.setdefault("ACTORMESH_HOST_ADDR", spec["tcp_host"])
    try:
        os.chdir(spec["cwd"])
    except OSError:
        pass
    sys.path[:] = spec["sys_path"]
    faulthandler.enable(file=sys.__stderr__ or sys.stderr, all_threads=False)
    # The agent's fallback for stack dumps of a process whose GIL is held in C code.
    faulthandler.register(signal.SIGUSR1, file=sys.__stderr__ or sys.stderr, all_threads=True)


def _worker_node(spec: dict[str, Any], key: bytes, init: dict[str, Any]) -> Node:
    """This worker's node (not started), at the address its controller gave it."""
    transport = Transport(
        key,
        init["run_dir"],
        f"{spec['mesh_id']}-{spec['rank']}",
        mailbox=bytes.fromhex(spec["mailbox"]),
        ipc=spec["ipc"],
        # On a host other than the controller's, the worker is also reachable over tcp://
        # (at its old port again when it is healed in place), possibly encrypted.
        # On the controller's host too once other hosts take part (the spec says so then).
        tcp_host=spec.get("tcp_host", init.get("tcp_host")),
        host_id=init.get("host_id"),
        tcp_port=spec.get("tcp_port", 0),
        curve=curve_keys(key) if spec.get("curve", init.get("curve")) else None,
        shm_lane=True,
    )
    node = Node(transport, role="worker")
    set_node(node)
    node.controller = _address(init["controller"])
    node.mesh_id = spec["mesh_id"]
    start_outbox(node, spec["rank"])
    return node


class _Controls:
    """What is asked of this worker's process as a whole (on the I/O thread): stop, its
    stacks, what its actors wait on, an interrupt."""

    def __init__(self, node: Node, host: ActorHost, rank: int) -> None:
        self.node = node
        self.host = host
        self.rank = rank
        self.stop = threading.Event()
        self.main_thread = threading.get_ident()  # only waits for "stop": not worth showing

    def on_stop(self, _: Message) -> None:
        self.stop.set()

    def on_stacks(self, msg: Message) -> None:
        asked = StacksEnvelope.of(msg)
        index = shape_from_state(asked.shape).local_index(self.rank)
        text = format_stacks(self.host.actors.values(), skip=[self.main_thread])
        port = reply_port(asked.reply)
        self.node.send(port.address, (REPLY, port.port_id, index, OK), *dumps(text))

    def on_waits(self, msg: Message) -> None:
        reply = WaitsEnvelope.of(msg).reply
        waits = []
        for runner in list(self.host.actors.values()):
            on = blocked_on(runner.thread.ident)
            if on:
                busy = runner.busy
                waits.append((runner.name, busy[0] if busy else "?", on))
        port = reply_port(reply)
        self.node.send(port.address, (REPLY, port.port_id, 0, OK), *dumps(waits))

    def on_interrupt(self, msg: Message) -> None:
        for runner in self.host.actors.values():
            runner.interrupt(msg)


def _set_scheduling_policy(policy: str) -> None:
    """``SCHED_BATCH`` unless told otherwise (``ACTORMESH_WORKER_SCHED``, see config.py).

    Threads started later inherit it. A cast wakes every rank it reaches; under the default
    policy each woken rank preempts whatever runs on its core, the caller included, so a
    controller casting to 8 ranks on a busy machine is interrupted between its sends. Workers
    are the non-interactive side of a mesh: that is what ``SCHED_BATCH`` is for.
    """
    if policy != "batch" or not hasattr(os, "sched_setscheduler"):
        return
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError as exc:  # a sandbox may forbid it: then the default policy it is
        logger.debug("could not switch to SCHED_BATCH: %s", exc)


def _deliver_output_before_exit(node: Node) -> None:
    """Make ``os._exit`` in user code send what the rank printed first.

    Output travels as messages; a process that calls ``os._exit`` right after ``print`` would
    otherwise take its last words with it (ZeroMQ sends from a background thread). Signals and
    crashes cannot be intercepted: their stderr still reaches the controller through the agent.
    """
    real_exit = os._exit
    pid = os.getpid()

    def exit_after_output(status: int) -> NoReturn:
        if os.getpid() != pid:  # a child forked by user code: the sockets are its parent's
            real_exit(status)
        try:
            flush_output()
            node.transport.close(linger=1.0)
        finally:
            real_exit(status)

    os._exit = exit_after_output


def main() -> None:
    """Entry point of a worker started as a fresh interpreter (``start_method=spawn``)."""
    from .osutil import die_with_parent

    die_with_parent(int(os.environ.pop("ACTORMESH_AGENT_PID")))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # interrupts arrive as messages
    request = json.loads(sys.stdin.readline())
    init = request["init"]
    code = 0
    try:
        run(request["spec"], bytes.fromhex(init["key"]), init)
        run_exit_handlers()  # only after a graceful stop (rank_exit.py)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main()

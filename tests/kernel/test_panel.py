"""The sidebar's kernel side, through real kernel messages: a control-channel request subscribes,
the kernel opens the ``actormesh.panel`` comm and pushes snapshots while cells run; controls
(stacks, interrupt, respawn, stop) answer on the control channel even while the shell is busy.
Every message is checked against the protocol schema (the fixtures' schema)."""

from __future__ import annotations

import queue
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from kernel_support import Kernel, spawn_code, start_kernel
from support import wait_until

from actormesh.kernel.panel import protocol

WAIT = 60  # generous: a 2-core machine shared with other test runs


class Panel:
    """Plays the JupyterLab panel against a kernel: requests on control, comm on iopub.

    Everything runs on the test's thread (jupyter_client's blocking client makes an event loop
    per thread that uses it, and one left in a helper thread is never closed)."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.client = f"test-{uuid.uuid4().hex[:6]}"
        self.comm_id: str | None = None
        self.messages: list[dict[str, Any]] = []
        self.request_statuses = 0  # status messages answering a panel request (want none)
        # A client of our own, with its own session: the test's client reads iopub for its own
        # cells, and two clients sharing a session reject each other's messages as replays.
        self.kc = BlockingKernelClient()
        self.kc.load_connection_info(kernel.km.get_connection_info())
        self.kc.start_channels()

    def _drain(self, timeout: float) -> None:
        try:
            msg = self.kc.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            return
        content = msg["content"]
        kind = msg["msg_type"]
        if kind == "status" and msg["parent_header"].get("msg_type") == protocol.REQUEST_TYPE:
            self.request_statuses += 1
        if kind == "comm_open" and content.get("target_name") == protocol.COMM_TARGET:
            data = content["data"]
            protocol.check_message(data)
            if data["client"] == self.client:
                self.comm_id = content["comm_id"]
                self.messages.append(data)
        elif kind == "comm_msg" and content["comm_id"] == self.comm_id:
            protocol.check_message(content["data"])
            self.messages.append(content["data"])

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        content = {
            "protocol": protocol.PROTOCOL_VERSION,
            "request_id": uuid.uuid4().hex,
            "op": op,
            **fields,
        }
        msg = self.kc.session.msg(protocol.REQUEST_TYPE, content)
        self.kc.control_channel.send(msg)
        while True:
            reply = self.kc.get_control_msg(timeout=WAIT)
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                assert reply["msg_type"] == protocol.REPLY_TYPE
                return dict(reply["content"])

    def ok(self, op: str, **fields: Any) -> None:
        reply = self.request(op, **fields)
        assert reply["status"] == "ok", reply

    def wait(self, what: str, pred: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The newest message since the last ``forget()`` that satisfies ``pred`` (waiting for
        one): call ``forget()`` before an action whose effect the next wait must see."""

        def seen() -> bool:
            self._drain(0.1)
            return any(pred(m) for m in self.messages)

        wait_until(seen, WAIT, what)
        return [m for m in self.messages if pred(m)][-1]

    def snapshot(self, what: str, pred: Callable[[list[dict[str, Any]]], bool]) -> dict[str, Any]:
        return self.wait(what, lambda m: m["type"] == "snapshot" and pred(ranks_of(m)))

    def forget(self) -> None:
        """Drop the messages seen so far: the next wait needs a new one."""
        self.messages.clear()

    def close(self) -> None:
        self.kc.stop_channels()


def ranks_of(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for m in snapshot["meshes"] for h in m["hosts"] for r in h["ranks"]]


def shell_reply(kernel: Kernel, msg_id: str) -> dict[str, Any]:
    while True:
        reply = kernel.kc.get_shell_msg(timeout=WAIT)
        if reply["parent_header"].get("msg_id") == msg_id:
            return dict(reply)


def states(*wanted: str) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda ranks: [r["state"] for r in ranks] == list(wanted)


@pytest.fixture
def panel_kernel() -> Iterator[tuple[Kernel, Panel]]:
    k = start_kernel()
    p = Panel(k)
    try:
        yield k, p
    finally:
        p.close()
        k.shutdown()


def test_subscribe_empty_then_live_states(panel_kernel: tuple[Kernel, Panel]) -> None:
    kernel, panel = panel_kernel
    panel.ok("subscribe", client=panel.client)
    hello = panel.wait("the hello", lambda m: m["type"] == "hello")
    assert hello["debugger"] is True  # the panel found actormesh.debugger.state
    panel.wait("an empty snapshot", lambda m: m["type"] == "snapshot" and m["meshes"] == [])

    kernel.ok(spawn_code(4))
    snap = panel.snapshot("4 idle ranks", states("idle", "idle", "idle", "idle"))
    mesh = snap["meshes"][0]
    assert mesh["names"] == ["procs"]
    assert mesh["extent"] == {"hosts": 1, "gpus": 4}
    pids = kernel.ok("print(*procs._procs.pids)").stream().split()
    assert [str(r["pid"]) for r in ranks_of(snap)] == pids
    panel.snapshot("memory of every rank", lambda rs: all(r["rss"] for r in rs))

    # A long cell keeps the shell busy: updates and controls still flow.
    cell = kernel.kc.execute("%%mesh procs\nimport time\nfor i in range(600):\n    time.sleep(0.1)")
    try:
        snap = panel.snapshot("4 busy ranks", states("busy", "busy", "busy", "busy"))
        busy = ranks_of(snap)[0]["busy"]
        assert busy["kind"] == "cell" and busy["what"].startswith("In [")
        assert busy["line"] in (3, 4)
        mesh_id = snap["meshes"][0]["mesh_id"]
        panel.ok("stacks", mesh_id=mesh_id, ranks=None)
        stacks = panel.wait("stacks", lambda m: m["type"] == "stacks")
        assert sorted(r for g in stacks["groups"] for r in g["ranks"]) == [0, 1, 2, 3]
        assert "time.sleep(0.1)" in stacks["groups"][0]["text"]
        panel.ok("interrupt", mesh_id=mesh_id, ranks=None)
        panel.wait(
            "the interrupt's result", lambda m: m["type"] == "result" and m["op"] == "interrupt"
        )
    finally:
        reply = shell_reply(kernel, cell)
    assert reply["content"]["status"] == "error"  # the cell reports its interrupted ranks
    panel.forget()
    panel.snapshot("idle again", states("idle", "idle", "idle", "idle"))

    # An actor's endpoint: busy in actor.endpoint, on the ranks it was called on.
    panel.forget()  # snapshots from before (the interrupt settling rank by rank) do not count
    kernel.ok(
        "class Sleeper(am.Actor):\n"
        "    @am.endpoint\n"
        "    def nap(self, s):\n"  # short sleeps: an interrupt lands when one returns
        "        import time\n        for _ in range(int(s * 10)): time.sleep(0.1)\n"
        "sleepers = procs.spawn('sleeper', Sleeper)\n"
        "sleepers.slice(gpus=slice(2, 4)).nap.broadcast(600)"
    )
    snap = panel.snapshot("ranks 2-3 napping", states("idle", "idle", "busy", "busy"))
    assert ranks_of(snap)[3]["busy"] == {"kind": "endpoint", "what": "sleeper.nap", "line": None}
    assert snap["meshes"][0]["actors"] == ["sleeper"]
    assert sorted(snap["meshes"][0]["names"]) == ["procs", "sleepers"]
    panel.forget()
    panel.ok("interrupt", mesh_id=mesh_id, ranks=[2, 3])
    panel.snapshot("the nap interrupted", states("idle", "idle", "idle", "idle"))
    # A status "idle" answering a panel request would show the notebook idle while a cell runs.
    assert panel.request_statuses == 0


def test_death_respawn_and_stop(
    panel_kernel: tuple[Kernel, Panel], unhandled_failures: list[object]
) -> None:
    kernel, panel = panel_kernel
    kernel.ok(spawn_code(4))
    panel.ok("subscribe", client=panel.client)
    snap = panel.snapshot("4 idle ranks", states("idle", "idle", "idle", "idle"))
    mesh_id = snap["meshes"][0]["mesh_id"]

    panel.forget()
    kernel.execute(
        "%%mesh procs --ranks 2\nimport os, signal\nos.kill(os.getpid(), signal.SIGKILL)"
    )
    snap = panel.snapshot("rank 2 dead", lambda rs: rs[2]["state"] == "dead")
    assert ranks_of(snap)[2]["dead"] == {"exitcode": None, "signal": "SIGKILL", "reason": ""}

    reply = panel.request("respawn", mesh_id=mesh_id, ranks=[5])
    assert reply["status"] == "error" and "ranks 0-3" in reply["message"]
    panel.forget()
    panel.ok("respawn", mesh_id=mesh_id, ranks=None)
    panel.wait("the respawn", lambda m: m["type"] == "result" and m["op"] == "respawn" and m["ok"])
    panel.snapshot("4 idle ranks again", states("idle", "idle", "idle", "idle"))
    assert (
        kernel.ok("%%mesh procs\nrank").value
        == "ValueMesh({gpus=0: 0, gpus=1: 1, gpus=2: 2, gpus=3: 3})"
    )

    panel.forget()
    panel.ok("stop", mesh_id=mesh_id, ranks=None)
    panel.wait("no mesh left", lambda m: m["type"] == "snapshot" and m["meshes"] == [])
    reply = panel.request("stacks", mesh_id=mesh_id, ranks=None)
    assert reply["status"] == "error" and "no live proc mesh" in reply["message"]


def test_bad_requests_get_clear_errors(panel_kernel: tuple[Kernel, Panel]) -> None:
    _, panel = panel_kernel
    assert "unknown operation 'reboot'" in panel.request("reboot", mesh_id="x")["message"]
    reply = panel.request("pause", mesh_id="nope", ranks=[0])
    assert reply["status"] == "error" and "no live proc mesh nope" in reply["message"]
    old = panel.request("subscribe", client="c", protocol=99)
    assert "protocol 99" in old["message"] and "same actormesh version" in old["message"]


def test_series_carry_metrics_and_samples_once(panel_kernel: tuple[Kernel, Panel]) -> None:
    """The charts' data: what the ranks log and what their agent samples reaches the panel,
    each point once; a new subscription starts over with the whole history."""
    kernel, panel = panel_kernel
    kernel.ok(spawn_code(2))
    panel.ok("subscribe", client=panel.client)
    first = panel.wait("the first series", lambda m: m["type"] == "series")
    assert first["reset"] is True
    kernel.ok(
        "%%mesh procs\nimport actormesh as am\n"
        "for i in range(5):\n    am.log_metrics({'loss': 1.0 / (i + 1) + rank}, step=i)"
    )

    def points() -> dict[int, list[int]]:
        got: dict[int, list[int]] = {}
        for m in panel.messages:
            if m["type"] != "series":
                continue
            for mesh in m["meshes"]:
                for metric in mesh["metrics"]:
                    for p in metric["ranks"]:
                        got.setdefault(p["rank"], []).extend(p["step"])
        return got

    panel.wait(
        "5 steps of both ranks", lambda m: points() == {0: list(range(5)), 1: list(range(5))}
    )
    sampled = panel.wait(
        "samples of both ranks",
        lambda m: (
            m["type"] == "series"
            and any({r["rank"] for r in mesh["resources"]} == {0, 1} for mesh in m["meshes"])
        ),
    )
    cpu = sampled["meshes"][0]["resources"][0]
    assert len(cpu["time"]) == len(cpu["cpu"]) == len(cpu["rss"]) >= 1
    assert cpu["rss"][0] > 10 << 20

    panel.forget()
    panel.ok("subscribe", client=panel.client)
    again = panel.wait("a reset", lambda m: m["type"] == "series" and m["reset"])
    (loss,) = again["meshes"][0]["metrics"]
    assert {p["rank"]: p["step"] for p in loss["ranks"]} == {0: list(range(5)), 1: list(range(5))}

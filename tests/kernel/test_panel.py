"""The sidebar's kernel side, through real kernel messages: a control-channel request subscribes,
the kernel opens the ``actormesh.panel`` comm and pushes snapshots while cells run; controls
(stacks, interrupt, respawn, stop) answer on the control channel even while the shell is busy.
Every message is checked against the protocol schema (the fixtures' schema)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernel_support import Kernel, spawn_code
from panel_support import WAIT, Panel, ranks_of


def shell_reply(kernel: Kernel, msg_id: str) -> dict[str, Any]:
    while True:
        reply = kernel.kc.get_shell_msg(timeout=WAIT)
        if reply["parent_header"].get("msg_id") == msg_id:
            return dict(reply)


def states(*wanted: str) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda ranks: [r["state"] for r in ranks] == list(wanted)


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


TRAINING = """
import os, signal, torch
import actormesh as am

procs = am.this_host().spawn_procs(per_host={"dp": 4})
model = am.module_to_mesh(torch.nn.Linear(4, 1), procs)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
ft = am.FaultTolerant({"model": model, "optim": opt})
x, y = torch.randn(8, 4), torch.randn(8, 1)

def step():
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()

def pid(t):
    return os.getpid()

for _ in range(3):
    step()
    ft.commit()
"""


def recovery(phase: str) -> Callable[[dict[str, Any]], bool]:
    def pred(m: dict[str, Any]) -> bool:
        shown = m["type"] == "snapshot" and m["meshes"] and m["meshes"][0]["recovery"]
        return bool(shown) and shown["phase"] == phase

    return pred


def test_a_training_recovery_shows_the_rank_lost_restored_and_resumed(
    panel_kernel: tuple[Kernel, Panel],
) -> None:
    kernel, panel = panel_kernel
    kernel.ok(TRAINING)
    panel.ok("subscribe", client=panel.client)
    snap = panel.snapshot("4 ranks", lambda rs: len(rs) == 4)
    assert snap["meshes"][0]["recovery"] is None  # none yet
    kernel.ok(
        "os.kill(am.call_on_shard_and_fetch(pid, model.weight, dp=1).get(), signal.SIGKILL)\n"
        "try:\n    step()\nexcept am.SupervisionError:\n    ft.recover()"
    )
    restored = panel.wait("the state restored", recovery("restored"))["meshes"][0]["recovery"]
    assert {k: restored[k] for k in ("kind", "ranks", "step", "source", "extent")} == {
        "kind": "recover", "ranks": ["{dp=1}"], "step": 3, "source": "replicas",
        "extent": {"dp": 4},
    }  # fmt: skip
    assert restored["seconds"] > 0 and restored["error"] is None
    panel.forget()
    kernel.ok("step()\nft.commit()")
    resumed = panel.wait("training resumed", recovery("resumed"))["meshes"][0]["recovery"]
    assert resumed["step"] == 4 and resumed["ranks"] == ["{dp=1}"]

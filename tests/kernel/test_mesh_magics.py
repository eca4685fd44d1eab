"""``%%mesh`` and ``%mesh`` in a real actormesh kernel, on a real 4-rank mesh."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from kernel_support import Kernel, spawn_code
from support import wait_until


def test_kernel_identifies_itself_and_has_the_magics(kernel4: Kernel) -> None:
    info = kernel4.kc.kernel_info(reply=True, timeout=30)["content"]
    assert info["implementation"] == "actormesh"
    doc = kernel4.ok("%mesh?").reply["content"]["payload"]  # shown by the pager
    text = json.dumps(doc)
    assert "%%mesh TARGET" in text and "In [2]" in text and "%mesh push" in text


def test_cell_runs_on_every_rank_with_grouped_output_and_values(kernel4: Kernel) -> None:
    r = kernel4.ok("%%mesh procs\nprint('hello')\nprint('I am', rank)\nrank * 10")
    out = r.stream()
    assert out.count("hello") == 1 and "[gpus=0-3] hello\n" in out
    for rank in range(4):
        assert f"[gpus={rank}] I am {rank}\n" in out
    assert r.value == "ValueMesh({gpus=0: 0, gpus=1: 10, gpus=2: 20, gpus=3: 30})"
    assert kernel4.ok("_mesh.values()").value == "[0, 10, 20, 30]"


def test_rank_namespaces_persist_across_cells(kernel4: Kernel) -> None:
    kernel4.ok("%%mesh procs\nstate = {'seen': [rank]}\ndef twice(v): return 2 * v")
    r = kernel4.ok("%%mesh procs -o out\nstate['seen'].append(twice(rank))\nstate['seen']")
    assert r.value == "ValueMesh({gpus=0: [0, 0], gpus=1: [1, 2], gpus=2: [2, 4], gpus=3: [3, 6]})"
    assert kernel4.ok("out.item(gpus=3)").value == "[3, 6]"
    r = kernel4.ok("%%mesh procs\nam.current_rank()['gpus'] == rank, size")
    assert r.value is not None and r.value.count("(True, 4)") == 4


def test_rank_selections(kernel4: Kernel) -> None:
    def ranks(line: str) -> str | None:
        return kernel4.ok(f"%%mesh {line}\nrank").value

    # Values are labelled with the ranks' own coordinates, whatever the selection.
    assert ranks("procs --ranks 1:3") == "ValueMesh({gpus=1: 1, gpus=2: 2})"
    assert ranks("procs --ranks ::2") == "ValueMesh({gpus=0: 0, gpus=2: 2})"
    assert ranks("procs --ranks 0,1,3") == "ValueMesh({gpus=0: 0, gpus=1: 1, gpus=3: 3})"
    assert ranks("procs --ranks gpus=2") == "ValueMesh({gpus=2: 2})"
    assert ranks("procs --ranks hosts=0,gpus=0:2") == "ValueMesh({gpus=0: 0, gpus=1: 1})"
    assert ranks("procs.slice(gpus=slice(2, 4))") == "ValueMesh({gpus=2: 2, gpus=3: 3})"
    assert kernel4.ok("_mesh.item(gpus=1)").value == "3"  # indexing: by position, as before


def test_bad_arguments_are_one_line_usage_errors(kernel4: Kernel) -> None:
    for line in [
        "procs --bogus",
        "nope",
        "procs --ranks 9",
        "procs --ranks 1:x",
        "procs --timeout -1",
        "procs -o 1x",
        "__import__('os').getcwd()",
        "procs.__class__",
        "procs.stop()",
        "42",
        "",
    ]:
        r = kernel4.execute(f"%%mesh {line}\nprint('should not run')")
        assert r.status == "error", line
        err = r.stream("stderr")
        assert err.startswith("UsageError: ") and err.count("\n") == 1, (line, err)
        assert "should not run" not in r.stream(), line
    r = kernel4.execute("%mesh frobnicate")
    assert r.stream("stderr").startswith("UsageError: %mesh: unknown subcommand")


def test_errors_show_the_cell_lines_grouped_by_rank(kernel4: Kernel) -> None:
    r = kernel4.execute("%%mesh procs\nx = 1\n1 / (rank - 1)")
    assert r.status == "error" and r.ename == "MeshCellError"
    tb = r.traceback
    assert "[rank 1] ZeroDivisionError: division by zero" in tb
    assert re.search(r'File "<mesh-cell-\d+>", line 2', tb) and "1 / (rank - 1)" in tb
    assert "actormesh" not in tb  # no runtime frames

    r = kernel4.execute("%%mesh procs\nraise ValueError('same everywhere')")
    assert r.traceback.count("ValueError: same everywhere") == 2  # the header and the last line
    assert "[ranks 0-3] ValueError: same everywhere" in r.traceback

    r = kernel4.execute("%%mesh procs\nfor i in range(\n")
    assert r.status == "error" and r.ename == "CellSyntaxError"
    assert "was never closed" in r.traceback and "magics.py" not in r.traceback
    assert "<mesh-cell-" in r.traceback
    assert kernel4.ok("%%mesh procs\nrank").value is not None  # the ranks are fine


def test_each_run_of_the_magic_in_one_cell_shows_its_own_lines(kernel4: Kernel) -> None:
    r = kernel4.execute(
        "ip = get_ipython()\n"
        "for i in range(3):\n"
        "    ip.run_cell_magic('mesh', 'procs', f'run = {i}')\n"
        "ip.run_cell_magic('mesh', 'procs', 'x = 0\\n1 / x  # the fourth run')"
    )
    assert r.status == "error" and r.ename == "MeshCellError", r.traceback
    assert re.search(r'File "<mesh-cell-\d+\.4>", line 2', r.traceback), r.traceback
    assert "1 / x  # the fourth run" in r.traceback


def test_output_complete_and_in_rank_order_on_8_ranks(kernel4: Kernel) -> None:
    kernel4.ok(spawn_code(8, "big"))
    try:
        r = kernel4.ok(
            "%%mesh big\nfor i in range(1000):\n    print(f'r{rank} line {i}')\nprint('all done')"
        )
        per_rank: dict[int, list[int]] = {}
        for line in r.stream().splitlines():
            m = re.fullmatch(r"\[gpus=(\d)\] r(\d) line (\d+)", line)
            if m:
                assert m.group(1) == m.group(2)
                per_rank.setdefault(int(m.group(1)), []).append(int(m.group(3)))
        assert sorted(per_rank) == list(range(8))
        for lines in per_rank.values():
            assert lines == list(range(1000))
        assert "[gpus=0-7] all done\n" in r.stream()
        r = kernel4.ok("%%mesh big --no-dedup --ranks 0:3\nprint('same')")
        assert sorted(r.stream().splitlines()) == [f"[gpus={i}] same" for i in range(3)]
    finally:
        kernel4.ok("big.stop().get(timeout=20)")


def test_push_pull_status_stacks(kernel4: Kernel) -> None:
    kernel4.ok("w = {'lr': 0.5}\nk = 3\n%mesh push procs w k")
    r = kernel4.ok("%%mesh procs\nw['lr'] * k + rank")
    assert r.value == "ValueMesh({gpus=0: 1.5, gpus=1: 2.5, gpus=2: 3.5, gpus=3: 4.5})"
    r = kernel4.ok("%%mesh procs\nsquare = rank ** 2")
    assert kernel4.ok("%mesh pull procs square").value == (
        "ValueMesh({gpus=0: 0, gpus=1: 1, gpus=2: 4, gpus=3: 9})"
    )
    assert kernel4.ok("%mesh pull procs.slice(gpus=3) square").value == "ValueMesh({gpus=3: 9})"
    assert kernel4.execute("%mesh pull procs nothing_here").status == "error"

    status = kernel4.ok("%mesh status procs").displays()[0]
    table = status["text/plain"].splitlines()
    assert table[0].split()[:4] == ["rank", "host", "pid", "state"]
    assert len(table) == 5 and all(" idle " in row and "MiB" in row for row in table[1:])

    stacks = kernel4.ok("%mesh stacks procs").stream()
    assert "=== ranks gpus=0, gpus=1, gpus=2, gpus=3 ===" in stacks


def test_mesh_on_runs_every_cell_on_the_mesh_until_off(kernel4: Kernel) -> None:
    kernel4.ok("%mesh on procs --ranks 0:2")
    try:
        assert kernel4.ok("rank + 100").value == "ValueMesh({gpus=0: 100, gpus=1: 101})"
        assert kernel4.ok("%%mesh procs --ranks 3\nrank").value == "ValueMesh({gpus=3: 3})"
    finally:
        kernel4.ok("%mesh off")
    assert kernel4.ok("rank = 'local'\nrank").value == "'local'"


def test_noblock_returns_at_once_and_status_shows_the_busy_ranks(
    kernel4: Kernel, tmp_path: Path
) -> None:
    # The cell runs until the test releases it, so the ranks are busy for as long as the test
    # looks at them, however slow the machine (a fixed 1.5 s cell was over on a loaded one).
    r = kernel4.ok(
        f"%%mesh procs --noblock -o job\nimport os, time; here = {str(tmp_path)!r}\n"
        "open(os.path.join(here, f'started-{rank}'), 'w').close(); deadline = time.time() + 60\n"
        "while not os.path.exists(os.path.join(here, 'release')) and time.time() < deadline:\n"
        "    time.sleep(0.01)\nrank"
    )
    try:
        assert r.value is not None and r.value.startswith("<%%mesh mesh-cell-")
        assert "running ranks 0-3" in r.value
        wait_until(
            lambda: len(list(tmp_path.glob("started-*"))) == 4, 30, "every rank to start the cell"
        )
        status = kernel4.ok("%mesh status").displays()[0]["text/plain"].splitlines()[1:]
        assert len(status) == 4
        assert all(re.search(r" busy +mesh-cell-\d+ line [45] ", row) for row in status), status
        stacks = kernel4.ok("%mesh stacks procs").stream()
        assert "actor _mesh_executor: in run for" in stacks and "time.sleep(0.01)" in stacks
    finally:
        (tmp_path / "release").touch()
    assert kernel4.ok("job.get(timeout=30)").value == (
        "ValueMesh({gpus=0: 0, gpus=1: 1, gpus=2: 2, gpus=3: 3})"
    )


def test_rich_output_from_ranks(kernel4: Kernel) -> None:
    r = kernel4.ok(
        "%%mesh procs\nfrom IPython.display import HTML, display\n"
        "print('before')\ndisplay(HTML(f'<b>rank {rank % 2}</b>'))\n"
    )
    htmls = [d["text/html"] for d in r.displays() if "text/html" in d]
    assert sorted(htmls) == ["<b>rank 0</b>", "<b>rank 1</b>"]
    out = r.stream()
    assert out.index("before") < out.index("[gpus=0,2]") and "[gpus=1,3]" in out


def _spin(kernel: Kernel, code: str, marker: str | tuple[str, ...], by_signal: bool = False) -> Any:
    """Run ``code``, interrupt the kernel once ``marker`` was printed (every one of them, in
    any order, when several); return the result.

    The kernelspec's interrupt_mode is "message" (the kernel signals itself only); a SIGINT
    sent straight to the kernel process must work the same."""
    sent: list[bool] = []
    waiting = {marker} if isinstance(marker, str) else set(marker)

    def on_message(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            waiting.difference_update({m for m in waiting if m in msg["content"]["text"]})
        if not sent and not waiting:
            sent.append(True)
            if by_signal:
                os.kill(kernel.pid, signal.SIGINT)
            else:
                kernel.km.interrupt_kernel()

    result = kernel.execute(code, timeout=60, on_message=on_message)
    assert sent, "the cell never printed its marker"
    return result


def _ranks(text: str) -> list[int]:
    """The ranks of a report heading's list: ``"0-2,5"`` -> ``[0, 1, 2, 5]``."""
    out: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return out


def test_interrupt_stops_the_ranks_and_the_cell_returns(kernel4: Kernel) -> None:
    pids = kernel4.ok("procs._procs.pids").value
    code = (
        "%%mesh procs\nimport time\ni = 0\nwhile True:\n"
        "    i += 1\n    time.sleep(0.01)\n    if i == 120: print('spinning')\n"
    )
    r = _spin(kernel4, code, "spinning")
    assert r.status == "error" and r.ename == "CellInterrupted"
    assert "[ranks 0-3] interrupted at line 6" in r.traceback or "at line 5" in r.traceback
    # The strip appeared (the cell ran > 1 s) and settled on the final states.
    widgets = [d for d in r.displays() if "application/vnd.jupyter.widget-view+json" in d]
    assert len(widgets) == 1
    states = [
        m["content"]["data"]["state"].get("value", "")
        for m in r.messages
        if m["msg_type"] == "comm_msg" and "state" in m["content"]["data"]
    ]
    assert "data-state='interrupted'" in [s for s in states if s][-1]
    # The ranks live on, keep their namespaces, and the worker processes are the same.
    assert kernel4.ok("%%mesh procs\ni > 100").value == (
        "ValueMesh({gpus=0: True, gpus=1: True, gpus=2: True, gpus=3: True})"
    )
    assert kernel4.ok("procs._procs.pids").value == pids
    assert kernel4.ok("procs.health().values()").value == str(["alive"] * 4)


def test_timeout_interrupts_the_ranks(kernel4: Kernel) -> None:
    r = kernel4.execute("%%mesh procs --timeout 0.5\nwhile True:\n    pass\n")
    assert r.status == "error" and r.ename == "CellTimeout"
    assert "timed out after 0.5 s on ranks 0-3" in r.traceback
    assert kernel4.ok("%%mesh procs\nrank").value is not None


def test_interrupting_a_plain_cell_interrupts_its_endpoints(kernel4: Kernel) -> None:
    kernel4.ok(
        "import time\nclass Spinner(am.Actor):\n"
        "    @am.endpoint\n    def spin(self):\n        print('spin started', flush=True)\n"
        "        while True: time.sleep(0.01)\n"
        "    @am.endpoint\n    def ping(self): return 'pong'\n"
        "spinners = procs.slice(gpus=slice(0, 2)).spawn('spinners', Spinner)"
    )
    pong = "ValueMesh({gpus=0: 'pong', gpus=1: 'pong'})"
    r = _spin(kernel4, "spinners.spin.call().get()", "spin started", by_signal=True)
    assert r.status == "error" and r.ename == "KeyboardInterrupt"
    assert kernel4.ok("spinners.ping.call().get(timeout=10)").value == pong
    # The interrupt may land anywhere in the cell, not only while it waits on a reply.
    # Once the cell holds the call's future: the ranks may print before call() returns.
    code = "spun = spinners.spin.call()\nprint('cell holds spun', flush=True)\ntime.sleep(60)"
    r = _spin(kernel4, code, ("spin started", "cell holds spun"))
    assert r.status == "error" and r.ename == "KeyboardInterrupt"
    assert "KeyboardInterrupt" in kernel4.ok("repr(spun.exception(timeout=10))").value
    assert kernel4.ok("spinners.ping.call().get(timeout=10)").value == pong
    # Calls that earlier cells made keep running.
    kernel4.ok("earlier = spinners.slice(gpus=0).spin.call_one()")
    r = _spin(kernel4, "print('sleeping', flush=True)\ntime.sleep(60)", "sleeping")
    assert r.status == "error" and r.ename == "KeyboardInterrupt"
    assert kernel4.ok("earlier.done()").value == "False"
    kernel4.ok("procs.slice(gpus=0).interrupt()")
    assert "KeyboardInterrupt" in kernel4.ok("repr(earlier.exception(timeout=10))").value
    assert kernel4.ok("spinners.ping.call().get(timeout=10)").value == pong


def test_actor_mesh_target_binds_the_rank_actor(kernel4: Kernel) -> None:
    kernel4.ok(
        "class Box(am.Actor):\n    def __init__(self): self.items = [am.current_rank()['gpus']]\n"
        "    @am.endpoint\n    def get(self): return self.items\n"
        "boxes = procs.spawn('boxes', Box)\nboxes.get.call().get(timeout=30)"
    )
    kernel4.ok("%%mesh boxes.slice(gpus=slice(1, 3))\nactor.items.append('from cell')")
    assert kernel4.ok("boxes.get.call().get(timeout=30)").value == (
        "ValueMesh({gpus=0: [0], gpus=1: [1, 'from cell'], gpus=2: [2, 'from cell'], gpus=3: [3]})"
    )


def test_a_rank_that_dies_fails_only_itself(kernel4: Kernel) -> None:
    kernel4.ok(spawn_code(3, "spare"))
    try:
        r = kernel4.execute(
            "%%mesh spare\nimport os, sys\nprint('last words', flush=True)\n"
            "if rank == 1: os._exit(3)\nrank"
        )
        assert r.status == "error" and r.ename == "MeshCellError"
        assert "[gpus=0-2] last words" in r.stream()
        assert "[rank 1] SupervisionError: process of rank gpus=1" in r.traceback
        assert "exited with code 3" in r.traceback
        assert "[rank 0]" not in r.traceback and "[rank 2]" not in r.traceback
        r = kernel4.ok("%%mesh spare --ranks 0,2\nrank")  # the others live on
        assert r.value == "ValueMesh({gpus=0: 0, gpus=2: 2})"  # the ranks' own coordinates
        r = kernel4.execute("%%mesh spare\nrank")  # a dead rank fails at once
        assert r.status == "error" and "[rank 1] SupervisionError" in r.traceback
    finally:
        kernel4.ok("spare.stop().get(timeout=20)")


def test_matplotlib_figures_from_ranks(kernel4: Kernel) -> None:
    pytest.importorskip("matplotlib")
    r = kernel4.ok(
        "%%mesh procs --ranks 0:2\nimport matplotlib.pyplot as plt\n"
        "plt.plot([0, 1], [0, rank + 1])\nplt.title(f'rank {rank}')\nplt.show()\n"
        "fig = plt.figure()\nplt.plot([1, 2])\n"  # left open: shown at the end of the cell
    )
    pngs = [d for d in r.displays() if "image/png" in d]
    assert all(d["image/png"].startswith("iVBOR") for d in pngs)  # base64 of a PNG
    # One figure per rank from show(), then the identical open figure: shown once for both
    # ranks, unless they drifted apart by more than the grouping window (loaded machine).
    labels = r.stream().splitlines()
    assert len(pngs) == len(labels)
    assert sorted(labels) in (
        ["[gpus=0-1]", "[gpus=0]", "[gpus=1]"],
        ["[gpus=0]", "[gpus=0]", "[gpus=1]", "[gpus=1]"],
    )
    assert "Warning" not in r.stream("stderr")


def test_mesh_interrupt_stops_a_noblock_cell(kernel4: Kernel) -> None:
    kernel4.ok("%%mesh procs --noblock -o job\nwhile True:\n    pass\n")
    kernel4.ok("%mesh interrupt procs")
    r = kernel4.execute("job.get(timeout=30)")
    assert r.status == "error" and r.ename == "MeshCellError"
    # A rank that had not started the cell yet says it was interrupted before it started.
    interrupted = re.findall(r"\[ranks? ([-\d,]+)\] KeyboardInterrupt", r.traceback)
    assert sorted(_ranks(",".join(interrupted))) == [0, 1, 2, 3], r.traceback
    assert kernel4.ok("%%mesh procs\nrank").value is not None

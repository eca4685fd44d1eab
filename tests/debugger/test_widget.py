"""The debugger widget: it appears when a rank pauses and drives the ranks with its buttons."""

from __future__ import annotations

import html
import re
from typing import Any

from kernel_support import Kernel
from support import wait_until

WIDGET = "__import__('actormesh').kernel.debugger_seam.installed().widget"


def rows(table: str) -> dict[int, tuple[str, str, str]]:
    """rank -> (state, location, function), as the widget's rank table shows them."""
    out = {}
    for rank, state, body in re.findall(r"<tr data-rank='(\d+)' data-state='(\w+)'.*?>(.*?)</tr>",
                                        table):  # fmt: skip
        cells = [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", body)]
        assert f"<span class='badge state-{state}'>{state}</span>" in body, body
        out[int(rank)] = (state, cells[3], cells[4])
    return out


def test_widget_appears_on_pause_and_steps_and_continues_ranks(dbg4: Kernel) -> None:
    r = dbg4.ok(
        "%%mesh procs\n"
        "a = rank + 100; share = 0.1 + 0.2\n"
        "if rank in (1, 3):\n"
        "    breakpoint()\n"
        "    b = a * 2\n"
        "    print('b is', b)\n"
    )
    n = r.reply["content"]["execution_count"]
    views = [m for m in r.messages if m["msg_type"] == "display_data"]
    assert any("application/vnd.jupyter.widget-view+json" in m["content"]["data"] for m in views)

    def table() -> dict[int, tuple[str, str, str]]:
        return rows(dbg4.ok(f"print({WIDGET}.table.value)").stream())

    def paused() -> list[int]:
        return [rank for rank, (state, _, _) in table().items() if state == "paused"]

    wait_until(lambda: paused() == [1, 3], 10, "the widget to show ranks 1 and 3 paused")
    # Ranks 0 and 2 finished the cell: idle, as the sidebar says (not "running").
    expected = {
        0: ("idle", "", ""),
        1: ("paused", f"In [{n}]:4", "<module>"),  # the sidebar's location form
        2: ("idle", "", ""),
        3: ("paused", f"In [{n}]:4", "<module>"),
    }
    wait_until(lambda: table() == expected, 10, f"the widget to show {expected}")
    dbg4.ok(f"w = {WIDGET}\nw.rank.value = (w.rank.value[0], 1)")
    stack = dbg4.ok("print(w.stack.value)").stream()
    assert f"<td class='code'>In [{n}]:4</td>" in stack, stack
    local = dbg4.ok("print(w.locals.value)").stream()
    assert "<td class='code value'>101</td>" in local, local
    # Shown rounded, the exact value on hover; Python code still gets the exact value.
    assert "<td class='code value' title='0.30000000000000004'>0.3</td>" in local, local
    value = dbg4.ok("%mesh dbg eval -r 1 share")
    assert value.value == "ValueMesh({gpus=1: 0.30000000000000004})"
    [shown] = [m["content"]["data"] for m in value.messages if m["msg_type"] == "execute_result"]
    assert "<td title='0.30000000000000004'>0.3</td>" in shown["text/html"], shown

    dbg4.ok("w.buttons[1].click()")  # step over, this rank only
    wait_until(lambda: table()[1][1] == f"In [{n}]:5", 10, "rank 1 to step to the next line")
    assert table()[3] == ("paused", f"In [{n}]:4", "<module>")  # rank 3 did not move

    # Continue every paused rank, and wait for them in the same cell: their remaining output
    # arrives while it runs.
    out = dbg4.ok("w.scope.value = 'all'\nw.buttons[0].click()\n_mesh.get(timeout=30)").stream()
    assert "[gpus=1] b is 202" in out and "[gpus=3] b is 206" in out, out
    wait_until(lambda: not paused(), 10, "every rank to run again")


def test_a_cell_whose_rank_pauses_ends_its_strip_paused_and_the_others_idle(
    dbg4: Kernel,
) -> None:
    """The cell's strip, the widget and the sidebar say the same of a rank paused in the
    debugger (paused, not running) and of ranks that finished (idle in the widget)."""
    r = dbg4.ok(
        "%%mesh procs --ranks 2\n"
        "import time\n"
        "time.sleep(1.5)  # past the second after which the cell shows its strip\n"
        "breakpoint()\n"
        "x = 1\n"
    )
    states = [
        m["content"]["data"]["state"].get("value", "")
        for m in r.messages
        if m["msg_type"] == "comm_msg" and "state" in m["content"]["data"]
    ]
    final = [s for s in states if "jp-actormesh-status-strip" in s][-1]
    assert "data-rank='2' data-state='paused'" in final and "1 paused" in final, final
    assert "running" not in final, final

    def table() -> dict[int, tuple[str, str, str]]:
        return rows(dbg4.ok(f"print({WIDGET}.table.value)").stream())

    wait_until(
        lambda: (
            {rank: state for rank, (state, _, _) in table().items()}
            == {0: "idle", 1: "idle", 2: "paused", 3: "idle"}
        ),
        10,
        "the widget to show rank 2 paused and the others idle",
    )
    # A cell that starts later sends the debugger nothing: the widget still sees it.
    dbg4.ok("%%mesh procs --ranks 0 --noblock\nimport time\ntime.sleep(6)")
    wait_until(
        lambda: table()[0][0] == "busy", 10, "the widget to show rank 0 busy in its new cell"
    )
    dbg4.ok("%mesh dbg continue -r 2")


def test_the_widget_says_which_slice_and_op_a_rank_runs(dbg4: Kernel, tmp_path: Any) -> None:
    """A rank busy in the tensor engine of a slice (a pipeline stage's): the widget's note says
    which slice and which op, as the sidebar does, while another rank is paused."""
    release = tmp_path / "release"
    dbg4.ok(
        "import os, time, torch\n"
        "import actormesh as am\n"
        "am.distribute(torch.ones(4), procs)  # the engine of the whole mesh, then a slice's\n"
        "stage = procs.slice(gpus=2)\n"
        "@am.remote(propagate=lambda t: t)\n"
        "def wait_for_release(t):\n"
        "    deadline = time.monotonic() + 60\n"
        f"    while not os.path.exists({str(release)!r}) and time.monotonic() < deadline:\n"
        "        time.sleep(0.05)\n"
        "    return t * 1\n"
        "y = wait_for_release(am.distribute(torch.ones(2), stage))\n"
    )
    try:
        dbg4.ok("%%mesh procs --ranks 0\nbreakpoint()\nx = 1\n")

        def notes() -> dict[int, str]:
            table = dbg4.ok(f"print({WIDGET}.table.value)").stream()
            out = {}
            for rank, body in re.findall(r"<tr data-rank='(\d+)'.*?>(.*?)</tr>", table):
                cells = [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", body)]
                out[int(rank)] = cells[5] if len(cells) > 5 else ""
            return out

        def engine_ranks() -> list[int]:
            return [r for r, n in notes().items() if n.startswith("tensor engine (gpus=2): op ")]

        # Both engines of rank 2 start first (each imports DTensor: seconds on a loaded machine);
        # the note names the one in an op, the slice's, from then on.
        wait_until(lambda: engine_ranks() == [2], 45, "rank 2 shown in an op of the slice's engine")
        shown = notes()
        assert shown[2].startswith("tensor engine (gpus=2): op "), shown
        assert shown[2].endswith("wait_for_release"), shown
        assert "gpus=2" not in shown[1] + shown[3], shown  # not on the slice
    finally:
        release.touch()
        dbg4.ok("%mesh dbg continue -r 0")
    assert dbg4.ok("print(am.inspect(y))").stream().strip() == "tensor([1., 1.])"

"""The debugger widget: it appears when a rank pauses and drives the ranks with its buttons."""

from __future__ import annotations

import html
import re

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
    assert table() == {
        0: ("running", "", ""),
        1: ("paused", f"In [{n}]:4", "<module>"),  # the sidebar's location form
        2: ("running", "", ""),
        3: ("paused", f"In [{n}]:4", "<module>"),
    }
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

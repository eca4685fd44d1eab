"""The debugger widget: it appears when a rank pauses and drives the ranks with its buttons."""

from __future__ import annotations

from kernel_support import Kernel
from support import wait_until

WIDGET = "get_ipython()._actormesh_magics.debug.widget"


def test_widget_appears_on_pause_and_steps_and_continues_ranks(dbg4: Kernel) -> None:
    r = dbg4.ok(
        "%%mesh procs\n"
        "a = rank + 100\n"
        "if rank in (1, 3):\n"
        "    breakpoint()\n"
        "    b = a * 2\n"
        "    print('b is', b)\n"
    )
    n = r.reply["content"]["execution_count"]
    views = [m for m in r.messages if m["msg_type"] == "display_data"]
    assert any("application/vnd.jupyter.widget-view+json" in m["content"]["data"] for m in views)

    def table() -> str:
        return str(dbg4.ok(f"{WIDGET}.table.value").value)

    wait_until(lambda: table().count("paused at") == 2, 10, "the widget to show 2 paused ranks")
    assert f"paused at In [{n}]:4 in &lt;module&gt;" in table()
    dbg4.ok(f"w = {WIDGET}\nw.rank.value = (w.rank.value[0], 1)")
    stack = dbg4.ok("w.stack.value").value
    assert stack is not None and f"In [{n}]:4" in stack
    assert "101" in str(dbg4.ok("w.locals.value").value)

    dbg4.ok("w.buttons[1].click()")  # step over, this rank only
    wait_until(lambda: f"In [{n}]:5" in table(), 10, "rank 1 to step to the next line")
    assert f"paused at In [{n}]:4" in table()  # rank 3 did not move

    # Continue every paused rank, and wait for them in the same cell: their remaining output
    # arrives while it runs.
    out = dbg4.ok("w.scope.value = 'all'\nw.buttons[0].click()\n_mesh.get(timeout=30)").stream()
    assert "[gpus=1] b is 202" in out and "[gpus=3] b is 206" in out, out
    wait_until(lambda: "paused" not in table(), 10, "every rank to run again")

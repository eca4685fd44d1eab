"""``am.log_metrics`` in a real kernel: ``procs.metrics()``, ``%mesh plot`` and ``--live``."""

from __future__ import annotations

import time
from typing import Any

from kernel_support import Kernel

TRAIN = """
class Trainer(am.Actor):
    @am.endpoint
    def train(self, steps, offset=0):
        for step in range(steps):
            loss = 1.0 / (step + 1) + am.current_rank()["gpus"]
            am.log_metrics({"loss": loss}, step=offset + step)
trainer = procs.spawn("plot_trainer", Trainer)
"""


def images(messages: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in messages if m["msg_type"] == kind and "image/png" in m["content"]["data"]]


def test_metrics_table_and_inline_plot(kernel4: Kernel) -> None:
    kernel4.ok(TRAIN)
    kernel4.ok("trainer.train.call(5).get()")
    kernel4.ok(
        "m = procs.metrics('loss'); rows = m.to_dict('records') if hasattr(m, 'to_dict') else m"
    )
    r = kernel4.ok("len(rows), sorted({row['gpus'] for row in rows})")
    assert r.value == "(20, [0, 1, 2, 3])"
    r = kernel4.ok("%mesh plot loss")
    shown = images(r.messages, "display_data")
    assert len(shown) == 1
    assert "20 values" in shown[0]["content"]["data"]["text/plain"]
    bad = kernel4.execute("%mesh plot")
    assert bad.status == "error" and "give the metric names" in bad.stream("stderr") + str(
        bad.reply
    )


def test_a_live_plot_redraws_while_a_later_cell_trains(kernel4: Kernel) -> None:
    kernel4.ok(TRAIN)
    r = kernel4.ok("%mesh plot loss --live")
    first = images(r.messages, "display_data")
    assert len(first) == 1
    display_id = first[0]["content"]["transient"]["display_id"]
    # The training cell runs on its own; the redraw arrives on iopub under the figure's id.
    kc = kernel4.kc
    msg_id = kc.execute("trainer.train.call(3, offset=100).get()")
    updated, idle, deadline = False, False, time.monotonic() + 60
    while not (updated and idle):
        assert time.monotonic() < deadline, "no redraw of the live plot within 60 s"
        msg = kc.get_iopub_msg(timeout=60)
        if msg["msg_type"] == "update_display_data":
            assert msg["content"]["transient"]["display_id"] == display_id
            updated = True
        if msg["msg_type"] == "status" and msg["parent_header"].get("msg_id") == msg_id:
            idle = idle or msg["content"]["execution_state"] == "idle"
    kernel4.ok("%mesh plot --stop")

"""Plays the JupyterLab sidebar against a real kernel (the kernel tests' panel client)."""

from __future__ import annotations

import queue
import uuid
from collections.abc import Callable
from typing import Any

from jupyter_client.blocking.client import BlockingKernelClient
from kernel_support import Kernel
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

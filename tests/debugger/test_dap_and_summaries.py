"""The DAP client against a scripted adapter on a loopback socket, and the summary tables."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from actormesh.debugger.dap import DapError, FrameReader, connect, encode
from actormesh.debugger.tensors import Comparison, check_name, summarize, summarize_in


def test_frames_split_and_joined_across_reads() -> None:
    data = encode({"seq": 1, "type": "event", "event": "a"}) + encode({"seq": 2, "x": "é" * 5})
    reader = FrameReader()
    got: list[dict[str, Any]] = []
    for i in range(len(data)):  # one byte at a time
        got.extend(reader.feed(data[i : i + 1]))
    assert got == [{"seq": 1, "type": "event", "event": "a"}, {"seq": 2, "x": "é" * 5}]
    with pytest.raises(DapError, match="without Content-Length"):
        FrameReader().feed(b"X-Other: 1\r\n\r\n{}")


class Adapter:
    """A scripted debug adapter: answers every request, can send events and hang up."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.conn: socket.socket | None = None
        self.requests: list[dict[str, Any]] = []
        self.silent: set[str] = set()  # commands left unanswered
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.conn, _ = self.server.accept()
        reader = FrameReader()
        while True:
            try:
                data = self.conn.recv(4096)
            except OSError:
                return
            if not data:
                return
            for msg in reader.feed(data):
                self.requests.append(msg)
                if msg["command"] in self.silent:
                    continue
                ok = msg["command"] != "fail"
                reply = {
                    "type": "response",
                    "request_seq": msg["seq"],
                    "success": ok,
                    "command": msg["command"],
                    "body": {"echo": msg.get("arguments")},
                }
                if not ok:
                    reply["message"] = "it failed"
                self.conn.sendall(encode(reply))

    def event(self, name: str, body: dict[str, Any]) -> None:
        assert self.conn is not None
        self.conn.sendall(encode({"type": "event", "event": name, "body": body, "seq": 0}))

    def hang_up(self) -> None:
        assert self.conn is not None
        self.conn.shutdown(socket.SHUT_RDWR)  # close() alone waits for the blocked recv
        self.conn.close()

    def close(self) -> None:
        self.server.close()
        if self.conn is not None:
            self.conn.close()


@pytest.fixture
def adapter() -> Iterator[Adapter]:
    a = Adapter()
    yield a
    a.close()


def test_requests_events_failures_and_hang_up(adapter: Adapter) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    seen = threading.Event()

    def on_event(name: str, body: dict[str, Any]) -> None:
        events.append((name, body))
        seen.set()

    client = connect("127.0.0.1", adapter.port, on_event, name="t")
    try:
        assert client.request("evaluate", {"expression": "x"}) == {"echo": {"expression": "x"}}
        with pytest.raises(DapError, match="fail failed: it failed"):
            client.request("fail")
        adapter.silent.add("slow")
        with pytest.raises(DapError, match=r"no answer to 'slow' within 0\.2 s"):
            client.request("slow", timeout=0.2)
        adapter.event("stopped", {"threadId": 3})
        assert seen.wait(5) and events[0] == ("stopped", {"threadId": 3})
        pending = client.send_request("slow")
        adapter.hang_up()
        with pytest.raises(DapError, match="closed before 'slow' was answered"):
            client.wait(pending, timeout=5)
        assert client.closed.wait(5)
        with pytest.raises(DapError, match="closed"):
            client.request("evaluate")
        assert events[-1] == ("_closed", {})
    finally:
        client.close()
    assert [r["seq"] for r in adapter.requests] == sorted(r["seq"] for r in adapter.requests)


def test_tensor_summary_counts_nan_and_inf_and_respects_the_cap() -> None:
    t = torch.tensor([1.0, float("nan"), float("inf"), -2.0])
    s = summarize(t, cap=10)
    assert (s["shape"], s["dtype"], s["nan"], s["inf"], s["sampled"]) == (
        [4],
        "float32",
        1,
        1,
        False,
    )
    big = summarize(torch.arange(100), cap=10)
    assert big["sampled"] and big["max"] == 9.0 and big["numel"] == 100
    assert summarize(torch.zeros(0))["norm"] is None
    assert summarize([1, 2])["kind"] == "value"
    json.dumps(summarize(torch.nn.Linear(2, 2)))  # JSON-able: it travels as text from a frame


def test_names_are_looked_up_never_evaluated() -> None:
    ns = {"model": torch.nn.Linear(2, 3)}
    assert summarize_in("model.weight", ns, 100)["shape"] == [3, 2]
    for bad in ["__import__('os')", "a b", "x[0]", "1x"]:
        with pytest.raises(ValueError, match="variable name"):
            check_name(bad)
    with pytest.raises(NameError):
        summarize_in("missing", ns, 100)


def test_comparison_flags_nan_ranks_and_module_ranks_that_differ() -> None:
    ones = summarize(torch.ones(4))
    nan = summarize(torch.tensor([1.0, float("nan"), 1.0, 1.0]))
    c = Comparison("t", {"r0": ones, "r1": nan, "r2": ones, "r3": "NameError: t"})
    assert c.flagged == ["r1"]
    assert ("norm", "r1") in c.odd and ("norm", "r0") not in c.odd
    assert "flagged: r1" in repr(c) and "jp-actormesh-odd" in c._repr_html_()
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    b.load_state_dict(a.state_dict())
    c2 = Comparison("m", {"r0": summarize(a), "r1": summarize(a), "r2": summarize(b)})
    assert c2.flagged == []
    with torch.no_grad():
        b.bias.add_(1)
    c3 = Comparison("m", {"r0": summarize(a), "r1": summarize(a), "r2": summarize(b)})
    assert c3.flagged == ["r2"] and ("bias norm", "r2") in c3.odd


def test_comparison_of_shards_compares_only_replicas_of_one_block() -> None:
    # Rows 0-1 on r0/r1 (replicas), rows 2-3 on r2/r3: the blocks differ, which is no news;
    # r3 disagreeing with r2, which holds the same rows, is.
    top, bottom = torch.ones(2, 4), torch.full((2, 4), 3.0)
    block = {"r0": "(2, 4)@(0, 0)", "r1": "(2, 4)@(0, 0)", "r2": "(2, 4)@(2, 0)",
             "r3": "(2, 4)@(2, 0)"}  # fmt: skip
    shards = {"r0": top, "r1": top, "r2": bottom, "r3": bottom}
    c = Comparison("t", {r: {**summarize(t), "block": block[r]} for r, t in shards.items()})
    assert c.flagged == [] and not c.odd
    shards["r3"] = bottom + 1
    c = Comparison("t", {r: {**summarize(t), "block": block[r]} for r, t in shards.items()})
    assert c.flagged == ["r2", "r3"]  # two replicas that disagree: either may be the odd one
    assert ("norm", "r3") in c.odd and ("norm", "r0") not in c.odd

"""The rank's metrics outbox (``messaging/metrics.py``) without a lock on the logging path: calls
from several threads, with flushes running meanwhile, each arrive exactly once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import pytest

from actormesh.runtime.messaging import metrics

THREADS = 4
CALLS = 3000


class _Transport:
    def call_soon(self, fn: Any) -> None:
        pass  # the flush timer: the test flushes by itself


class _Node:
    """What the outbox uses of a worker's node: where to send, and a send that keeps."""

    controller = object()
    mesh_id = "mesh-test"
    transport = _Transport()

    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    def send(self, dest: object, envelope: tuple[Any, ...]) -> None:
        self.sent.append(envelope)


@pytest.fixture
def node() -> Iterator[_Node]:
    saved = metrics._outbox
    metrics._outbox = metrics._Outbox()
    fake = _Node()
    metrics.start_outbox(fake, 3)  # type: ignore[arg-type]  # a stand-in for Node
    try:
        yield fake
    finally:
        metrics._outbox = saved


def test_concurrent_calls_and_flushes_lose_and_repeat_nothing(node: _Node) -> None:
    start = threading.Barrier(THREADS + 1)
    logging_done = threading.Event()

    def log(thread: int) -> None:
        start.wait(timeout=10)
        for i in range(CALLS):
            metrics.log_metrics({"loss": float(i), "thread": thread}, step=i)

    def flush_until_done() -> None:
        start.wait(timeout=10)
        while not logging_done.is_set():
            metrics.flush_metrics()

    loggers = [threading.Thread(target=log, args=(t,)) for t in range(THREADS)]
    flusher = threading.Thread(target=flush_until_done)
    for t in [*loggers, flusher]:
        t.start()
    for t in loggers:
        t.join(timeout=60)
    logging_done.set()
    flusher.join(timeout=60)
    assert not any(t.is_alive() for t in [*loggers, flusher])
    metrics.flush_metrics()

    assert all(env[:3] == (metrics.METRICS, "mesh-test", 3) for env in node.sent)
    records = [r for env in node.sent for r in metrics.call_records(env[3])]
    got = sorted((int(value), step) for name, value, step, _ in records if name == "thread")
    assert got == sorted((t, i) for t in range(THREADS) for i in range(CALLS))
    losses = sorted((step, value) for name, value, step, _ in records if name == "loss")
    assert losses == sorted((i, float(i)) for _ in range(THREADS) for i in range(CALLS))
    assert len(node.sent) > 1  # the flushes did run while the threads logged


def test_values_are_floats_and_bad_ones_refused_before_anything_is_kept(node: _Node) -> None:
    import numpy as np

    metrics.log_metrics({"a": 1, "b": np.float32(0.5), "c": True}, step=2)
    with pytest.raises(metrics.MeshUsageError, match="must be a number"):
        metrics.log_metrics({"ok": 1.0, "bad": "0.5"})
    with pytest.raises(metrics.MeshUsageError, match=r"'huge' is an int of 1329 bits, too large"):
        metrics.log_metrics({"ok": 1.0, "huge": 10**400})
    with pytest.raises(metrics.MeshUsageError, match=r"'huge' is Fraction.*too large for a float"):
        metrics.log_metrics({"ok": 1.0, "huge": Fraction(10**400, 3)})
    metrics.flush_metrics()
    (envelope,) = node.sent
    assert metrics.call_records(envelope[3]) == [
        ("a", 1.0, 2, envelope[3][0][1]),
        ("b", 0.5, 2, envelope[3][0][1]),
        ("c", 1.0, 2, envelope[3][0][1]),
    ]
    assert all(type(v) is float for _, v, _, _ in metrics.call_records(envelope[3]))

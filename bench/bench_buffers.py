"""64 MB through ``TensorBuffer``'s socket path, beside raw pyzmq between the same two processes.

Two actors A and B on two worker processes of one host. A owns a 64 MB float32 tensor and
serves it as ``TensorBuffer(t, transport="socket")`` (the path buffers take between hosts,
forced here on one host); B times ``buf.read_into(dst)``. The floor runs in the very same two
processes: B binds a raw pyzmq PULL socket, A pushes the same 64 MB as one zero-copy frame, B
receives it and copies it into the same ``dst`` (what ``read_into`` must do too), then tells A
it is done over a PUSH socket of its own. Both go over ipc://, which is what the runtime's
worker-to-worker connection uses on one host; the floor is also run over tcp://127.0.0.1.
The two sides alternate for ``ROUNDS`` rounds; the ratio uses the medians of all iterations.
Target (issue 4): the socket path at ≥ 80 % of raw pyzmq's bandwidth.

Run:  python bench/bench_buffers.py            (BENCH_QUICK=1: one short round)
Prints one JSON object; ``BENCH_OUT=path`` also writes it there.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/
import common as C

import actormesh as am

NBYTES = 64 << 20
WARMUP, ITERS, ROUNDS = (1, 5, 1) if C.QUICK else (3, 15, 4)
TARGET = 0.80


class Owner(am.Actor):
    """A: owns the tensor; serves it as a buffer, or pushes it raw."""

    def __init__(self) -> None:
        import torch

        self.t = torch.ones(NBYTES // 4, dtype=torch.float32)
        self.buf = am.TensorBuffer(self.t, transport="socket")
        self._push: Any = None
        self._acks: Any = None

    @am.endpoint
    def buffer(self) -> am.TensorBuffer:
        return self.buf

    @am.endpoint
    def push_raw(self, endpoint: str, ack_endpoint: str, n: int) -> None:
        """Send the tensor ``n`` times, each after the reader acknowledged the previous one."""
        import zmq

        ctx = zmq.Context.instance()
        push = ctx.socket(zmq.PUSH)
        push.connect(endpoint)
        acks = ctx.socket(zmq.PULL)
        acks.bind(ack_endpoint)
        try:
            for _ in range(n):
                push.send(memoryview(self.t.numpy()).cast("B"), copy=False)
                acks.recv()
        finally:
            push.close(linger=1000)
            acks.close(linger=0)


class Reader(am.Actor):
    """B: reads through the buffer, or receives the raw frames; times each transfer."""

    def __init__(self) -> None:
        import torch

        self.dst = torch.zeros(NBYTES // 4, dtype=torch.float32)

    @am.endpoint
    def read(self, buf: am.TensorBuffer, n: int) -> list[int]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            buf.read_into(self.dst).get()
            out.append(time.perf_counter_ns() - t0)
            assert float(self.dst[-1]) == 1.0
            self.dst.fill_(0)
        return out

    @am.endpoint
    def receive_raw(self, endpoint: str, ack_endpoint: str, n: int, ready: Any) -> list[int]:
        import torch
        import zmq

        ctx = zmq.Context.instance()
        pull = ctx.socket(zmq.PULL)
        pull.bind(endpoint)
        ack = ctx.socket(zmq.PUSH)
        ack.connect(ack_endpoint)
        ready.send(True)
        out = []
        try:
            for _ in range(n):
                t0 = time.perf_counter_ns()
                frame = pull.recv(copy=False)
                src = torch.frombuffer(frame.buffer, dtype=torch.float32)
                self.dst.copy_(src)
                out.append(time.perf_counter_ns() - t0)
                assert float(self.dst[-1]) == 1.0
                self.dst.fill_(0)
                ack.send(b"")
        finally:
            pull.close(linger=0)
            ack.close(linger=1000)
        return out


def raw_round(owner: Any, reader: Any, kind: str, n: int, tag: int) -> list[int]:
    run_dir = os.environ.get("TMPDIR", "/tmp")
    if kind == "ipc":
        data, acks = (f"ipc://{run_dir}/ambench-{os.getpid()}-{tag}-{i}" for i in ("d", "a"))
    else:
        import socket

        ports = []
        for _ in range(2):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                ports.append(s.getsockname()[1])
        data, acks = (f"tcp://127.0.0.1:{p}" for p in ports)
    ready_port, ready_recv = am.Channel.open()
    received = reader.receive_raw.call_one(data, acks, n, ready_port)
    ready_recv.recv().get(timeout=30)  # B has bound: A may connect and send
    owner.push_raw.call_one(data, acks, n).get(timeout=300)
    return list(received.get(timeout=300))


def main() -> None:
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load0 = os.getloadavg()[0]
    procs = am.this_host().spawn_procs(per_host={"procs": 2})
    owner = procs.slice(procs=0).spawn("owner", Owner)
    reader = procs.slice(procs=1).spawn("reader", Reader)
    buf = owner.buffer.call_one().get(timeout=120)
    samples: dict[str, list[int]] = {"buffer": [], "raw_ipc": [], "raw_tcp": []}
    for r in range(ROUNDS):
        for kind in ("raw_ipc", "buffer", "raw_tcp"):
            if kind == "buffer":
                got = reader.read.call_one(buf, WARMUP + ITERS).get(timeout=300)
            else:
                got = raw_round(owner, reader, kind[4:], WARMUP + ITERS, r)
            samples[kind] += list(got)[WARMUP:]
    procs.stop().get(timeout=60)

    def gbps(ns: list[int]) -> float:
        return NBYTES / (statistics.median(ns) / 1e9) / 1e9

    result = {
        "started": started,
        "load_average": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "nbytes": NBYTES,
        "rounds": ROUNDS,
        "iters_per_round": ITERS,
        "GBps": {k: round(gbps(v), 3) for k, v in samples.items()},
    }
    ratio = gbps(samples["buffer"]) / gbps(samples["raw_ipc"])
    result["buffer_over_raw_ipc"] = round(ratio, 3)
    result["buffer_over_raw_tcp"] = round(gbps(samples["buffer"]) / gbps(samples["raw_tcp"]), 3)
    result["target"] = f">= {TARGET:.0%} of raw pyzmq (ipc, same two processes)"
    result["met"] = ratio >= TARGET
    C.print_result(result, indent=2)


if __name__ == "__main__":
    main()

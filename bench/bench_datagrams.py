"""What the floor itself spends: a pickled echo over raw pyzmq beside the same echo over unix
datagram sockets, to 1 and to 8 worker processes, and the two mixed (calls over pyzmq, replies as
datagrams: what actormesh does since issue 22's tenth pass).

No actormesh code runs here. Each worker process has a DEALER socket connected to the
controller's ROUTER (ipc://) and a bound unix datagram socket; the controller has both too. The
sides alternate in short blocks; reported are the medians of the block medians and, per side,
the difference to pyzmq's in µs (the median of the per-block differences).

Run:  python bench/bench_datagrams.py   (BENCH_QUICK=1: fewer blocks; BENCH_OUT=path: JSON)
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import pickle
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

WORKERS = 8
QUICK = os.environ.get("BENCH_QUICK") == "1"
BLOCKS = 6 if QUICK else 20
CALLS = 100 if QUICK else 200
BUFFER = 65536
STOP = b""


def worker_main(index: int, run_dir: str) -> None:
    """Echo: a call on the DEALER is answered on the DEALER, or as a datagram when it asks."""
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, b"w%d" % index)
    dealer.connect(f"ipc://{run_dir}/router")
    inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    inbox.bind(f"{run_dir}/w{index}")
    out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    controller = f"{run_dir}/controller"
    dealer.send(b"ready")

    # Datagram calls are served by a thread of their own, as the DEALER's are by this one.
    def serve_datagrams() -> None:
        while True:
            data = inbox.recv(BUFFER)
            if data == STOP:
                return
            out.sendto(pickle.dumps(pickle.loads(data), protocol=5), controller)

    thread = threading.Thread(target=serve_datagrams, daemon=True)
    thread.start()
    while True:
        frame = dealer.recv()
        if frame == STOP:
            break
        value = pickle.dumps(pickle.loads(frame[1:]), protocol=5)
        if frame[:1] == b"d":  # answer as a datagram
            out.sendto(value, controller)
        else:
            dealer.send(value)
    thread.join(10)
    dealer.close(linger=0)
    ctx.term()


def main() -> None:
    run_dir = tempfile.mkdtemp(prefix="am-bench-dgram-")
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(f"ipc://{run_dir}/router")
    inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    inbox.bind(f"{run_dir}/controller")
    out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    procs = [mp.Process(target=worker_main, args=(i, run_dir)) for i in range(WORKERS)]
    for proc in procs:
        proc.start()
    ids = sorted(router.recv_multipart()[0] for _ in range(WORKERS))
    paths = [f"{run_dir}/w{i}" for i in range(WORKERS)]

    def pyzmq(i: int, n: int) -> None:
        call = b"z" + pickle.dumps(("ping", (i,)), protocol=5)
        for k in range(n):
            router.send_multipart([ids[k], call])
        for _ in range(n):
            assert pickle.loads(router.recv_multipart()[1]) == ("ping", (i,))

    def datagrams(i: int, n: int) -> None:
        call = pickle.dumps(("ping", (i,)), protocol=5)
        for k in range(n):
            out.sendto(call, paths[k])
        for _ in range(n):
            assert pickle.loads(inbox.recv(BUFFER)) == ("ping", (i,))

    def mixed(i: int, n: int) -> None:
        call = b"d" + pickle.dumps(("ping", (i,)), protocol=5)
        for k in range(n):
            router.send_multipart([ids[k], call])
        for _ in range(n):
            assert pickle.loads(inbox.recv(BUFFER)) == ("ping", (i,))

    sides: dict[str, Callable[[int, int], None]] = {
        "pyzmq": pyzmq,
        "datagrams": datagrams,
        "pyzmq calls, datagram replies": mixed,
    }
    out_json: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "load_average_start": round(os.getloadavg()[0], 2),
        "cpus": len(os.sched_getaffinity(0)),
        "blocks": BLOCKS,
        "calls_per_block": CALLS,
    }
    try:
        for n in (1, WORKERS):
            for fn in sides.values():  # warm up
                for i in range(50):
                    fn(i, n)
            blocks: dict[str, list[float]] = {name: [] for name in sides}
            for b in range(BLOCKS):
                order = list(sides.items())
                if b % 2:
                    order.reverse()  # which side goes first alternates too
                for name, fn in order:
                    start = time.perf_counter_ns()
                    for i in range(CALLS):
                        fn(i, n)
                    blocks[name].append((time.perf_counter_ns() - start) / CALLS / 1e3)
            result = {}
            for name, per_block in blocks.items():
                diffs = [a - z for a, z in zip(per_block, blocks["pyzmq"], strict=True)]
                result[name] = {
                    "median_us": round(statistics.median(per_block), 1),
                    "vs_pyzmq_us": round(statistics.median(diffs), 1),
                }
            out_json[f"call_{n}"] = result
    finally:
        for k in range(WORKERS):
            router.send_multipart([ids[k], STOP])
            out.sendto(STOP, paths[k])
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        router.close(linger=0)
        ctx.term()
        inbox.close()
        out.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    out_json["load_average_end"] = round(os.getloadavg()[0], 2)
    text = json.dumps(out_json, indent=1)
    print(text)
    if os.environ.get("BENCH_OUT"):
        with open(os.environ["BENCH_OUT"], "w") as f:
            f.write(text)
    print(file=sys.stderr)
    print("| echo | to 1 worker, µs | vs pyzmq | to 8 workers, µs | vs pyzmq |", file=sys.stderr)
    print("|---|---|---|---|---|", file=sys.stderr)
    for name in sides:
        one, eight = out_json["call_1"][name], out_json[f"call_{WORKERS}"][name]
        print(
            f"| {name} | {one['median_us']} | {one['vs_pyzmq_us']:+} | "
            f"{eight['median_us']} | {eight['vs_pyzmq_us']:+} |",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()

"""PyTorch Monarch (torchmonarch 0.7.0, Rust hyperactor backend) benchmark.

Adapted from shared/peers/bench_monarch.py: same workloads, parameters and metric names, plus
``spawn_cold_8``: ``this_host()`` + spawn 8 + first call in a fresh controller process.
Run:  BENCH_OUT=out.json bench/.venvs/monarch/bin/python bench/peers/bench_monarch.py
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import warnings
from importlib.metadata import version
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
import common as C
import torch
from monarch.actor import Actor, endpoint, this_host


class Worker(Actor):
    def __init__(self) -> None:
        import torch as _t  # torch imported in every worker

        self._torch = _t
        self.count = 0
        self.t: Any = None
        self.dst: dict[int, Any] = {}
        self.buf: Any = None

    @endpoint
    def ready(self) -> int:
        return os.getpid()

    @endpoint
    def ping(self, x: int) -> int:
        return x

    @endpoint
    def recv(self, x: int) -> None:
        self.count += 1

    @endpoint
    def get_count(self) -> int:
        return self.count

    @endpoint
    def reset(self) -> None:
        self.count = 0

    @endpoint
    def consume(self, t: Any) -> int:  # controller -> actor, small ack
        return t.numel() * t.element_size()

    @endpoint
    def make(self, nbytes: int) -> int:
        self.t = self._torch.ones(nbytes // 4, dtype=self._torch.float32)
        return nbytes

    @endpoint
    def produce(self) -> Any:  # actor -> caller
        return self.t

    @endpoint
    def pull(self, other: Any, nbytes: int) -> int:  # actor -> actor via messages
        t0 = time.perf_counter_ns()
        t = other.produce.call_one().get()
        assert t.numel() * 4 == nbytes
        return time.perf_counter_ns() - t0

    @endpoint
    def make_rdma(self, nbytes: int) -> Any:
        from monarch.rdma import RDMABuffer

        self.t = self._torch.ones(nbytes // 4, dtype=self._torch.float32)
        self.buf = RDMABuffer(self.t.view(-1))
        return self.buf

    @endpoint
    def rdma_read(self, buf: Any, nbytes: int) -> int:
        dst = self.dst.get(nbytes)
        if dst is None:
            dst = self.dst[nbytes] = self._torch.empty(nbytes // 4, dtype=self._torch.float32)
        t0 = time.perf_counter_ns()
        buf.read_into(dst.view(-1)).get()
        el = time.perf_counter_ns() - t0
        assert float(dst[-1]) == 1.0
        return el


def bench_ff(R: C.Results, a: Any) -> None:
    for i in range(C.FF_WARMUP):
        a.recv.broadcast(i)
    a.get_count.call_one().get()
    for rep in range(C.FF_REPEATS):
        a.reset.call_one().get()
        t0 = time.perf_counter_ns()
        for i in range(C.FF_MSGS):
            a.recv.broadcast(i)
        t_send = time.perf_counter_ns() - t0
        while a.get_count.call_one().get() < C.FF_MSGS:
            pass
        t_all = time.perf_counter_ns() - t0
        R.add(
            f"ff_rep{rep}",
            {
                "msgs_per_s": C.FF_MSGS / (t_all / 1e9),
                "send_msgs_per_s": C.FF_MSGS / (t_send / 1e9),
                "seconds": t_all / 1e9,
            },
        )


def bench_payload(R: C.Results, a: Any, name: str, size: tuple[int, int, int]) -> None:
    """Controller -> actor (send tensor, small ack) and actor -> controller (fetch)."""
    nb, w, it = size
    x = torch.ones(nb // 4, dtype=torch.float32)
    try:
        R.add(f"send_{name}", C.time_loop(lambda i: a.consume.call_one(x).get(), w, it, nb))
    except Exception as e:
        R.error(f"send_{name}", e)
    try:
        a.make.call_one(nb).get()
        R.add(f"fetch_{name}", C.time_loop(lambda i: a.produce.call_one().get(), w, it, nb))
    except Exception as e:
        R.error(f"fetch_{name}", e)


def bench_a2a(R: C.Results, a: Any, b: Any, name: str, size: tuple[int, int, int]) -> None:
    """Actor -> actor: by message (B calls A.produce) and by RDMABuffer (TCP fallback here)."""
    nb, w, it = size
    try:
        a.make.call_one(nb).get()
        inner: list[int] = []
        st = C.time_loop(lambda i: inner.append(b.pull.call_one(a, nb).get()), w, it, nb)
        st["inner"] = C.stats_ns(inner[w:], nb)
        R.add(f"a2a_msg_{name}", st)
    except Exception as e:
        R.error(f"a2a_msg_{name}", e)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            buf = a.make_rdma.call_one(nb).get()
        inner_r: list[int] = []
        st = C.time_loop(lambda i: inner_r.append(b.rdma_read.call_one(buf, nb).get()), w, it, nb)
        st["inner"] = C.stats_ns(inner_r[w:], nb)
        from monarch.rdma import get_rdma_backend

        st["backend"] = get_rdma_backend()
        R.add(f"a2a_rdma_{name}", st)
    except Exception as e:
        R.error(f"a2a_rdma_{name}", e)
    with contextlib.suppress(Exception):
        a.make.call_one(8).get()  # free the big tensor


def bench_mesh(R: C.Results, host: Any, n: int) -> None:
    try:
        t0 = time.perf_counter()
        procs = host.spawn_procs(per_host={"gpus": n})
        am = procs.spawn(f"w{n}", Worker)
        pids = am.ready.call().get()
        R.add(f"spawn_{n}", {"seconds": time.perf_counter() - t0, "n": len(list(pids.values()))})
    except Exception as e:
        R.error(f"spawn_{n}", e)
        return
    try:
        R.add(
            f"call_all_{n}",
            C.time_loop(lambda i: am.ping.call(i).get(), C.ALL_WARMUP, C.ALL_ITERS),
        )
    except Exception as e:
        R.error(f"call_all_{n}", e)

    if n == 2:
        a = am.slice(gpus=0)
        b = am.slice(gpus=1)
        try:
            R.add(
                "call_one",
                C.time_loop(lambda i: a.ping.call_one(i).get(), C.RTT_WARMUP, C.RTT_ITERS),
            )
        except Exception as e:
            R.error("call_one", e)
        try:
            bench_ff(R, a)
        except Exception as e:
            R.error("ff", e)
        for name, size in C.PAYLOADS.items():
            bench_payload(R, a, name, size)
        for name, size in C.A2A_PAYLOADS.items():
            bench_a2a(R, a, b, name, size)
    try:
        procs.stop().get()
    except Exception as e:
        R.error(f"stop_{n}", e)


def cold_spawn_main(n: int) -> None:
    """``--cold-spawn N``: this process is a fresh controller; print its spawn timings as JSON."""
    t0 = time.perf_counter()
    host = this_host()
    t1 = time.perf_counter()
    procs = host.spawn_procs(per_host={"gpus": n})
    am = procs.spawn(f"cold{n}", Worker)
    pids = am.ready.call().get()
    t2 = time.perf_counter()
    procs.stop().get()
    n_pids = len(set(pids.values()))
    print(json.dumps({"seconds": t2 - t0, "init_s": t1 - t0, "spawn_s": t2 - t1, "n": n_pids}))


def bench_cold_spawn(R: C.Results, n: int) -> None:
    """Run ``cold_spawn_main`` in a child process (imports are done before its clock starts)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--cold-spawn", str(n)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr[-1500:]}")
        lines = [x for x in p.stdout.splitlines() if x.startswith('{"seconds"')]
        R.add(f"spawn_cold_{n}", json.loads(lines[-1]))
    except Exception as e:
        R.error(f"spawn_cold_{n}", e)


def main() -> None:
    R = C.Results("monarch")
    R.data["versions"] = {"torchmonarch": version("torchmonarch"), "torch": torch.__version__}
    bench_cold_spawn(R, max(C.MESH_SIZES))
    t0 = time.perf_counter()
    host = this_host()
    R.add("init_s", {"seconds": time.perf_counter() - t0})
    for n in C.MESH_SIZES:
        bench_mesh(R, host, n)
    R.save()


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--cold-spawn":
        cold_spawn_main(int(sys.argv[2]))
    else:
        main()

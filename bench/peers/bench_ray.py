"""Ray 2.60 benchmark (single node, local cluster started by ray.init).

Adapted from shared/peers/bench_ray.py: same workloads, parameters and metric names.
Run:  BENCH_OUT=out.json bench/.venvs/ray/bin/python bench/peers/bench_ray.py
With RAY_ENABLE_ZERO_COPY_TORCH_TENSORS=1 the system is reported as "ray_zc".
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
import common as C
import numpy as np
import ray
import torch


@ray.remote
class Worker:
    def __init__(self) -> None:
        import torch as _t  # torch imported in every worker

        self._torch = _t
        self.count = 0
        self.t: Any = None

    def ready(self) -> int:
        return os.getpid()

    def ping(self, x: int) -> int:
        return x

    def recv(self, x: int) -> None:
        self.count += 1

    def get_count(self) -> int:
        return self.count

    def reset(self) -> None:
        self.count = 0

    def consume(self, t: Any) -> int:  # controller -> actor, small ack
        return t.numel() * t.element_size() if hasattr(t, "numel") else t.nbytes

    def make(self, nbytes: int, kind: str = "torch") -> int:
        if kind == "torch":
            self.t = self._torch.ones(nbytes // 4, dtype=self._torch.float32)
        else:
            self.t = np.ones(nbytes // 4, dtype=np.float32)
        return nbytes

    def produce(self) -> Any:  # actor -> caller
        return self.t

    def pull(self, other: Any, nbytes: int) -> int:  # actor -> actor: direct call
        t0 = time.perf_counter_ns()
        t = ray.get(other.produce.remote())
        assert t.nbytes == nbytes if isinstance(t, np.ndarray) else t.numel() * 4 == nbytes
        return time.perf_counter_ns() - t0

    def put_ref(self) -> tuple[int, list[Any]]:  # actor-side ray.put
        t0 = time.perf_counter_ns()
        ref = ray.put(self.t)
        return time.perf_counter_ns() - t0, [ref]

    def get_ref(self, refs: list[Any], nbytes: int) -> int:  # actor-side ray.get
        t0 = time.perf_counter_ns()
        t = ray.get(refs[0])
        el = time.perf_counter_ns() - t0
        assert float(t[-1]) == 1.0
        return el


def bench_ff(R: C.Results, a: Any) -> None:
    for i in range(C.FF_WARMUP):
        a.recv.remote(i)
    ray.get(a.get_count.remote())
    for rep in range(C.FF_REPEATS):
        ray.get(a.reset.remote())
        t0 = time.perf_counter_ns()
        for i in range(C.FF_MSGS):
            a.recv.remote(i)
        t_send = time.perf_counter_ns() - t0
        while ray.get(a.get_count.remote()) < C.FF_MSGS:
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
    nb, w, it = size
    x = torch.ones(nb // 4, dtype=torch.float32)
    try:  # tensor passed by value: Ray puts it in the object store
        R.add(f"send_{name}", C.time_loop(lambda i: ray.get(a.consume.remote(x)), w, it, nb))
    except Exception as e:
        R.error(f"send_{name}", e)
    try:
        R.add(f"put_{name}", C.time_loop(lambda i: ray.put(x), w, it, nb))
    except Exception as e:
        R.error(f"put_{name}", e)
    try:
        ray.get(a.make.remote(nb))
        R.add(f"fetch_{name}", C.time_loop(lambda i: ray.get(a.produce.remote()), w, it, nb))
    except Exception as e:
        R.error(f"fetch_{name}", e)


def bench_a2a(
    R: C.Results, a: Any, b: Any, name: str, size: tuple[int, int, int], kind: str
) -> None:
    nb, w, it = size
    sfx = "" if kind == "torch" else "_np"
    try:
        ray.get(a.make.remote(nb, kind))
        inner: list[int] = []
        st = C.time_loop(lambda i: inner.append(ray.get(b.pull.remote(a, nb))), w, it, nb)
        st["inner"] = C.stats_ns(inner[w:], nb)
        R.add(f"a2a_msg_{name}{sfx}", st)
    except Exception as e:
        R.error(f"a2a_msg_{name}{sfx}", e)
    try:  # explicit ray.put in A, ray.get in B (ref relayed by controller)
        puts, gets, tot = [], [], []
        for _ in range(w + it):
            t0 = time.perf_counter_ns()
            pt, refs = ray.get(a.put_ref.remote())
            gt = ray.get(b.get_ref.remote(refs, nb))
            tot.append(time.perf_counter_ns() - t0)
            puts.append(pt)
            gets.append(gt)
            del refs
        st = C.stats_ns(tot[w:], nb)
        st["put_in_A"] = C.stats_ns(puts[w:], nb)
        st["get_in_B"] = C.stats_ns(gets[w:], nb)
        R.add(f"a2a_putget_{name}{sfx}", st)
    except Exception as e:
        R.error(f"a2a_putget_{name}{sfx}", e)


def bench_mesh(R: C.Results, n: int) -> None:
    try:
        t0 = time.perf_counter()
        actors = [Worker.remote() for _ in range(n)]
        pids = ray.get([a.ready.remote() for a in actors])
        R.add(f"spawn_{n}", {"seconds": time.perf_counter() - t0, "n": len(set(pids))})
    except Exception as e:
        R.error(f"spawn_{n}", e)
        return
    try:
        R.add(
            f"call_all_{n}",
            C.time_loop(
                lambda i: ray.get([a.ping.remote(i) for a in actors]),
                C.ALL_WARMUP,
                C.ALL_ITERS,
            ),
        )
    except Exception as e:
        R.error(f"call_all_{n}", e)
    if n == 2:
        a, b = actors
        try:
            R.add(
                "call_one",
                C.time_loop(lambda i: ray.get(a.ping.remote(i)), C.RTT_WARMUP, C.RTT_ITERS),
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
            for kind in ("torch", "numpy"):
                bench_a2a(R, a, b, name, size, kind)
            ray.get(a.make.remote(8))
    for a_ in actors:
        ray.kill(a_)
    actors.clear()
    time.sleep(1.0)


def main() -> None:
    zc = os.environ.get("RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "0") not in ("", "0")
    R = C.Results("ray_zc" if zc else "ray")
    R.data["versions"] = {
        "ray": ray.__version__,
        "torch": torch.__version__,
        "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": os.environ.get(
            "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS", "0"
        ),
    }
    t0 = time.perf_counter()
    ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    R.add("init_s", {"seconds": time.perf_counter() - t0})
    try:
        for n in C.MESH_SIZES:
            bench_mesh(R, n)
    finally:
        R.save()
        ray.shutdown()


if __name__ == "__main__":
    main()

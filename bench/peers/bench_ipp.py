"""ipyparallel 9.2 benchmark (local ipcontroller + ipengines over ZeroMQ).

Adapted from shared/peers/bench_ipp.py: same workloads, parameters and metric names.
Run:  BENCH_OUT=out.json bench/.venvs/ipp/bin/python bench/peers/bench_ipp.py
Payloads are numpy float32 arrays (ipp's zero-copy buffer path); one torch variant is measured
for comparison.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench/
import common as C
import ipyparallel as ipp
import numpy as np
import torch


# engine-side functions (canned by value and sent with each apply)
def ready() -> int:
    import os

    import torch  # noqa: F401  torch imported in every engine

    return os.getpid()


def ping(x: int) -> int:
    return x


def recv(x: int) -> None:
    import sys

    sys._bench_cnt = getattr(sys, "_bench_cnt", 0) + 1  # type: ignore[attr-defined]


def get_count() -> int:
    import sys

    return getattr(sys, "_bench_cnt", 0)


def reset() -> None:
    import sys

    sys._bench_cnt = 0  # type: ignore[attr-defined]


def consume(t: Any) -> int:
    return t.nbytes if hasattr(t, "nbytes") else t.numel() * t.element_size()


def make(nbytes: int) -> int:
    import sys

    import numpy as np

    sys._bench_t = np.ones(nbytes // 4, dtype=np.float32)  # type: ignore[attr-defined]
    return nbytes


def produce() -> Any:
    import sys

    return sys._bench_t  # type: ignore[attr-defined]


def bench_ff(R: C.Results, rc: Any, a: Any) -> None:
    for i in range(C.FF_WARMUP):
        a.apply_async(recv, i)
    a.apply_sync(get_count)
    for rep in range(C.FF_REPEATS):
        a.apply_sync(reset)
        t0 = time.perf_counter_ns()
        for i in range(C.FF_MSGS):
            a.apply_async(recv, i)
        t_send = time.perf_counter_ns() - t0
        while a.apply_sync(get_count) < C.FF_MSGS:
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
    rc.purge_everything()


def bench_payload(R: C.Results, rc: Any, a: Any, name: str, size: tuple[int, int, int]) -> None:
    nb, w, it = size
    x = np.ones(nb // 4, dtype=np.float32)
    try:
        R.add(f"send_{name}", C.time_loop(lambda i: a.apply_sync(consume, x), w, it, nb))
    except Exception as e:
        R.error(f"send_{name}", e)
    try:
        xt = torch.ones(nb // 4, dtype=torch.float32)
        R.add(f"send_{name}_torch", C.time_loop(lambda i: a.apply_sync(consume, xt), w, it, nb))
    except Exception as e:
        R.error(f"send_{name}_torch", e)
    try:
        R.add(f"push_{name}", C.time_loop(lambda i: a.push({"x": x}, block=True), w, it, nb))
    except Exception as e:
        R.error(f"push_{name}", e)
    try:
        R.add(f"pull_{name}", C.time_loop(lambda i: a.pull("x", block=True), w, it, nb))
    except Exception as e:
        R.error(f"pull_{name}", e)
    try:
        a.apply_sync(make, nb)
        R.add(f"fetch_{name}", C.time_loop(lambda i: a.apply_sync(produce), w, it, nb))
    except Exception as e:
        R.error(f"fetch_{name}", e)
    rc.purge_everything()


def bench_relay(
    R: C.Results, rc: Any, a: Any, b: Any, name: str, size: tuple[int, int, int]
) -> None:
    """No direct engine->engine channel: relay through the client."""
    nb, w, it = size
    try:
        a.push({"y": np.ones(nb // 4, dtype=np.float32)}, block=True)

        def relay(i: int) -> None:
            y = a.pull("y", block=True)
            b.push({"y": y}, block=True)

        R.add(f"a2a_relay_{name}", C.time_loop(relay, w, it, nb))
        a.execute("y = None", block=True)
        b.execute("y = None", block=True)
        rc.purge_everything()
    except Exception as e:
        R.error(f"a2a_relay_{name}", e)


def bench_mesh(R: C.Results, n: int) -> None:
    cluster = ipp.Cluster(n=n, log_level=40)
    try:
        t0 = time.perf_counter()
        cluster.start_controller_sync()
        t1 = time.perf_counter()
        cluster.start_engines_sync(n=n)
        rc = cluster.connect_client_sync()
        rc.wait_for_engines(n, timeout=300)
        pids = rc[:].apply_sync(ready)
        t2 = time.perf_counter()
        R.add(f"controller_start_{n}", {"seconds": t1 - t0})
        R.add(
            f"spawn_{n}",
            {"seconds": t2 - t1, "n": len(set(pids)), "incl_controller_s": t2 - t0},
        )
    except Exception as e:
        R.error(f"spawn_{n}", e)
        with contextlib.suppress(Exception):
            cluster.stop_cluster_sync()
        return
    try:
        dv = rc[:]
        R.add(
            f"call_all_{n}",
            C.time_loop(lambda i: dv.apply_sync(ping, i), C.ALL_WARMUP, C.ALL_ITERS),
        )
        if n == 2:
            a = rc[0]
            try:
                R.add(
                    "call_one",
                    C.time_loop(lambda i: a.apply_sync(ping, i), C.RTT_WARMUP, C.RTT_ITERS),
                )
            except Exception as e:
                R.error("call_one", e)
            try:
                bench_ff(R, rc, a)
            except Exception as e:
                R.error("ff", e)
            for name, size in C.PAYLOADS.items():
                bench_payload(R, rc, a, name, size)
            b = rc[1]
            for name, size in C.A2A_PAYLOADS.items():
                bench_relay(R, rc, a, b, name, size)
    except Exception as e:
        R.error(f"mesh_{n}", e)
    finally:
        with contextlib.suppress(Exception):
            rc.close()
        cluster.stop_cluster_sync()


def main() -> None:
    R = C.Results("ipp")
    R.data["versions"] = {"ipyparallel": ipp.__version__, "torch": torch.__version__}
    for n in C.MESH_SIZES:
        bench_mesh(R, n)
    R.save()


if __name__ == "__main__":
    main()

"""Shared parameters and helpers for every benchmark script in bench/.

Copied from the team's peer measurements (shared/peers/common.py) with the same parameters and
metric conventions, so figures stay comparable with peers/RESULTS.md.  Every bench_*.py script
imports this module (``sys.path`` points at bench/), measures with the same payloads, iteration
counts and statistics, and writes one JSON file per run (``BENCH_OUT``); report.py turns the
JSON files of one ``run.sh`` invocation into RESULTS.md.

``BENCH_QUICK=1`` selects the smoke-test mode (about 10x fewer iterations).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

# ---- identical parameters for every system ------------------------------------------------
MESH_SIZES = [2, 4, 8]  # spawn + call-to-all
RTT_WARMUP, RTT_ITERS = 200, 2000  # call_one no-op round trip
ALL_WARMUP, ALL_ITERS = 50, 500  # call to all N actors + gather
FF_WARMUP, FF_MSGS = 1000, 10000  # fire-and-forget to one actor
FF_REPEATS = 2
# payload name -> (bytes, warmup, iters); float32 tensors, numel = bytes // 4
PAYLOADS = {
    "1MB": (1 << 20, 10, 100),
    "64MB": (64 << 20, 3, 30),  # 10 samples of ~40 ms let one slow patch of the VM move the median
}
A2A_PAYLOADS = {  # actor -> actor
    "64MB": (64 << 20, 1, 5),
    "256MB": (256 << 20, 1, 3),
}
QUICK = os.environ.get("BENCH_QUICK") == "1"
if QUICK:  # smoke-test mode
    RTT_WARMUP, RTT_ITERS = 20, 200
    ALL_WARMUP, ALL_ITERS = 5, 50
    FF_WARMUP, FF_MSGS = 100, 1000
    PAYLOADS = {"1MB": (1 << 20, 2, 10), "64MB": (64 << 20, 1, 2)}
    A2A_PAYLOADS = {"64MB": (64 << 20, 1, 2), "256MB": (256 << 20, 0, 1)}

Stats = dict[str, Any]


def print_result(result: dict[str, Any], indent: int = 1) -> None:
    """Print one script's JSON result, and write it to ``BENCH_OUT`` when that is set (the
    scripts beside the peer comparison: paired, buffers, allreduce, kernel, debugger)."""
    text = json.dumps(result, indent=indent, default=str)
    print(text, flush=True)
    out = os.environ.get("BENCH_OUT")
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")


def now() -> int:
    return time.perf_counter_ns()


def stats_ns(samples_ns: Iterable[int], nbytes: int | None = None) -> Stats:
    """Summary of per-operation latencies given in ns (and GB/s when ``nbytes`` is given)."""
    xs = sorted(samples_ns)
    n = len(xs)
    if n == 0:
        return {"n": 0}
    p90 = xs[min(n - 1, round(0.9 * (n - 1)))]
    d: Stats = {
        "n": n,
        "median_us": statistics.median(xs) / 1e3,
        "p90_us": p90 / 1e3,
        "mean_us": statistics.fmean(xs) / 1e3,
        "min_us": xs[0] / 1e3,
    }
    if nbytes:
        d["median_GBps"] = nbytes / (d["median_us"] * 1e3)  # bytes/ns == GB/s
        d["best_GBps"] = nbytes / (d["min_us"] * 1e3)
    return d


def timed(fn: Callable[[int], object], start: int, count: int) -> list[int]:
    """Nanoseconds of each of ``fn(start) .. fn(start + count - 1)``, timed one by one."""
    out = []
    for i in range(start, start + count):
        t0 = time.perf_counter_ns()
        fn(i)
        out.append(time.perf_counter_ns() - t0)
    return out


def time_loop(
    fn: Callable[[int], object], warmup: int, iters: int, nbytes: int | None = None
) -> Stats:
    """Run ``fn(i)`` ``warmup`` times untimed, then ``iters`` times timed one by one."""
    for i in range(warmup):
        fn(i)
    return stats_ns(timed(fn, 0, iters), nbytes)


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    try:
        with open("/proc/meminfo") as f:
            info["mem_total_kB"] = int(f.readline().split()[1])
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/loadavg") as f:
            info["loadavg"] = f.read().split()[:3]
    except (OSError, ValueError):
        pass
    return info


class Results:
    """Metrics, errors and notes of one benchmark run, saved as JSON."""

    def __init__(self, system: str) -> None:
        self.system = system
        self.data: dict[str, Any] = {
            "system": system,
            "machine": machine_info(),
            "params": {
                "RTT": [RTT_WARMUP, RTT_ITERS],
                "ALL": [ALL_WARMUP, ALL_ITERS],
                "FF": [FF_WARMUP, FF_MSGS],
                "PAYLOADS": PAYLOADS,
                "A2A": A2A_PAYLOADS,
                "quick": QUICK,
            },
            "metrics": {},
            "errors": {},
            "notes": [],
        }

    def add(self, key: str, value: Any) -> None:
        self.data["metrics"][key] = value
        v = value
        if isinstance(v, dict):
            keep = ("median_us", "p90_us", "median_GBps", "msgs_per_s", "seconds", "n")
            v = {k: (round(x, 3) if isinstance(x, float) else x) for k, x in v.items() if k in keep}
        print(f"[{self.system}] {key}: {v}", flush=True)

    def error(self, key: str, exc: BaseException | str) -> None:
        msg = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        self.data["errors"][key] = msg[:2000]
        print(f"[{self.system}] ERROR {key}: {msg[:500]}", flush=True)

    def note(self, s: str) -> None:
        self.data["notes"].append(s)
        print(f"[{self.system}] note: {s}", flush=True)

    def save(self, path: str | None = None) -> None:
        path = path or os.environ.get("BENCH_OUT") or f"/tmp/bench-{self.system}.json"
        d = os.path.dirname(path)
        if d:
            os.makedirs(d, exist_ok=True)
        with open(path, "w") as f:
            json.dump(self.data, f, indent=1, default=str)
        print(f"[{self.system}] wrote {path}", flush=True)

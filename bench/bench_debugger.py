"""The debugger's costs: stack dumps of 8 ranks, pausing 8 busy ranks and listing them, and the
``call_one`` round trip with the debugger off, attached (no breakpoint), and detached again.

    python bench/bench_debugger.py                 # prints JSON
    BENCH_OUT=out.json BENCH_QUICK=1 python bench/bench_debugger.py

Runs as a plain script controller (the kernel side of the debugger needs no IPython), with the
debugger enabled before the first mesh as the kernel does. Pausing is timed from the request
to the moment every rank is listed as paused with its location; the first pause of a rank also
starts debugpy there and attaches (cold, measured on fresh meshes), later ones do not (warm).
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
from actormesh.debugger.session import Debugger, enable_breakpoints, get_debugger

QUICK = os.environ.get("BENCH_QUICK") == "1"
RANKS = 8
CALLS = 300 if QUICK else 2000
STACK_ITERS = 10 if QUICK else 50
PAUSE_ROUNDS = 2 if QUICK else 5
COLD_ROUNDS = 2 if QUICK else 5  # fresh 8-rank meshes, each paused once
ROUNDS = 2 if QUICK else 5  # alternating attached / detached blocks of call_one


class Spinner(am.Actor):
    def __init__(self) -> None:
        self.stop = False

    @am.endpoint
    def spin(self) -> int:
        self.stop = False
        n = 0
        while not self.stop:
            n += 1
        return n

    @am.endpoint
    def ping(self) -> None:
        return None


def median_ms(samples_ns: list[int]) -> dict[str, float]:
    xs = sorted(samples_ns)
    return {
        "median_ms": statistics.median(xs) / 1e6,
        "p90_ms": xs[round(0.9 * (len(xs) - 1))] / 1e6,
        "min_ms": xs[0] / 1e6,
    }


def time_calls(one: Any, n: int) -> dict[str, float]:
    for _ in range(50):
        one.ping.call_one().get(timeout=10)
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        one.ping.call_one().get(timeout=10)
        samples.append(time.perf_counter_ns() - t0)
    return median_ms(samples)


def wait_paused(debugger: Debugger, mesh_id: str, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len([r for r in debugger.paused() if r.mesh_id == mesh_id and r.location]) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {len(debugger.paused())} of {n} ranks paused")
        time.sleep(0.002)


def pause_and_list(debugger: Debugger, spinners: Any, mesh_id: str) -> int:
    """Pause every busy rank and list them; ns. The ranks are running again afterwards."""
    ranks = list(range(RANKS))
    spinning = spinners.spin.call()
    time.sleep(0.2)  # let every rank enter its loop (the pause must find it busy)
    t0 = time.perf_counter_ns()
    debugger.pause(mesh_id, ranks)
    wait_paused(debugger, mesh_id, RANKS)
    listed = debugger.paused()
    elapsed = time.perf_counter_ns() - t0
    assert len(listed) == RANKS
    for rd in listed:
        rd.evaluate("self.stop = True")
    debugger.resume(mesh_id, ranks)
    spinning.get(timeout=30)
    return elapsed


def main() -> None:
    results: dict[str, Any] = {"ranks": RANKS, "quick": QUICK, "python": sys.version.split()[0]}
    enable_breakpoints()  # what the kernel does when it loads: before any host agent starts
    procs = am.this_host().spawn_procs(per_host={"gpus": RANKS})
    spinners = procs.spawn("spinners", Spinner)
    spinners.ping.call().get(timeout=60)
    one = spinners.slice(gpus=0)
    mesh_id = procs._procs.mesh_id
    try:
        # 1. call_one with the debugger never started on any rank
        results["call_one_before_debugging"] = time_calls(one, CALLS)

        # 2. stacks of every rank
        procs.stacks().get(timeout=10)
        samples = []
        for _ in range(STACK_ITERS):
            t0 = time.perf_counter_ns()
            procs.stacks().get(timeout=10)
            samples.append(time.perf_counter_ns() - t0)
        results["stacks_8"] = median_ms(samples)

        # 3. pause 8 busy ranks and list them: cold (starts debugpy and attaches) on fresh
        # meshes, then warm on the first mesh (its first pause is cold too, and not counted)
        debugger = get_debugger()
        cold = []
        for _ in range(COLD_ROUNDS):
            fresh = am.this_host().spawn_procs(per_host={"gpus": RANKS})
            try:
                fresh_spinners = fresh.spawn("spinners", Spinner)
                fresh_spinners.ping.call().get(timeout=60)
                cold.append(pause_and_list(debugger, fresh_spinners, fresh._procs.mesh_id))
            finally:
                fresh.stop().get(timeout=60)
        results["pause_8_and_list_cold"] = median_ms(cold)
        ranks = list(range(RANKS))
        pauses = [pause_and_list(debugger, spinners, mesh_id) for _ in range(PAUSE_ROUNDS + 1)]
        results["pause_8_and_list_warm"] = median_ms(pauses[1:])

        # 4. call_one to a rank with the debugger attached (no breakpoint set), to the same
        # rank detached again (debugpy stays loaded), and to a rank of a second mesh that never
        # debugged, in alternating blocks so that all three see the same noise.
        plain = am.this_host().spawn_procs(per_host={"gpus": 1})
        plain_one = plain.spawn("plain", Spinner)
        try:
            on, detached, off = [], [], []
            for _ in range(ROUNDS):
                debugger.attach(mesh_id, ranks)
                on.append(time_calls(one, CALLS // ROUNDS)["median_ms"])
                off.append(time_calls(plain_one, CALLS // ROUNDS)["median_ms"])
                debugger.detach_all()
                detached.append(time_calls(one, CALLS // ROUNDS)["median_ms"])
        finally:
            plain.stop().get(timeout=60)
        results["call_one_never_debugged_median_ms"] = statistics.median(off)
        results["call_one_attached_median_ms"] = statistics.median(on)
        results["call_one_detached_median_ms"] = statistics.median(detached)
        results["ratio_attached_vs_never"] = statistics.median(on) / statistics.median(off)
        results["ratio_detached_vs_never"] = statistics.median(detached) / statistics.median(off)
        debugger.shutdown()
    finally:
        procs.stop().get(timeout=60)
    results["load_average"] = os.getloadavg()
    C.print_result(results, indent=2)


if __name__ == "__main__":
    main()

"""What ``am.log_metrics`` costs a training loop on a rank, and what the live charts cost a rank.

One rank runs the same loop twice per block pair, with and without ``log_metrics({"loss": x,
"lr": y}, step=i)`` in it, alternating which goes first; the added time per call is the
difference of the two per-iteration medians, measured on the same machine a moment apart (this
VM's speed drifts within a minute). Two figures per pair: wall time, and the CPU time of the
loop's own thread (``time.thread_time``): on a loaded machine the wall figure also holds the
time the rank waits for a core while other processes (the controller taking in the values
among them) run, the CPU figure only what the call costs the rank. A second pair does the same
with a 0-d tensor value (its ``.item()`` on the rank is part of the price). Target (issue 23):
at most 5 µs per call.

Steady state (issue 23: sampling and metrics ≤ 1 % of a rank's CPU): the host agent's CPU for
one rank's sample a second (``ResourceSampler``, measured in this process on the mesh's live
workers), and the CPU share of ``log_metrics`` for a rank that logs two values every
``STEP_MS`` of training (its per-call CPU times its calls a second).

Run:  BENCH_OUT=out.json python bench/bench_metrics.py     (BENCH_QUICK=1: fewer samples)
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
from actormesh.runtime.procs.sampling import GpuReader, ResourceSampler

BLOCKS = 6 if C.QUICK else 30
ITERS = 2_000 if C.QUICK else 10_000
SAMPLE_TICKS = 50 if C.QUICK else 300
STEP_MS = 10.0  # a short training step: a small model's forward, backward and optimizer step


class Loop(am.Actor):
    @am.endpoint
    def run(self, iters: int, log: bool, tensor: bool) -> tuple[float, float]:
        """Wall and thread-CPU seconds per iteration of a loop that does a little float work
        (and maybe logs)."""
        import torch

        x = 1.0
        value = torch.tensor(0.5) if tensor else 0.5
        start, cpu_start = time.perf_counter(), time.thread_time()
        if log:
            for i in range(iters):
                x = x * 0.999 + 0.001
                am.log_metrics({"loss": x, "lr": value}, step=i)
        else:
            for _ in range(iters):
                x = x * 0.999 + 0.001
        wall, cpu = time.perf_counter() - start, time.thread_time() - cpu_start
        return wall / iters, cpu / iters

    @am.endpoint
    def pid(self) -> int:
        return os.getpid()


def pair(loop: am.ActorMesh[Loop], tensor: bool) -> dict[str, Any]:
    with_log: list[tuple[float, float]] = []
    without: list[tuple[float, float]] = []
    for block in range(BLOCKS):
        order = (True, False) if block % 2 == 0 else (False, True)
        for log in order:
            wall, cpu = loop.run.call_one(ITERS, log, tensor).get(timeout=120)
            (with_log if log else without).append((wall * 1e6, cpu * 1e6))

    def added(i: int) -> float:
        return statistics.median(w[i] for w in with_log) - statistics.median(w[i] for w in without)

    return {
        "with_log_us": statistics.median(w[0] for w in with_log),
        "without_us": statistics.median(w[0] for w in without),
        "added_us_per_call": added(0),
        "added_cpu_us_per_call": added(1),
        "target_us": 5.0,
        "met": added(0) <= 5.0,
        "met_in_cpu": added(1) <= 5.0,
    }


def sampling_cost(pids: list[int]) -> dict[str, float]:
    """The CPU of the agent's sampling tick over live workers, per rank sampled: the tick of
    ``ResourceSampler`` on this process's thread, against ``pids`` (once a second in the
    agent; here back to back)."""
    sampler = ResourceSampler.__new__(ResourceSampler)  # no node: only its reading is timed
    sampler._procs = {}
    sampler.gpus = GpuReader()
    workers = [("bench", rank, pid) for rank, pid in enumerate(pids)]
    sampler.workers = lambda: workers
    sampler._sample()  # the first reading only starts psutil's CPU interval
    ticks = []
    for _ in range(SAMPLE_TICKS):
        start = time.thread_time()
        samples = sampler._sample()
        ticks.append(time.thread_time() - start)
        assert len(samples) == len(pids), samples
    per_rank_us = statistics.median(ticks) / len(pids) * 1e6
    return {
        "ranks": len(pids),
        "cpu_us_per_rank_sample": per_rank_us,
        # One sample a second: the share of one core the agent spends on each rank.
        "percent_of_a_core_per_rank": per_rank_us / 1e6 * 100,
    }


def main() -> None:
    procs = am.this_host().spawn_procs(per_host={"gpus": 4})
    try:
        loops = procs.spawn("loop", Loop)
        loop = loops.slice(gpus=0)
        loop.run.call_one(ITERS, True, False).get(timeout=120)  # warm-up
        floats = pair(loop, tensor=False)
        result = {
            "machine": C.machine_info(),
            "load_1min": os.getloadavg()[0],
            "blocks": BLOCKS,
            "iters": ITERS,
            "float_values": floats,
            "tensor_values": pair(loop, tensor=True),
            "sampling": sampling_cost(loops.pid.call().get(timeout=60).values()),
            "metrics_at_steady_state": {
                "step_ms": STEP_MS,
                "percent_of_rank_cpu": floats["added_cpu_us_per_call"] / (STEP_MS * 1e3) * 100,
            },
        }
    finally:
        procs.stop().get(timeout=30)
    C.print_result(result)


if __name__ == "__main__":
    main()

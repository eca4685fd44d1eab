"""What ``am.log_metrics`` costs a training loop on a rank.

One rank runs the same loop twice per block pair, with and without ``log_metrics({"loss": x,
"lr": y}, step=i)`` in it, alternating which goes first; the added time per call is the
difference of the two per-iteration medians, measured on the same machine a moment apart (this
VM's speed drifts within a minute). A second pair does the same with a 0-d tensor value (its
``.item()`` on the rank is part of the price). Target (issue 23): at most 5 µs per call.

Run:  BENCH_OUT=out.json python bench/bench_metrics.py     (BENCH_QUICK=1: fewer samples)
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/
import common as C

import actormesh as am

BLOCKS = 6 if C.QUICK else 30
ITERS = 2_000 if C.QUICK else 10_000


class Loop(am.Actor):
    @am.endpoint
    def run(self, iters: int, log: bool, tensor: bool) -> float:
        """Seconds per iteration of a loop that does a little float work (and maybe logs)."""
        import torch

        x = 1.0
        value = torch.tensor(0.5) if tensor else 0.5
        start = time.perf_counter()
        if log:
            for i in range(iters):
                x = x * 0.999 + 0.001
                am.log_metrics({"loss": x, "lr": value}, step=i)
        else:
            for _ in range(iters):
                x = x * 0.999 + 0.001
        return (time.perf_counter() - start) / iters


def pair(loop: am.ActorMesh[Loop], tensor: bool) -> dict[str, float]:
    with_log, without = [], []
    for block in range(BLOCKS):
        order = (True, False) if block % 2 == 0 else (False, True)
        for log in order:
            per_iter = loop.run.call_one(ITERS, log, tensor).get(timeout=120)
            (with_log if log else without).append(per_iter * 1e6)
    added = statistics.median(with_log) - statistics.median(without)
    return {
        "with_log_us": statistics.median(with_log),
        "without_us": statistics.median(without),
        "added_us_per_call": added,
        "target_us": 5.0,
        "met": added <= 5.0,
    }


def main() -> None:
    procs = am.this_host().spawn_procs(per_host={"gpus": 1})
    try:
        loop = procs.spawn("loop", Loop)
        loop.run.call_one(ITERS, True, False).get(timeout=120)  # warm-up
        result = {
            "machine": C.machine_info(),
            "blocks": BLOCKS,
            "iters": ITERS,
            "float_values": pair(loop, tensor=False),
            "tensor_values": pair(loop, tensor=True),
        }
    finally:
        procs.stop().get(timeout=30)
    C.print_result(result)


if __name__ == "__main__":
    main()

"""``call_one`` and ``call`` to 8 beside their raw pyzmq floor, interleaved in one process.

The report's targets for these two latencies divide actormesh's figure by the floor's, measured
about a minute earlier by another process (``peers/bench_limits.py``). On a shared 2-core VM the
machine's speed drifts within a minute by as much as the gap being measured: raw pyzmq's own
``call_one`` read 130, 203 and 130 µs in the three rounds of one run. Here one controller
process holds both at once, the floor's raw pyzmq workers (``bench_limits.py``'s worker and
calls, unchanged, over tcp://) and an actormesh mesh of 8, and alternates between them in short
blocks, so that each pair of blocks sees the same machine. The first side of a pair alternates
too. The ratio is the median of all actormesh samples over the median of all floor samples;
the median of the per-block-pair ratios is kept beside it.

Run:  BENCH_OUT=out.json python bench/bench_paired.py     (BENCH_QUICK=1: fewer samples)
Prints one JSON object; ``BENCH_OUT=path`` also writes it there.
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers"))
import bench_limits as floor
import common as C

import actormesh as am

N = 8
# (blocks, calls per block): the same number of samples per side as the separate scripts
SHAPES = {
    "call_one": (40, C.RTT_ITERS // 40),
    "call_all_8": (20, C.ALL_ITERS // 20),
}
CALL_TIMEOUT_S = 30.0


class Pinger(am.Actor):
    def __init__(self) -> None:
        import torch  # noqa: F401  same "torch imported" condition as the floor's workers

    @am.endpoint
    def ping(self, i: int) -> int:
        return i


def interleave(
    ours: Callable[[int], object],
    base: Callable[[int], object],
    warmup: int,
    shape: tuple[int, int],
) -> dict[str, Any]:
    """Time ``ours`` and ``base`` in ``shape`` = (blocks, calls per block), alternating."""
    blocks, per_block = shape
    C.timed(ours, 0, warmup)
    C.timed(base, 0, warmup)
    mine: list[int] = []
    theirs: list[int] = []
    pair_ratios: list[float] = []
    for b in range(blocks):
        start = b * per_block
        if b % 2 == 0:
            a = C.timed(ours, start, per_block)
            f = C.timed(base, start, per_block)
        else:
            f = C.timed(base, start, per_block)
            a = C.timed(ours, start, per_block)
        mine += a
        theirs += f
        pair_ratios.append(statistics.median(a) / statistics.median(f))
    got, ref = C.stats_ns(mine), C.stats_ns(theirs)
    return {
        "actormesh": got,
        "floor": ref,
        "ratio": got["median_us"] / ref["median_us"],
        "pair_ratio_median": statistics.median(pair_ratios),
        "blocks": blocks,
        "per_block": per_block,
    }


def main() -> None:
    out: dict[str, Any] = {"machine": C.machine_info(), "n": N, "shapes": SHAPES}
    pool = floor.ZPool("tcp", N)
    procs = None
    try:
        procs = am.this_host().spawn_procs(per_host={"gpus": N})
        actors = procs.spawn("pinger", Pinger)
        actors.ping.call(0).get(timeout=120)
        one = actors.slice(gpus=0)
        ident = pool.ids[0]
        out["call_one"] = interleave(
            lambda i: one.ping.call_one(i).get(timeout=CALL_TIMEOUT_S),
            lambda i: floor.call_pickled(pool, ident, i),
            C.RTT_WARMUP,
            SHAPES["call_one"],
        )
        out["call_all_8"] = interleave(
            lambda i: actors.ping.call(i).get(timeout=CALL_TIMEOUT_S),
            lambda i: floor.call_all(pool, i),
            C.ALL_WARMUP,
            SHAPES["call_all_8"],
        )
    finally:
        pool.close()
        if procs is not None:
            procs.stop().get(timeout=60)
    C.print_result(out)


if __name__ == "__main__":
    main()

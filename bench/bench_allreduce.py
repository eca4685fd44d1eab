"""gloo all-reduce of 64 MB across 4 actors, beside the same all-reduce launched by torchrun.

Both sides run the same ``measure()`` in 4 processes with one intra-op thread each (torchrun's
``OMP_NUM_THREADS=1``): a barrier, then ``all_reduce`` of a 64 MB float32 tensor, timed; an
iteration takes as long as its slowest rank. The actormesh side forms its group with
``actormesh.runtime.dataplane.distributed.init_process_group`` over an actor mesh and calls
``measure`` as an endpoint; the torchrun side is ``python -m torch.distributed.run --standalone
--nproc-per-node 4`` running this file with ``--worker``. The sides alternate for ``ROUNDS``
rounds (torchrun's start-up is not timed) and the medians of all iterations are compared.
Target (issue 4): actormesh's median within 10 % of torchrun's.

Run:  python bench/bench_allreduce.py          (BENCH_QUICK=1: one short round)
Prints one JSON object; ``BENCH_OUT=path`` also writes it there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/
import common as C

import actormesh as am
from actormesh.runtime.dataplane.distributed import init_process_group

WORLD = 4
NBYTES = 64 << 20
# More iterations than common.PAYLOADS["64MB"]: one all-reduce takes ~0.1-0.2 s here, and the
# machine is shared, so a ratio of medians needs more samples to be stable.
WARMUP, ITERS, ROUNDS = (1, 3, 1) if C.QUICK else (3, 20, 4)
TARGET = 1.10


def measure(nbytes: int, warmup: int, iters: int) -> list[int]:
    """This rank's time (ns) for each timed all-reduce; the group must exist."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    t = torch.ones(nbytes // 4, dtype=torch.float32)
    out = []
    for i in range(warmup + iters):
        dist.barrier()
        t0 = time.perf_counter_ns()
        dist.all_reduce(t)
        elapsed = time.perf_counter_ns() - t0
        if i >= warmup:
            out.append(elapsed)
    return out


def slowest(per_rank: list[list[int]]) -> list[int]:
    return [max(times) for times in zip(*per_rank, strict=True)]


# -- the torchrun side ---------------------------------------------------------------------------


def worker(out_path: str, nbytes: int, warmup: int, iters: int) -> None:
    """Run under torchrun: measure, gather every rank's times on rank 0, write them."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    mine = measure(nbytes, warmup, iters)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(gathered, f)
    dist.destroy_process_group()


def torchrun_round() -> list[int]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times.json")
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={WORLD}",
            os.path.abspath(__file__),
            "--worker",
            out,
            str(NBYTES),
            str(WARMUP),
            str(ITERS),
        ]
        # torchrun would set OMP_NUM_THREADS=1 itself (and print a banner saying so).
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        subprocess.run(cmd, check=True, timeout=600, stdout=subprocess.DEVNULL, env=env)
        with open(out) as f:
            return slowest(json.load(f))


# -- the actormesh side --------------------------------------------------------------------------


class Bench(am.Actor):
    @am.endpoint
    def measure(self, nbytes: int, warmup: int, iters: int) -> list[int]:
        return measure(nbytes, warmup, iters)


def actormesh_rounds() -> Any:
    procs = am.this_host().spawn_procs(per_host={"procs": WORLD})
    actors = procs.spawn("bench", Bench)
    init_process_group(actors).get(timeout=120)

    def one_round() -> list[int]:
        return slowest(actors.measure.call(NBYTES, WARMUP, ITERS).get(timeout=600).values())

    return procs, one_round


def main() -> None:
    results: dict[str, Any] = {
        "metric": f"gloo all_reduce {NBYTES >> 20} MB, {WORLD} ranks, one host",
        "params": {"warmup": WARMUP, "iters": ITERS, "rounds": ROUNDS, "quick": C.QUICK},
        "machine": C.machine_info(),
    }
    samples: dict[str, list[int]] = {"actormesh": [], "torchrun": []}
    procs, actor_round = actormesh_rounds()
    try:
        for r in range(ROUNDS):
            # Alternate, and swap who goes first, so drift on a shared machine hits both.
            order = ["actormesh", "torchrun"] if r % 2 == 0 else ["torchrun", "actormesh"]
            for side in order:
                times = actor_round() if side == "actormesh" else torchrun_round()
                samples[side].extend(times)
                med, low = statistics.median(times) / 1e6, min(times) / 1e6
                print(f"round {r} {side}: median {med:.1f} ms, min {low:.1f} ms", file=sys.stderr)
    finally:
        procs.stop().get(timeout=30)
    for side, xs in samples.items():
        results[side] = C.stats_ns(xs, NBYTES)
    ratio = results["actormesh"]["median_us"] / results["torchrun"]["median_us"]
    results["ratio_median"] = round(ratio, 3)
    results["target"] = f"actormesh median <= {TARGET:.2f} x torchrun median"
    results["met"] = ratio <= TARGET
    C.print_result(results)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=4, metavar=("OUT", "NBYTES", "WARMUP", "ITERS"))
    ns = parser.parse_args()
    if ns.worker:
        out, nbytes, warmup, iters = ns.worker
        worker(out, int(nbytes), int(warmup), int(iters))
    else:
        main()

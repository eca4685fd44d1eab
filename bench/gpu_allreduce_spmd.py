"""The all-reduce loop of bench_gpu.py: imported by its actors, or run under torchrun."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time


def time_allreduce(nbytes: int, iters: int) -> float:
    """Median seconds of one all-reduce of ``nbytes`` in the default group (after a warm-up)."""
    import torch
    import torch.distributed as dist

    x = torch.ones(nbytes // 4, device="cuda")
    for _ in range(3):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(x)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


if __name__ == "__main__":
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    seconds = time_allreduce(int(sys.argv[1]), int(sys.argv[2]))
    if dist.get_rank() == 0:
        print(json.dumps({"seconds": seconds}))
    dist.destroy_process_group()
